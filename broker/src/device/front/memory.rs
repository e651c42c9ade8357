//! A device's memory as sessions ask for it: allocations carved out of chunks (`pool`),
//! the virtual memory API's reservations and mappings (`pool/reserved.rs`), what sessions
//! share with each other (`ipc`), and client memory shared with the executor.

use std::os::fd::{BorrowedFd, OwnedFd};

use gpushare_protocol::DevicePtr;

use super::Device;
use crate::device::{DeviceError, DeviceResult};

impl Device {
    /// Device memory that outlives the context (see `pool`), for user `owner`: what another
    /// user freed is never handed to it with their bytes in it.
    pub fn alloc(&self, bytes: u64, owner: u32) -> DeviceResult<DevicePtr> {
        self.pool.alloc(&*self.link, bytes, owner)
    }

    /// Allocates at exactly `ptr` for user `owner`; returns the memory it took.
    pub fn alloc_at(&self, ptr: DevicePtr, bytes: u64, owner: u32) -> DeviceResult<u64> {
        self.pool.alloc_at(&*self.link, ptr, bytes, owner)
    }

    pub fn free(&self, ptr: DevicePtr) -> DeviceResult<()> {
        self.pool.free(&*self.link, ptr)
    }

    /// What sessions of this device share with each other.
    pub fn ipc(&self) -> &crate::device::ipc::Ipc {
        &self.ipc
    }

    // ---- the virtual memory API: see `pool/reserved.rs` ----

    /// Reserves address space for user `owner` to map physical memory into.
    pub fn reserve(&self, size: u64, align: u64, hint: u64, owner: u32) -> DeviceResult<u64> {
        self.pool.reserve(size, align, hint, owner)
    }

    pub fn unreserve(&self, at: u64, size: u64, owner: u32) -> DeviceResult<()> {
        self.pool.unreserve(at, size, owner)
    }

    /// Physical memory mapped nowhere: its descriptor holds it.
    pub fn make_memory(&self, size: u64) -> DeviceResult<OwnedFd> {
        let g = self.space().granularity.max(1);
        if size == 0 || !size.is_multiple_of(g) {
            return Err(DeviceError::InvalidArgument(format!(
                "{size} bytes is not a whole number of {g}-byte granules"
            )));
        }
        if size > self.info().total_memory {
            return Err(DeviceError::OutOfMemory);
        }
        self.link.make_memory(size)
    }

    pub fn map_memory(
        &self,
        at: u64,
        size: u64,
        fd: BorrowedFd<'_>,
        owner: u32,
    ) -> DeviceResult<()> {
        self.pool.map(&*self.link, at, size, fd, owner)
    }

    /// Unmaps whole mappings; returns them (address, size).
    pub fn unmap_memory(&self, at: u64, size: u64, owner: u32) -> DeviceResult<Vec<(u64, u64)>> {
        self.pool.unmap(&*self.link, at, size, owner)
    }

    pub fn share_memory(
        &self,
        region: u64,
        fd: BorrowedFd<'_>,
        len: u64,
        at: u64,
        offset: u64,
    ) -> DeviceResult<()> {
        self.link.share_memory(region, fd, len, at, offset)
    }

    pub fn unshare_memory(&self, region: u64) {
        self.link.unshare_memory(region)
    }
}

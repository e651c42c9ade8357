//! A client's virtual memory objects (`cuMemCreate`, `cuMemAddressReserve`, `cuMemMap` …):
//! physical memory it made, charged to its user's quota from creation until the memory is
//! both released and unmapped; address space it reserved; and what it mapped where, which the
//! range check of every copy accepts like an allocation.

use std::collections::{BTreeMap, HashMap};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use gpushare_protocol::{DevicePtr, ErrorCode};

use super::{MAX_ALLOCATIONS, SessionState};
use crate::device::Device;

/// Physical device memory: its descriptor holds it (see `Link::make_memory`). Shared by the
/// sessions that hold a handle of it (one made it, others imported it).
#[derive(Debug)]
pub struct Physical {
    pub fd: OwnedFd,
    pub size: u64,
    /// The GPU it is on.
    pub gpu: u32,
}

/// A handle of the client's: physical memory, whether the client let go of it, and how many
/// of its mappings name it.
#[derive(Debug)]
struct Handle {
    physical: Arc<Physical>,
    released: bool,
    mappings: u32,
    /// Bytes charged to the quota for it (0 for memory another process made).
    charged: u64,
}

/// A session's physical-memory handles: its data thread makes and maps them, its control task
/// exports and imports them.
#[derive(Debug, Default)]
pub struct Handles {
    next: u64,
    table: HashMap<u64, Handle>,
}

impl Handles {
    /// The memory behind a handle the client still holds.
    pub fn physical(&self, handle: u64) -> Option<Arc<Physical>> {
        self.table
            .get(&handle)
            .filter(|h| !h.released)
            .map(|h| h.physical.clone())
    }

    /// A new handle of `physical`, charged `charged` bytes.
    pub fn add(&mut self, physical: Arc<Physical>, charged: u64) -> Result<u64, ErrorCode> {
        if self.table.len() >= MAX_ALLOCATIONS {
            return Err(ErrorCode::TooManyHandles);
        }
        self.next += 1;
        self.table.insert(
            self.next,
            Handle {
                physical,
                released: false,
                mappings: 0,
                charged,
            },
        );
        Ok(self.next)
    }

    /// Drops `handle` when it is released and nothing maps it; returns what it had charged.
    fn settle(&mut self, handle: u64) -> u64 {
        match self.table.get(&handle) {
            Some(h) if h.released && h.mappings == 0 => {
                self.table.remove(&handle).map_or(0, |h| h.charged)
            }
            _ => 0,
        }
    }

    pub(super) fn clear(&mut self) {
        self.table.clear();
    }
}

#[derive(Debug, Default)]
pub(super) struct Vmm {
    /// Reservation address → size.
    reserved: BTreeMap<DevicePtr, u64>,
    /// Mapping address → (size, handle).
    mapped: BTreeMap<DevicePtr, (u64, u64)>,
}

impl Vmm {
    /// Whether `[ptr, ptr + len)` lies in mappings that follow one another without a gap
    /// (a buffer of PyTorch's expandable segments spans several). A zero-length range may
    /// start at a mapping's end.
    pub(super) fn covers(&self, ptr: DevicePtr, len: u64) -> bool {
        let Some(end) = ptr.checked_add(len) else {
            return false;
        };
        let Some((&base, &(size, _))) = self.mapped.range(..=ptr).next_back() else {
            return false;
        };
        let mut reach = base + size;
        if ptr > reach || (len > 0 && ptr == reach) {
            return false;
        }
        while reach < end {
            match self.mapped.get(&reach) {
                Some(&(size, _)) => reach += size,
                None => return false,
            }
        }
        true
    }

    /// Every mapping (address, size), the lowest first.
    pub(super) fn mappings(&self) -> impl Iterator<Item = (DevicePtr, u64)> + '_ {
        self.mapped.iter().map(|(&at, &(size, _))| (at, size))
    }

    /// Forgets every reservation and mapping (their memory went with a context, or was given
    /// back already).
    pub(super) fn clear(&mut self) {
        self.reserved.clear();
        self.mapped.clear();
    }
}

impl SessionState {
    pub(super) fn mem_reserve(
        &mut self,
        size: u64,
        align: u64,
        hint: DevicePtr,
    ) -> Result<(u64, u64), ErrorCode> {
        if self.vmm.reserved.len() >= MAX_ALLOCATIONS {
            return Err(ErrorCode::TooManyHandles);
        }
        let at = self
            .device
            .reserve(size, align, hint, self.info.uid)
            .map_err(|e| e.code())?;
        self.vmm.reserved.insert(at, size);
        Ok((at, 0))
    }

    pub(super) fn mem_unreserve(
        &mut self,
        ptr: DevicePtr,
        size: u64,
    ) -> Result<(u64, u64), ErrorCode> {
        if self.vmm.reserved.get(&ptr) != Some(&size) {
            return Err(ErrorCode::InvalidPointer);
        }
        self.device
            .unreserve(ptr, size, self.info.uid)
            .map_err(|e| e.code())?;
        self.vmm.reserved.remove(&ptr);
        Ok((0, 0))
    }

    fn handles(&self) -> std::sync::MutexGuard<'_, Handles> {
        self.info.vmm.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn mem_create(&mut self, size: u64) -> Result<(u64, u64), ErrorCode> {
        if size == 0 {
            return Err(ErrorCode::InvalidArgument);
        }
        // Charged first, as an allocation is.
        self.info.charge_memory(size)?;
        let made = self.device.make_memory(size).map_err(|e| e.code());
        let added = made.and_then(|fd| {
            let gpu = self.device.info().index;
            self.handles()
                .add(Arc::new(Physical { fd, size, gpu }), size)
        });
        if added.is_err() {
            self.info.release_memory(size);
        }
        added.map(|id| (id, 0))
    }

    pub(super) fn mem_release(&mut self, handle: u64) -> Result<(u64, u64), ErrorCode> {
        let charged = {
            let mut handles = self.handles();
            match handles.table.get_mut(&handle) {
                Some(h) if !h.released => h.released = true,
                _ => return Err(ErrorCode::InvalidHandle),
            }
            handles.settle(handle)
        };
        self.info.release_memory(charged);
        Ok((0, 0))
    }

    pub(super) fn mem_map(
        &mut self,
        ptr: DevicePtr,
        size: u64,
        handle: u64,
    ) -> Result<(u64, u64), ErrorCode> {
        let physical = self
            .handles()
            .physical(handle)
            .ok_or(ErrorCode::InvalidHandle)?;
        if size > physical.size {
            return Err(ErrorCode::InvalidArgument);
        }
        self.device
            .map_memory(ptr, size, physical.fd.as_fd(), self.info.uid)
            .map_err(|e| e.code())?;
        self.vmm.mapped.insert(ptr, (size, handle));
        if let Some(h) = self.handles().table.get_mut(&handle) {
            h.mappings += 1;
        }
        // Memory lost at this address in a reset is there again.
        self.lost.forget_buffers_in(ptr, ptr + size);
        Ok((0, 0))
    }

    pub(super) fn mem_unmap(&mut self, ptr: DevicePtr, size: u64) -> Result<(u64, u64), ErrorCode> {
        // The device may still be running work that reads it: CUDA's unmap waits for it.
        self.sync_all()?;
        let gone = self
            .device
            .unmap_memory(ptr, size, self.info.uid)
            .map_err(|e| e.code())?;
        let mut charged = 0;
        for (at, _) in gone {
            if let Some((_, handle)) = self.vmm.mapped.remove(&at) {
                let mut handles = self.handles();
                if let Some(h) = handles.table.get_mut(&handle) {
                    h.mappings = h.mappings.saturating_sub(1);
                }
                charged += handles.settle(handle);
            }
        }
        self.info.release_memory(charged);
        Ok((0, 0))
    }

    /// Unmaps, unreserves and lets go of everything (the session ends, or is told it lost
    /// its memory while the context lives). The caller settles the quota.
    pub(super) fn release_vmm(&mut self) {
        let uid = self.info.uid;
        release_all(&self.device, &mut self.vmm, uid);
        self.handles().clear();
    }

    /// Forgets every handle, reservation and mapping (a reset took the context they were in).
    pub(super) fn forget_vmm(&mut self) {
        self.vmm.clear();
        self.handles().clear();
    }
}

fn release_all(device: &Device, vmm: &mut Vmm, uid: u32) {
    for (&at, &(size, _)) in &vmm.mapped {
        if let Err(e) = device.unmap_memory(at, size, uid) {
            tracing::warn!(at = format_args!("{at:#x}"), error = %e, "could not unmap a departed client's memory");
        }
    }
    for (&at, &size) in &vmm.reserved {
        let _ = device.unreserve(at, size, uid);
    }
    vmm.clear();
}

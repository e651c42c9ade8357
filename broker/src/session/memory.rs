//! A session's plain device allocations: made anywhere or at the address a client rebuilding
//! after a reset asks for, charged to the user's quota first, and freed once the work queued
//! before the free has ended.

use std::sync::atomic::Ordering;

use gpushare_protocol::{DevicePtr, ErrorCode};

use super::{MAX_ALLOCATIONS, SessionState};

impl SessionState {
    /// Allocates `bytes`, anywhere or at exactly `at` (a client rebuilding after a reset).
    pub(super) fn alloc(
        &mut self,
        bytes: u64,
        at: Option<DevicePtr>,
    ) -> Result<(u64, u64), ErrorCode> {
        if bytes == 0 {
            return Err(ErrorCode::InvalidArgument);
        }
        if self.allocations.len() >= MAX_ALLOCATIONS {
            return Err(ErrorCode::TooManyHandles);
        }
        // Charged first, so that another session of the same user cannot take the room
        // meanwhile; given back if the device refuses.
        self.info.charge_memory(bytes)?;
        let placed = self.alloc_on_device(bytes, at);
        if placed.is_err() {
            self.info.release_memory(bytes);
        }
        let (ptr, charge) = placed?;
        self.allocations.insert(ptr, bytes);
        if charge > bytes {
            self.placed_charges.insert(ptr, charge);
        }
        self.info
            .counters
            .allocations
            .fetch_add(1, Ordering::Relaxed);
        Ok((ptr, 0))
    }

    /// Allocates `bytes` on the device, anywhere or at exactly `at`, with `bytes` already
    /// charged; returns the pointer and what it cost (more than `bytes` for placed memory,
    /// the extra charged here).
    fn alloc_on_device(
        &mut self,
        bytes: u64,
        at: Option<DevicePtr>,
    ) -> Result<(DevicePtr, u64), ErrorCode> {
        let mut charge = bytes;
        let ptr = match at {
            None => self
                .device
                .alloc(bytes, self.info.uid)
                .map_err(|e| e.code())?,
            Some(ptr) => {
                let end = ptr
                    .checked_add(bytes)
                    .ok_or(ErrorCode::AddressUnavailable)?;
                if self.allocations.overlaps(ptr, end) {
                    return Err(ErrorCode::AddressUnavailable);
                }
                let took = self.device.alloc_at(ptr, bytes, self.info.uid).map_err(|e| {
                    tracing::debug!(ptr = format_args!("{ptr:#x}"), bytes, error = %e, "cannot allocate at the address asked for");
                    e.code()
                })?;
                // Placed memory costs whole granules on a GPU: the quota counts what it took.
                if took > bytes {
                    if let Err(code) = self.info.charge_memory(took - bytes) {
                        let _ = self.device.free(ptr);
                        return Err(code);
                    }
                    charge = took;
                }
                // Memory lost at this address in a reset is there again.
                self.lost.forget_buffers_in(ptr, end);
                ptr
            }
        };
        Ok((ptr, charge))
    }

    /// Frees the allocation at `ptr`, once the work queued before it has ended.
    pub(super) fn free(&mut self, ptr: DevicePtr) -> Result<(u64, u64), ErrorCode> {
        let size = self
            .allocations
            .size_of(ptr)
            .ok_or(ErrorCode::InvalidPointer)?;
        // Work queued before the free (a stream-ordered `cuMemFreeAsync`, a kernel not
        // yet waited for) may still use the memory: it ends first, as CUDA's free waits
        // for it, whether the bytes go back to the device or stay in the pool for the
        // user's next allocation, in this program or another of theirs. An error it met
        // is this command's to report (the client learns it at its next
        // synchronization); the memory goes back all the same.
        let drained = self.sync_all();
        self.device.free(ptr).map_err(|e| e.code())?;
        self.device.ipc().forget_memory(self.info.id, ptr);
        self.allocations.remove(ptr);
        let charged = self.placed_charges.remove(&ptr).unwrap_or(size);
        self.info.release_memory(charged);
        drained.map(|()| (0, 0))
    }
}

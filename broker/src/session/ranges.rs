//! The range check every device pointer a client names meets before the device sees it: in
//! one of its allocations, across its mappings of the virtual memory API, in memory another
//! session shared with it (CUDA IPC), in page-locked host memory it shares (where device
//! code reaches it), or in a module global it looked up.

use gpushare_protocol::{DevicePtr, ErrorCode};

use super::SessionState;

impl SessionState {
    /// [`SessionState::check_device`] for a range a command writes: a write into a module
    /// global is noted (see `reset`).
    pub(super) fn check_write(&self, ptr: DevicePtr, len: u64) -> Result<(), ErrorCode> {
        match self.allocations.check_range(ptr, len) {
            Ok(()) => Ok(()),
            Err(_) if self.held_otherwise(ptr, len) => Ok(()),
            Err(e) => {
                let mut modules = self.modules.lock().map_err(|_| ErrorCode::Internal)?;
                if modules.in_global(ptr, len) {
                    modules.note_write(ptr, len);
                    Ok(())
                } else {
                    Err(e)
                }
            }
        }
    }

    /// Checks that `[ptr, ptr + len)` is the client's.
    pub(super) fn check_device(&self, ptr: DevicePtr, len: u64) -> Result<(), ErrorCode> {
        match self.allocations.check_range(ptr, len) {
            Ok(()) => Ok(()),
            Err(_) if self.held_otherwise(ptr, len) => Ok(()),
            Err(e) => {
                let in_global = self
                    .modules
                    .lock()
                    .map(|m| m.in_global(ptr, len))
                    .unwrap_or(false);
                if in_global { Ok(()) } else { Err(e) }
            }
        }
    }

    /// Whether the range is the client's other than as an allocation or a global.
    fn held_otherwise(&self, ptr: DevicePtr, len: u64) -> bool {
        self.vmm.covers(ptr, len)
            || self.in_opened_memory(ptr, len)
            || self.in_host_memory(ptr, len)
    }

    /// Whether `[ptr, ptr + len)` is page-locked host memory the client shares, as device
    /// code reaches it.
    fn in_host_memory(&self, ptr: DevicePtr, len: u64) -> bool {
        self.info
            .hosts
            .lock()
            .is_ok_and(|h| h.holds_device_range(ptr, len))
    }
}

//! CUDA IPC between processes of one user on one device (`cuIpcGetMemHandle`,
//! `cuIpcOpenMemHandle`, `cuIpcCloseMemHandle`, `cuIpcGetEventHandle`,
//! `cuIpcOpenEventHandle`), what `torch.multiprocessing` uses to pass CUDA tensors. Every
//! process's work runs in the broker's one context, so memory opened is at the exporter's
//! own address; a handle carries the broker's random token for it.

use std::ffi::c_uint;

use gpushare_protocol::Command;

use super::DeviceKind;
use super::device::{reserve_range, unreserve_range};
use crate::driver::{self, Driver};
use crate::handle;
use crate::status::{Cu, entry, out};
use crate::types::{CUdeviceptr, CUevent, CUresult, event, result};

/// `CUipcMemHandle` and `CUipcEventHandle`: 64 opaque bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IpcHandle {
    pub reserved: [u8; 64],
}

const MEMORY_MAGIC: &[u8; 8] = b"gpsIPCm1";
const EVENT_MAGIC: &[u8; 8] = b"gpsIPCe1";
/// `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`, the one flag (peer access means nothing here).
const LAZY_PEER_ACCESS: c_uint = 1;

fn handle_of(magic: &[u8; 8], (lo, hi): (u64, u64)) -> IpcHandle {
    let mut h = IpcHandle { reserved: [0; 64] };
    h.reserved[..8].copy_from_slice(magic);
    h.reserved[8..16].copy_from_slice(&lo.to_le_bytes());
    h.reserved[16..24].copy_from_slice(&hi.to_le_bytes());
    h
}

/// The token a handle carries, if it is one of `magic`'s.
fn token_in(magic: &[u8; 8], h: &IpcHandle) -> Cu<(u64, u64)> {
    if &h.reserved[..8] != magic {
        return Err(result::INVALID_VALUE);
    }
    let word = |at: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&h.reserved[at..at + 8]);
        u64::from_le_bytes(w)
    };
    Ok((word(8), word(16)))
}

impl Driver {
    fn ipc_open_memory(&self, token: (u64, u64)) -> Cu<u64> {
        let (base, size) = self.transport.call(Command::IpcOpenMemory {
            token_lo: token.0,
            token_hi: token.1,
        })?;
        // Its address is kept from this process's own mappings, as every device address is.
        if !reserve_range(base, size) {
            let _ = self.transport.call(Command::IpcCloseMemory { ptr: base });
            crate::log::say_once(
                "memory another process shared lies where this process has memory of its own",
            );
            return Err(result::OUT_OF_MEMORY);
        }
        self.memory.add_device(base, size, DeviceKind::Ipc, true);
        Ok(base)
    }

    fn ipc_close_memory(&self, ptr: u64) -> Cu<()> {
        match self.memory.device_range(ptr, 0) {
            Some((base, r)) if base == ptr && r.kind == DeviceKind::Ipc => {}
            _ => return Err(result::INVALID_VALUE),
        }
        self.transport.call(Command::IpcCloseMemory { ptr })?;
        if let Some(r) = self.memory.remove_device(ptr) {
            unreserve_range(ptr, r.bytes);
        }
        Ok(())
    }
}

/// # Safety
/// `h` is NULL or valid for writing a handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuIpcGetMemHandle(h: *mut IpcHandle, ptr: CUdeviceptr) -> CUresult {
    entry("cuIpcGetMemHandle", || {
        let d = crate::route::for_pointer(ptr)?;
        match d.memory.device_range(ptr, 0) {
            Some((_, r)) if r.kind == DeviceKind::Allocation => {}
            _ => return Err(result::INVALID_VALUE),
        }
        let token = d.transport.call(Command::IpcExportMemory { ptr })?;
        // SAFETY: the caller's contract.
        unsafe { out(h, handle_of(MEMORY_MAGIC, token)) }
    })
}

/// # Safety
/// `ptr` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuIpcOpenMemHandle_v2(
    ptr: *mut CUdeviceptr,
    h: IpcHandle,
    flags: c_uint,
) -> CUresult {
    entry("cuIpcOpenMemHandle_v2", || {
        let d = driver::live()?;
        if ptr.is_null() || flags & !LAZY_PEER_ACCESS != 0 {
            return Err(result::INVALID_VALUE);
        }
        let base = d.ipc_open_memory(token_in(MEMORY_MAGIC, &h)?)?;
        // SAFETY: the caller's contract.
        unsafe { out(ptr, base) }
    })
}

/// # Safety
/// As `cuIpcOpenMemHandle_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuIpcOpenMemHandle(
    ptr: *mut CUdeviceptr,
    h: IpcHandle,
    flags: c_uint,
) -> CUresult {
    // SAFETY: the same contract.
    unsafe { cuIpcOpenMemHandle_v2(ptr, h, flags) }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuIpcCloseMemHandle(ptr: CUdeviceptr) -> CUresult {
    entry("cuIpcCloseMemHandle", || {
        crate::route::for_pointer(ptr)?.ipc_close_memory(ptr)
    })
}

/// # Safety
/// `h` is NULL or valid for writing a handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuIpcGetEventHandle(h: *mut IpcHandle, e: CUevent) -> CUresult {
    entry("cuIpcGetEventHandle", || {
        let d = crate::route::by_event(e)?;
        let id = d.event(e)?;
        let flags = d.event_flags(id).ok_or(result::INVALID_HANDLE)?;
        // CUDA shares only events made to be shared.
        if flags & event::INTERPROCESS == 0 {
            return Err(result::INVALID_VALUE);
        }
        let token = d.transport.call(Command::IpcExportEvent { event: id })?;
        // SAFETY: the caller's contract.
        unsafe { out(h, handle_of(EVENT_MAGIC, token)) }
    })
}

/// # Safety
/// `e` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuIpcOpenEventHandle(e: *mut CUevent, h: IpcHandle) -> CUresult {
    entry("cuIpcOpenEventHandle", || {
        let d = driver::live()?;
        if e.is_null() {
            return Err(result::INVALID_VALUE);
        }
        let (token_lo, token_hi) = token_in(EVENT_MAGIC, &h)?;
        let id = d.new_event(event::INTERPROCESS | event::DISABLE_TIMING, |id| {
            d.transport
                .call(Command::IpcOpenEvent {
                    token_lo,
                    token_hi,
                    event: id,
                })
                .map(drop)
        })?;
        // SAFETY: the caller's contract.
        unsafe { out(e, handle::event_handle(d.device, id)) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handle_carries_its_token_and_kind() {
        let h = handle_of(MEMORY_MAGIC, (7, 9));
        assert_eq!(token_in(MEMORY_MAGIC, &h), Ok((7, 9)));
        assert_eq!(token_in(EVENT_MAGIC, &h), Err(result::INVALID_VALUE));
        let zero = IpcHandle { reserved: [0; 64] };
        assert_eq!(token_in(MEMORY_MAGIC, &zero), Err(result::INVALID_VALUE));
        assert_eq!(std::mem::size_of::<IpcHandle>(), 64);
    }
}

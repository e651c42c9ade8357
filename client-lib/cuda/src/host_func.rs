//! Host functions in stream order (`cuLaunchHostFunc`, `cuStreamAddCallback`): the driver
//! waits for the stream's work, then calls the function in the calling thread before it
//! returns. The order is CUDA's (after the stream's earlier work, before its later work, since
//! the program submits that only once this returns); what differs is that the call blocks
//! while CUDA's returns at once and calls from a thread of its own. A function that waits for
//! work the program submits after it would wait forever, as CUDA forbids anyway (a host
//! function may not call CUDA). Inside a stream capture it is refused.

use std::ffi::{c_uint, c_void};

use crate::driver::{self, Driver};
use crate::status::{Cu, entry};
use crate::types::{CUresult, CUstream, result};

/// `CUhostFn`.
pub type HostFn = Option<unsafe extern "C" fn(*mut c_void)>;
/// `CUstreamCallback`: the stream, the stream's status, the user's data.
pub type StreamCallback = Option<unsafe extern "C" fn(CUstream, CUresult, *mut c_void)>;

impl Driver {
    /// Waits for `stream`'s work; its outcome (the first error since its last sync).
    fn drain_for_host(&self, stream: u32) -> Cu<()> {
        crate::graph::refuse_while_capturing(self, stream)?;
        self.sync_stream(stream)
    }
}

fn launch(stream: CUstream, per_thread: bool, f: HostFn, data: *mut c_void) -> Cu<()> {
    let d = driver::live()?;
    let f = f.ok_or(result::INVALID_VALUE)?;
    let s = d.stream(stream, per_thread)?;
    d.drain_for_host(s)?;
    // SAFETY: the program's function and data, called as CUDA would (once, after the stream's
    // earlier work).
    unsafe { f(data) };
    Ok(())
}

fn callback(
    stream: CUstream,
    per_thread: bool,
    f: StreamCallback,
    data: *mut c_void,
    flags: c_uint,
) -> Cu<()> {
    let d = driver::live()?;
    let f = f.ok_or(result::INVALID_VALUE)?;
    if flags != 0 {
        return Err(result::INVALID_VALUE);
    }
    let s = d.stream(stream, per_thread)?;
    // A callback is told the stream's status, and called whatever it is.
    let status = match d.drain_for_host(s) {
        Ok(()) => result::SUCCESS,
        Err(code) => code,
    };
    // SAFETY: the program's callback and data, called as CUDA would.
    unsafe { f(stream, status, data) };
    Ok(())
}

/// # Safety
/// `data` is whatever the function expects (CUDA's contract).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchHostFunc(
    stream: CUstream,
    f: HostFn,
    data: *mut c_void,
) -> CUresult {
    entry("cuLaunchHostFunc", || launch(stream, false, f, data))
}

/// # Safety
/// As `cuLaunchHostFunc`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchHostFunc_ptsz(
    stream: CUstream,
    f: HostFn,
    data: *mut c_void,
) -> CUresult {
    entry("cuLaunchHostFunc_ptsz", || launch(stream, true, f, data))
}

/// # Safety
/// `data` is whatever the callback expects (CUDA's contract).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamAddCallback(
    stream: CUstream,
    f: StreamCallback,
    data: *mut c_void,
    flags: c_uint,
) -> CUresult {
    entry("cuStreamAddCallback", || {
        callback(stream, false, f, data, flags)
    })
}

/// # Safety
/// As `cuStreamAddCallback`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamAddCallback_ptsz(
    stream: CUstream,
    f: StreamCallback,
    data: *mut c_void,
    flags: c_uint,
) -> CUresult {
    entry("cuStreamAddCallback_ptsz", || {
        callback(stream, true, f, data, flags)
    })
}

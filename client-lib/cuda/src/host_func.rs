//! Host functions in stream order (`cuLaunchHostFunc`, `cuStreamAddCallback`): called from a
//! thread of the driver's once the stream's earlier work is done, its later work waiting
//! for them, while the call returns at once, as CUDA's does (`host_point`). Where that cannot
//! be set up (the page it needs cannot be had) the driver waits for the stream's work and
//! calls the function before it returns instead: the same order, but the call blocks. A
//! function may not call CUDA (CUDA's rule too). Captured, a host function becomes a node of
//! the graph; a callback (`cuStreamAddCallback`) cannot be captured, as in CUDA.

use std::ffi::{c_uint, c_void};

use crate::driver::{self, Driver};
use crate::host_point::Call;
use crate::status::{Cu, entry};
use crate::types::{CUresult, CUstream, result};

/// `CUhostFn`.
pub type HostFn = Option<HostFnPtr>;
/// A `CUhostFn` that is not NULL.
pub type HostFnPtr = unsafe extern "C" fn(*mut c_void);
/// `CUstreamCallback`: the stream, the stream's status, the user's data.
pub type StreamCallback = Option<unsafe extern "C" fn(CUstream, CUresult, *mut c_void)>;

impl Driver {
    /// Runs host function `function` with `data` (an address) on `stream`, in stream order:
    /// at a host point when one can be set up, else after waiting for the stream.
    pub fn host_function(&self, stream: u32, function: HostFnPtr, data: usize) -> Cu<()> {
        // SAFETY: the program's function and data, called as CUDA would (once, after the
        // stream's earlier work and before its later work).
        let call: Call = Box::new(move || unsafe { function(data as *mut c_void) });
        match self.host_point(stream, call)? {
            Ok(()) => Ok(()),
            Err(call) => {
                self.sync_stream(stream)?;
                call();
                Ok(())
            }
        }
    }
}

fn launch(stream: CUstream, per_thread: bool, f: HostFn, data: *mut c_void) -> Cu<()> {
    let d = driver::live()?;
    let f = f.ok_or(result::INVALID_VALUE)?;
    let s = d.stream(stream, per_thread)?;
    let data = data as usize;
    // Captured, it is a host node of the graph (which is then replayed).
    if crate::graph::capture(d, s, || crate::graph::Op::Host { function: f, data })? {
        return Ok(());
    }
    d.host_function(s, f, data)
}

fn callback(
    stream: CUstream,
    per_thread: bool,
    f: StreamCallback,
    data: *mut c_void,
    flags: c_uint,
) -> Cu<()> {
    let d = crate::route::by_stream(stream)?;
    let f = f.ok_or(result::INVALID_VALUE)?;
    if flags != 0 {
        return Err(result::INVALID_VALUE);
    }
    let s = d.stream(stream, per_thread)?;
    crate::graph::refuse_while_capturing(d, s)?;
    let (handle, data) = (stream as usize, data as usize);
    // SAFETY: the program's callback and data, called as CUDA would. An error of the stream's
    // earlier work is told at the program's next synchronization, as for any other work.
    let call: Call =
        Box::new(move || unsafe { f(handle as CUstream, result::SUCCESS, data as *mut c_void) });
    match d.host_point(s, call)? {
        Ok(()) => Ok(()),
        Err(_) => {
            // A callback is told the stream's status, and called whatever it is.
            let status = match d.sync_stream(s) {
                Ok(()) => result::SUCCESS,
                Err(code) => code,
            };
            // SAFETY: as above.
            unsafe { f(stream, status, data as *mut c_void) };
            Ok(())
        }
    }
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

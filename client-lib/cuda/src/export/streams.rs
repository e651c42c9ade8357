//! cuBLAS's and cuBLASLt's questions about contexts and streams (table `21318c60…`), seen on
//! the H200 (driver 580) from CuPy's and PyTorch's cuBLAS 13, and read in that driver's code:
//!
//! - slot 4, `(context, u64 *id)`: the context's unique id, what `cuCtxGetId` gives (the
//!   driver reads it from its context object; cuBLASLt keys its per-context state on it);
//! - slot 51, `(context, stream, void **private, bool per_thread)`: the driver's own object
//!   for a stream handle; NULL means the legacy stream, or the thread's own when `per_thread`
//!   (a byte: any value but 0);
//! - slot 39, `(context, private, u64 *id)`: that object's stream id, what `cuStreamGetId`
//!   gives (cuBLAS asks 51 then 39 to key its per-stream workspace).
//!
//! This driver's object for a stream is the stream's own handle (`handle::stream_handle`),
//! never a pointer: slot 39 reads the id back out of it, and a value it did not make is
//! refused rather than read.

use std::ffi::c_void;

use crate::context::current;
use crate::driver::{self, Driver};
use crate::handle;
use crate::status::{Cu, entry, out};
use crate::types::{CUcontext, CUresult, CUstream, result, stream};

/// The context's unique id (0 for NULL, which the driver answers so too).
pub extern "C" fn context_id(ctx: CUcontext, id: *mut u64) -> CUresult {
    if id.is_null() {
        return result::UNKNOWN; // what the driver answers
    }
    entry("context_id", || {
        // SAFETY: non-NULL; the caller passes a writable out-parameter.
        unsafe { id.write(0) };
        if ctx.is_null() {
            return Ok(());
        }
        let context = driver::get()?.contexts.get(ctx)?;
        // SAFETY: as above.
        unsafe { out(id, context.id) }
    })
}

/// The stream a handle means, and its device's driver, as the driver resolves it for slot 51.
fn resolve(ctx: CUcontext, h: CUstream, per_thread: bool) -> Cu<(&'static Driver, u32)> {
    let first = driver::first()?;
    match h as usize {
        usize::MAX => Err(result::INVALID_HANDLE),
        // The special handles belong to a context: the one named, else the current one.
        0 | stream::LEGACY | stream::PER_THREAD => {
            let c = if ctx.is_null() { current() } else { ctx };
            if c.is_null() {
                return Err(result::INVALID_CONTEXT);
            }
            let dev = first.contexts.get(c)?.device;
            let d = crate::route::device(first, dev)?;
            Ok((d, d.stream(h, per_thread)?))
        }
        _ => {
            let d = crate::route::by_stream(h)?;
            Ok((d, d.stream(h, false)?))
        }
    }
}

/// The driver's object for a stream handle: here, the handle of the stream it means.
pub extern "C" fn private_stream(
    ctx: CUcontext,
    h: CUstream,
    private: *mut *mut c_void,
    per_thread: u8,
) -> CUresult {
    entry("private_stream", || {
        if private.is_null() {
            return Err(result::INVALID_VALUE);
        }
        let (d, id) = resolve(ctx, h, per_thread != 0)?;
        // SAFETY: non-NULL; the caller passes a writable out-parameter.
        unsafe { out(private, handle::stream_handle(d.device, id)) }
    })
}

/// The stream id of an object slot 51 gave.
pub extern "C" fn private_stream_id(
    _ctx: CUcontext,
    private: *mut c_void,
    id: *mut u64,
) -> CUresult {
    entry("private_stream_id", || {
        if private.is_null() || id.is_null() {
            return Err(result::INVALID_VALUE);
        }
        driver::get()?;
        let (_, stream) = handle::stream_id(private).ok_or(result::INVALID_HANDLE)?;
        // SAFETY: non-NULL; the caller passes a writable out-parameter.
        unsafe { out(id, stream as u64) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_driver_the_slots_refuse_cleanly() {
        let mut v = 7u64;
        assert_eq!(context_id(std::ptr::null_mut(), &mut v), result::SUCCESS);
        assert_eq!(v, 0, "NULL's id is 0");
        assert_eq!(
            context_id(std::ptr::null_mut(), std::ptr::null_mut()),
            result::UNKNOWN
        );
        let mut p = std::ptr::null_mut();
        assert_eq!(
            private_stream(std::ptr::null_mut(), std::ptr::null_mut(), &mut p, 0),
            result::NOT_INITIALIZED
        );
        assert_eq!(
            private_stream(
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0
            ),
            result::INVALID_VALUE
        );
        assert_eq!(
            private_stream_id(std::ptr::null_mut(), std::ptr::null_mut(), &mut v),
            result::INVALID_VALUE
        );
    }
}

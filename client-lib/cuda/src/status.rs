//! CUresult, as this driver makes it: from the broker's error codes, from the connection's
//! errors, and the names and sentences `cuGetErrorName` / `cuGetErrorString` give.

use std::ffi::c_char;
use std::panic::{AssertUnwindSafe, catch_unwind};

use gpushare_conn::Error;
use gpushare_protocol::ErrorCode;

use crate::errors::ERRORS;
use crate::types::{CUresult, result};

/// A driver call's outcome before it crosses the ABI.
pub type Cu<T> = Result<T, CUresult>;

/// Runs entry point `name`'s body: its error becomes the CUresult, and a panic never unwinds
/// into the caller (it is reported once and answered with CUDA_ERROR_UNKNOWN).
#[inline]
pub fn entry(name: &'static str, body: impl FnOnce() -> Cu<()>) -> CUresult {
    let level = trace::level();
    if level == trace::CALLS {
        crate::log::say(name);
    }
    let began = (level >= trace::TIMES).then(crate::log::timed::now_ns);
    let code = match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => result::SUCCESS,
        Ok(Err(code)) => code,
        Err(_) => {
            crate::log::say_once(&format!("internal error (a panic) in {name}"));
            result::UNKNOWN
        }
    };
    if let Some(began) = began {
        crate::log::timed::call(name, began, code);
    }
    if code == result::SUCCESS {
        return code;
    }
    if level >= trace::ERRORS && code != result::NOT_READY {
        crate::log::say(&format!(
            "{name} -> {}",
            self::name(code).unwrap_or("?\0").trim_end_matches('\0')
        ));
    }
    code
}

/// `GPUSHARE_CUDA_TRACE`: 1 names every call that fails (but NOT_READY), 2 every call, 3
/// every call with when it began and how long it took (`log::timed`).
pub mod trace {
    use std::sync::atomic::{AtomicU8, Ordering};

    pub const ERRORS: u8 = 1;
    pub const CALLS: u8 = 2;
    pub const TIMES: u8 = 3;
    const UNREAD: u8 = u8::MAX;
    static LEVEL: AtomicU8 = AtomicU8::new(UNREAD);

    #[inline]
    pub fn level() -> u8 {
        match LEVEL.load(Ordering::Relaxed) {
            UNREAD => {
                let level = std::env::var(gpushare_conn::env::CUDA_TRACE_ENV)
                    .ok()
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                LEVEL.store(level, Ordering::Relaxed);
                level
            }
            level => level,
        }
    }
}

/// Writes an out-parameter; a NULL one is the caller's error.
///
/// # Safety
/// `ptr` is NULL or valid for writing a `T`.
pub unsafe fn out<T>(ptr: *mut T, value: T) -> Cu<()> {
    if ptr.is_null() {
        return Err(result::INVALID_VALUE);
    }
    // SAFETY: non-NULL, and the caller says it is valid for writes.
    unsafe { ptr.write(value) };
    Ok(())
}

/// What a broker error code means to a CUDA program.
pub fn from_code(code: ErrorCode) -> CUresult {
    match code {
        ErrorCode::InvalidArgument | ErrorCode::InvalidPointer | ErrorCode::AddressUnavailable => {
            result::INVALID_VALUE
        }
        ErrorCode::OutOfMemory | ErrorCode::OutOfQuota | ErrorCode::TooManyHandles => {
            result::OUT_OF_MEMORY
        }
        ErrorCode::InvalidHandle => result::INVALID_HANDLE,
        ErrorCode::NotSupported => result::NOT_SUPPORTED,
        ErrorCode::NotReady => result::NOT_READY,
        ErrorCode::ShuttingDown => result::DEVICE_UNAVAILABLE,
        ErrorCode::VersionMismatch => result::SYSTEM_DRIVER_MISMATCH,
        ErrorCode::PermissionDenied => result::NOT_PERMITTED,
        // Not sticky: a program that catches it goes on (its state is intact after WorkLost).
        ErrorCode::LaunchFailed | ErrorCode::DeviceReset | ErrorCode::WorkLost => {
            result::LAUNCH_FAILED
        }
        ErrorCode::DeviceError => result::ILLEGAL_ADDRESS,
        ErrorCode::NotFound => result::NOT_FOUND,
        ErrorCode::InvalidCommand
        | ErrorCode::ArenaOutOfBounds
        | ErrorCode::Internal
        | ErrorCode::ProtocolViolation => result::UNKNOWN,
    }
}

/// What a program is told when another program's GPU fault stopped its work.
const WORK_LOST: &str = "a GPU fault in another program stopped this program's work that was on the GPU (it may have run in part, so it was not run again): this call reports CUDA_ERROR_LAUNCH_FAILED once; its GPU memory, streams and modules are intact and later calls work";

/// What a connection error means to a CUDA program.
pub fn from_error(e: &Error) -> CUresult {
    match e {
        Error::Command {
            code: ErrorCode::WorkLost,
            ..
        } => {
            crate::log::say(WORK_LOST);
            result::LAUNCH_FAILED
        }
        Error::Command { code, .. } => from_code(*code),
        Error::Request(w) | Error::Rejected(w) => from_code(w.code),
        Error::InvalidArgument(_) => result::INVALID_VALUE,
        Error::Rebuilt(_) | Error::RebuildFailed(_) => result::LAUNCH_FAILED,
        Error::Connect { .. }
        | Error::BrokerShutdown(_)
        | Error::BrokerRestarting(_)
        | Error::Evicted(_)
        | Error::BrokerGone
        | Error::BrokerUnresponsive { .. }
        | Error::Protocol(_)
        | Error::Io(_) => result::DEVICE_UNAVAILABLE,
    }
}

fn lookup(code: CUresult) -> Option<&'static (i32, &'static str, &'static str)> {
    ERRORS
        .binary_search_by_key(&code, |e| e.0)
        .ok()
        .map(|i| &ERRORS[i])
}

/// A CUresult's name, NUL-terminated (`cuGetErrorName`).
pub fn name(code: CUresult) -> Option<&'static str> {
    lookup(code).map(|e| e.1)
}

/// What a CUresult means, NUL-terminated (`cuGetErrorString`).
pub fn text(code: CUresult) -> Option<&'static str> {
    lookup(code).map(|e| e.2)
}

/// # Safety
/// `out` is NULL or valid for writing a pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetErrorString(error: CUresult, out: *mut *const c_char) -> CUresult {
    entry("cuGetErrorString", || match text(error) {
        // SAFETY: the caller's contract.
        Some(s) => unsafe { self::out(out, s.as_ptr().cast()) },
        None => {
            // SAFETY: as above; CUDA leaves NULL for an unknown code.
            let _ = unsafe { self::out(out, std::ptr::null()) };
            Err(result::INVALID_VALUE)
        }
    })
}

/// # Safety
/// `out` is NULL or valid for writing a pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetErrorName(error: CUresult, out: *mut *const c_char) -> CUresult {
    entry("cuGetErrorName", || match name(error) {
        // SAFETY: the caller's contract.
        Some(s) => unsafe { self::out(out, s.as_ptr().cast()) },
        None => {
            // SAFETY: as above.
            let _ = unsafe { self::out(out, std::ptr::null()) };
            Err(result::INVALID_VALUE)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_has_a_nul_terminated_name_and_text_in_order() {
        assert!(ERRORS.windows(2).all(|w| w[0].0 < w[1].0), "sorted by code");
        for (code, name, text) in ERRORS {
            assert!(name.ends_with('\0') && text.ends_with('\0'), "{code}");
            assert_eq!(super::name(code), Some(name));
        }
        assert_eq!(text(result::INVALID_VALUE), Some("invalid argument\0"));
        assert_eq!(
            name(result::NOT_SUPPORTED),
            Some("CUDA_ERROR_NOT_SUPPORTED\0")
        );
        assert_eq!(name(12345), None);
    }

    #[test]
    fn every_broker_error_maps_to_a_known_cuda_error() {
        for code in ErrorCode::ALL {
            assert!(name(from_code(code)).is_some(), "{code:?}");
        }
    }

    #[test]
    fn a_panic_becomes_an_error_not_an_unwind() {
        assert_eq!(entry("cuBoom", || panic!("boom")), result::UNKNOWN);
        assert_eq!(
            entry("cuQuery", || Err(result::NOT_READY)),
            result::NOT_READY
        );
        assert_eq!(entry("cuFine", || Ok(())), result::SUCCESS);
    }
}

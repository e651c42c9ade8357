//! What every C call keeps to: its body runs under a panic guard, its failure becomes a
//! status code and a per-thread message, and its pointer arguments are checked before use.

use std::cell::RefCell;
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::panic::{self, AssertUnwindSafe};

use super::codes::{GPUSHARE_E_INTERNAL, GPUSHARE_E_NULL, GPUSHARE_OK, status_of};
use super::session::gpushare_client;
use crate::Error;
use crate::client::Client;

thread_local! {
    static LAST_ERROR: RefCell<Option<CString>> = const { RefCell::new(None) };
}

fn set_last_error(message: String) {
    // A message with an interior NUL would be cut short in C; keep the rest readable.
    let message = CString::new(message.replace('\0', "\\0")).unwrap_or_default();
    // `try_with` fails only while the thread is being torn down; then there is nobody to tell.
    let _ = LAST_ERROR.try_with(|last| *last.borrow_mut() = Some(message));
}

/// Why a C call failed.
pub(super) enum Failure {
    /// The library or the broker reported an error.
    Client(Error),
    /// A required pointer argument was NULL.
    Null(&'static str),
}

impl From<Error> for Failure {
    fn from(err: Error) -> Self {
        Failure::Client(err)
    }
}

pub(super) type FfiResult<T = ()> = std::result::Result<T, Failure>;

pub(super) fn invalid(message: impl Into<String>) -> Failure {
    Failure::Client(Error::InvalidArgument(message.into()))
}

/// Runs one C call's body: catches panics, turns the outcome into a status code and records
/// the message of a failure for `gpushare_last_error_message`.
pub(super) fn guard(func: &'static str, body: impl FnOnce() -> FfiResult) -> c_int {
    match panic::catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => GPUSHARE_OK,
        Ok(Err(Failure::Client(err))) => {
            set_last_error(format!("{func}: {err}"));
            status_of(&err)
        }
        Ok(Err(Failure::Null(arg))) => {
            set_last_error(format!("{func}: `{arg}` must not be NULL"));
            GPUSHARE_E_NULL
        }
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            // Dropping a panic payload can itself panic; leaking it cannot.
            std::mem::forget(payload);
            set_last_error(format!(
                "{func}: internal error in the gpushare client library ({what}); please report this bug"
            ));
            GPUSHARE_E_INTERNAL
        }
    }
}

pub(super) fn non_null<T>(ptr: *const T, arg: &'static str) -> FfiResult {
    if ptr.is_null() {
        Err(Failure::Null(arg))
    } else {
        Ok(())
    }
}

/// Borrows the client behind a handle.
///
/// # Safety
/// `client` is NULL or a handle from [`gpushare_connect`] not yet passed to
/// [`gpushare_disconnect`].
pub(super) unsafe fn client_ref<'a>(client: *const gpushare_client) -> FfiResult<&'a Client> {
    non_null(client, "client")?;
    // SAFETY: non-NULL, and by the caller's contract a live handle from `gpushare_connect`;
    // `Client` is `Sync`, so shared use from several threads is fine.
    Ok(unsafe { &(*client).client })
}

/// Writes an out-parameter that was checked for NULL.
///
/// # Safety
/// `out` is non-NULL, aligned, and valid for a write of `T`.
pub(super) unsafe fn put<T>(out: *mut T, value: T) {
    // SAFETY: guaranteed by the caller.
    unsafe { out.write(value) }
}

/// A C byte buffer as a slice; NULL is allowed when `len` is 0.
///
/// # Safety
/// If `len > 0`, `ptr` is valid for reads of `len` bytes for `'a` and not written meanwhile.
pub(super) unsafe fn bytes<'a>(
    ptr: *const c_void,
    len: usize,
    arg: &'static str,
) -> FfiResult<&'a [u8]> {
    if len == 0 {
        return Ok(&[]);
    }
    non_null(ptr, arg)?;
    if len > isize::MAX as usize {
        return Err(invalid(format!("`{arg}` length {len} is too large")));
    }
    // SAFETY: non-NULL, `len` fits in `isize`, and the caller guarantees `len` readable bytes.
    Ok(unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) })
}

/// A mutable C byte buffer as a slice; NULL is allowed when `len` is 0.
///
/// # Safety
/// If `len > 0`, `ptr` is valid for reads and writes of `len` bytes for `'a` and nothing else
/// accesses them meanwhile.
pub(super) unsafe fn bytes_mut<'a>(
    ptr: *mut c_void,
    len: usize,
    arg: &'static str,
) -> FfiResult<&'a mut [u8]> {
    if len == 0 {
        return Ok(&mut []);
    }
    non_null(ptr, arg)?;
    if len > isize::MAX as usize {
        return Err(invalid(format!("`{arg}` length {len} is too large")));
    }
    // SAFETY: non-NULL, `len` fits in `isize`, and the caller guarantees `len` writable bytes
    // that nothing else touches while we hold them.
    Ok(unsafe { std::slice::from_raw_parts_mut(ptr.cast::<u8>(), len) })
}

/// The message of the most recent failed call on this thread ("" if none has failed). The
/// string stays valid until the next gpushare call on this thread.
#[unsafe(no_mangle)]
pub extern "C" fn gpushare_last_error_message() -> *const c_char {
    LAST_ERROR
        .try_with(|last| last.borrow().as_deref().map(CStr::as_ptr))
        .ok()
        .flatten()
        .unwrap_or(c"".as_ptr())
}

/// The message `gpushare_last_error_message` gives now, as a Rust string.
#[cfg(test)]
pub(super) fn last_error() -> String {
    // SAFETY: gpushare_last_error_message never returns NULL and the string lives until
    // the next call on this thread.
    unsafe { CStr::from_ptr(gpushare_last_error_message()) }
        .to_string_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffi::GPUSHARE_E_INVALID_ARGUMENT;

    #[test]
    fn a_panic_becomes_an_internal_error_with_a_message() {
        let rc = guard("gpushare_test", || panic!("boom"));
        assert_eq!(rc, GPUSHARE_E_INTERNAL);
        let message = last_error();
        assert!(
            message.contains("gpushare_test") && message.contains("boom"),
            "{message}"
        );
    }

    #[test]
    fn a_failure_becomes_its_code_and_a_message_naming_the_call() {
        let rc = guard("gpushare_test", || Err(Failure::Null("out")));
        assert_eq!(rc, GPUSHARE_E_NULL);
        assert_eq!(last_error(), "gpushare_test: `out` must not be NULL");
        let rc = guard("gpushare_test", || Err(invalid("bad size")));
        assert_eq!(rc, GPUSHARE_E_INVALID_ARGUMENT);
        assert_eq!(last_error(), "gpushare_test: bad size");
        assert_eq!(guard("gpushare_test", || Ok(())), GPUSHARE_OK);
        // Success leaves the last failure's message in place.
        assert_eq!(last_error(), "gpushare_test: bad size");
    }

    #[test]
    fn a_message_with_a_nul_is_kept_whole() {
        let rc = guard("gpushare_test", || Err(invalid("a\0b")));
        assert_eq!(rc, GPUSHARE_E_INVALID_ARGUMENT);
        assert!(last_error().ends_with("a\\0b"), "{}", last_error());
    }

    #[test]
    fn a_c_buffer_may_be_null_only_when_empty() {
        // SAFETY: NULL with length 0 is allowed; NULL with a length is refused before use.
        unsafe {
            assert!(bytes(std::ptr::null(), 0, "src").is_ok_and(|b| b.is_empty()));
            assert!(matches!(
                bytes(std::ptr::null(), 4, "src"),
                Err(Failure::Null("src"))
            ));
            assert!(bytes_mut(std::ptr::null_mut(), 0, "dst").is_ok_and(|b| b.is_empty()));
            assert!(matches!(
                bytes_mut(std::ptr::null_mut(), 4, "dst"),
                Err(Failure::Null("dst"))
            ));
        }
        let data = [1u8, 2, 3];
        // SAFETY: `data` is valid for reads of 3 bytes.
        let got = unsafe { bytes(data.as_ptr().cast(), data.len(), "src") };
        assert!(got.is_ok_and(|b| b == [1, 2, 3]));
        // SAFETY: a length past isize::MAX is refused before the pointer is read.
        let huge = unsafe { bytes(data.as_ptr().cast(), usize::MAX, "src") };
        assert!(matches!(
            huge,
            Err(Failure::Client(crate::Error::InvalidArgument(_)))
        ));
    }
}

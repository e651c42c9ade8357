//! A session from C: connecting and disconnecting, what the broker granted, and the calls
//! that speak of the whole session (synchronize, iterations, job and deadline declarations).

use std::ffi::{CStr, c_char, c_int};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use gpushare_protocol::PriorityClass;

use super::codes::{
    GPUSHARE_BACKEND_NAME_LEN, GPUSHARE_CLASS_BEST_EFFORT, GPUSHARE_CLASS_HIGH,
    GPUSHARE_CLASS_NORMAL, GPUSHARE_CONNECT_REBUILD, GPUSHARE_QUOTA_UNLIMITED,
};
use super::guard::{client_ref, guard, invalid, non_null, put};
use crate::client::{Client, ConnectOptions};

/// A session with `gpushared` (opaque to C). Safe to share between threads.
#[allow(non_camel_case_types)]
pub struct gpushare_client {
    pub(super) client: Client,
}

const _: () = {
    const fn shareable<T: Send + Sync>() {}
    shareable::<Client>();
};

/// Connects to `gpushared`.
///
/// `socket_path` NULL means `$GPUSHARE_SOCKET`, or `/run/gpushare/gpushare.sock` when unset;
/// `name` NULL means the process name. On success `*out` holds the new handle; on failure it
/// is set to NULL.
///
/// # Safety
/// `socket_path` and `name` are NULL or NUL-terminated strings; `out` is NULL or valid for a
/// write of one pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gpushare_connect(
    socket_path: *const c_char,
    name: *const c_char,
    out: *mut *mut gpushare_client,
) -> c_int {
    // SAFETY: the caller's contract is `connect_with_flags`'s.
    unsafe { connect_with_flags("gpushare_connect", socket_path, name, 0, out) }
}

/// Like [`gpushare_connect`], with `flags`: [`GPUSHARE_CONNECT_REBUILD`] makes the library
/// record what the client uploads (a host copy of every byte copied to the device) and loads,
/// and rebuild its device state by itself after a GPU reset caused by another client: the
/// call that meets the reset fails once with `GPUSHARE_E_DEVICE_RESET` (work submitted before
/// the fault is lost and not run again), and every handle and device address keeps working.
/// Unknown flags are refused with `GPUSHARE_E_INVALID_ARGUMENT`.
///
/// # Safety
/// As for [`gpushare_connect`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gpushare_connect_with_flags(
    socket_path: *const c_char,
    name: *const c_char,
    flags: u32,
    out: *mut *mut gpushare_client,
) -> c_int {
    // SAFETY: the caller's contract is `connect_with_flags`'s.
    unsafe { connect_with_flags("gpushare_connect_with_flags", socket_path, name, flags, out) }
}

/// # Safety
/// `socket_path` and `name` are NULL or NUL-terminated strings; `out` is NULL or valid for a
/// write of one pointer.
unsafe fn connect_with_flags(
    func: &'static str,
    socket_path: *const c_char,
    name: *const c_char,
    flags: u32,
    out: *mut *mut gpushare_client,
) -> c_int {
    guard(func, || {
        non_null(out, "out")?;
        // SAFETY: `out` is non-NULL and, by the contract, writable.
        unsafe { put(out, std::ptr::null_mut()) };
        if flags & !GPUSHARE_CONNECT_REBUILD != 0 {
            return Err(invalid(format!("unknown connect flags {flags:#x}")));
        }
        let mut opts = ConnectOptions {
            rebuild: flags & GPUSHARE_CONNECT_REBUILD != 0,
            ..ConnectOptions::default()
        };
        if !socket_path.is_null() {
            // SAFETY: non-NULL, and NUL-terminated by the contract.
            let path = unsafe { CStr::from_ptr(socket_path) };
            opts.socket = PathBuf::from(std::ffi::OsStr::from_bytes(path.to_bytes()));
        }
        if !name.is_null() {
            // SAFETY: non-NULL, and NUL-terminated by the contract.
            let name = unsafe { CStr::from_ptr(name) };
            opts.name = name.to_string_lossy().into_owned();
        }
        let client = Client::connect_with(opts)?;
        let handle = Box::into_raw(Box::new(gpushare_client { client }));
        // SAFETY: checked non-NULL above.
        unsafe { put(out, handle) };
        Ok(())
    })
}

/// Ends the session: the broker frees everything it still holds (memory, streams, events,
/// modules). NULL is ignored.
///
/// # Safety
/// `client` is NULL or a handle from [`gpushare_connect`] that no other thread is using and
/// that is not used again.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gpushare_disconnect(client: *mut gpushare_client) {
    if client.is_null() {
        return;
    }
    // SAFETY: a live handle from `gpushare_connect` (a `Box::into_raw`), given up by the caller.
    let handle = unsafe { Box::from_raw(client) };
    // Nothing to report from here; the status is dropped on purpose.
    let _ = guard("gpushare_disconnect", move || {
        drop(handle);
        Ok(())
    });
}

/// What the broker granted this session.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
#[allow(non_camel_case_types)]
pub struct gpushare_session_info_t {
    pub client_id: u64,
    /// `GPUSHARE_CLASS_*`.
    pub priority_class: u32,
    /// Weight in fair-share scheduling.
    pub weight: u32,
    /// Bytes; [`GPUSHARE_QUOTA_UNLIMITED`] when there is no quota.
    pub memory_quota: u64,
    /// The device's memory, bytes.
    pub total_memory: u64,
    pub sm_count: u32,
    /// The backend name ("sim", "cuda"), NUL-terminated, truncated to 15 bytes.
    pub backend: [c_char; GPUSHARE_BACKEND_NAME_LEN],
}

/// `name` as a NUL-terminated C string of at most `GPUSHARE_BACKEND_NAME_LEN` bytes,
/// truncated at a character boundary.
fn backend_name(name: &str) -> [c_char; GPUSHARE_BACKEND_NAME_LEN] {
    let mut out = [0 as c_char; GPUSHARE_BACKEND_NAME_LEN];
    let mut len = name.len().min(GPUSHARE_BACKEND_NAME_LEN - 1);
    while !name.is_char_boundary(len) {
        len -= 1;
    }
    for (dst, src) in out.iter_mut().zip(&name.as_bytes()[..len]) {
        *dst = *src as c_char;
    }
    out
}

/// Fills `*out` with what the broker granted this session.
///
/// # Safety
/// `client` is NULL or a live handle; `out` is NULL or valid for a write of the struct.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gpushare_session_info(
    client: *const gpushare_client,
    out: *mut gpushare_session_info_t,
) -> c_int {
    guard("gpushare_session_info", || {
        // SAFETY: the caller's contract.
        let client = unsafe { client_ref(client) }?;
        non_null(out, "out")?;
        let session = client.session();
        let info = gpushare_session_info_t {
            client_id: session.client_id,
            priority_class: match session.class {
                PriorityClass::High => GPUSHARE_CLASS_HIGH,
                PriorityClass::Normal => GPUSHARE_CLASS_NORMAL,
                PriorityClass::BestEffort => GPUSHARE_CLASS_BEST_EFFORT,
            },
            weight: session.weight,
            memory_quota: session.memory_quota.unwrap_or(GPUSHARE_QUOTA_UNLIMITED),
            total_memory: session.device.total_memory,
            sm_count: session.device.sm_count,
            backend: backend_name(&session.backend),
        };
        // SAFETY: checked non-NULL; writable by the contract.
        unsafe { put(out, info) };
        Ok(())
    })
}

/// Waits for all of this client's work and reports the first error any of it met.
///
/// # Safety
/// `client` is NULL or a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gpushare_synchronize(client: *const gpushare_client) -> c_int {
    guard("gpushare_synchronize", || {
        // SAFETY: the caller's contract.
        let client = unsafe { client_ref(client) }?;
        Ok(client.synchronize()?)
    })
}

/// Marks the end of one iteration (a training step, an inference request). `out_latency_ns`
/// (may be NULL) gets the iteration's latency as the scheduler saw it (0 under FIFO),
/// `out_missed` (may be NULL) 1 when it missed a declared deadline.
///
/// # Safety
/// `client` is NULL or a live handle; the out-pointers are NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gpushare_end_iteration(
    client: *const gpushare_client,
    out_latency_ns: *mut u64,
    out_missed: *mut c_int,
) -> c_int {
    guard("gpushare_end_iteration", || {
        // SAFETY: the caller's contract.
        let client = unsafe { client_ref(client) }?;
        let (latency, missed) = client.end_iteration()?;
        if !out_latency_ns.is_null() {
            // SAFETY: non-NULL, and valid for a write by the caller's contract.
            unsafe { out_latency_ns.write(latency.as_nanos() as u64) };
        }
        if !out_missed.is_null() {
            // SAFETY: as above.
            unsafe { out_missed.write(missed as c_int) };
        }
        Ok(())
    })
}

/// Declares the job's expected remaining GPU time and memory (for SRTF/PACK and memory
/// admission); all zero withdraws it.
///
/// # Safety
/// `client` is NULL or a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gpushare_declare_job(
    client: *const gpushare_client,
    remaining_ns: u64,
    persistent_bytes: u64,
    ephemeral_bytes: u64,
) -> c_int {
    guard("gpushare_declare_job", || {
        // SAFETY: the caller's contract.
        let client = unsafe { client_ref(client) }?;
        Ok(client.declare_job(
            std::time::Duration::from_nanos(remaining_ns),
            persistent_bytes,
            ephemeral_bytes,
        )?)
    })
}

/// Declares a periodic deadline per iteration (both zero withdraw it).
///
/// # Safety
/// `client` is NULL or a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gpushare_declare_deadline(
    client: *const gpushare_client,
    period_ns: u64,
    deadline_ns: u64,
) -> c_int {
    guard("gpushare_declare_deadline", || {
        // SAFETY: the caller's contract.
        let client = unsafe { client_ref(client) }?;
        Ok(client.declare_deadline(
            std::time::Duration::from_nanos(period_ns),
            std::time::Duration::from_nanos(deadline_ns),
        )?)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffi::guard::last_error;
    use crate::ffi::{GPUSHARE_E_INVALID_ARGUMENT, GPUSHARE_E_NULL};

    #[test]
    fn the_backend_name_is_truncated_and_terminated() {
        // SAFETY: `backend_name` always leaves a NUL within the array.
        let c = |name: &str| unsafe { CStr::from_ptr(backend_name(name).as_ptr()) }.to_owned();
        assert_eq!(c("sim").as_c_str(), c"sim");
        assert_eq!(c("").as_c_str(), c"");
        assert_eq!(c("a-very-long-backend-name").as_c_str(), c"a-very-long-bac");
        // 14 ASCII bytes and a two-byte character: the character does not fit whole.
        assert_eq!(c("abcdefghijklmné").as_c_str(), c"abcdefghijklmn");
    }

    #[test]
    fn unknown_connect_flags_are_refused_before_connecting_and_out_is_cleared() {
        let mut out: *mut gpushare_client = std::ptr::dangling_mut();
        // A socket nobody listens on: reaching it would fail with GPUSHARE_E_CONNECT instead.
        let socket = c"/nonexistent/gpushare-ffi-test.sock";
        // SAFETY: valid C strings and a valid out-pointer.
        let rc =
            unsafe { gpushare_connect_with_flags(socket.as_ptr(), c"t".as_ptr(), 0x80, &mut out) };
        assert_eq!(rc, GPUSHARE_E_INVALID_ARGUMENT);
        assert!(out.is_null());
        assert!(
            last_error().contains("unknown connect flags 0x80"),
            "{}",
            last_error()
        );
        // SAFETY: NULL out-pointer, checked first.
        let rc =
            unsafe { gpushare_connect(socket.as_ptr(), std::ptr::null(), std::ptr::null_mut()) };
        assert_eq!(rc, GPUSHARE_E_NULL);
        // SAFETY: NULL is ignored.
        unsafe { gpushare_disconnect(std::ptr::null_mut()) };
    }
}

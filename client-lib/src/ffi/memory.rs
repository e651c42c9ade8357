//! Device memory from C: allocations, copies and memset.

use std::ffi::{c_int, c_void};

use super::guard::{bytes, bytes_mut, client_ref, guard, non_null, put};
use super::session::gpushare_client;

/// Allocates `bytes` of device memory; `*out_ptr` gets its device address.
///
/// # Safety
/// `client` is NULL or a live handle; `out_ptr` is NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gpushare_alloc(
    client: *const gpushare_client,
    bytes: u64,
    out_ptr: *mut u64,
) -> c_int {
    guard("gpushare_alloc", || {
        // SAFETY: the caller's contract.
        let client = unsafe { client_ref(client) }?;
        non_null(out_ptr, "out_ptr")?;
        let ptr = client.alloc_raw(bytes)?;
        // SAFETY: checked non-NULL; writable by the contract.
        unsafe { put(out_ptr, ptr) };
        Ok(())
    })
}

/// Frees an allocation by its base address (waits for the broker's answer).
///
/// # Safety
/// `client` is NULL or a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gpushare_free(client: *const gpushare_client, ptr: u64) -> c_int {
    guard("gpushare_free", || {
        // SAFETY: the caller's contract.
        let client = unsafe { client_ref(client) }?;
        Ok(client.free_raw(ptr)?)
    })
}

/// Copies `bytes` host bytes to device memory on `stream`; returns once they are on the
/// device (synchronizes the stream, so it also reports earlier asynchronous errors).
///
/// # Safety
/// `client` is NULL or a live handle; `src` is valid for reads of `bytes` bytes (it may be
/// NULL when `bytes` is 0).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gpushare_copy_htod(
    client: *const gpushare_client,
    stream: u32,
    dst: u64,
    src: *const c_void,
    bytes: usize,
) -> c_int {
    guard("gpushare_copy_htod", || {
        // SAFETY: the caller's contract.
        let client = unsafe { client_ref(client) }?;
        // SAFETY: the caller's contract.
        let src = unsafe { self::bytes(src, bytes, "src") }?;
        Ok(client.copy_to_device_raw(stream, dst, src)?)
    })
}

/// Copies `bytes` of device memory to host memory on `stream`; returns once they are in
/// `dst` (reports earlier asynchronous errors).
///
/// # Safety
/// `client` is NULL or a live handle; `dst` is valid for writes of `bytes` bytes (it may be
/// NULL when `bytes` is 0).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gpushare_copy_dtoh(
    client: *const gpushare_client,
    stream: u32,
    dst: *mut c_void,
    src: u64,
    bytes: usize,
) -> c_int {
    guard("gpushare_copy_dtoh", || {
        // SAFETY: the caller's contract.
        let client = unsafe { client_ref(client) }?;
        // SAFETY: the caller's contract.
        let dst = unsafe { bytes_mut(dst, bytes, "dst") }?;
        Ok(client.copy_to_host_raw(stream, dst, src)?)
    })
}

/// Copies `bytes` within device memory on `stream` (asynchronous).
///
/// # Safety
/// `client` is NULL or a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gpushare_copy_dtod(
    client: *const gpushare_client,
    stream: u32,
    dst: u64,
    src: u64,
    bytes: u64,
) -> c_int {
    guard("gpushare_copy_dtod", || {
        // SAFETY: the caller's contract.
        let client = unsafe { client_ref(client) }?;
        Ok(client.copy_device_raw(stream, dst, src, bytes)?)
    })
}

/// Sets `bytes` of device memory at `dst` to `value` on `stream` (asynchronous).
///
/// # Safety
/// `client` is NULL or a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gpushare_memset(
    client: *const gpushare_client,
    stream: u32,
    dst: u64,
    value: u8,
    bytes: u64,
) -> c_int {
    guard("gpushare_memset", || {
        // SAFETY: the caller's contract.
        let client = unsafe { client_ref(client) }?;
        Ok(client.memset_raw(stream, dst, value, bytes)?)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffi::GPUSHARE_E_NULL;
    use crate::ffi::guard::last_error;

    #[test]
    fn a_null_client_is_refused_and_named() {
        let mut ptr = 0u64;
        let mut buf = [0u8; 4];
        // SAFETY: NULL client (checked first); the other pointers are valid.
        let rcs = unsafe {
            [
                (
                    "gpushare_alloc",
                    gpushare_alloc(std::ptr::null(), 4, &mut ptr),
                ),
                ("gpushare_free", gpushare_free(std::ptr::null(), 4)),
                (
                    "gpushare_copy_dtoh",
                    gpushare_copy_dtoh(std::ptr::null(), 0, buf.as_mut_ptr().cast(), 0, 4),
                ),
                (
                    "gpushare_memset",
                    gpushare_memset(std::ptr::null(), 0, 0, 0, 4),
                ),
            ]
        };
        for (func, rc) in rcs {
            assert_eq!(rc, GPUSHARE_E_NULL, "{func}");
        }
        assert_eq!(last_error(), "gpushare_memset: `client` must not be NULL");
        assert_eq!(ptr, 0, "out-parameters are written only on success");
    }
}

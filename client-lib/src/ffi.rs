//! The C ABI: `libgpushare.so` and `include/gpushare.h`.
//!
//! Every function returns an `int` status: [`GPUSHARE_OK`] (0), the broker's [`ErrorCode`]
//! value (1..=19, wire-stable), or a library-side code from 100 up (`GPUSHARE_E_CONNECT`, …).
//! The failing call's sentence is kept per thread for [`gpushare_last_error_message`].
//!
//! Rules every function here keeps:
//! - no panic crosses the boundary: each body runs under [`std::panic::catch_unwind`] and a
//!   panic becomes [`GPUSHARE_E_INTERNAL`];
//! - every pointer argument is checked for NULL before anything is sent to the broker, so a
//!   NULL out-pointer never leaks a broker-side object ([`GPUSHARE_E_NULL`]);
//! - out-parameters are written only on success.
//!
//! Handles are plain numbers (streams and events `uint32_t`, device pointers, modules and
//! functions `uint64_t`) owned by the caller: nothing is freed behind its back, and the broker
//! reclaims everything a session still holds when it ends.

use std::cell::RefCell;
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::os::unix::ffi::OsStrExt;
use std::panic::{self, AssertUnwindSafe};
use std::path::PathBuf;

use gpushare_protocol::control::ModuleFormat;
use gpushare_protocol::{Command, ErrorCode, EventId, Kernel, PriorityClass, StreamId};

use crate::Error;
use crate::client::{Client, ConnectOptions};

// ---- status codes --------------------------------------------------------------------

const fn wire(code: ErrorCode) -> c_int {
    code as c_int
}

/// Success.
pub const GPUSHARE_OK: c_int = 0;
pub const GPUSHARE_E_INVALID_COMMAND: c_int = wire(ErrorCode::InvalidCommand);
pub const GPUSHARE_E_INVALID_ARGUMENT: c_int = wire(ErrorCode::InvalidArgument);
pub const GPUSHARE_E_INVALID_HANDLE: c_int = wire(ErrorCode::InvalidHandle);
pub const GPUSHARE_E_INVALID_POINTER: c_int = wire(ErrorCode::InvalidPointer);
pub const GPUSHARE_E_ARENA_OUT_OF_BOUNDS: c_int = wire(ErrorCode::ArenaOutOfBounds);
pub const GPUSHARE_E_OUT_OF_MEMORY: c_int = wire(ErrorCode::OutOfMemory);
pub const GPUSHARE_E_OUT_OF_QUOTA: c_int = wire(ErrorCode::OutOfQuota);
pub const GPUSHARE_E_NOT_SUPPORTED: c_int = wire(ErrorCode::NotSupported);
pub const GPUSHARE_E_DEVICE_ERROR: c_int = wire(ErrorCode::DeviceError);
pub const GPUSHARE_E_NOT_READY: c_int = wire(ErrorCode::NotReady);
pub const GPUSHARE_E_SHUTTING_DOWN: c_int = wire(ErrorCode::ShuttingDown);
pub const GPUSHARE_E_VERSION_MISMATCH: c_int = wire(ErrorCode::VersionMismatch);
pub const GPUSHARE_E_PERMISSION_DENIED: c_int = wire(ErrorCode::PermissionDenied);
pub const GPUSHARE_E_TOO_MANY_HANDLES: c_int = wire(ErrorCode::TooManyHandles);
pub const GPUSHARE_E_LAUNCH_FAILED: c_int = wire(ErrorCode::LaunchFailed);
/// A broker-side internal error, or a bug (panic) inside this library.
pub const GPUSHARE_E_INTERNAL: c_int = wire(ErrorCode::Internal);
pub const GPUSHARE_E_PROTOCOL_VIOLATION: c_int = wire(ErrorCode::ProtocolViolation);
/// Another client faulted the GPU and its context was recreated: this client's device state
/// is gone; the session goes on.
pub const GPUSHARE_E_DEVICE_RESET: c_int = wire(ErrorCode::DeviceReset);
/// Memory could not be placed at the device address asked for (a rebuild after a reset could
/// not get a buffer's old address back); with rebuild on, the client is unusable afterwards.
pub const GPUSHARE_E_ADDRESS_UNAVAILABLE: c_int = wire(ErrorCode::AddressUnavailable);
/// The broker does not know the named thing (a cached module image, a kernel, a global).
pub const GPUSHARE_E_NOT_FOUND: c_int = wire(ErrorCode::NotFound);
/// The broker's socket could not be reached.
pub const GPUSHARE_E_CONNECT: c_int = 100;
/// The connection to the broker was lost; the session is over.
pub const GPUSHARE_E_BROKER_GONE: c_int = 101;
/// The broker evicted this client; the session is over.
pub const GPUSHARE_E_EVICTED: c_int = 102;
/// The broker said something this library does not understand; the session is over.
pub const GPUSHARE_E_PROTOCOL: c_int = 103;
/// An I/O error on the connection.
pub const GPUSHARE_E_IO: c_int = 104;
/// A pointer argument that must not be NULL was NULL.
pub const GPUSHARE_E_NULL: c_int = 105;
/// Rebuilding the client's device state after a GPU reset failed (other than for an
/// address); the client is unusable: disconnect, connect again and upload again.
pub const GPUSHARE_E_REBUILD_FAILED: c_int = 106;

/// `gpushare_connect_with_flags` flag: record what the client uploads and loads, and rebuild
/// its device state by itself after a GPU reset (same handles, same device addresses).
pub const GPUSHARE_CONNECT_REBUILD: u32 = 1;

/// `gpushare_module_load` formats.
pub const GPUSHARE_MODULE_PTX: c_int = 0;
pub const GPUSHARE_MODULE_CUBIN: c_int = 1;
pub const GPUSHARE_MODULE_FATBIN: c_int = 2;

/// `gpushare_session_info_t::priority_class` values.
pub const GPUSHARE_CLASS_HIGH: u32 = 0;
pub const GPUSHARE_CLASS_NORMAL: u32 = 1;
pub const GPUSHARE_CLASS_BEST_EFFORT: u32 = 2;

/// `gpushare_session_info_t::memory_quota` when the client has no quota.
pub const GPUSHARE_QUOTA_UNLIMITED: u64 = u64::MAX;

/// The stream every client has.
pub const GPUSHARE_DEFAULT_STREAM: u32 = 0;

/// Size of `gpushare_session_info_t::backend`, terminating NUL included.
pub const GPUSHARE_BACKEND_NAME_LEN: usize = 16;

/// The status code for a library error.
fn status_of(err: &Error) -> c_int {
    match err {
        Error::Connect { .. } => GPUSHARE_E_CONNECT,
        Error::Rejected(w) | Error::Request(w) => wire(w.code),
        Error::Command { code, .. } => wire(*code),
        Error::BrokerShutdown(_) | Error::BrokerRestarting(_) => GPUSHARE_E_SHUTTING_DOWN,
        Error::Evicted(_) => GPUSHARE_E_EVICTED,
        Error::BrokerGone => GPUSHARE_E_BROKER_GONE,
        Error::Protocol(_) => GPUSHARE_E_PROTOCOL,
        Error::InvalidArgument(_) => GPUSHARE_E_INVALID_ARGUMENT,
        Error::Io(_) => GPUSHARE_E_IO,
        Error::Rebuilt(_) => GPUSHARE_E_DEVICE_RESET,
        Error::RebuildFailed(crate::RebuildError::AddressUnavailable { .. }) => {
            GPUSHARE_E_ADDRESS_UNAVAILABLE
        }
        Error::RebuildFailed(_) => GPUSHARE_E_REBUILD_FAILED,
    }
}

/// The `#define` name of a status code.
fn name_of(code: c_int) -> &'static CStr {
    match code {
        GPUSHARE_OK => c"GPUSHARE_OK",
        GPUSHARE_E_INVALID_COMMAND => c"GPUSHARE_E_INVALID_COMMAND",
        GPUSHARE_E_INVALID_ARGUMENT => c"GPUSHARE_E_INVALID_ARGUMENT",
        GPUSHARE_E_INVALID_HANDLE => c"GPUSHARE_E_INVALID_HANDLE",
        GPUSHARE_E_INVALID_POINTER => c"GPUSHARE_E_INVALID_POINTER",
        GPUSHARE_E_ARENA_OUT_OF_BOUNDS => c"GPUSHARE_E_ARENA_OUT_OF_BOUNDS",
        GPUSHARE_E_OUT_OF_MEMORY => c"GPUSHARE_E_OUT_OF_MEMORY",
        GPUSHARE_E_OUT_OF_QUOTA => c"GPUSHARE_E_OUT_OF_QUOTA",
        GPUSHARE_E_NOT_SUPPORTED => c"GPUSHARE_E_NOT_SUPPORTED",
        GPUSHARE_E_DEVICE_ERROR => c"GPUSHARE_E_DEVICE_ERROR",
        GPUSHARE_E_NOT_READY => c"GPUSHARE_E_NOT_READY",
        GPUSHARE_E_SHUTTING_DOWN => c"GPUSHARE_E_SHUTTING_DOWN",
        GPUSHARE_E_VERSION_MISMATCH => c"GPUSHARE_E_VERSION_MISMATCH",
        GPUSHARE_E_PERMISSION_DENIED => c"GPUSHARE_E_PERMISSION_DENIED",
        GPUSHARE_E_TOO_MANY_HANDLES => c"GPUSHARE_E_TOO_MANY_HANDLES",
        GPUSHARE_E_LAUNCH_FAILED => c"GPUSHARE_E_LAUNCH_FAILED",
        GPUSHARE_E_INTERNAL => c"GPUSHARE_E_INTERNAL",
        GPUSHARE_E_PROTOCOL_VIOLATION => c"GPUSHARE_E_PROTOCOL_VIOLATION",
        GPUSHARE_E_DEVICE_RESET => c"GPUSHARE_E_DEVICE_RESET",
        GPUSHARE_E_ADDRESS_UNAVAILABLE => c"GPUSHARE_E_ADDRESS_UNAVAILABLE",
        GPUSHARE_E_NOT_FOUND => c"GPUSHARE_E_NOT_FOUND",
        GPUSHARE_E_REBUILD_FAILED => c"GPUSHARE_E_REBUILD_FAILED",
        GPUSHARE_E_CONNECT => c"GPUSHARE_E_CONNECT",
        GPUSHARE_E_BROKER_GONE => c"GPUSHARE_E_BROKER_GONE",
        GPUSHARE_E_EVICTED => c"GPUSHARE_E_EVICTED",
        GPUSHARE_E_PROTOCOL => c"GPUSHARE_E_PROTOCOL",
        GPUSHARE_E_IO => c"GPUSHARE_E_IO",
        GPUSHARE_E_NULL => c"GPUSHARE_E_NULL",
        _ => c"GPUSHARE_E_UNKNOWN",
    }
}

// ---- the last error, per thread ------------------------------------------------------

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
enum Failure {
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

type FfiResult<T = ()> = std::result::Result<T, Failure>;

fn invalid(message: impl Into<String>) -> Failure {
    Failure::Client(Error::InvalidArgument(message.into()))
}

/// Runs one C call's body: catches panics, turns the outcome into a status code and records
/// the message of a failure for `gpushare_last_error_message`.
fn guard(func: &'static str, body: impl FnOnce() -> FfiResult) -> c_int {
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

fn non_null<T>(ptr: *const T, arg: &'static str) -> FfiResult {
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
unsafe fn client_ref<'a>(client: *const gpushare_client) -> FfiResult<&'a Client> {
    non_null(client, "client")?;
    // SAFETY: non-NULL, and by the caller's contract a live handle from `gpushare_connect`;
    // `Client` is `Sync`, so shared use from several threads is fine.
    Ok(unsafe { &(*client).client })
}

/// Writes an out-parameter that was checked for NULL.
///
/// # Safety
/// `out` is non-NULL, aligned, and valid for a write of `T`.
unsafe fn put<T>(out: *mut T, value: T) {
    // SAFETY: guaranteed by the caller.
    unsafe { out.write(value) }
}

/// A C byte buffer as a slice; NULL is allowed when `len` is 0.
///
/// # Safety
/// If `len > 0`, `ptr` is valid for reads of `len` bytes for `'a` and not written meanwhile.
unsafe fn bytes<'a>(ptr: *const c_void, len: usize, arg: &'static str) -> FfiResult<&'a [u8]> {
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
unsafe fn bytes_mut<'a>(
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

// ---- connection ----------------------------------------------------------------------

/// A session with `gpushared` (opaque to C). Safe to share between threads.
#[allow(non_camel_case_types)]
pub struct gpushare_client {
    client: Client,
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

/// The `#define` name of a status code ("GPUSHARE_E_UNKNOWN" for an unknown one); a static
/// string.
#[unsafe(no_mangle)]
pub extern "C" fn gpushare_error_name(code: c_int) -> *const c_char {
    name_of(code).as_ptr()
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

// ---- memory --------------------------------------------------------------------------

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

// ---- streams -------------------------------------------------------------------------

/// Submits `cmd`, waits for it, and returns its first result word.
fn wait_for(client: &Client, cmd: Command) -> FfiResult<u64> {
    Ok(client.submit_wait(cmd)?.0)
}

/// A handle id the broker returned, which must fit the C type.
fn id32(id: u64, what: &str) -> FfiResult<u32> {
    u32::try_from(id).map_err(|_| {
        Failure::Client(Error::Protocol(format!(
            "the broker returned {what} id {id}, which does not fit in 32 bits"
        )))
    })
}

/// Creates a stream; `*out` gets its id.
///
/// # Safety
/// `client` is NULL or a live handle; `out` is NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gpushare_stream_create(
    client: *const gpushare_client,
    out: *mut u32,
) -> c_int {
    guard("gpushare_stream_create", || {
        // SAFETY: the caller's contract.
        let client = unsafe { client_ref(client) }?;
        non_null(out, "out")?;
        let id: StreamId = id32(wait_for(client, Command::StreamCreate)?, "stream")?;
        // SAFETY: checked non-NULL; writable by the contract.
        unsafe { put(out, id) };
        Ok(())
    })
}

/// Destroys a stream (waits for the broker's answer). Stream 0 cannot be destroyed.
///
/// # Safety
/// `client` is NULL or a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gpushare_stream_destroy(
    client: *const gpushare_client,
    stream: u32,
) -> c_int {
    guard("gpushare_stream_destroy", || {
        // SAFETY: the caller's contract.
        let client = unsafe { client_ref(client) }?;
        wait_for(client, Command::StreamDestroy { stream }).map(drop)
    })
}

/// Waits for the stream's work and reports the first error an asynchronous command met.
///
/// # Safety
/// `client` is NULL or a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gpushare_stream_synchronize(
    client: *const gpushare_client,
    stream: u32,
) -> c_int {
    guard("gpushare_stream_synchronize", || {
        // SAFETY: the caller's contract.
        let client = unsafe { client_ref(client) }?;
        Ok(client.sync_stream(stream)?)
    })
}

// ---- events --------------------------------------------------------------------------

/// Creates an event; `*out` gets its id.
///
/// # Safety
/// `client` is NULL or a live handle; `out` is NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gpushare_event_create(
    client: *const gpushare_client,
    out: *mut u32,
) -> c_int {
    guard("gpushare_event_create", || {
        // SAFETY: the caller's contract.
        let client = unsafe { client_ref(client) }?;
        non_null(out, "out")?;
        let id: EventId = id32(wait_for(client, Command::EventCreate)?, "event")?;
        // SAFETY: checked non-NULL; writable by the contract.
        unsafe { put(out, id) };
        Ok(())
    })
}

/// Destroys an event (waits for the broker's answer).
///
/// # Safety
/// `client` is NULL or a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gpushare_event_destroy(
    client: *const gpushare_client,
    event: u32,
) -> c_int {
    guard("gpushare_event_destroy", || {
        // SAFETY: the caller's contract.
        let client = unsafe { client_ref(client) }?;
        wait_for(client, Command::EventDestroy { event }).map(drop)
    })
}

/// Records `event` at the current end of `stream` (asynchronous).
///
/// # Safety
/// `client` is NULL or a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gpushare_event_record(
    client: *const gpushare_client,
    event: u32,
    stream: u32,
) -> c_int {
    guard("gpushare_event_record", || {
        // SAFETY: the caller's contract.
        let client = unsafe { client_ref(client) }?;
        Ok(client.submit_async(Command::EventRecord { stream, event })?)
    })
}

/// `*done` = 1 when the work before the event is complete, else 0.
///
/// # Safety
/// `client` is NULL or a live handle; `done` is NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gpushare_event_query(
    client: *const gpushare_client,
    event: u32,
    done: *mut c_int,
) -> c_int {
    guard("gpushare_event_query", || {
        // SAFETY: the caller's contract.
        let client = unsafe { client_ref(client) }?;
        non_null(done, "done")?;
        let result = wait_for(client, Command::EventQuery { event })?;
        // SAFETY: checked non-NULL; writable by the contract.
        unsafe { put(done, c_int::from(result == 1)) };
        Ok(())
    })
}

/// Waits until the work before the event is complete.
///
/// # Safety
/// `client` is NULL or a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gpushare_event_synchronize(
    client: *const gpushare_client,
    event: u32,
) -> c_int {
    guard("gpushare_event_synchronize", || {
        // SAFETY: the caller's contract.
        let client = unsafe { client_ref(client) }?;
        wait_for(client, Command::EventSync { event }).map(drop)
    })
}

/// `*ns` = device time in nanoseconds from `start` to `end` (both recorded and complete).
///
/// # Safety
/// `client` is NULL or a live handle; `ns` is NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gpushare_event_elapsed_ns(
    client: *const gpushare_client,
    start: u32,
    end: u32,
    ns: *mut u64,
) -> c_int {
    guard("gpushare_event_elapsed_ns", || {
        // SAFETY: the caller's contract.
        let client = unsafe { client_ref(client) }?;
        non_null(ns, "ns")?;
        let elapsed = wait_for(client, Command::EventElapsed { start, end })?;
        // SAFETY: checked non-NULL; writable by the contract.
        unsafe { put(ns, elapsed) };
        Ok(())
    })
}

// ---- built-in kernels ----------------------------------------------------------------

/// Launches a built-in kernel on `stream` without waiting.
///
/// # Safety
/// `client` is NULL or a live handle.
unsafe fn launch(
    func: &'static str,
    client: *const gpushare_client,
    stream: u32,
    kernel: Kernel,
) -> c_int {
    guard(func, || {
        // SAFETY: the caller's contract.
        let client = unsafe { client_ref(client) }?;
        Ok(client.submit_async(Command::Launch { stream, kernel })?)
    })
}

/// `dst[i] = value` for `i < n` (asynchronous).
///
/// # Safety
/// `client` is NULL or a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gpushare_fill_f32(
    client: *const gpushare_client,
    stream: u32,
    dst: u64,
    n: u64,
    value: f32,
) -> c_int {
    let kernel = Kernel::FillF32 { dst, n, value };
    // SAFETY: the caller's contract is `launch`'s.
    unsafe { launch("gpushare_fill_f32", client, stream, kernel) }
}

/// `y[i] = alpha * x[i] + y[i]` for `i < n` (asynchronous).
///
/// # Safety
/// `client` is NULL or a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gpushare_axpy_f32(
    client: *const gpushare_client,
    stream: u32,
    x: u64,
    y: u64,
    n: u64,
    alpha: f32,
) -> c_int {
    let kernel = Kernel::AxpyF32 { x, y, n, alpha };
    // SAFETY: the caller's contract is `launch`'s.
    unsafe { launch("gpushare_axpy_f32", client, stream, kernel) }
}

/// `c[i] = a[i] + b[i]` for `i < n` (asynchronous).
///
/// # Safety
/// `client` is NULL or a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gpushare_vec_add_f32(
    client: *const gpushare_client,
    stream: u32,
    a: u64,
    b: u64,
    c: u64,
    n: u64,
) -> c_int {
    let kernel = Kernel::VecAddF32 { a, b, c, n };
    // SAFETY: the caller's contract is `launch`'s.
    unsafe { launch("gpushare_vec_add_f32", client, stream, kernel) }
}

/// `out[0] = sum(x[0..n])` (asynchronous).
///
/// # Safety
/// `client` is NULL or a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gpushare_reduce_sum_f32(
    client: *const gpushare_client,
    stream: u32,
    x: u64,
    out: u64,
    n: u64,
) -> c_int {
    let kernel = Kernel::ReduceSumF32 { x, out, n };
    // SAFETY: the caller's contract is `launch`'s.
    unsafe { launch("gpushare_reduce_sum_f32", client, stream, kernel) }
}

/// `C = alpha * A·B + beta * C`, row-major, A m×k, B k×n, C m×n (asynchronous).
///
/// # Safety
/// `client` is NULL or a live handle.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn gpushare_gemm_f32(
    client: *const gpushare_client,
    stream: u32,
    a: u64,
    b: u64,
    c: u64,
    m: u32,
    n: u32,
    k: u32,
    alpha: f32,
    beta: f32,
) -> c_int {
    let kernel = Kernel::GemmF32 {
        a,
        b,
        c,
        m,
        n,
        k,
        alpha,
        beta,
    };
    // SAFETY: the caller's contract is `launch`'s.
    unsafe { launch("gpushare_gemm_f32", client, stream, kernel) }
}

/// `C = alpha * A·B + beta * C` with A (m×k) and B (k×n) in bfloat16 and C (m×n) in f32,
/// row-major, accumulated in f32 (asynchronous; `GPUSHARE_E_NOT_SUPPORTED` without cuBLAS).
///
/// # Safety
/// `client` is NULL or a live handle.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn gpushare_gemm_bf16(
    client: *const gpushare_client,
    stream: u32,
    a: u64,
    b: u64,
    c: u64,
    m: u32,
    n: u32,
    k: u32,
    alpha: f32,
    beta: f32,
) -> c_int {
    let kernel = Kernel::GemmBf16 {
        a,
        b,
        c,
        m,
        n,
        k,
        alpha,
        beta,
    };
    // SAFETY: the caller's contract is `launch`'s.
    unsafe { launch("gpushare_gemm_bf16", client, stream, kernel) }
}

/// Occupies `blocks` thread blocks for `micros` microseconds (asynchronous).
///
/// # Safety
/// `client` is NULL or a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gpushare_spin(
    client: *const gpushare_client,
    stream: u32,
    micros: u64,
    blocks: u32,
) -> c_int {
    let kernel = Kernel::Spin { micros, blocks };
    // SAFETY: the caller's contract is `launch`'s.
    unsafe { launch("gpushare_spin", client, stream, kernel) }
}

// ---- modules -------------------------------------------------------------------------

/// Loads a module image (`GPUSHARE_MODULE_PTX`, `_CUBIN` or `_FATBIN`); `*out_module` gets its
/// id. The sim device answers `GPUSHARE_E_NOT_SUPPORTED`.
///
/// # Safety
/// `client` is NULL or a live handle; `image` is valid for reads of `len` bytes; `out_module`
/// is NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gpushare_module_load(
    client: *const gpushare_client,
    format: c_int,
    image: *const c_void,
    len: usize,
    out_module: *mut u64,
) -> c_int {
    guard("gpushare_module_load", || {
        // SAFETY: the caller's contract.
        let client = unsafe { client_ref(client) }?;
        non_null(image, "image")?;
        non_null(out_module, "out_module")?;
        // SAFETY: the caller's contract.
        let image = unsafe { bytes(image, len, "image") }?;
        let format = match format {
            GPUSHARE_MODULE_PTX => ModuleFormat::Ptx,
            GPUSHARE_MODULE_CUBIN => ModuleFormat::Cubin,
            GPUSHARE_MODULE_FATBIN => ModuleFormat::Fatbin,
            other => {
                return Err(invalid(format!(
                    "unknown module format {other} (expected GPUSHARE_MODULE_PTX, _CUBIN or _FATBIN)"
                )));
            }
        };
        let module = client.load_module_raw(format, image)?;
        // SAFETY: checked non-NULL; writable by the contract.
        unsafe { put(out_module, module) };
        Ok(())
    })
}

/// Unloads a module; its functions become invalid.
///
/// # Safety
/// `client` is NULL or a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gpushare_module_unload(
    client: *const gpushare_client,
    module: u64,
) -> c_int {
    guard("gpushare_module_unload", || {
        // SAFETY: the caller's contract.
        let client = unsafe { client_ref(client) }?;
        Ok(client.unload_module(module)?)
    })
}

/// Looks up a kernel of a loaded module by its (mangled) name; `*out_fn` gets its id.
///
/// # Safety
/// `client` is NULL or a live handle; `name` is NULL or a NUL-terminated string; `out_fn` is
/// NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gpushare_module_function(
    client: *const gpushare_client,
    module: u64,
    name: *const c_char,
    out_fn: *mut u64,
) -> c_int {
    guard("gpushare_module_function", || {
        // SAFETY: the caller's contract.
        let client = unsafe { client_ref(client) }?;
        non_null(name, "name")?;
        non_null(out_fn, "out_fn")?;
        // SAFETY: non-NULL, and NUL-terminated by the contract.
        let name = unsafe { CStr::from_ptr(name) };
        let name = name
            .to_str()
            .map_err(|_| invalid("the function name is not valid UTF-8"))?;
        let function = client.get_function(module, name)?;
        // SAFETY: checked non-NULL; writable by the contract.
        unsafe { put(out_fn, function) };
        Ok(())
    })
}

/// Launches a module function on `stream` with `params_len` bytes of packed parameters
/// (asynchronous; returns once the broker has taken the parameters).
///
/// # Safety
/// `client` is NULL or a live handle; `grid` and `block` are NULL or point to three
/// `uint32_t` each; `params` is valid for reads of `params_len` bytes (it may be NULL when
/// `params_len` is 0).
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn gpushare_launch(
    client: *const gpushare_client,
    stream: u32,
    function: u64,
    grid: *const u32,
    block: *const u32,
    shared_mem: u32,
    params: *const c_void,
    params_len: usize,
) -> c_int {
    guard("gpushare_launch", || {
        // SAFETY: the caller's contract.
        let client = unsafe { client_ref(client) }?;
        non_null(grid, "grid")?;
        non_null(block, "block")?;
        // SAFETY: non-NULL and pointing to three `uint32_t` by the contract; read unaligned
        // so a misaligned C array cannot make this undefined.
        let (grid, block) = unsafe {
            (
                grid.cast::<[u32; 3]>().read_unaligned(),
                block.cast::<[u32; 3]>().read_unaligned(),
            )
        };
        // SAFETY: the caller's contract.
        let params = unsafe { bytes(params, params_len, "params") }?;
        Ok(client.launch_function_raw(stream, function, grid, block, shared_mem, params)?)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn last_error() -> String {
        // SAFETY: gpushare_last_error_message never returns NULL and the string lives until
        // the next call on this thread.
        unsafe { CStr::from_ptr(gpushare_last_error_message()) }
            .to_string_lossy()
            .into_owned()
    }

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
    fn errors_map_to_their_codes() {
        assert_eq!(status_of(&Error::BrokerGone), GPUSHARE_E_BROKER_GONE);
        assert_eq!(status_of(&Error::Evicted("x".into())), GPUSHARE_E_EVICTED);
        assert_eq!(
            status_of(&Error::BrokerShutdown("x".into())),
            GPUSHARE_E_SHUTTING_DOWN
        );
        assert_eq!(status_of(&Error::Protocol("x".into())), GPUSHARE_E_PROTOCOL);
        assert_eq!(
            status_of(&Error::InvalidArgument("x".into())),
            GPUSHARE_E_INVALID_ARGUMENT
        );
        assert_eq!(
            status_of(&Error::Io(std::io::ErrorKind::Other.into())),
            GPUSHARE_E_IO
        );
        for code in ErrorCode::ALL {
            let err = Error::Command { op: "test", code };
            assert_eq!(status_of(&err), code.as_u32() as c_int);
            assert_ne!(name_of(status_of(&err)), c"GPUSHARE_E_UNKNOWN", "{code:?}");
        }
        let rc = guard("gpushare_test", || Err(Failure::Null("out")));
        assert_eq!(rc, GPUSHARE_E_NULL);
        assert_eq!(last_error(), "gpushare_test: `out` must not be NULL");
        assert_eq!(guard("gpushare_test", || Ok(())), GPUSHARE_OK);
    }

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
}

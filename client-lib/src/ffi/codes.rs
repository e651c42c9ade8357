//! The numbers C sees: status codes, flags and limits (`include/gpushare.h` defines the same),
//! and which library error becomes which status code.

use std::ffi::{CStr, c_char, c_int};

use gpushare_protocol::ErrorCode;

use crate::Error;

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
/// A GPU fault in another program stopped work this client had on the GPU: it may have run in
/// part and was not run again; device memory and handles are intact, the session goes on.
pub const GPUSHARE_E_WORK_LOST: c_int = wire(ErrorCode::WorkLost);
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
/// The broker gave no sign of life for the timeout (`GPUSHARE_TIMEOUT`, 30 s by default): it
/// may be stopped or wedged. The session is over; connect again.
pub const GPUSHARE_E_BROKER_UNRESPONSIVE: c_int = 107;

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
pub(super) fn status_of(err: &Error) -> c_int {
    match err {
        Error::Connect { .. } => GPUSHARE_E_CONNECT,
        Error::Rejected(w) | Error::Request(w) => wire(w.code),
        Error::Command { code, .. } => wire(*code),
        Error::BrokerShutdown(_) | Error::BrokerRestarting(_) => GPUSHARE_E_SHUTTING_DOWN,
        Error::Evicted(_) => GPUSHARE_E_EVICTED,
        Error::BrokerGone => GPUSHARE_E_BROKER_GONE,
        Error::BrokerUnresponsive { .. } => GPUSHARE_E_BROKER_UNRESPONSIVE,
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
        GPUSHARE_E_WORK_LOST => c"GPUSHARE_E_WORK_LOST",
        GPUSHARE_E_REBUILD_FAILED => c"GPUSHARE_E_REBUILD_FAILED",
        GPUSHARE_E_BROKER_UNRESPONSIVE => c"GPUSHARE_E_BROKER_UNRESPONSIVE",
        GPUSHARE_E_CONNECT => c"GPUSHARE_E_CONNECT",
        GPUSHARE_E_BROKER_GONE => c"GPUSHARE_E_BROKER_GONE",
        GPUSHARE_E_EVICTED => c"GPUSHARE_E_EVICTED",
        GPUSHARE_E_PROTOCOL => c"GPUSHARE_E_PROTOCOL",
        GPUSHARE_E_IO => c"GPUSHARE_E_IO",
        GPUSHARE_E_NULL => c"GPUSHARE_E_NULL",
        _ => c"GPUSHARE_E_UNKNOWN",
    }
}

/// The `#define` name of a status code ("GPUSHARE_E_UNKNOWN" for an unknown one); a static
/// string.
#[unsafe(no_mangle)]
pub extern "C" fn gpushare_error_name(code: c_int) -> *const c_char {
    name_of(code).as_ptr()
}

#[cfg(test)]
mod tests {
    use super::*;

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
    }

    #[test]
    fn every_library_code_has_its_name_and_others_are_unknown() {
        for (code, name) in [
            (GPUSHARE_OK, c"GPUSHARE_OK"),
            (GPUSHARE_E_CONNECT, c"GPUSHARE_E_CONNECT"),
            (GPUSHARE_E_BROKER_GONE, c"GPUSHARE_E_BROKER_GONE"),
            (GPUSHARE_E_EVICTED, c"GPUSHARE_E_EVICTED"),
            (GPUSHARE_E_PROTOCOL, c"GPUSHARE_E_PROTOCOL"),
            (GPUSHARE_E_IO, c"GPUSHARE_E_IO"),
            (GPUSHARE_E_NULL, c"GPUSHARE_E_NULL"),
            (GPUSHARE_E_REBUILD_FAILED, c"GPUSHARE_E_REBUILD_FAILED"),
            (
                GPUSHARE_E_BROKER_UNRESPONSIVE,
                c"GPUSHARE_E_BROKER_UNRESPONSIVE",
            ),
        ] {
            assert_eq!(name_of(code), name);
        }
        assert_eq!(name_of(-1), c"GPUSHARE_E_UNKNOWN");
        assert_eq!(name_of(99), c"GPUSHARE_E_UNKNOWN");
    }
}

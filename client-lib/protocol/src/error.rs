//! Error codes carried in completions and control replies.

use serde::{Deserialize, Serialize};

/// What went wrong with a command, as both sides name it.
///
/// The numeric values are part of the wire format and of the C ABI (`GPUSHARE_E_*`):
/// never renumber, only append.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, thiserror::Error)]
#[repr(u32)]
pub enum ErrorCode {
    #[error("unknown or malformed command")]
    InvalidCommand = 1,
    #[error("invalid argument")]
    InvalidArgument = 2,
    #[error("no such handle (stream, event, module or function) for this client")]
    InvalidHandle = 3,
    #[error("device pointer range is not inside one of this client's allocations")]
    InvalidPointer = 4,
    #[error("range lies outside the shared data arena")]
    ArenaOutOfBounds = 5,
    #[error("device out of memory")]
    OutOfMemory = 6,
    #[error("allocation would exceed this client's memory quota")]
    OutOfQuota = 7,
    #[error("not supported by this device backend")]
    NotSupported = 8,
    #[error("device error")]
    DeviceError = 9,
    #[error("not ready yet")]
    NotReady = 10,
    #[error("broker shutting down")]
    ShuttingDown = 11,
    #[error("protocol version mismatch")]
    VersionMismatch = 12,
    #[error("permission denied")]
    PermissionDenied = 13,
    #[error("too many handles of this kind for one client")]
    TooManyHandles = 14,
    #[error("kernel launch failed")]
    LaunchFailed = 15,
    #[error("internal broker error")]
    Internal = 16,
    #[error("protocol violation")]
    ProtocolViolation = 17,
    #[error(
        "the GPU was reset after a fault; this client's device memory, streams, events and modules were lost"
    )]
    DeviceReset = 18,
    #[error(
        "the device address asked for is not available (another allocation holds part of it, or the device cannot place memory there)"
    )]
    AddressUnavailable = 19,
    #[error("not found (no such symbol in the module, or no such cached image)")]
    NotFound = 20,
    #[error(
        "a GPU fault in another program stopped this work while it was on the GPU; it may have run in part, so it was not run again. Device memory, streams, events and modules are intact"
    )]
    WorkLost = 21,
}

impl ErrorCode {
    pub const ALL: [ErrorCode; 21] = [
        ErrorCode::InvalidCommand,
        ErrorCode::InvalidArgument,
        ErrorCode::InvalidHandle,
        ErrorCode::InvalidPointer,
        ErrorCode::ArenaOutOfBounds,
        ErrorCode::OutOfMemory,
        ErrorCode::OutOfQuota,
        ErrorCode::NotSupported,
        ErrorCode::DeviceError,
        ErrorCode::NotReady,
        ErrorCode::ShuttingDown,
        ErrorCode::VersionMismatch,
        ErrorCode::PermissionDenied,
        ErrorCode::TooManyHandles,
        ErrorCode::LaunchFailed,
        ErrorCode::Internal,
        ErrorCode::ProtocolViolation,
        ErrorCode::DeviceReset,
        ErrorCode::AddressUnavailable,
        ErrorCode::NotFound,
        ErrorCode::WorkLost,
    ];

    pub fn as_u32(self) -> u32 {
        self as u32
    }

    /// The code for a completion status word; `None` for 0 (success) or an unknown value.
    pub fn from_u32(value: u32) -> Option<ErrorCode> {
        ErrorCode::ALL.iter().copied().find(|c| c.as_u32() == value)
    }
}

/// An error with a human sentence attached, as sent on the control socket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{code}: {message}")]
pub struct WireError {
    pub code: ErrorCode,
    pub message: String,
}

impl WireError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        WireError {
            code,
            message: message.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_are_unique() {
        let mut seen = std::collections::HashSet::new();
        for code in ErrorCode::ALL {
            assert!(seen.insert(code.as_u32()), "duplicate value for {code:?}");
            assert_eq!(ErrorCode::from_u32(code.as_u32()), Some(code));
        }
        assert_eq!(ErrorCode::from_u32(0), None);
        assert_eq!(ErrorCode::from_u32(9999), None);
    }
}

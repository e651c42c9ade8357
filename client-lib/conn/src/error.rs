//! What can go wrong talking to `gpushared`, for every client kind.

use std::path::PathBuf;

use gpushare_protocol::control::ShutdownKind;
use gpushare_protocol::error::WireError;
use gpushare_protocol::{DevicePtr, ErrorCode};

/// Everything that can go wrong talking to `gpushared`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// (`cause` is part of the message, not a chained source, so it is printed once.)
    #[error("cannot connect to gpushared at {path}: {cause}{}", connect_hint(.cause))]
    Connect {
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error("gpushared refused the session: {0}")]
    Rejected(WireError),
    #[error("{op} failed: {code}")]
    Command { op: &'static str, code: ErrorCode },
    #[error("{0}")]
    Request(WireError),
    #[error("{0}")]
    BrokerShutdown(String),
    /// gpushared restarts itself after a GPU fault it could not recover in place: it is back
    /// on the same socket shortly: connect again.
    #[error("gpushared restarts after a GPU fault ({0}); reconnect")]
    BrokerRestarting(String),
    #[error("evicted by gpushared: {0}")]
    Evicted(String),
    #[error("the connection to gpushared was lost (the broker exited or closed it)")]
    BrokerGone,
    /// gpushared gave no sign of life for the timeout (`GPUSHARE_TIMEOUT`): no answer, no
    /// completion, no reply to a ping. The session is over; connect again.
    #[error(
        "gpushared did not answer for {:.1} s (it may be stopped or wedged); this session is over, connect again (GPUSHARE_TIMEOUT sets how long a call waits)",
        *.waited_ms as f64 / 1000.0
    )]
    BrokerUnresponsive { waited_ms: u64 },
    #[error("gpushare protocol error: {0}")]
    Protocol(String),
    #[error("{0}")]
    InvalidArgument(String),
    #[error("I/O error talking to gpushared: {0}")]
    Io(#[from] std::io::Error),
    /// A GPU reset (another client's fault, or a restart of gpushared after one) took this
    /// client's device state, and the client library made it again from what it recorded
    /// (`ConnectOptions::rebuild`): the call that met the
    /// reset fails with this, once. Work submitted before the fault was lost and is not run
    /// again; submit it again (the handles and device addresses stay the same).
    #[error(
        "device reset: work submitted before the fault was lost; state was rebuilt from host data ({0}); submit that work again"
    )]
    Rebuilt(String),
    /// A rebuild after a GPU reset failed; every later call of this client fails with it.
    /// Connect again and upload again.
    #[error(
        "cannot rebuild this client's device state after a GPU reset: {0}; reconnect and upload again"
    )]
    RebuildFailed(RebuildError),
}

/// What to do about a failed connection, by its cause.
fn connect_hint(cause: &std::io::Error) -> &'static str {
    match cause.kind() {
        std::io::ErrorKind::PermissionDenied => {
            " — this user may not use gpushared (the socket's group and mode decide; ask the administrator)"
        }
        _ => " — is gpushared running? (set GPUSHARE_SOCKET to use another socket)",
    }
}

impl Error {
    /// The error for a broker that ended every session.
    pub fn shutdown(kind: ShutdownKind, reason: String) -> Error {
        match kind {
            ShutdownKind::Stopping => Error::BrokerShutdown(reason),
            ShutdownKind::Restarting => Error::BrokerRestarting(reason),
        }
    }

    /// The broker's error code, where there is one.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            Error::Command { code, .. } => Some(*code),
            Error::Rejected(w) | Error::Request(w) => Some(w.code),
            Error::BrokerShutdown(_) | Error::BrokerRestarting(_) => Some(ErrorCode::ShuttingDown),
            Error::Rebuilt(_) => Some(ErrorCode::DeviceReset),
            Error::RebuildFailed(RebuildError::AddressUnavailable { .. }) => {
                Some(ErrorCode::AddressUnavailable)
            }
            _ => None,
        }
    }

    /// Whether the session is over (the client must reconnect).
    pub fn is_fatal(&self) -> bool {
        matches!(
            self,
            Error::BrokerShutdown(_)
                | Error::BrokerRestarting(_)
                | Error::Evicted(_)
                | Error::BrokerGone
                | Error::BrokerUnresponsive { .. }
                | Error::Protocol(_)
                | Error::RebuildFailed(_)
        )
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a client's device state could not be made again after a reset. Once a rebuild has
/// failed, every later call of that client fails with it: some of its handles are not
/// there any more, and a result computed without them would be wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RebuildError {
    /// The broker could not place an allocation at its old address (another allocation
    /// holds part of the range, or the device cannot place memory there).
    #[error("device memory at {ptr:#x} ({bytes} bytes) could not be allocated again: {cause}")]
    AddressUnavailable {
        ptr: DevicePtr,
        bytes: u64,
        cause: String,
    },
    /// gpushared restarted after a fault and did not take a new session in time.
    #[error("gpushared did not come back within {waited_ms} ms of its restart: {last}")]
    BrokerNotBack { waited_ms: u64, last: String },
    /// gpushared came back and refused the new session (a culprit's process is refused for
    /// a while after its fault).
    #[error("gpushared refused a new session: {0}")]
    Refused(String),
    /// Another step failed (uploading a shadow, loading a module again, …).
    #[error("{what} failed: {cause}")]
    Step { what: String, cause: String },
}

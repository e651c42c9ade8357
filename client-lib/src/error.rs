//! The client library's error type.

use std::path::PathBuf;

use gpushare_protocol::ErrorCode;
use gpushare_protocol::error::WireError;

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
    #[error("evicted by gpushared: {0}")]
    Evicted(String),
    #[error("the connection to gpushared was lost (the broker exited or closed it)")]
    BrokerGone,
    #[error("gpushare protocol error: {0}")]
    Protocol(String),
    #[error("{0}")]
    InvalidArgument(String),
    #[error("I/O error talking to gpushared: {0}")]
    Io(#[from] std::io::Error),
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
    /// The broker's error code, where there is one.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            Error::Command { code, .. } => Some(*code),
            Error::Rejected(w) | Error::Request(w) => Some(w.code),
            Error::BrokerShutdown(_) => Some(ErrorCode::ShuttingDown),
            _ => None,
        }
    }

    /// Whether the session is over (the client must reconnect).
    pub fn is_fatal(&self) -> bool {
        matches!(
            self,
            Error::BrokerShutdown(_) | Error::Evicted(_) | Error::BrokerGone | Error::Protocol(_)
        )
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

//! The wire contract between gpushare clients and the `gpushared` broker.
//!
//! This crate holds no I/O: it defines what travels and how it is laid out.
//! - [`control`]: messages on the `SOCK_SEQPACKET` control socket (serde + bincode).
//! - [`ring`]: the shared-memory layout, the ring entry formats and the SPSC ring logic.
//! - [`command`]: the typed commands carried in submission entries, and their encoding.
//! - [`error`]: the error codes both sides speak.
//! - [`stats`]: the status snapshot the broker reports.
//! - [`job`]: batch scheduler jobs that hold shares of the GPUs, as the scheduler's hooks and
//!   the broker speak of them, and where both find Slurm's `scontrol` (one lookup of the
//!   environment and the file system, like [`socket_path_from_env`]'s of the environment).
//! - `socket` and `wake` (feature `socket`): the control socket's framing and the rings'
//!   eventfd wake-ups, one copy for every client kind and the broker.

pub mod command;
pub mod control;
pub mod error;
pub mod graph;
pub mod job;
// The fuzz targets' bodies and seeds: test code, kept out of production builds.
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
pub mod ring;
#[cfg(feature = "socket")]
pub mod socket;
pub mod stats;
pub mod text;
pub mod timed;
#[cfg(feature = "socket")]
pub mod wake;

pub use command::{Command, Kernel};
pub use error::ErrorCode;

/// Most streams one session may hold at once, its default stream included: past it a
/// creation fails (`TooManyHandles`; a client-side driver says so at creation).
pub const MAX_STREAMS: usize = 1024;
/// Most events one session may hold at once.
pub const MAX_EVENTS: usize = 16384;

/// Version of the wire protocol; client and broker must agree exactly.
pub const PROTOCOL_VERSION: u32 = 16;

/// Where clients find the broker unless told otherwise.
pub const DEFAULT_SOCKET_PATH: &str = "/run/gpushare/gpushare.sock";

/// Environment variable that overrides [`DEFAULT_SOCKET_PATH`] on both sides.
pub const SOCKET_ENV: &str = "GPUSHARE_SOCKET";

/// A device address as the broker's device sees it.
pub type DevicePtr = u64;

/// A client's stream handle. Stream 0 is the default stream every client has.
pub type StreamId = u32;

/// A client's event handle.
pub type EventId = u32;

/// A client's graph handle (an instantiated graph gpushared made).
pub type GraphId = u32;

/// The socket path to use: `GPUSHARE_SOCKET` if set and non-empty, else the default.
pub fn socket_path_from_env() -> std::path::PathBuf {
    match std::env::var_os(SOCKET_ENV) {
        Some(p) if !p.is_empty() => p.into(),
        _ => DEFAULT_SOCKET_PATH.into(),
    }
}

/// Scheduling class of a client. Ordered from most to least important.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum PriorityClass {
    High,
    Normal,
    BestEffort,
}

impl PriorityClass {
    pub fn as_str(self) -> &'static str {
        match self {
            PriorityClass::High => "high",
            PriorityClass::Normal => "normal",
            PriorityClass::BestEffort => "best-effort",
        }
    }
}

impl std::fmt::Display for PriorityClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for PriorityClass {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "high" => Ok(PriorityClass::High),
            "normal" => Ok(PriorityClass::Normal),
            "best-effort" | "besteffort" | "best_effort" => Ok(PriorityClass::BestEffort),
            other => Err(format!(
                "unknown priority class `{other}` (expected high, normal or best-effort)"
            )),
        }
    }
}

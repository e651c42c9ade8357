//! The device layer: one GPU context as the broker uses it, and the backends behind it.
//!
//! A caller (a session, the guardian) holds a [`Device`] and makes [`Call`]s on it. The
//! device's [`Link`] carries each call to an [`Executor`] — in a device worker process
//! ([`remote`]), or in gpushared itself ([`local`], `--in-process-device`) — which looks its
//! handles up and runs it on a [`Backend`]: a real GPU through CUDA ([`cuda`]) or the CPU
//! model ([`sim`]).
//!
//! - `call`: every operation, declared once, and the one `match` that runs it; `reply`: what
//!   a call gets back;
//! - `backend`: the [`Backend`] trait, an operation a method;
//! - `executor`: a backend with its handle tables and the client memory shared with it;
//! - `gate`: the priority gate's word, and a worker's hold on it;
//! - `link`: where calls run, and the ledger of posted work's answers;
//! - `front`: [`Device`], what callers use; `handles`: the handles they hold;
//! - `pool`: clients' memory, carved out of chunks that outlive a context;
//! - `local`, `remote`: the two links.

pub mod backend;
pub mod call;
pub mod cuda;
pub mod executor;
mod front;
pub mod gate;
pub mod graph;
mod handles;
pub mod ipc;
pub mod link;
pub mod local;
pub(crate) mod mirrors;
mod pool;
mod progress;
pub mod remote;
pub mod reply;
pub mod sim;

use std::borrow::Cow;

use gpushare_protocol::ErrorCode;
use gpushare_protocol::command::OccupancyQuery;

pub use self::backend::Backend;
pub use self::call::{Call, EventKind, GateWord, Handle, Place, ProgressValue, Reply, Span};
pub use self::executor::Executor;
pub use self::front::Device;
pub use self::gate::{Gate, GateHold};
pub use self::handles::{Event, Function, Graph, Module, Stream};
pub use self::link::{Link, Memory, Pace, Space};
pub use self::progress::{Fate, Kept, drop_dependents};

/// What a device can fail with; it crosses the process boundary as itself.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum DeviceError {
    #[error("device out of memory")]
    OutOfMemory,
    #[error("not supported by the {backend} backend: {what}")]
    NotSupported {
        backend: Cow<'static, str>,
        what: String,
    },
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("not ready")]
    NotReady,
    #[error("device error: {0}")]
    Failed(String),
    /// A sticky error: the shared context is unusable until the broker resets it.
    #[error("GPU fault: {0}")]
    Fault(String),
    /// The wait was cut short because the device is being reset.
    #[error("interrupted by a device reset")]
    Cancelled,
    /// Memory cannot be placed at the address asked for.
    #[error("cannot allocate at the address asked for: {0}")]
    AddressUnavailable(String),
    /// A device worker, alive, did not answer within the time asked for: it is busy (a long
    /// call), which by itself is no fault.
    #[error("{0}")]
    NoAnswer(String),
    /// A name the module does not have (a function, a global).
    #[error("not found: {0}")]
    NotFound(String),
}

impl DeviceError {
    pub fn code(&self) -> ErrorCode {
        match self {
            DeviceError::OutOfMemory => ErrorCode::OutOfMemory,
            DeviceError::NotSupported { .. } => ErrorCode::NotSupported,
            DeviceError::InvalidArgument(_) => ErrorCode::InvalidArgument,
            DeviceError::NotReady => ErrorCode::NotReady,
            DeviceError::Failed(_) | DeviceError::Fault(_) | DeviceError::NoAnswer(_) => {
                ErrorCode::DeviceError
            }
            DeviceError::Cancelled => ErrorCode::DeviceReset,
            DeviceError::AddressUnavailable(_) => ErrorCode::AddressUnavailable,
            DeviceError::NotFound(_) => ErrorCode::NotFound,
        }
    }
}

pub type DeviceResult<T> = Result<T, DeviceError>;

/// What a client-side driver needs to know of a function: its parameters' (offset, size)
/// in the packed buffer, and its `CUfunction_attribute` values by number.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FunctionShape {
    pub params: Vec<(u32, u32)>,
    pub attributes: Vec<i32>,
}

/// An occupancy question about a function.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Occupancy {
    pub query: OccupancyQuery,
    pub block_size: u32,
    /// Dynamic shared memory per block; the block count for `DynamicSmemPerBlock`.
    pub dynamic_smem: u64,
    pub flags: u32,
    pub cluster: [u32; 3],
}

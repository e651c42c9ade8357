//! Every device operation, declared once: a [`Call`] with its arguments, the [`Reply`] it
//! gets, and the one `match` that runs it on a backend ([`Executor::run`]). The session makes
//! calls, the link carries them (in this process, or to a device worker, serialised whole
//! without knowing them one by one), and the executor at the other end runs them. A new
//! operation is a variant here, an arm in `call/run.rs`, and a [`Backend`] method.

use std::sync::Arc;

use gpushare_protocol::command::{LaunchAttributes, ModuleLaunch};
use gpushare_protocol::control::ModuleFormat;
use gpushare_protocol::{DevicePtr, Kernel, PriorityClass};
use serde::{Deserialize, Serialize};

use super::backend::Backend;
use super::executor::{Executor, lock};
pub use super::reply::{Answer, Handle, Reply};
use super::{DeviceError, DeviceResult, Occupancy};
pub use crate::shm::Span;

/// Which kind of event to make.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventKind {
    /// One that can time work.
    Timing,
    /// One only for knowing when work is done (cheaper to record on a GPU).
    Marker,
    /// As `cuEventCreate` makes it with these flags.
    Flags(u32),
}

/// A value for a stream's slot in the progress page ([`super::progress`]): written into slot
/// `slot` of the page `page` from the worker's CPU, the opening value once the device has
/// taken the first call of the stream's work, the closing one once a call that waits for the
/// stream has seen that work finish (a write queued on the stream instead costs the work a
/// memory operation on the GPU each, about 1.3 µs on an H200 before a launch and 1.9 µs
/// before a synchronization).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProgressValue {
    pub page: Span,
    pub slot: u32,
    pub value: u32,
}

/// Where a kernel's work goes: the SM partition its stream's work takes from this kernel on
/// (`None`: the whole GPU), and the gate it waits at first, if any ([`super::gate::Gate`]).
/// Every launch says it, so that no call of its own travels for it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Place {
    pub sms: Option<u32>,
    pub gate: Option<GateWord>,
}

/// A gate of gpushared's progress page: the stream waits until the 32-bit slot `slot` of
/// `page` lets it pass ([`super::gate::passes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct GateWord {
    pub page: Span,
    pub slot: u32,
}

/// One device operation. Variable-length parts (launch parameters, a module image, a name)
/// travel beside it as its payload.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Call {
    RegisterArena {
        span: Span,
    },
    UnregisterArena {
        span: Span,
    },
    /// The reply is where device code reaches the region.
    RegisterHost {
        span: Span,
    },
    UnregisterHost {
        span: Span,
    },
    /// Streams, events, modules and functions are named by their caller: after a fault the
    /// same names are made again in the context that takes over.
    CreateStream {
        id: Handle,
        class: PriorityClass,
    },
    DestroyStream {
        stream: Handle,
    },
    /// `staged`: the device has read `src` when the call returns (the client reuses it).
    CopyHtoD {
        stream: Handle,
        src: Span,
        dst: DevicePtr,
        staged: bool,
    },
    /// `staged`: the bytes are in `dst` when the call returns, and `close` (if any) is
    /// written once the stream's work before the copy has finished.
    CopyDtoH {
        stream: Handle,
        src: DevicePtr,
        dst: Span,
        staged: bool,
        close: Option<ProgressValue>,
    },
    CopyDtoD {
        stream: Handle,
        src: DevicePtr,
        dst: DevicePtr,
        len: u64,
    },
    /// `count` elements of `elem_bytes` (1, 2 or 4) set to `value`.
    Memset {
        stream: Handle,
        dst: DevicePtr,
        value: u32,
        elem_bytes: u8,
        count: u64,
    },
    /// `start`: an event marking where the kernel starts, recorded just before it (in one
    /// step, so that nothing can come between them, and after its gate). `place`: where it
    /// goes.
    Launch {
        stream: Handle,
        kernel: Kernel,
        start: Option<Handle>,
        place: Place,
    },
    /// A graph of the encoded nodes that are the payload ([`gpushare_protocol::graph`]), each
    /// kernel's function a handle of this executor's.
    MakeGraph {
        id: Handle,
    },
    DropGraph {
        graph: Handle,
    },
    /// New parameters for some nodes, in place; the payload is the encoded changes
    /// ([`gpushare_protocol::graph::encode_changes`]). Fails where the device cannot change
    /// the graph in place (the caller then makes it again whole).
    UpdateGraph {
        graph: Handle,
    },
    LaunchGraph {
        stream: Handle,
        graph: Handle,
        start: Option<Handle>,
        place: Place,
    },
    /// The packed parameters are the payload.
    LaunchModule {
        stream: Handle,
        function: Handle,
        launch: ModuleLaunch,
        attributes: LaunchAttributes,
        start: Option<Handle>,
        place: Place,
    },
    /// The stream writes `value` (32 bits) at `done` when it gets there, then waits until the
    /// 32 bits at `go` are at least `value` (a client's host function in stream order; both
    /// are the client's page-locked host memory as the device reaches it).
    HostPoint {
        stream: Handle,
        done: DevicePtr,
        go: DevicePtr,
        value: u32,
    },
    /// The stream writes `value` into slot `slot` (32 bits) of the progress page `page` once
    /// the work before it has finished: a mark that tells the session so without asking
    /// ([`super::Device::mark_done`]).
    Progress {
        stream: Handle,
        page: Span,
        slot: u32,
        value: u32,
    },
    /// The first call of a stream's work since it was known idle: runs `call`, then writes the
    /// `opening` value (`super::progress`) unless a faulted context refused it.
    Opening {
        opening: ProgressValue,
        call: Box<Call>,
    },
    /// Waits for the stream's work; then writes `close`, if any, and `told` (the client's
    /// sync word: [`gpushare_protocol::ring::SYNC_WORD`]) unless a call on the stream failed
    /// since its last synchronization (the sync then reports that failure).
    SyncStream {
        stream: Handle,
        close: Option<ProgressValue>,
        told: Option<ProgressValue>,
    },
    EndBatch {
        stream: Handle,
        idle: bool,
    },
    StreamBusy {
        stream: Handle,
    },
    StreamDone {
        stream: Handle,
    },
    StreamWaitEvent {
        stream: Handle,
        event: Handle,
    },
    CreateEvent {
        id: Handle,
        kind: EventKind,
    },
    DestroyEvent {
        event: Handle,
    },
    /// `start`: marks where the stream's next work starts (for timing it).
    RecordEvent {
        event: Handle,
        stream: Handle,
        start: bool,
    },
    EventDone {
        event: Handle,
    },
    SyncEvent {
        event: Handle,
    },
    ElapsedNs {
        start: Handle,
        end: Handle,
    },
    /// Whether the context is poisoned, and by what.
    Fault,
    /// The image is the payload.
    LoadModule {
        id: Handle,
        format: ModuleFormat,
    },
    DropModule {
        module: Handle,
    },
    /// The name is the payload.
    GetFunction {
        id: Handle,
        module: Handle,
    },
    DropFunction {
        function: Handle,
    },
    MemoryInfo,
    /// A TMA tensor map; the arguments (`control::TensorMapArgs`, encoded) are the payload.
    EncodeTensorMap,
    FunctionShape {
        function: Handle,
    },
    SetFunctionAttribute {
        function: Handle,
        attribute: u32,
        value: i32,
    },
    Occupancy {
        function: Handle,
        question: Occupancy,
    },
    /// The name is the payload.
    ModuleGlobal {
        module: Handle,
    },
    /// The names of a module's functions, in the module's order, from the `first`th on: a
    /// page of them ([`Reply::names_page`]).
    FunctionNames {
        module: Handle,
        first: u32,
    },
}

impl Call {
    /// The stream whose work a call is, if any (an episode's first call: its own).
    pub fn stream(&self) -> Option<Handle> {
        match self {
            Call::DestroyStream { stream }
            | Call::CopyHtoD { stream, .. }
            | Call::CopyDtoH { stream, .. }
            | Call::CopyDtoD { stream, .. }
            | Call::Memset { stream, .. }
            | Call::Launch { stream, .. }
            | Call::LaunchGraph { stream, .. }
            | Call::LaunchModule { stream, .. }
            | Call::HostPoint { stream, .. }
            | Call::Progress { stream, .. }
            | Call::SyncStream { stream, .. }
            | Call::EndBatch { stream, .. }
            | Call::StreamBusy { stream }
            | Call::StreamDone { stream }
            | Call::StreamWaitEvent { stream, .. }
            | Call::RecordEvent { stream, .. } => Some(*stream),
            Call::Opening { call, .. } => call.stream(),
            _ => None,
        }
    }

    /// The start marker a kernel takes along, for the calls that launch one.
    pub fn start_marker(&mut self) -> Option<&mut Option<Handle>> {
        match self {
            Call::Launch { start, .. }
            | Call::LaunchModule { start, .. }
            | Call::LaunchGraph { start, .. } => Some(start),
            _ => None,
        }
    }
}

mod run;

#[cfg(test)]
mod tests;

//! What gpushared and its device workers say to each other: a request on a calling thread's
//! channel and its reply, and the messages of the worker's control socket. Both ends are the
//! same binary, so nothing here is versioned; lengths are still checked, and a message that
//! does not decode is an error, never a panic.

use gpushare_protocol::command::{LaunchAttributes, ModuleLaunch};
use gpushare_protocol::control::{DeviceInfo, ModuleFormat};
use gpushare_protocol::{DevicePtr, Kernel, PriorityClass};
use serde::{Deserialize, Serialize};

use crate::device::{DeviceError, FunctionShape, Occupancy};

/// A worker's stream, event, module or function.
pub type Handle = u64;

/// Client memory a copy names: a region shared with the worker (by its id), and where in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Span {
    pub region: u64,
    pub offset: u64,
    pub len: u64,
}

/// Where a request's variable-length bytes are (launch parameters, a module image, a name).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Payload {
    None,
    /// Right after the encoded request, in the channel's request area.
    Inline(u32),
    /// Too big for the request area: handed over on the control socket first, by this id.
    Blob(u64),
}

/// One device call.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Request {
    Alloc {
        bytes: u64,
    },
    AllocAt {
        ptr: DevicePtr,
        bytes: u64,
    },
    Free {
        ptr: DevicePtr,
    },
    RegisterArena {
        span: Span,
    },
    UnregisterArena {
        span: Span,
    },
    CreateStream {
        class: PriorityClass,
    },
    DestroyStream {
        stream: Handle,
    },
    CopyHtoD {
        stream: Handle,
        src: Span,
        dst: DevicePtr,
        staged: bool,
    },
    CopyDtoH {
        stream: Handle,
        src: DevicePtr,
        dst: Span,
        staged: bool,
    },
    CopyDtoD {
        stream: Handle,
        src: DevicePtr,
        dst: DevicePtr,
        len: u64,
    },
    Memset {
        stream: Handle,
        dst: DevicePtr,
        value: u32,
        elem_bytes: u8,
        count: u64,
    },
    /// `start`: an event marking where the kernel starts, recorded just before it (in one
    /// step, so that nothing can come between them).
    Launch {
        stream: Handle,
        kernel: Kernel,
        start: Option<Handle>,
    },
    LimitSms {
        stream: Handle,
        sms: Option<u32>,
    },
    /// The packed parameters are the payload.
    LaunchModule {
        stream: Handle,
        function: Handle,
        launch: ModuleLaunch,
        attributes: LaunchAttributes,
        start: Option<Handle>,
    },
    SyncStream {
        stream: Handle,
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
    /// `None`: a timing event; `Some(flags)`: `cuEventCreate`'s flags.
    CreateEvent {
        marker: bool,
        flags: Option<u32>,
    },
    DestroyEvent {
        event: Handle,
    },
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
    Fault,
    /// The image is the payload.
    LoadModule {
        format: ModuleFormat,
    },
    DropModule {
        module: Handle,
    },
    /// The name is the payload.
    GetFunction {
        module: Handle,
    },
    DropFunction {
        function: Handle,
    },
    RegisterHost {
        span: Span,
    },
    UnregisterHost {
        span: Span,
    },
    MemoryInfo,
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
}

/// What a request comes with on the channel.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Envelope {
    pub request: Request,
    pub payload: Payload,
}

/// A device error as it travels (the device's own type names its backend statically).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum WireError {
    OutOfMemory,
    NotSupported { backend: String, what: String },
    InvalidArgument(String),
    NotReady,
    Failed(String),
    Fault(String),
    Cancelled,
    AddressUnavailable(String),
}

impl From<&DeviceError> for WireError {
    fn from(e: &DeviceError) -> WireError {
        match e {
            DeviceError::OutOfMemory => WireError::OutOfMemory,
            DeviceError::NotSupported { backend, what } => WireError::NotSupported {
                backend: (*backend).to_string(),
                what: what.clone(),
            },
            DeviceError::InvalidArgument(w) => WireError::InvalidArgument(w.clone()),
            DeviceError::NotReady => WireError::NotReady,
            DeviceError::Failed(w) => WireError::Failed(w.clone()),
            DeviceError::Fault(w) => WireError::Fault(w.clone()),
            DeviceError::Cancelled => WireError::Cancelled,
            DeviceError::AddressUnavailable(w) => WireError::AddressUnavailable(w.clone()),
        }
    }
}

impl From<WireError> for DeviceError {
    fn from(e: WireError) -> DeviceError {
        match e {
            WireError::OutOfMemory => DeviceError::OutOfMemory,
            WireError::NotSupported { backend, what } => DeviceError::NotSupported {
                backend: static_backend(&backend),
                what,
            },
            WireError::InvalidArgument(w) => DeviceError::InvalidArgument(w),
            WireError::NotReady => DeviceError::NotReady,
            WireError::Failed(w) => DeviceError::Failed(w),
            WireError::Fault(w) => DeviceError::Fault(w),
            WireError::Cancelled => DeviceError::Cancelled,
            WireError::AddressUnavailable(w) => DeviceError::AddressUnavailable(w),
        }
    }
}

/// The backend names a worker can have.
pub fn static_backend(name: &str) -> &'static str {
    match name {
        "cuda" => "cuda",
        "sim" => "sim",
        _ => "remote",
    }
}

/// What a request got.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    Done,
    /// A pointer, a handle, bytes taken, nanoseconds, a count.
    Value(u64),
    Pair(u64, u64),
    Flag(bool),
    Shape(FunctionShape),
    Fault(Option<String>),
    Failed(WireError),
}

/// A reply, and what a stream request learnt of the stream's device time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Answer {
    pub reply: Reply,
    /// (device time measured since last told, whether measurements are still pending).
    pub news: Option<(u64, bool)>,
}

/// Which device a worker opens.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum WorkerBackend {
    Cuda {
        ordinal: i32,
    },
    Sim {
        index: u32,
        memory: u64,
        realtime: bool,
    },
}

/// The built-in kernels compiled for a compute capability (PTX), passed from worker to worker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BuiltinKernels {
    pub cc: (u32, u32),
    pub ptx: String,
}

/// How a worker is to start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerSpec {
    pub backend: WorkerBackend,
    /// Load the fault-injection kernels (`--allow-fault-injection`).
    pub fault_injection: bool,
    /// The log filter (tracing's env-filter syntax).
    pub log: String,
    /// Shown in the worker's log lines: which GPU, which trust domain, which generation.
    pub label: String,
    /// Kernels an earlier worker compiled, so that this one need not.
    pub builtins: Option<BuiltinKernels>,
}

/// gpushared → worker, on the control socket.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ToWorker {
    Start(WorkerSpec),
    /// A channel's memfd comes with it.
    OpenChannel {
        id: u64,
    },
    /// The region's memfd comes with it.
    ShareMemory {
        region: u64,
        len: u64,
        at: u64,
    },
    UnshareMemory {
        region: u64,
    },
    /// A memfd of `len` bytes comes with it: a request's payload too big for its channel.
    Blob {
        id: u64,
        len: u64,
    },
    /// Allocate above this address (a replaced worker's allocations ended there, and clients
    /// rebuilding their state want their old addresses free).
    AddressFloor {
        end: u64,
    },
}

/// Worker → gpushared, on the control socket.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum FromWorker {
    Ready {
        info: DeviceInfo,
        backend: String,
        sm_partitions: bool,
        /// The built-in kernels it compiled (CUDA), for the workers after it.
        builtins: Option<BuiltinKernels>,
    },
    /// The device could not be opened.
    Failed {
        reason: String,
    },
    Ack,
    Refused {
        reason: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpushare_protocol::control::{decode, encode};

    #[test]
    fn every_device_error_survives_the_trip() {
        let errors = [
            DeviceError::OutOfMemory,
            DeviceError::NotSupported {
                backend: "sim",
                what: "modules".into(),
            },
            DeviceError::InvalidArgument("x".into()),
            DeviceError::NotReady,
            DeviceError::Failed("f".into()),
            DeviceError::Fault("illegal address".into()),
            DeviceError::Cancelled,
            DeviceError::AddressUnavailable("0x1000".into()),
        ];
        for e in errors {
            let wire = WireError::from(&e);
            let back: WireError = decode(&encode(&wire).expect("encodes")).expect("decodes");
            assert_eq!(DeviceError::from(back), e);
        }
    }

    #[test]
    fn a_launch_request_is_small() {
        let env = Envelope {
            request: Request::LaunchModule {
                stream: 3,
                function: 9,
                launch: ModuleLaunch {
                    function: 9,
                    grid: [1024, 1, 1],
                    block: [256, 1, 1],
                    shared_mem_bytes: 0,
                    params_offset: 0,
                    params_len: 64,
                },
                attributes: LaunchAttributes::default(),
                start: Some(4),
            },
            payload: Payload::Inline(64),
        };
        let bytes = encode(&env).expect("encodes");
        assert!(bytes.len() < 96, "{} bytes", bytes.len());
        let back: Envelope = decode(&bytes).expect("decodes");
        assert!(matches!(
            back.request,
            Request::LaunchModule { stream: 3, .. }
        ));
    }
}

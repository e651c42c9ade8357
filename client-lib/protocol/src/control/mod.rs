//! Messages on the control socket (`SOCK_SEQPACKET`, one message per datagram, bincode).
//!
//! A session starts with the client's [`ClientMessage::Hello`] and the broker's
//! [`BrokerMessage::Welcome`], which for a `Role::Client` (or `Role::Governed`) carries three file descriptors by
//! `SCM_RIGHTS`, in this order: the shared region (memfd, size sealed), the submission
//! eventfd (client → broker) and the completion eventfd (broker → client).
//!
//! Requests carry a `request` number that the reply echoes; the broker may also send
//! [`BrokerMessage::ShuttingDown`] or [`BrokerMessage::Evicted`] at any time.

use serde::{Deserialize, Serialize};

use crate::PriorityClass;
use crate::error::WireError;
use crate::job::{JobGpu, JobStart, JobStats, PodGrant, PodIdentity};
use crate::ring::ShmLayout;
use crate::stats::StatusReport;

mod codec;
mod device;

pub use codec::{CodecError, decode, decode_prefix, encode, encode_into, hello_version};
pub use device::{DeviceInfo, device_by_uuid};

/// Largest control message either side accepts.
pub const MAX_CONTROL_MESSAGE: usize = 1 << 20;

/// Largest module image a client may load.
pub const MAX_MODULE_IMAGE: u64 = 256 << 20;

/// Why every session ends at once ([`BrokerMessage::ShuttingDown`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ShutdownKind {
    /// gpushared is stopping (a signal, an upgrade): it stays away until started again.
    Stopping,
    /// gpushared restarts itself after a GPU fault it cannot recover in place: it is back on
    /// the same socket shortly, and a client may reconnect (the client library's rebuild does
    /// so by itself).
    Restarting,
}

/// Number of file descriptors that come with a client's `Welcome`.
pub const WELCOME_FDS: usize = 3;

/// What a connection is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Role {
    /// Runs work on the GPU: gets a shared region and rings.
    Client,
    /// Only asks for status (the `gpushare` tool): gets no region.
    Monitor,
    /// An unmodified program under `gpushare run`, through the libcuda interposer: it runs
    /// its work on its own CUDA context and gets a region and rings like a client, over
    /// which it asks for admission (`GovernedReserve`, `GovernedRelease`, `GovernedTokens`).
    Governed,
    /// An unmodified program under `gpushare run` whose CUDA driver is gpushare's
    /// (`libcuda.so.1` from `client-lib/cuda`): all its GPU work runs in the broker's
    /// context, like a client's. Its arena stages pageable copies and launch parameters; its
    /// page-locked memory comes in separate regions (`ShareHostMemory`).
    Consolidated,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    pub protocol_version: u32,
    pub role: Role,
    /// A name for status displays (defaults to the process name on the client side).
    pub client_name: String,
    /// A client may ask for a class less important than its policy grants, never more.
    pub requested_class: Option<PriorityClass>,
    /// Submission ring entries wanted (0 = broker default); the broker may round or clamp.
    pub sq_entries: u32,
    /// Data arena bytes wanted (0 = broker default); the broker may round or clamp.
    pub arena_size: u64,
    /// The device to run on (its index); `None` lets the broker pick the least loaded.
    pub gpu: Option<u32>,
}

/// The format of a module image.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ModuleFormat {
    Ptx,
    Cubin,
    Fatbin,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClientMessage {
    Hello(Hello),
    /// Loads a module whose image comes as a memfd (one `SCM_RIGHTS` descriptor) of
    /// `image_len` bytes.
    LoadModule {
        request: u64,
        format: ModuleFormat,
        image_len: u64,
    },
    /// Looks up a function in a loaded module.
    GetFunction {
        request: u64,
        module: u64,
        name: String,
    },
    UnloadModule {
        request: u64,
        module: u64,
    },
    Status {
        request: u64,
    },
    /// The client is leaving on purpose.
    Goodbye,
    /// Changes a live client's grant (root or the admin group only). `None` leaves a field as
    /// it is; `memory_quota: Some(None)` removes the quota.
    AdminSet {
        request: u64,
        client: u64,
        class: Option<PriorityClass>,
        weight: Option<u32>,
        memory_quota: Option<Option<u64>>,
    },
    /// Drops a client, which is told `reason` (root or the admin group only).
    AdminEvict {
        request: u64,
        client: u64,
        reason: String,
    },
    /// A batch scheduler's job starts here with shares of the GPUs (root or the admin group
    /// only; Slurm's prolog sends it). Answered with `Job`.
    AdminJobStart {
        request: u64,
        start: JobStart,
    },
    /// The job has ended: its grant goes and its sessions still open are evicted (root or the
    /// admin group only; Slurm's epilog sends it). Answered with `Job`, the job's last
    /// figures; `NotFound` for a job gpushared does not hold.
    AdminJobEnd {
        request: u64,
        job: u64,
    },
    /// A Kubernetes container was allocated shares of the GPUs (root or the admin group only;
    /// gpushare's kubelet plugin sends it). gpushared numbers the job and opens a socket for
    /// it. Answered with `Pod`; `AdminJobEnd` ends it.
    AdminPodStart {
        request: u64,
        gpus: Vec<JobGpu>,
    },
    /// Which pod holds Kubernetes job `job` (root or the admin group only): its class follows
    /// from the policy's `[kubernetes]`. Answered with `Job`.
    AdminPodIdentify {
        request: u64,
        job: u64,
        pod: PodIdentity,
    },
    /// Loads a module from an image the broker already holds (another session loaded the same
    /// bytes): no image travels. Answered with `ModuleLoaded`; `NotFound` when the broker does
    /// not hold it (send it with `LoadModule`).
    LoadCachedModule {
        request: u64,
        format: ModuleFormat,
        hash: ImageHash,
    },
    /// Looks up a function with what a client-side driver needs to launch it and answer
    /// queries about it. Answered with `FunctionInfo`.
    GetFunctionInfo {
        request: u64,
        module: u64,
        name: String,
    },
    /// Looks up a module's global variable. Answered with `Global`.
    GetGlobal {
        request: u64,
        module: u64,
        name: String,
    },
    /// Shares `bytes` of page-locked host memory from `offset` (whole pages) of a file (one
    /// `SCM_RIGHTS` descriptor: a memfd sealed against shrinking, or a tmpfs file the program
    /// mapped shared, as `/dev/shm`) that the broker maps and registers with the device, so
    /// copies to and from it are DMA. `at` is where the client mapped it (the broker maps it at
    /// the same address when it can, so that device code may use the client's pointer).
    /// Answered with `HostShared`.
    ShareHostMemory {
        request: u64,
        bytes: u64,
        at: u64,
        offset: u64,
    },
    /// Stops sharing a host region. Answered with `HostUnshared`.
    UnshareHostMemory {
        request: u64,
        region: u32,
    },
    /// Is the broker there? Answered with `Pong` by the control plane, whatever the data
    /// thread is doing: a client waiting long for a completion asks, to tell a busy broker
    /// from a stopped one.
    Ping {
        request: u64,
    },
    /// A descriptor by which another process may take this session's physical memory
    /// `handle` (`cuMemExportToShareableHandle`). Answered with `MemoryExported`, which carries
    /// it (one `SCM_RIGHTS` descriptor).
    ExportMemory {
        request: u64,
        handle: u64,
    },
    /// Takes physical memory another process exported (its descriptor comes with this, one
    /// `SCM_RIGHTS`) as a handle of this session's. Answered with `MemoryImported`.
    ImportMemory {
        request: u64,
    },
    /// Peer access for this session's GPU to gpushared's GPU `gpu` (`cuCtxEnablePeerAccess` in
    /// a process that works on both): that GPU's memory of this session's trust domain is
    /// mapped into this GPU's context at its own addresses, now and as it is made. Answered
    /// with `PeerAccessEnabled`.
    EnablePeerAccess {
        request: u64,
        gpu: u32,
    },
    /// Makes a TMA tensor map (`cuTensorMapEncode*`). Answered with `TensorMap`.
    EncodeTensorMap {
        request: u64,
        args: TensorMapArgs,
    },
    /// The names of a loaded module's functions (kernels), in the module's order, from the
    /// `first`th on: as many as one answer holds (ask again from where it ended). Answered
    /// with `FunctionNames`.
    GetFunctionNames {
        request: u64,
        module: u64,
        first: u32,
    },
    /// Makes and instantiates a CUDA graph of `bytes` encoded nodes ([`crate::graph`]), which
    /// come as a file (one `SCM_RIGHTS` descriptor). Answered with `GraphMade`.
    MakeGraph {
        request: u64,
        bytes: u64,
    },
}

/// The arguments of `cuTensorMapEncodeTiled`, `cuTensorMapEncodeIm2col` or
/// `cuTensorMapReplaceAddress`. A tensor map is host data that only NVIDIA's driver knows how
/// to make; gpushared's device worker makes it, where every device address is the same.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TensorMapArgs {
    Tiled {
        layout: TensorLayout,
        box_dim: Vec<u32>,
    },
    Im2col {
        layout: TensorLayout,
        lower_corner: Vec<i32>,
        upper_corner: Vec<i32>,
        channels_per_pixel: u32,
        pixels_per_column: u32,
    },
    ReplaceAddress {
        map: Vec<u8>,
        global_address: u64,
    },
}

/// What `cuTensorMapEncodeTiled` and `cuTensorMapEncodeIm2col` share: the tensor in memory,
/// and the enums' numbers as CUDA has them.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TensorLayout {
    pub data_type: u32,
    pub global_address: u64,
    pub global_dim: Vec<u64>,
    pub global_strides: Vec<u64>,
    pub element_strides: Vec<u32>,
    pub interleave: u32,
    pub swizzle: u32,
    pub l2_promotion: u32,
    pub oob_fill: u32,
}

/// Bytes of a `CUtensorMap`.
pub const TENSOR_MAP_BYTES: usize = 128;

/// A module image's content hash (BLAKE3), by which the broker deduplicates images.
pub type ImageHash = [u8; 32];

/// The content hash of a module image.
pub fn image_hash(image: &[u8]) -> ImageHash {
    *blake3::hash(image).as_bytes()
}

/// The content hash of the image `reader` yields, read in pieces (the same as [`image_hash`]
/// of all of it); also how many bytes it read.
pub fn image_hash_reader(mut reader: impl std::io::Read) -> std::io::Result<(ImageHash, u64)> {
    let mut hasher = blake3::Hasher::new();
    let read = std::io::copy(&mut reader, &mut hasher)?;
    Ok((*hasher.finalize().as_bytes(), read))
}

/// What a client-side driver needs to know of a function.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionDetails {
    /// The function's id in the session (as `GetFunction` returns).
    pub id: u64,
    /// Each kernel parameter's (offset, size) in the packed parameter buffer, in order.
    pub params: Vec<(u32, u32)>,
    /// `CUfunction_attribute` values, indexed by attribute number.
    pub attributes: Vec<i32>,
}

/// A shared host region as the broker registered it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostRegionGrant {
    pub region: u32,
    /// Where device code reaches the region (the client's own address when the broker could
    /// map it there).
    pub device_ptr: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Welcome {
    pub protocol_version: u32,
    pub broker_version: String,
    pub client_id: u64,
    /// `None` for monitors.
    pub layout: Option<ShmLayout>,
    pub backend: String,
    pub device: DeviceInfo,
    pub class: PriorityClass,
    pub weight: u32,
    pub memory_quota: Option<u64>,
    /// The size and alignment of physical memory and reserved address space (the virtual
    /// memory API's granularity); 0 where the device has no such memory.
    pub memory_granularity: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum BrokerMessage {
    Welcome(Box<Welcome>),
    /// The broker refuses the session (version mismatch, permission …) and will close it.
    Rejected(WireError),
    ModuleLoaded {
        request: u64,
        result: Result<u64, WireError>,
    },
    Function {
        request: u64,
        result: Result<u64, WireError>,
    },
    ModuleUnloaded {
        request: u64,
        result: Result<(), WireError>,
    },
    Status {
        request: u64,
        report: Box<StatusReport>,
    },
    /// A request could not be parsed or was not allowed in this session.
    RequestFailed {
        request: u64,
        error: WireError,
    },
    /// The broker is stopping or restarting; every command not yet completed is lost.
    ShuttingDown {
        kind: ShutdownKind,
        reason: String,
    },
    /// An administrator or the broker removed this client.
    Evicted {
        reason: String,
    },
    /// The answer to `AdminSet` and `AdminEvict`.
    AdminDone {
        request: u64,
        result: Result<(), WireError>,
    },
    /// The answer to `AdminJobStart`, `AdminJobEnd` and `AdminPodIdentify`.
    Job {
        request: u64,
        result: Result<JobStats, WireError>,
    },
    /// The answer to `AdminPodStart`.
    Pod {
        request: u64,
        result: Result<PodGrant, WireError>,
    },
    /// The answer to `GetFunctionInfo`.
    FunctionInfo {
        request: u64,
        result: Result<FunctionDetails, WireError>,
    },
    /// The answer to `GetGlobal`: the variable's device address and size.
    Global {
        request: u64,
        result: Result<(u64, u64), WireError>,
    },
    /// The answer to `ShareHostMemory`.
    HostShared {
        request: u64,
        result: Result<HostRegionGrant, WireError>,
    },
    /// The answer to `UnshareHostMemory`.
    HostUnshared {
        request: u64,
        result: Result<(), WireError>,
    },
    /// The answer to `ExportMemory`; the descriptor comes with it.
    MemoryExported {
        request: u64,
        result: Result<(), WireError>,
    },
    /// The answer to `EncodeTensorMap`: the map's [`TENSOR_MAP_BYTES`].
    TensorMap {
        request: u64,
        result: Result<Vec<u8>, WireError>,
    },
    /// The answer to `ImportMemory`: the new handle and the memory's size.
    MemoryImported {
        request: u64,
        result: Result<(u64, u64), WireError>,
    },
    /// The answer to `EnablePeerAccess`.
    PeerAccessEnabled {
        request: u64,
        result: Result<(), WireError>,
    },
    /// Another client's work faulted the GPU and the broker recreated its context: everything
    /// this client held on the device is gone (listed in `lost`); the session goes on, and
    /// commands naming lost handles fail with `DeviceReset`.
    DeviceReset {
        gpu: u32,
        reason: String,
        lost: LostState,
    },
    /// The answer to `Ping`.
    Pong {
        request: u64,
    },
    /// The answer to `GetFunctionNames`: how many functions the module has, and the names
    /// from the `first` asked for on (at least one while any remain).
    FunctionNames {
        request: u64,
        result: Result<(u32, Vec<String>), WireError>,
    },
    /// The answer to `MakeGraph`: the instantiated graph's handle, for `LaunchGraph`.
    GraphMade {
        request: u64,
        result: Result<crate::GraphId, WireError>,
    },
}

/// What a client lost in a GPU reset.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LostState {
    /// (base pointer, bytes) of every allocation.
    pub buffers: Vec<(u64, u64)>,
    /// Streams the client created (the default stream 0 is recreated by the broker).
    pub streams: Vec<u32>,
    pub events: Vec<u32>,
    pub modules: Vec<u64>,
}

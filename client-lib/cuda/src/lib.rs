//! `libcuda.so.1` for consolidated clients: a client-side CUDA driver that runs an unmodified
//! program's GPU work inside gpushared's context (`gpushare run`).
//!
//! The program's CUDA runtime, cuBLAS, cuDNN, NVRTC and Triton stay as they are and call this
//! library as their driver. It answers queries from what the broker told it (device
//! attributes at connect, function layouts at first use), and sends work — allocations,
//! copies, memsets, module loads, launches, streams, events — over the connection core's
//! rings, without waiting where CUDA does not wait; an error such work meets surfaces at the
//! next call that synchronizes, as in CUDA.
//!
//! - [`entry`]: every driver entry point (generated table), `cuGetProcAddress`, and the
//!   stub that reports an unsupported call.
//! - [`driver`]: connecting at `cuInit`, a device's session and state; [`route`]: which
//!   device's driver a call goes to (one process may work on several); `fork`: what a forked
//!   child gets.
//! - [`transport`]: the session, and the connection core's payload ring in its arena for
//!   launch parameters and staged copies.
//! - [`device`], [`context`]: device queries and contexts.
//! - [`peer`]: peer access between the devices a process sees.
//! - [`memory`], [`copy`]: allocations, pointer queries, page-locked host memory, copies;
//!   `across`: copies that touch another device's memory.
//! - [`stream`], [`event`]: streams (the default streams map to the client's) and events.
//! - [`module`], [`image`], [`launch`], [`occupancy`]: modules loaded lazily, launches.
//! - [`graph`]: stream capture recorded in the client and replayed.
//! - [`export`]: the export tables the runtime and libraries ask for (`cuGetExportTable`).
//! - [`status`]: CUresult from the broker's errors; `cuGetErrorString`.
//! - [`log`]: the driver's lines on stderr.

mod across;
pub mod context;
pub mod copy;
pub mod device;
pub mod driver;
pub mod entry;
mod errors;
pub mod event;
pub mod export;
mod fork;
pub mod gpus;
pub mod graph;
pub mod handle;
pub mod host_func;
pub mod host_point;
pub mod image;
pub mod launch;
pub mod log;
pub mod memo;
pub mod memory;
pub mod module;
pub mod occupancy;
pub mod peer;
pub mod profiler;
pub mod route;
pub mod status;
pub mod stream;
pub mod tensor_map;
pub mod transport;
pub mod types;

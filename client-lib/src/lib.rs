//! gpushare client library: run GPU work through the `gpushared` broker.
//!
//! ```no_run
//! use gpushare::{Client, Kernel};
//! let client = Client::connect()?;
//! let stream = client.create_stream()?;
//! let a = client.alloc::<f32>(1024)?;
//! let b = client.alloc::<f32>(1024)?;
//! let c = client.alloc::<f32>(1024)?;
//! a.copy_from_host(&vec![1.0; 1024])?;
//! b.copy_from_host(&vec![2.0; 1024])?;
//! stream.launch(Kernel::VecAddF32 { a: a.ptr(), b: b.ptr(), c: c.ptr(), n: 1024 })?;
//! stream.synchronize()?;
//! assert_eq!(c.to_vec()?, vec![3.0; 1024]);
//! # Ok::<(), gpushare::Error>(())
//! ```
//!
//! Commands travel through a shared-memory ring; asynchronous commands (launches, device
//! copies, memsets, event records) report errors at the next synchronization. The C ABI
//! lives in [`ffi`] and `include/gpushare.h`.

mod client;
pub mod ffi;
mod handles;
mod monitor;
mod rebuild;

pub use client::{Client, ConnectOptions, DeviceReset, SessionInfo};
pub use gpushare_conn::{Error, Result};
pub use gpushare_protocol::control::ModuleFormat;
pub use gpushare_protocol::job::{JobGpu, JobStart, JobStats};
pub use gpushare_protocol::stats::{ClientStats, StatusReport, UserStats};
pub use gpushare_protocol::{Command, DevicePtr, ErrorCode, Kernel, PriorityClass};
pub use handles::{DeviceBuffer, Event, Function, HostBuffer, Module, Stream};
pub use monitor::Monitor;
pub use rebuild::RebuildError;

//! `gpushared`, the gpushare broker: owns the GPU and runs many clients' work on it.
//!
//! - [`server`]: the control socket, handshakes, per-connection tasks, shutdown; one file per
//!   step (`listen`, `handshake`, `session`, `control` and `admin`, `framing`, `status`).
//! - [`session`]: one client's tables, accounting and ring-draining data thread: `info`
//!   (what status sees), `modules` and `allocations` (its tables), `serve` (the ring loop),
//!   `execute` (one command), `turns` (scheduler turns), `reset` (what a GPU reset took),
//!   `reclaim` (the release at its end), `governed` (admission for governed clients).
//! - [`fault`]: GPU fault containment: the watchdog, context reset, culprit and probation.
//! - [`dispatch`]: one GPU's scheduler as sessions meet it: kernels wait for their turn.
//! - [`device`]: the `Device` trait and its backends (`sim`; `cuda` on GPU machines).
//! - [`shm`]: the shared region (its eventfd wake-ups are `gpushare_protocol::wake`).
//! - [`cli`]: `gpushared`'s command line (also read by the man page generator).
//! - [`policy`]: the policy file (classes, weights, quotas by user and group).
//! - [`registry`]: the live sessions, for status.
//! - [`sched`]: the scheduler's decisions (queues, policies, rate and deadline control), clock-free.
//! - [`metrics`]: the status report as Prometheus text, and the `/metrics` endpoint.
//! - [`telemetry`]: eBPF view of every process that uses the GPU (ioctls, libcuda calls).

pub mod cli;
pub mod config;
pub mod device;
pub mod dispatch;
pub mod fault;
pub mod metrics;
pub mod policy;
pub mod registry;
pub mod sched;
pub mod server;
pub mod session;
pub mod shm;
pub mod telemetry;

//! `gpushared`, the gpushare broker: owns the GPU and runs many clients' work on it.
//!
//! - [`server`]: the control socket, handshakes, per-connection tasks, shutdown; one file per
//!   step (`listen`, `handshake`, `session`, `control` and `admin`, `framing`, `status`), plus
//!   `images` (module images shared between sessions by content hash) and `consolidated` (the
//!   control requests only a client-side CUDA driver makes).
//! - [`session`]: one client's tables, accounting and ring-draining data thread: `info`
//!   (what status sees), `modules`, `allocations` and `hosts` (its tables; `hosts` is the
//!   page-locked host memory it shares), `serve` (the ring loop), `execute` (one command),
//!   `consolidated` (what a client-side CUDA driver asks besides), `turns` (scheduler turns),
//!   `reset` (what a GPU reset took), `reclaim` (the release at its end), `governed`
//!   (admission for governed clients).
//! - [`fault`]: GPU fault containment: the watchdog, context reset, culprit and probation.
//! - [`dispatch`]: one GPU's scheduler as sessions meet it: kernels wait for their turn.
//! - [`sched`]: the scheduler's decisions, clock-free: `dispatch` (the dispatcher), `gates`
//!   (what every policy shares), `view` (what a policy sees), `client` (what a client declared
//!   and queued), `policy/` (one file per policy), and the controllers `admission`, `rate`,
//!   `deadline`, `profile`.
//! - [`device`]: the `Device` trait and its backends: `sim` (a CPU model: `cost`, `kernels`,
//!   `memory`, and the H100's `attributes` it reports) and `cuda` (one file per concern:
//!   `context`, `memory` and `placed`, `copy`, `stream` and `timing`, `event`, `module`,
//!   `builtins`, `gemm`, `partition`, `injection`, `holder`, `error`).
//! - [`shm`]: the shared region (its eventfd wake-ups are `gpushare_protocol::wake`).
//! - [`cli`]: `gpushared`'s command line (also read by the man page generator); [`config`]:
//!   the settings that are not policy.
//! - [`policy`]: the policy file (classes, weights, quotas by user and group).
//! - [`accounts`]: each user's sessions together: the memory quota they share.
//! - [`registry`]: the live sessions, for status.
//! - [`metrics`]: the status report as Prometheus text, and the `/metrics` endpoint.
//! - [`telemetry`]: eBPF view of every process that uses the GPU (ioctls, libcuda calls).
//!
//! `docs/design.md` maps every crate of the workspace the same way.

pub mod accounts;
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

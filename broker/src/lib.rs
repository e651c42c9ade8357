//! `gpushared`, the gpushare broker: owns the GPU and runs many clients' work on it.
//!
//! - [`server`]: the control socket, handshakes, per-connection tasks, shutdown; one file per
//!   step (`listen`, `handshake`, `connection`, `control` and `admin`, `framing`, `status`),
//!   plus `images` (module images shared between sessions by content hash) and `driver` (the
//!   control requests only a client-side CUDA driver makes).
//! - [`session`]: one client's tables, accounting and ring-draining data thread: `info`
//!   (what status sees), `module_table`, `allocations` and `hosts` (its tables; `hosts` is
//!   the page-locked host memory it shares), `serve` (the ring loop), `execute` (one
//!   command), `launch` (kernel launches), `legacy` (CUDA's legacy stream order and what else a client-side CUDA driver
//!   asks), `turns` (scheduler turns), `reset` (what a GPU reset took), `reclaim` (the
//!   release at its end), `governed` (admission for governed clients).
//! - [`gpu`]: one GPU's home: its `scheduler`, its contexts (one per trust domain) with their
//!   `health` and `guardian` (fault containment), `restart` (when a GPU cannot be recovered
//!   in place) and `workers` (starting the device workers).
//! - [`sched`]: the scheduler's decisions, clock-free: `dispatcher`, `gates` (what every
//!   policy shares), `view` (what a policy sees), `client` (what a client declared and
//!   queued), `policy/` (one file per policy), and the controllers `admission`, `rate`,
//!   `deadline`, `profile`.
//! - [`device`]: one GPU context as the broker uses it: every operation declared once as a
//!   `call`, run by an `executor` on a `backend` (`cuda`, or the CPU model `sim`), in a device
//!   worker (`remote`) or in gpushared (`local`); see its own docs.
//! - [`shm`]: the shared region (its eventfd wake-ups are `gpushare_protocol::wake`).
//! - [`cli`]: `gpushared`'s command line (also read by the man page generator); [`config`]:
//!   the settings that are not policy.
//! - [`access`]: the policy file: who may use the GPU, and on what terms (classes, weights,
//!   quotas and trust domains by user and group).
//! - [`accounts`]: each user's sessions together: the memory quota they share.
//! - [`registry`]: the live sessions, for status.
//! - [`metrics`]: the status report as Prometheus text, and the `/metrics` endpoint.
//! - [`telemetry`]: eBPF view of every process that uses the GPU (ioctls, libcuda calls).
//! - [`timeline`]: `GPUSHARE_TIMELINE=1`, every command and device call timed on stderr.
//!
//! `docs/design.md` maps every crate of the workspace the same way.

pub mod access;
pub mod accounts;
pub mod cli;
pub mod config;
pub mod device;
pub mod gpu;
pub mod images;
pub mod jobs;
pub mod metrics;
pub mod registry;
pub mod sched;
pub mod server;
pub mod session;
pub mod shm;
pub mod shrink_guard;
pub mod telemetry;
pub mod thread_nice;
pub mod timeline;

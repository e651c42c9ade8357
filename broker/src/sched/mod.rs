//! The scheduler's decisions: per-client software queues, one dispatcher, pluggable policies,
//! and the controllers that gate opportunistic and lower-priority work.
//!
//! Pure logic, no clock and no I/O: every call takes `now` (ns, any monotonic origin) from
//! the caller, so the same code runs in the broker and in the tests' discrete-event
//! simulator (`simulate`). It carries out the scheduling of four papers:
//! Salus (FIFO, SRTF, PACK, FAIR and memory [`admission`]), Orion (the priority policy over
//! kernel [`profile`]s), TGS ([`rate`] control of best-effort launches) and CudaMon (SM
//! partitions for [`deadline`] clients).
//!
//! How a caller drives a [`Dispatcher`]:
//! - `add_client` when a session starts, `remove_client` when it ends (its queued and
//!   in-flight records go; nobody is left waiting on them);
//! - `submit` each kernel launch into its client's FIFO queue, then `poll`: the grants are
//!   the requests to hand to the device now, in order (with the SM partition to run them on);
//! - `complete` when the device reports a granted request done (with its measured time), then
//!   `poll` again; `iteration_boundary` when a client declares an iteration's end;
//! - when `next_wakeup` returns a time, `poll` again at that time even if nothing happened.
//!
//! Before a policy sees a client, the dispatcher applies the gates every policy shares; a
//! client's queue head is a candidate only if all pass:
//! - memory admission: its declared job footprint was admitted ([`admission`]);
//! - stream depth: fewer than `max_inflight_per_client` of its requests are in flight (its
//!   granted requests run in order on its own stream);
//! - rate ([`rate`]): a best-effort head needs tokens for its blocks. The limit is engaged
//!   while a high-priority client is registered or outside load is reported, and binds while
//!   high-priority work is queued or in flight (or outside load is non-zero);
//! - partition ([`deadline`]): while a deadline client is present, clients below it keep
//!   their SMs in flight within the partition (one request always fits), and their grants
//!   carry the partition size. On a device without SM partitions their grants carry none, and
//!   a pacer holds them to the partition's share of the device's SM-time instead.
//!
//! Policies ([`policy`]) pick among the candidates, one grant per `pick`.
//!
//! Where each part lives: `client.rs` (what a client declared, queued and was granted),
//! `dispatcher.rs` (the [`Dispatcher`]: clients, submit, grant, complete),
//! `stats.rs` (what it tells of its clients), `gates.rs` (the gates above and `next_wakeup`),
//! `view.rs` (the [`View`] a policy picks from), `policy/` (the policies), and the
//! controllers `admission.rs`, `rate.rs`, `deadline.rs`, `profile.rs`.
//! `tests/` holds the dispatcher's contract; `simulate/` is the tests' discrete-event
//! simulator.

pub mod admission;
mod client;
pub mod deadline;
mod dispatcher;
mod gates;
pub mod id_hash;
mod inflight;
pub mod policy;
pub mod profile;
pub mod rate;
#[cfg(test)]
pub mod simulate;
mod stats;
mod view;

pub use self::admission::{Admit, MemoryAdmission, TooLarge};
pub use self::client::{
    ClientSchedStats, ClientSpec, DeadlineSpec, Grant, Inflight, IterationReport, JobProfile,
    Request, user_account,
};
pub use self::deadline::{DeadlineConfig, DeadlineController, SharePacer};
pub use self::dispatcher::Dispatcher;
pub use self::policy::{
    FairConfig, FifoConfig, Pick, Policy, PolicyKind, PriorityConfig, build_policy,
};
pub use self::profile::{Bound, KernelKey, KernelProfile, ProfileTable};
pub use self::rate::{RateConfig, RateController};
pub use self::view::{ClientView, View};

pub type ClientId = u64;
/// Unique per dispatcher, increasing in submission order.
pub type RequestId = u64;

/// What the dispatcher knows of the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceShape {
    pub sms: u32,
    /// The device can run a client's kernels on a subset of its SMs (CUDA green contexts).
    /// Without, partitioned clients are rate-controlled instead.
    pub sm_partitions: bool,
}

/// What the policy file tunes of the policies (the rest of [`SchedConfig`] is gpushared's).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Tunables {
    pub priority: PriorityConfig,
    pub fair: FairConfig,
}

/// Tunables. `Default` gives the values the module docs describe.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SchedConfig {
    /// Granted-but-not-completed requests per client (its stream's depth).
    pub max_inflight_per_client: u32,
    /// Device memory for admission; `None`: no admission control.
    pub memory_capacity: Option<u64>,
    pub fifo: FifoConfig,
    pub priority: PriorityConfig,
    pub fair: FairConfig,
    /// `None`: best-effort clients are never rate-limited.
    pub rate: Option<RateConfig>,
    pub deadline: DeadlineConfig,
    /// EWMA weight of a new sample (kernel durations, iteration latencies).
    pub ewma_alpha: f64,
    /// Assumed duration of a kernel never seen and not declared.
    pub default_kernel_ns: u64,
}

impl Default for SchedConfig {
    fn default() -> Self {
        SchedConfig {
            max_inflight_per_client: 2,
            memory_capacity: None,
            fifo: FifoConfig::default(),
            priority: PriorityConfig::default(),
            fair: FairConfig::default(),
            rate: Some(RateConfig::default()),
            deadline: DeadlineConfig::default(),
            ewma_alpha: 0.2,
            default_kernel_ns: 100_000,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchedError {
    #[error("client {0} is already registered with the scheduler")]
    DuplicateClient(ClientId),
    #[error("client {0} is not registered with the scheduler")]
    UnknownClient(ClientId),
    #[error("request {request} of client {client} is not in flight")]
    UnknownRequest {
        client: ClientId,
        request: RequestId,
    },
    #[error("client {client}: {source}; declare a smaller job")]
    TooLarge {
        client: ClientId,
        #[source]
        source: TooLarge,
    },
}

#[cfg(test)]
mod tests;

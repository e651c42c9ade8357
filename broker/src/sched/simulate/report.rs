//! What a simulation reports: per client, and of the run.

use gpushare_protocol::PriorityClass;

use crate::sched::ClientId;

/// What happened to one client.
#[derive(Debug, Clone, Default)]
pub struct ClientReport {
    pub id: ClientId,
    pub class: Option<PriorityClass>,
    /// Kernels submitted, granted, completed.
    pub submitted: u64,
    pub granted: u64,
    pub completed: u64,
    /// Sum of measured kernel times.
    pub gpu_ns: u64,
    /// The same, each scaled by its kernel's share of the SMs (SM·time, in whole-GPU ns).
    pub sm_gpu_ns: u64,
    pub iterations: u64,
    /// Per iteration: arrival (or start) to end, queueing included.
    pub latencies_ns: Vec<u64>,
    pub iteration_ends: Vec<u64>,
    pub joined_at: Option<u64>,
    /// When its last iteration completed.
    pub finished_at: Option<u64>,
    /// `finished_at − start_ns`.
    pub jct_ns: Option<u64>,
    /// `add_client` refused it.
    pub refused: bool,
    /// Removed by `leave_ns` before finishing.
    pub left_early: bool,
}

impl ClientReport {
    /// Nearest-rank percentile of the iteration latencies (0 when there are none).
    pub fn percentile(&self, p: f64) -> u64 {
        if self.latencies_ns.is_empty() {
            return 0;
        }
        let mut v = self.latencies_ns.clone();
        v.sort_unstable();
        let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
        v[rank.clamp(1, v.len()) - 1]
    }

    pub fn p50(&self) -> u64 {
        self.percentile(50.0)
    }

    pub fn p99(&self) -> u64 {
        self.percentile(99.0)
    }

    /// Iterations completed in `[from, to)` per second.
    pub fn throughput(&self, from: u64, to: u64) -> f64 {
        let n = self
            .iteration_ends
            .iter()
            .filter(|&&t| t >= from && t < to)
            .count();
        n as f64 / ((to - from) as f64 / 1e9)
    }
}

/// The outcome of a run.
#[derive(Debug, Clone)]
pub struct SimReport {
    pub end_ns: u64,
    pub clients: Vec<ClientReport>,
    /// (time, client) of every grant, if recorded.
    pub grants: Vec<(u64, ClientId)>,
}

impl SimReport {
    pub fn client(&self, id: ClientId) -> Option<&ClientReport> {
        self.clients.iter().find(|c| c.id == id)
    }
}

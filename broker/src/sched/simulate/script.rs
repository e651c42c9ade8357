//! What a simulation runs: each client's script, and the model's settings.

use crate::sched::{ClientSpec, DeviceShape, KernelProfile, SchedConfig};

/// When a client's iterations begin.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arrivals {
    /// The next iteration starts `think_ns` after the previous one ends.
    Closed { think_ns: u64 },
    /// Iterations arrive every `period_ns` (the first at join), queueing if one is running.
    Periodic { period_ns: u64 },
    /// Iterations arrive with exponential gaps of mean `mean_gap_ns` (the first one gap after
    /// join), queueing if one is running.
    Poisson { mean_gap_ns: u64 },
}

/// One client's behaviour.
#[derive(Debug, Clone)]
pub struct ClientScript {
    pub spec: ClientSpec,
    pub start_ns: u64,
    /// Leaves (is removed, its work dropped) at this time, finished or not.
    pub leave_ns: Option<u64>,
    pub arrivals: Arrivals,
    /// The kernels of one iteration, submitted together. Must not be empty.
    pub iteration: Vec<KernelProfile>,
    /// Iterations to run (arrivals, for open-loop clients); `None`: until the horizon.
    pub iterations: Option<u64>,
}

impl ClientScript {
    /// A closed-loop client with no think time, from time 0 until the horizon.
    pub fn new(spec: ClientSpec, iteration: Vec<KernelProfile>) -> ClientScript {
        ClientScript {
            spec,
            start_ns: 0,
            leave_ns: None,
            arrivals: Arrivals::Closed { think_ns: 0 },
            iteration,
            iterations: None,
        }
    }
}

/// The simulated device and run.
#[derive(Debug, Clone, Copy)]
pub struct SimConfig {
    pub sms: u32,
    pub sched: SchedConfig,
    pub seed: u64,
    /// The run stops here at the latest; no arrivals after it.
    pub horizon_ns: u64,
    /// Keep a log of every grant (time, client).
    pub record_grants: bool,
    /// The modelled GPU runs kernels on SM partitions (green contexts); without, the
    /// dispatcher paces partitioned clients instead, and the model runs every kernel on the
    /// whole device.
    pub sm_partitions: bool,
    /// From a kernel's end on the GPU until the dispatcher (and the program) sees it: the
    /// round trip a real broker pays per completion (0: at once). The GPU goes on with what
    /// is queued meanwhile.
    pub observe_ns: u64,
}

impl SimConfig {
    pub(super) fn device(&self) -> DeviceShape {
        DeviceShape {
            sms: self.sms,
            sm_partitions: self.sm_partitions,
        }
    }
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            sms: 132,
            sched: SchedConfig::default(),
            seed: 1,
            horizon_ns: 1_000_000_000,
            record_grants: false,
            observe_ns: 0,
            sm_partitions: true,
        }
    }
}

//! FAIR's tunables (the policy file's `[fair]`, `access/sched_tunables.rs`).

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FairConfig {
    /// Requests in flight over all clients.
    pub max_concurrent: u32,
    /// Most GPU time a newly backlogged client may be owed.
    pub lag_ns: u64,
    /// GPU time a client's turn may run ahead of the next backlogged client (0: turns of one
    /// kernel, `max_concurrent` in flight over all clients).
    pub quantum_ns: u64,
    /// Kernels of one client in flight during its turn (with a quantum).
    pub max_run: u32,
    /// How long a client owed GPU time is waited for after its work completed (0: never).
    pub anticipate_ns: u64,
    /// Clients' kernels side by side while their SMs fit, charged by SM·time (see the docs).
    pub share_sms: bool,
    /// Clients within a quantum of the least served run side by side (see the docs).
    pub side_by_side: bool,
    /// Shares belong to users: a user's programs draw on one virtual time (see the docs).
    pub per_user: bool,
    /// Side by side: a client holds back those of its weight or more only while this much
    /// estimated GPU time of its work is queued or in flight (0: always; see the docs).
    pub hungry_ns: u64,
    /// With `hungry_ns`: a client whose work has waited this long on the device past when it
    /// would have been done, behind the others' work, is hungry too (0: never; see the docs).
    pub waited_ns: u64,
    /// With `hungry_ns`: GPU time a client left unused while it was not hungry is owed to it
    /// when it becomes hungry (up to the lag); false: after a quantum of asking for less, it
    /// starts level with its hungry peers (`hunger.rs`).
    pub bank_unused: bool,
    /// Side by side: while no active account leads the least served by more than this much
    /// virtual time, launches skip the scheduler (0: never; `free.rs`). Past it they are gated
    /// until the policy has held nobody for a while.
    pub free_lead_ns: u64,
}

impl FairConfig {
    /// Whether launches may skip the scheduler at all (`free_lead_ns`, side by side only).
    pub fn may_run_free(&self) -> bool {
        self.side_by_side && self.free_lead_ns > 0
    }
}

impl Default for FairConfig {
    fn default() -> Self {
        FairConfig {
            max_concurrent: 1,
            lag_ns: 20_000_000,
            quantum_ns: 0,
            max_run: 32,
            anticipate_ns: 500_000,
            share_sms: false,
            side_by_side: false,
            per_user: false,
            hungry_ns: 0,
            waited_ns: 0,
            bank_unused: true,
            free_lead_ns: 0,
        }
    }
}

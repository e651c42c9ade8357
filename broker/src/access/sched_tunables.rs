//! The scheduling policy a policy file asks for, and its tunables (`scheduler`, `[priority]`,
//! `[fair]`) over the policies' defaults.

use super::Policy;

/// `[fair] quantum_us` for exclusive turns (`side_by_side = false`, and `priority`'s lower
/// classes by weight) when the file does not set it.
const FAIR_QUANTUM_NS: u64 = 1_000_000;

/// `[fair] quantum_us` side by side (the default under `scheduler = "fair"`) when the file
/// does not set it: on the H200, 16 PyTorch programs of equal weights did 0.77-0.78 x FIFO's
/// work with 5 ms and 0.60-0.62 x with 1 ms, every program held a third of the time
/// (docs/benchmarks.md, run A10).
const FAIR_SIDE_QUANTUM_NS: u64 = 5_000_000;

impl Policy {
    /// The scheduling policy the file asks for (FIFO when it names none).
    pub fn scheduler(&self) -> crate::sched::PolicyKind {
        self.file
            .scheduler
            .as_deref()
            .and_then(|s| s.parse().ok())
            .unwrap_or(crate::sched::PolicyKind::Fifo)
    }

    /// The priority policy's tunables: the file's `[priority]` over the defaults.
    pub fn priority_config(&self) -> crate::sched::PriorityConfig {
        let base = crate::sched::PriorityConfig::default();
        let p = &self.file.priority;
        crate::sched::PriorityConfig {
            lower_sm_share: p.lower_sm_share.or(base.lower_sm_share),
            lower_depth_beside_high: p.lower_depth.or(Some(if p.gate.unwrap_or(base.gate_lower) {
                crate::sched::policy::priority::LOWER_DEPTH_GATED
            } else {
                crate::sched::policy::priority::LOWER_DEPTH_UNGATED
            })),
            lower_queue_ns_beside_high: match p.lower_queue_us {
                Some(0) => None,
                Some(us) => Some(us.saturating_mul(1_000)),
                None if p.lower_by_weight == Some(true) => {
                    Some(crate::sched::policy::priority::LOWER_QUEUE_NS_BY_WEIGHT)
                }
                None => base.lower_queue_ns_beside_high,
            },
            beside_other_contexts: p
                .beside_other_contexts
                .unwrap_or(base.beside_other_contexts),
            lower_by_weight: p.lower_by_weight.unwrap_or(base.lower_by_weight),
            gate_lower: p.gate.unwrap_or(base.gate_lower),
            ..base
        }
    }

    /// The fair policy's tunables: the file's `[fair]` over the defaults. Under
    /// `scheduler = "fair"` turns are 1 ms unless the file says otherwise: on the H200, one
    /// kernel at a time over all clients ran consolidated PyTorch programs at 4-6 % of FIFO's
    /// throughput with shares 29-64 % off the weights, 1 ms turns at 9-25 % within 3.2 %
    /// (docs/benchmarks.md). The same holds for FAIR within `priority`'s lower classes
    /// (`lower_by_weight`): one kernel at a time ran them at 5 % of FIFO's throughput.
    /// Under `scheduler = "fair"` clients within that quantum run side by side: 1.5-1.8 × the
    /// throughput of exclusive turns for 4-16 PyTorch programs with device-time shares within
    /// 1.7 % against turns' 1.8-9.4 % (run R4), with a 5 ms quantum unless the file sets one
    /// ([`FAIR_SIDE_QUANTUM_NS`]); priority's lower classes keep turns.
    pub fn fair_config(&self) -> crate::sched::FairConfig {
        use crate::sched::PolicyKind;
        let base = crate::sched::FairConfig::default();
        let f = &self.file.fair;
        // Side by side under `scheduler = "fair"` unless the file asks for one kernel at a time.
        let side_by_side = f.side_by_side.unwrap_or(
            base.side_by_side || (self.scheduler() == PolicyKind::Fair && f.quantum_us != Some(0)),
        );
        let quantum_ns = match (f.quantum_us, self.scheduler()) {
            (Some(us), _) => us.saturating_mul(1_000),
            (None, PolicyKind::Fair) if side_by_side => FAIR_SIDE_QUANTUM_NS,
            (None, PolicyKind::Fair | PolicyKind::Priority) => FAIR_QUANTUM_NS,
            (None, _) => base.quantum_ns,
        };
        crate::sched::FairConfig {
            quantum_ns,
            anticipate_ns: f
                .anticipate_us
                .map_or(base.anticipate_ns, |us| us.saturating_mul(1_000)),
            lag_ns: f.lag_us.map_or(base.lag_ns, |us| us.saturating_mul(1_000)),
            share_sms: f.share_sms.unwrap_or(base.share_sms),
            side_by_side,
            per_user: f.per_user.unwrap_or(base.per_user),
            // Off unless asked for: a program that waits for each small step, its kernels
            // queued on the device behind the others' work, is never hungry by its
            // estimates, and would no longer hold a busy program back (docs/benchmarks.md,
            // runs H8-H14).
            hungry_ns: f
                .hungry_us
                .map_or(base.hungry_ns, |us| us.saturating_mul(1_000)),
            waited_ns: f
                .waited_us
                .map_or(base.waited_ns, |us| us.saturating_mul(1_000)),
            bank_unused: f.bank_unused.unwrap_or(base.bank_unused),
            free_lead_ns: f
                .free_lead_us
                .map_or(base.free_lead_ns, |us| us.saturating_mul(1_000)),
            ..base
        }
    }

    /// Every policy's tunables the file sets.
    pub fn tunables(&self) -> crate::sched::Tunables {
        crate::sched::Tunables {
            priority: self.priority_config(),
            fair: self.fair_config(),
        }
    }
}

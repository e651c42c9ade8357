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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn priority_tunables_come_from_the_file_and_bad_ones_are_refused() {
        let p = Policy::parse(
            "scheduler = \"priority\"\n[priority]\nlower_sm_share = 0.5\nlower_depth = 1\nlower_queue_us = 0\nbeside_other_contexts = true\nlower_by_weight = true\n",
            "t.toml",
        )
        .expect("valid policy");
        let cfg = p.priority_config();
        assert_eq!(cfg.lower_sm_share, Some(0.5));
        assert_eq!(cfg.lower_depth_beside_high, Some(1));
        assert_eq!(cfg.lower_queue_ns_beside_high, None, "0: the depth alone");
        let by_weight = Policy::parse(
            "scheduler = \"priority\"\n[priority]\nlower_by_weight = true\n",
            "t.toml",
        )
        .expect("valid policy");
        assert_eq!(
            by_weight.priority_config().lower_queue_ns_beside_high,
            Some(100_000),
            "by weight, 100 µs unless the file says"
        );
        assert!(cfg.beside_other_contexts);
        assert!(cfg.lower_by_weight);
        let none = Policy::parse("", "t.toml").expect("empty policy is valid");
        assert_eq!(
            none.priority_config(),
            crate::sched::PriorityConfig::default()
        );
        assert!(
            none.priority_config().gate_lower,
            "gated unless the file says"
        );
        assert_eq!(none.priority_config().lower_depth_beside_high, Some(8));
        let ungated = Policy::parse("[priority]\ngate = false\n", "t.toml")
            .expect("valid policy")
            .priority_config();
        assert!(!ungated.gate_lower);
        assert_eq!(
            ungated.lower_depth_beside_high,
            Some(2),
            "without the gate, the shallow queue"
        );
        for bad in [
            "lower_sm_share = 0.0",
            "lower_sm_share = 1.5",
            "lower_depth = 0",
        ] {
            let e = Policy::parse(&format!("[priority]\n{bad}\n"), "t.toml")
                .expect_err("out-of-range tunable");
            assert!(e.to_string().contains("[priority]"), "{e}");
        }
    }

    #[test]
    fn the_fair_tunables_come_from_the_file() {
        let p = Policy::parse(
            "scheduler = \"fair\"\n[fair]\nquantum_us = 1500\nshare_sms = true\nside_by_side = true\n",
            "t.toml",
        )
        .expect("valid policy");
        assert_eq!(p.fair_config().quantum_ns, 1_500_000);
        assert!(p.fair_config().share_sms);
        assert!(p.fair_config().side_by_side);
        assert_eq!(p.tunables().fair, p.fair_config());
        let none = Policy::parse("", "t.toml").expect("empty policy is valid");
        assert_eq!(none.fair_config(), crate::sched::FairConfig::default());
        let fair = Policy::parse("scheduler = \"fair\"\n", "t.toml").expect("valid policy");
        assert_eq!(
            fair.fair_config().quantum_ns,
            5_000_000,
            "a 5 ms quantum side by side under fair"
        );
        assert!(fair.fair_config().side_by_side, "side by side under fair");
        let turns = Policy::parse(
            "scheduler = \"fair\"\n[fair]\nside_by_side = false\n",
            "t.toml",
        )
        .expect("valid policy");
        assert!(
            !turns.fair_config().side_by_side,
            "exclusive turns, asked for"
        );
        assert_eq!(turns.fair_config().quantum_ns, 1_000_000, "1 ms turns");
        assert!(
            !turns.fair_config().per_user,
            "shares by program unless asked"
        );
        let users = Policy::parse("scheduler = \"fair\"\n[fair]\nper_user = true\n", "t.toml")
            .expect("valid policy");
        assert!(users.fair_config().per_user, "shares by user, asked for");
        assert_eq!(users.fair_config().lag_ns, 20_000_000, "20 ms owed at most");
        let lag = Policy::parse("scheduler = \"fair\"\n[fair]\nlag_us = 100000\n", "t.toml")
            .expect("valid policy");
        assert_eq!(lag.fair_config().lag_ns, 100_000_000, "the lag asked for");
        let hungry = Policy::parse("scheduler = \"fair\"\n[fair]\nhungry_us = 300\n", "t.toml")
            .expect("valid policy");
        assert_eq!(
            hungry.fair_config().hungry_ns,
            300_000,
            "hungry as asked for"
        );
        assert_eq!(users.fair_config().hungry_ns, 0, "off unless asked for");
        let waited = Policy::parse(
            "scheduler = \"fair\"\n[fair]\nhungry_us = 1000\nwaited_us = 500\n",
            "t.toml",
        )
        .expect("valid policy");
        assert_eq!(
            (
                waited.fair_config().hungry_ns,
                waited.fair_config().waited_ns
            ),
            (1_000_000, 500_000),
            "waited as asked for"
        );
        assert_eq!(hungry.fair_config().waited_ns, 0, "off unless asked for");
        let level = Policy::parse(
            "scheduler = \"fair\"\n[fair]\nhungry_us = 1000\nbank_unused = false\n",
            "t.toml",
        )
        .expect("valid policy");
        assert!(!level.fair_config().bank_unused, "leveling as asked for");
        assert!(
            hungry.fair_config().bank_unused,
            "banking unless asked otherwise"
        );
        assert_eq!(
            hungry.fair_config().free_lead_ns,
            0,
            "always gated unless asked"
        );
        let free = Policy::parse(
            "scheduler = \"fair\"\n[fair]\nfree_lead_us = 500000\n",
            "t.toml",
        )
        .expect("valid policy");
        assert_eq!(free.fair_config().free_lead_ns, 500_000_000);
        let off = Policy::parse("scheduler = \"fair\"\n[fair]\nquantum_us = 0\n", "t.toml")
            .expect("valid policy");
        assert_eq!(
            off.fair_config().quantum_ns,
            0,
            "one kernel at a time, asked for"
        );
        assert!(
            !off.fair_config().side_by_side,
            "one kernel at a time is not side by side"
        );
        let lower = Policy::parse("scheduler = \"priority\"\n", "t.toml").expect("valid policy");
        assert_eq!(
            lower.fair_config().quantum_ns,
            1_000_000,
            "priority's lower classes by weight: 1 ms turns too"
        );
        assert!(!lower.fair_config().side_by_side, "exclusive turns there");
        Policy::parse("[fair]\nquantum = 3\n", "t.toml").expect_err("unknown key");
    }
}

//! The gates every policy shares: a client's queue head is a candidate only if its memory
//! was admitted, its stream has room, a best-effort head has rate tokens, and a client
//! partitioned below a deadline client fits its partition (or its pacer). Also when to poll
//! again for a head that waits on one of them.

use gpushare_protocol::PriorityClass;

use super::{ClientSpec, Dispatcher};

/// Values that change only with clients, class or outside load: computed once per call.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Context {
    pub(super) high_present: bool,
    /// Most important class among clients with a deadline.
    pub(super) deadline_class: Option<PriorityClass>,
    /// The rate limit is engaged (a high client is present, or outside load): its state
    /// carries on; it restarts from slow start when it engages.
    pub(super) limiter_engaged: bool,
    /// ...and binds now: high has work queued or in flight (or there is outside load). While
    /// high is idle best-effort runs free, as there is nothing to protect.
    pub(super) limiter_active: bool,
}

impl Dispatcher {
    /// Recomputes what changes only with clients and load, and catches the controllers up.
    pub(super) fn refresh_context(&mut self, now: u64) {
        let mut ctx = Context::default();
        let mut high_busy = false;
        for c in &self.clients {
            if c.spec.class == PriorityClass::High {
                ctx.high_present = true;
                high_busy |= !c.queue.is_empty() || !c.inflight.is_empty();
            }
            if c.spec.deadline.is_some() {
                ctx.deadline_class = Some(match ctx.deadline_class {
                    Some(d) => d.min(c.spec.class),
                    None => c.spec.class,
                });
            }
        }
        if let Some(r) = self.rate.as_mut() {
            r.advance(now);
            let outside = r.outside_load() > 0.0;
            ctx.limiter_engaged = ctx.high_present || outside;
            ctx.limiter_active = high_busy || outside;
            if ctx.limiter_engaged && !self.ctx.limiter_engaged {
                r.restart(now);
            }
        }
        self.deadline.set_active(ctx.deadline_class.is_some());
        self.deadline.advance(now);
        self.pacer.refill(now, self.pacing_rate());
        self.ctx = ctx;
    }

    /// Whether partitioned clients are paced (the device cannot partition SMs, and their
    /// share is below the whole device).
    pub(super) fn pacing(&self) -> bool {
        !self.device.sm_partitions && self.deadline.share() < 1.0
    }

    /// SM-ns per ns the partitioned clients may use together.
    pub(super) fn pacing_rate(&self) -> f64 {
        self.deadline.share() * f64::from(self.device.sms)
    }

    /// Partitioned below a deadline client: no deadline of its own, class not above it.
    pub(super) fn is_restricted(ctx: &Context, spec: &ClientSpec) -> bool {
        match ctx.deadline_class {
            Some(d) => spec.deadline.is_none() && spec.class >= d,
            None => false,
        }
    }

    pub(super) fn compute_eligible(&mut self) {
        let depth = self.cfg.max_inflight_per_client.max(1) as usize;
        let cap = self.deadline.cap_sms();
        let paced = self.pacing() && !self.pacer.ready();
        self.waiting_tokens = false;
        self.waiting_partition = false;
        self.waiting_pacer = false;
        for (i, c) in self.clients.iter().enumerate() {
            let Some(head) = c.queue.front() else {
                self.eligible[i] = false;
                continue;
            };
            let mut ok = c.admitted && c.inflight.len() < depth;
            if ok && Self::is_restricted(&self.ctx, &c.spec) {
                let need = head.profile.sm_need.min(cap);
                if self.restricted_count > 0 && self.restricted_sms + need > cap {
                    ok = false;
                    self.waiting_partition = true;
                } else if paced {
                    ok = false;
                    self.waiting_pacer = true;
                }
            }
            if ok
                && c.spec.class == PriorityClass::BestEffort
                && self.ctx.limiter_active
                && let Some(r) = &self.rate
                && !r.ready(head.profile.key.blocks)
            {
                ok = false;
                self.waiting_tokens = true;
            }
            self.eligible[i] = ok;
        }
    }

    /// When to `poll` again although nothing was submitted or completed: a best-effort head
    /// waiting for tokens, or a partitioned one for the partition to grow. `None`: only
    /// submissions and completions change anything now.
    pub fn next_wakeup(&self) -> Option<u64> {
        let mut at: Option<u64> = None;
        let mut consider = |t: u64| at = Some(at.map_or(t, |a| a.min(t)));
        if self.waiting_tokens
            && let Some(r) = &self.rate
        {
            for c in &self.clients {
                if c.spec.class == PriorityClass::BestEffort
                    && c.admitted
                    && let Some(h) = c.queue.front()
                    && !r.ready(h.profile.key.blocks)
                {
                    consider(r.ready_at(h.profile.key.blocks, self.last_now));
                }
            }
            // The rate may grow at the period's end.
            consider(r.next_period_at());
        }
        if self.waiting_partition {
            consider(self.deadline.next_period_at());
        }
        if self.waiting_pacer {
            consider(self.pacer.ready_at(self.pacing_rate()));
            // The share may grow at the period's end.
            consider(self.deadline.next_period_at());
        }
        // A policy's timer that has come was there for the last poll to act on; a poll now
        // could change nothing more (the simulator stepped 1 ns at a time for ever on one:
        // SRTF's grace after an iteration, with nobody else waiting).
        if let Some(t) = self.policy.next_wakeup().filter(|&t| t > self.last_now) {
            consider(t);
        }
        at.map(|t| t.max(self.last_now + 1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sched::simulate::kernel;
    use crate::sched::{Bound, DeadlineSpec, DeviceShape, PolicyKind, SchedConfig};

    fn spec(id: u64, class: PriorityClass, deadline: bool) -> ClientSpec {
        ClientSpec {
            deadline: deadline.then_some(DeadlineSpec {
                period_ns: 10_000_000,
                deadline_ns: 8_000_000,
            }),
            ..ClientSpec::new(id, class, 1)
        }
    }

    #[test]
    fn clients_below_a_deadline_client_are_partitioned_and_others_are_not() {
        let none = Context::default();
        assert!(!Dispatcher::is_restricted(
            &none,
            &spec(1, PriorityClass::BestEffort, false)
        ));
        let below_normal = Context {
            deadline_class: Some(PriorityClass::Normal),
            ..Context::default()
        };
        for (class, deadline, restricted) in [
            (PriorityClass::High, false, false),
            (PriorityClass::Normal, false, true),
            (PriorityClass::BestEffort, false, true),
            (PriorityClass::Normal, true, false),
            (PriorityClass::BestEffort, true, false),
        ] {
            assert_eq!(
                Dispatcher::is_restricted(&below_normal, &spec(1, class, deadline)),
                restricted,
                "{class} with deadline {deadline}"
            );
        }
    }

    #[test]
    fn the_rate_limit_engages_with_a_high_client_and_binds_while_it_has_work() {
        let device = DeviceShape {
            sms: 132,
            sm_partitions: true,
        };
        let mut d = Dispatcher::with_config(PolicyKind::Fifo, device, SchedConfig::default());
        d.add_client(spec(1, PriorityClass::BestEffort, false))
            .expect("registers");
        assert!(!d.ctx.limiter_engaged && !d.ctx.limiter_active);
        d.add_client(spec(2, PriorityClass::High, false))
            .expect("registers");
        assert!(d.ctx.high_present && d.ctx.limiter_engaged);
        assert!(
            !d.ctx.limiter_active,
            "an idle high client protects nothing"
        );
        d.submit(2, kernel(1, 10, 4, Bound::Compute), 1)
            .expect("submits");
        d.refresh_context(2);
        assert!(d.ctx.limiter_active);
    }

    #[test]
    fn the_partition_follows_the_most_important_deadline_client() {
        let device = DeviceShape {
            sms: 132,
            sm_partitions: false,
        };
        let mut d = Dispatcher::with_config(PolicyKind::Fifo, device, SchedConfig::default());
        d.add_client(spec(1, PriorityClass::BestEffort, true))
            .expect("registers");
        d.add_client(spec(2, PriorityClass::Normal, true))
            .expect("registers");
        d.add_client(spec(3, PriorityClass::BestEffort, false))
            .expect("registers");
        assert_eq!(d.ctx.deadline_class, Some(PriorityClass::Normal));
        d.remove_client(2).expect("removes");
        assert_eq!(d.ctx.deadline_class, Some(PriorityClass::BestEffort));
        d.remove_client(1).expect("removes");
        assert_eq!(d.ctx.deadline_class, None);
        assert!(
            !d.pacing(),
            "nobody is partitioned without a deadline client"
        );
    }
}

//! SM partitions for clients with deadlines, after CudaMon's AIMD controller.
//!
//! Clients that declare a deadline report each iteration's latency. While one is present,
//! the clients ranked below it (no deadline of their own, class not above the deadline
//! client's) share a partition of `share × sms` SMs. A deadline miss cuts the share
//! multiplicatively (once per control period, however many misses it saw); every period
//! without a miss grows it by a fixed step. The controller remembers the share that missed
//! and, for `probe_after` periods, grows only to one step below it, so the misses stop
//! instead of recurring every sawtooth; after that it probes upward again, in case the
//! deadline client's needs shrank. With no deadline client the share grows back to the whole
//! device, step by step.
//!
//! The floor is `min_sms` SMs (8 by default: Hopper's green contexts split SMs in groups of
//! 8), so partitioned work always progresses. The dispatcher keeps the partitioned clients'
//! SMs in flight within `cap_sms()` and tells the device layer the cap with each grant; on
//! CUDA the kernel then runs on a green context of that size (`device/cuda/partition.rs`).
//!
//! Where the device cannot partition SMs (no green contexts), rate control holds them
//! instead ([`SharePacer`]): the partitioned clients' kernels are paced so that together they
//! use no more than `share` of the device's SM-time, which is what a partition of that size
//! would let them use. Their kernels then run on the whole device, a fraction of the time.

/// Tunables of the controller.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DeadlineConfig {
    pub period_ns: u64,
    /// Multiplicative decrease on a miss.
    pub decrease: f64,
    /// Share added per period without a miss.
    pub increase: f64,
    /// The partition never shrinks below this many SMs.
    pub min_sms: u32,
    /// Periods the share that missed is remembered as a ceiling.
    pub probe_after: u64,
}

impl Default for DeadlineConfig {
    fn default() -> Self {
        DeadlineConfig {
            period_ns: 10_000_000,
            decrease: 0.5,
            increase: 1.0 / 16.0,
            min_sms: 8,
            probe_after: 100,
        }
    }
}

/// The AIMD controller over the partitioned clients' SM share.
#[derive(Debug, Clone)]
pub struct DeadlineController {
    cfg: DeadlineConfig,
    sms: u32,
    share: f64,
    period_start: u64,
    missed: bool,
    /// Share that missed, and the periods it still caps growth for.
    ceiling: Option<(f64, u64)>,
}

impl DeadlineController {
    pub fn new(cfg: DeadlineConfig, sms: u32, now: u64) -> DeadlineController {
        DeadlineController {
            cfg,
            sms: sms.max(1),
            share: 1.0,
            period_start: now,
            missed: false,
            ceiling: None,
        }
    }

    fn floor(&self) -> f64 {
        (self.cfg.min_sms.clamp(1, self.sms) as f64 / self.sms as f64).min(1.0)
    }

    /// Whether any deadline client is present; without one the ceiling is forgotten.
    pub fn set_active(&mut self, active: bool) {
        if !active {
            self.ceiling = None;
        }
    }

    /// Closes the periods that ended by `now`.
    pub fn advance(&mut self, now: u64) {
        let period = self.cfg.period_ns.max(1);
        if now < self.period_start + period {
            return;
        }
        let elapsed = (now - self.period_start) / period;
        self.period_start += elapsed * period;
        // The period holding a miss grows nothing; the rest each add a step.
        let mut grow = elapsed;
        if std::mem::take(&mut self.missed) {
            grow -= 1;
        }
        if let Some((level, left)) = self.ceiling {
            self.ceiling = (left > elapsed).then(|| (level, left - elapsed));
        }
        let limit = match self.ceiling {
            Some((level, _)) => (level - self.cfg.increase).max(self.share),
            None => 1.0,
        };
        let grown = self.share + grow as f64 * self.cfg.increase;
        self.share = grown.min(limit).min(1.0);
    }

    /// A deadline client's iteration missed its deadline at `now`.
    pub fn report_miss(&mut self, now: u64) {
        self.advance(now);
        if self.missed {
            return; // one cut per period
        }
        self.missed = true;
        self.ceiling = Some((self.share, self.cfg.probe_after));
        self.share = (self.share * self.cfg.decrease).max(self.floor());
    }

    /// The partitioned clients' share of the device's SMs.
    pub fn share(&self) -> f64 {
        self.share
    }

    /// The partition size in SMs.
    pub fn cap_sms(&self) -> u32 {
        let sms = (self.share * self.sms as f64).floor() as u32;
        sms.clamp(self.cfg.min_sms.clamp(1, self.sms), self.sms)
    }

    /// End of the current period (when the share may grow next).
    pub fn next_period_at(&self) -> u64 {
        self.period_start.saturating_add(self.cfg.period_ns.max(1))
    }
}

/// Rate control for partitioned clients on a device without SM partitions: a pacer over
/// SM-time. A kernel costs its expected duration times the SMs it occupies; the budget
/// refills at `share × sms` SM-ns per ns and never banks more than nothing, so unused share is
/// not saved up for a burst later. A kernel may start while the budget is not negative (one
/// always can, after a wait), and its cost may take it below zero.
#[derive(Debug, Clone, Copy, Default)]
pub struct SharePacer {
    /// SM-ns available (negative: owed).
    budget: f64,
    last: u64,
}

impl SharePacer {
    /// Refills for the time since the last call, at `rate` SM-ns per ns.
    pub fn refill(&mut self, now: u64, rate: f64) {
        let dt = now.saturating_sub(self.last) as f64;
        self.last = self.last.max(now);
        self.budget = (self.budget + dt * rate).min(0.0);
    }

    pub fn ready(&self) -> bool {
        self.budget >= 0.0
    }

    /// Charges a granted kernel.
    pub fn take(&mut self, sm_ns: f64) {
        self.budget -= sm_ns;
    }

    /// When the budget is back to zero at `rate`.
    pub fn ready_at(&self, rate: f64) -> u64 {
        if self.ready() || rate <= 0.0 {
            return self.last;
        }
        self.last
            .saturating_add((-self.budget / rate).ceil() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pacer_holds_kernels_to_their_share_of_sm_time_and_banks_nothing() {
        // 1 ms whole-GPU kernels at a quarter share: one may start every 4 ms.
        let (sms, share) = (132.0, 0.25);
        let rate = share * sms;
        let cost = 1_000_000.0 * sms;
        let mut p = SharePacer::default();
        p.refill(0, rate);
        assert!(p.ready());
        p.take(cost);
        p.refill(3_999_999, rate);
        assert!(!p.ready());
        assert_eq!(p.ready_at(rate), 4_000_000);
        p.refill(4_000_000, rate);
        assert!(p.ready());
        // Idle for a second: still one kernel, then the wait again.
        p.refill(1_004_000_000, rate);
        p.take(cost);
        p.refill(1_004_000_001, rate);
        assert!(!p.ready());
    }

    const P: u64 = 10_000_000;

    #[test]
    fn a_miss_halves_once_per_period_and_quiet_periods_grow_it() {
        let mut d = DeadlineController::new(DeadlineConfig::default(), 128, 0);
        d.set_active(true);
        d.report_miss(1);
        d.report_miss(2);
        assert_eq!(d.share(), 0.5);
        assert_eq!(d.cap_sms(), 64);
        d.report_miss(P + 1);
        assert_eq!(d.share(), 0.25);
        // Grows back to one step below the last share that missed (0.5), and holds there.
        d.advance(P * 30);
        assert_eq!(d.share(), 0.5 - 1.0 / 16.0);
        // After probe_after periods the ceiling expires and growth resumes.
        d.advance(P * 140);
        assert_eq!(d.share(), 1.0);
    }

    #[test]
    fn the_floor_is_min_sms_and_the_share_recovers_when_deadlines_leave() {
        let mut d = DeadlineController::new(DeadlineConfig::default(), 132, 0);
        d.set_active(true);
        for i in 0..10 {
            d.report_miss(i * P);
        }
        assert_eq!(d.cap_sms(), 8);
        d.set_active(false);
        d.advance(20 * P);
        assert!(d.share() > 0.5);
        d.advance(40 * P);
        assert_eq!(d.share(), 1.0);
        assert_eq!(d.cap_sms(), 132);
    }
}

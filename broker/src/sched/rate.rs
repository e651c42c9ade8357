//! Rate control for opportunistic (best-effort) clients, after TGS (NSDI'23).
//!
//! TGS lets an opportunistic job use what a production job leaves of the GPU by limiting the
//! opportunistic job's kernel launch rate and adapting that limit like TCP's congestion
//! window. Here the limit is a token bucket on thread-block launches (a kernel of `b` blocks
//! takes `b` tokens), shared by all best-effort clients because it is their sum that hurts.
//!
//! Each control period the controller compares the high-priority clients' observed
//! throughput with their solo throughput (`observe_high`, or, automatically, `Σ solo estimate
//! ÷ Σ measured time` of their kernels). Below `(1 − tolerance)` of solo is congestion:
//! multiplicative decrease. Otherwise the rate grows — doubling per period until the first
//! congestion (slow start), then by a fixed step (additive increase, the step a fraction of
//! the rate at the last decrease). It grows only in periods where the bucket actually held
//! best-effort work back, so an idle limit does not inflate; with no signal it holds.
//! Outside load (GPU processes that bypass the broker) shrinks the allowance at once:
//! `allowance = max(min_rate, rate × (1 − busy))`.

/// Tunables of the controller.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateConfig {
    /// Blocks/s a best-effort client starts at when the limit engages.
    pub initial_bps: f64,
    /// Never below: opportunistic work always makes some progress.
    pub min_bps: f64,
    pub max_bps: f64,
    pub period_ns: u64,
    /// High-priority throughput may fall this fraction below solo before it counts.
    pub tolerance: f64,
    /// Multiplicative decrease factor.
    pub decrease: f64,
    /// Additive step per period, as a fraction of the rate just before the last decrease.
    pub increase_frac: f64,
    pub slow_start_factor: f64,
    /// Bucket depth, as time at the current allowance.
    pub burst_ns: u64,
}

impl Default for RateConfig {
    fn default() -> Self {
        RateConfig {
            initial_bps: 20_000.0,
            min_bps: 1_000.0,
            max_bps: 1e12,
            period_ns: 20_000_000,
            tolerance: 0.05,
            decrease: 0.7,
            increase_frac: 0.05,
            slow_start_factor: 2.0,
            burst_ns: 2_000_000,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    SlowStart,
    Aimd,
}

/// The TGS-style controller and the token bucket it drives.
#[derive(Debug, Clone)]
pub struct RateController {
    cfg: RateConfig,
    rate: f64,
    phase: Phase,
    step: f64,
    outside: f64,
    tokens: f64,
    refilled_at: u64,
    period_start: u64,
    explicit: Option<f64>,
    est_sum: f64,
    meas_sum: f64,
    limited: bool,
    decreases: u64,
}

impl RateController {
    pub fn new(cfg: RateConfig, now: u64) -> RateController {
        let mut r = RateController {
            cfg,
            rate: cfg.initial_bps,
            phase: Phase::SlowStart,
            step: 0.0,
            outside: 0.0,
            tokens: 0.0,
            refilled_at: now,
            period_start: now,
            explicit: None,
            est_sum: 0.0,
            meas_sum: 0.0,
            limited: false,
            decreases: 0,
        };
        r.restart(now);
        r
    }

    /// Back to slow start from the initial rate (when the limit engages again).
    pub fn restart(&mut self, now: u64) {
        self.rate = self
            .cfg
            .initial_bps
            .clamp(self.cfg.min_bps, self.cfg.max_bps);
        self.phase = Phase::SlowStart;
        self.step = 0.0;
        self.tokens = self.burst();
        self.refilled_at = now;
        self.period_start = now;
        self.clear_signal();
    }

    fn clear_signal(&mut self) {
        self.explicit = None;
        self.est_sum = 0.0;
        self.meas_sum = 0.0;
        self.limited = false;
    }

    /// High-priority throughput observed this period against its solo throughput (any unit,
    /// the same for both). Takes precedence over the automatic samples.
    pub fn observe_high(&mut self, rate: f64, solo_rate: f64) {
        if solo_rate > 0.0 && rate.is_finite() && rate >= 0.0 {
            self.explicit = Some(rate / solo_rate);
        }
    }

    /// One completed high-priority kernel: its solo estimate and its measured time.
    pub fn sample_high(&mut self, est_ns: u64, measured_ns: u64) {
        if est_ns > 0 && measured_ns > 0 {
            self.est_sum += est_ns as f64;
            self.meas_sum += measured_ns as f64;
        }
    }

    /// Fraction of the GPU busy with work outside the broker, 0..=1.
    pub fn set_outside_load(&mut self, busy: f64) {
        self.outside = if busy.is_finite() {
            busy.clamp(0.0, 1.0)
        } else {
            0.0
        };
    }

    pub fn outside_load(&self) -> f64 {
        self.outside
    }

    /// Best-effort work was held back for lack of tokens this period (the limit binds).
    pub fn note_limited(&mut self) {
        self.limited = true;
    }

    /// Refills the bucket and closes the control periods that ended by `now`.
    pub fn advance(&mut self, now: u64) {
        if now > self.refilled_at {
            let dt = (now - self.refilled_at) as f64 / 1e9;
            self.tokens = (self.tokens + self.allowance() * dt).min(self.burst());
            self.refilled_at = now;
        }
        let period = self.cfg.period_ns.max(1);
        if now >= self.period_start + period {
            self.close_period();
            // Later whole periods had no samples: the rate holds through them.
            self.period_start = now - (now - self.period_start) % period;
        }
    }

    fn close_period(&mut self) {
        let ratio = self
            .explicit
            .or_else(|| (self.meas_sum > 0.0).then(|| (self.est_sum / self.meas_sum).min(1.0)));
        let limited = self.limited;
        self.clear_signal();
        let Some(ratio) = ratio else { return };
        let c = self.cfg;
        if ratio < 1.0 - c.tolerance {
            self.step = (self.rate * c.increase_frac).max(c.min_bps * c.increase_frac);
            self.rate = (self.rate * c.decrease).max(c.min_bps);
            self.phase = Phase::Aimd;
            self.decreases += 1;
        } else if limited {
            self.rate = match self.phase {
                Phase::SlowStart => self.rate * c.slow_start_factor,
                Phase::Aimd => self.rate + self.step,
            }
            .min(c.max_bps);
        }
    }

    /// The controlled rate, blocks/s, before outside load.
    pub fn rate(&self) -> f64 {
        self.rate
    }

    #[cfg(test)]
    pub fn phase(&self) -> Phase {
        self.phase
    }

    #[cfg(test)]
    pub fn decreases(&self) -> u64 {
        self.decreases
    }

    /// The rate best-effort clients may launch at now, blocks/s.
    pub fn allowance(&self) -> f64 {
        (self.rate * (1.0 - self.outside)).max(self.cfg.min_bps)
    }

    fn burst(&self) -> f64 {
        (self.allowance() * self.cfg.burst_ns as f64 / 1e9).max(1.0)
    }

    /// Tokens a kernel of `blocks` must find in the bucket: a grid larger than the bucket
    /// needs a full bucket and leaves it in debt, so the average rate still holds.
    fn need(&self, blocks: u32) -> f64 {
        (blocks.max(1) as f64).min(self.burst())
    }

    pub fn ready(&self, blocks: u32) -> bool {
        self.tokens >= self.need(blocks)
    }

    pub fn take(&mut self, blocks: u32) {
        self.tokens -= blocks.max(1) as f64;
    }

    /// When a kernel of `blocks` will find its tokens (`now` if it does already).
    pub fn ready_at(&self, blocks: u32, now: u64) -> u64 {
        let missing = self.need(blocks) - self.tokens;
        if missing <= 0.0 {
            return now;
        }
        let ns = (missing / self.allowance() * 1e9).ceil();
        now.saturating_add(ns.min(u64::MAX as f64) as u64)
            .max(now + 1)
    }

    /// End of the current control period (when the rate may change next).
    pub fn next_period_at(&self) -> u64 {
        self.period_start.saturating_add(self.cfg.period_ns.max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A toy plant: the high-priority job keeps its solo rate while best-effort launches stay
    /// under `capacity` blocks/s and degrades as `capacity / rate` above it. Runs `periods`
    /// control periods with best-effort demand always above the limit; returns the rate at
    /// the end of every period.
    fn drive(r: &mut RateController, capacity: impl Fn(usize) -> f64, periods: usize) -> Vec<f64> {
        let p = r.cfg.period_ns;
        let mut rates = Vec::new();
        for i in 0..periods {
            let start = (i as u64) * p;
            r.note_limited();
            let c = capacity(i);
            let used = r.allowance();
            let high = if used <= c { 1.0 } else { c / used };
            r.observe_high(100.0 * high, 100.0);
            r.advance(start + p);
            rates.push(r.rate());
        }
        rates
    }

    #[test]
    fn converges_near_the_capacity_that_keeps_high_at_solo() {
        let cfg = RateConfig::default();
        let mut r = RateController::new(cfg, 0);
        let capacity = 1_000_000.0;
        // Congestion is declared once high falls under (1 − tolerance): at capacity / 0.95.
        let knee = capacity / (1.0 - cfg.tolerance);
        let rates = drive(&mut r, |_| capacity, 400);
        let steady = &rates[200..];
        let mean = steady.iter().sum::<f64>() / steady.len() as f64;
        let max = steady.iter().cloned().fold(0.0, f64::max);
        let min = steady.iter().cloned().fold(f64::MAX, f64::min);
        println!(
            "rate control: steady mean {:.3}, min {:.3}, max {:.3} of the knee ({} decreases)",
            mean / knee,
            min / knee,
            max / knee,
            r.decreases()
        );
        assert_eq!(r.phase(), Phase::Aimd);
        // Sawtooth between decrease × knee and one step above the knee.
        assert!(max <= knee * (1.0 + 2.0 * cfg.increase_frac), "{max}");
        assert!(
            min >= knee * cfg.decrease * (1.0 - cfg.increase_frac),
            "{min}"
        );
        assert!((mean / knee - 1.0).abs() < 0.2, "{mean}");
    }

    #[test]
    fn backs_off_when_high_slows_or_outside_load_appears() {
        let cfg = RateConfig::default();
        let mut r = RateController::new(cfg, 0);
        let rates = drive(&mut r, |i| if i < 150 { 1e6 } else { 2e5 }, 200);
        let before = rates[149];
        // Within a few periods of the drop the rate is under the new knee.
        let knee = 2e5 / (1.0 - cfg.tolerance);
        let after = rates[155];
        println!(
            "rate control: {before:.0} blocks/s before high's drop, {after:.0} five periods after"
        );
        assert!(after <= knee * (1.0 + 2.0 * cfg.increase_frac), "{after}");
        let a = r.allowance();
        r.set_outside_load(0.5);
        assert!((r.allowance() - a * 0.5).abs() < 1e-6 * a);
        r.set_outside_load(1.0);
        assert_eq!(r.allowance(), cfg.min_bps);
    }

    #[test]
    fn holds_without_a_signal_and_grows_only_when_the_limit_binds() {
        let mut r = RateController::new(RateConfig::default(), 0);
        let p = RateConfig::default().period_ns;
        r.advance(p * 10);
        assert_eq!(r.rate(), 20_000.0);
        r.observe_high(1.0, 1.0); // high is fine, but best-effort never hit the limit
        r.advance(p * 11);
        assert_eq!(r.rate(), 20_000.0);
        r.observe_high(1.0, 1.0);
        r.note_limited();
        r.advance(p * 12);
        assert_eq!(r.rate(), 40_000.0);
    }

    #[test]
    fn the_bucket_paces_launches() {
        let cfg = RateConfig {
            initial_bps: 1_000_000.0,
            ..RateConfig::default()
        };
        let mut r = RateController::new(cfg, 0);
        // A full bucket: 2 ms at 1 M blocks/s = 2000 blocks.
        assert!(r.ready(1_500));
        r.take(1_500);
        assert!(!r.ready(1_000));
        let at = r.ready_at(1_000, 0);
        assert_eq!(at, 500_000);
        r.advance(at);
        assert!(r.ready(1_000));
        // A grid bigger than the bucket waits for a full bucket and leaves it in debt.
        r.take(1_000);
        let at = r.ready_at(100_000, at);
        r.advance(at);
        assert!(r.ready(100_000));
        r.take(100_000);
        assert!(r.ready_at(1, at) >= at + 98_000_000);
    }
}

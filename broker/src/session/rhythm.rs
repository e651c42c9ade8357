//! How long a data thread spins for its client's next request: as long as that client's recent
//! requests took to come, when they came close together. A JAX step leaves the ring empty
//! about 90 µs (the GPU's work and a host function); spinning the fixed 50 µs, the data
//! thread and the worker slept and were woken every step (docs/benchmarks.md, run M1).

use std::time::Duration;

/// Gaps remembered.
const KEPT: usize = 16;
/// Gaps needed before the spin follows them.
const ENOUGH: usize = 4;
/// The spin is a whole number of these, so that a steady client's spin stays put (each
/// change is told to the device worker).
const STEP: Duration = Duration::from_micros(50);

/// The last gaps between a batch's end and the next request, and the spin they call for.
#[derive(Debug)]
pub(super) struct Rhythm {
    gaps: [Duration; KEPT],
    next: usize,
    seen: usize,
    base: Duration,
    ceiling: Duration,
    spin: Duration,
}

impl Rhythm {
    /// Spins `base` until the gaps say otherwise, and never more than `ceiling`.
    pub(super) fn new(base: Duration, ceiling: Duration) -> Rhythm {
        Rhythm {
            gaps: [Duration::ZERO; KEPT],
            next: 0,
            seen: 0,
            base,
            ceiling,
            spin: base,
        }
    }

    /// Notes how long the ring stayed empty before a request came.
    pub(super) fn note(&mut self, gap: Duration) {
        self.gaps[self.next] = gap;
        self.next = (self.next + 1) % KEPT;
        self.seen = (self.seen + 1).min(KEPT);
        self.spin = self.follow();
    }

    /// How long to spin now.
    pub(super) fn spin(&self) -> Duration {
        self.spin
    }

    /// The spin that would have caught three in four of the recent requests that a base spin
    /// slept through, with a quarter more to spare, in steps of 50 µs; the base when there
    /// are too few of them, or when they came further apart than the ceiling (spinning would
    /// mostly burn it for nothing). Requests that came within the base spin say nothing:
    /// a step of several batches has short gaps and one long one.
    fn follow(&self) -> Duration {
        let mut long = [Duration::ZERO; KEPT];
        let mut n = 0;
        for &g in &self.gaps[..self.seen] {
            if g > self.base {
                long[n] = g;
                n += 1;
            }
        }
        if n < ENOUGH {
            return self.base;
        }
        let long = &mut long[..n];
        long.sort_unstable();
        let q = long[(n * 3).div_ceil(4) - 1];
        let steps = q.saturating_add(q / 4).as_nanos().div_ceil(STEP.as_nanos());
        let want = STEP.saturating_mul(u32::try_from(steps).unwrap_or(u32::MAX));
        if want <= self.base || want > self.ceiling {
            self.base
        } else {
            want
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: Duration = Duration::from_micros(50);
    const CEILING: Duration = Duration::from_micros(500);

    fn rhythm(gaps_us: &[u64]) -> Rhythm {
        rhythm_within(gaps_us, CEILING)
    }

    fn rhythm_within(gaps_us: &[u64], ceiling: Duration) -> Rhythm {
        let mut r = Rhythm::new(BASE, ceiling);
        for &g in gaps_us {
            r.note(Duration::from_micros(g));
        }
        r
    }

    #[test]
    fn a_new_client_gets_the_base_spin() {
        assert_eq!(rhythm(&[]).spin(), BASE);
        assert_eq!(rhythm(&[90, 90, 90]).spin(), BASE);
    }

    #[test]
    fn a_step_loop_s_gap_is_waited_out_with_room() {
        // 90 µs gaps: 112.5 µs, rounded up to 150.
        let r = rhythm(&[90; 8]);
        assert_eq!(r.spin(), Duration::from_micros(150));
    }

    #[test]
    fn requests_closer_than_the_base_keep_the_base() {
        assert_eq!(rhythm(&[5; 16]).spin(), BASE);
    }

    #[test]
    fn short_gaps_inside_a_step_do_not_hide_its_long_one() {
        // Four batches a step: three a few µs apart, then 90 µs.
        let r = rhythm(&[3, 4, 2, 90, 3, 4, 2, 90, 3, 4, 2, 90, 3, 4, 2, 90]);
        assert_eq!(r.spin(), Duration::from_micros(150));
    }

    #[test]
    fn think_time_beyond_the_ceiling_is_not_spun_for() {
        // A client 2 ms apart (gpushare-demo cost) and an idle one.
        assert_eq!(rhythm(&[2_000; 16]).spin(), BASE);
        assert_eq!(rhythm(&[10_000_000; 16]).spin(), BASE);
    }

    #[test]
    fn one_late_request_in_four_does_not_lengthen_the_spin() {
        let r = rhythm(&[90, 90, 90, 5_000, 90, 90, 90, 5_000]);
        assert_eq!(r.spin(), Duration::from_micros(150));
    }

    #[test]
    fn the_spin_follows_the_client_when_its_rhythm_changes() {
        let mut r = rhythm(&[90; 16]);
        for _ in 0..16 {
            r.note(Duration::from_millis(3));
        }
        assert_eq!(r.spin(), BASE);
    }

    #[test]
    fn a_ceiling_at_the_base_turns_it_off() {
        assert_eq!(rhythm_within(&[90; 16], BASE).spin(), BASE);
    }
}

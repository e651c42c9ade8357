//! CLOCK_MONOTONIC in nanoseconds: the clock the broker's grants and telemetry speak, and the
//! one traces of several processes can be lined up on.

/// Now, in CLOCK_MONOTONIC nanoseconds.
pub fn monotonic_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).map_or(0, |t| {
        (t.tv_sec() as u64)
            .saturating_mul(1_000_000_000)
            .saturating_add(t.tv_nsec() as u64)
    })
}

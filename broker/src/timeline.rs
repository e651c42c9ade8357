//! `GPUSHARE_TIMELINE=1`: each client command gpushared's data threads run and each call a
//! device runs, one line each on stderr: `timeline: data|device t=<µs> <what> <µs it took>`,
//! `t` on CLOCK_MONOTONIC, the clock of the client driver's `GPUSHARE_CUDA_TRACE=3`, so that a
//! program's calls and their way through gpushared and its device worker line up (that is how
//! a JAX step's lost 120 µs were found, docs/consolidated.md). Lines are kept in memory and
//! written in blocks, and when gpushared or a worker ends, so that writing them hardly moves
//! the times they show. Off, it costs one relaxed load per command and call.

use std::fmt::{Debug, Write as _};
use std::sync::OnceLock;

use gpushare_protocol::timed::TimedLines;
use gpushare_protocol::wake::monotonic_ns;

/// The environment variable that turns it on (any value but empty or `0`).
pub const TIMELINE_ENV: &str = "GPUSHARE_TIMELINE";

static LINES: TimedLines = TimedLines::new();

fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os(TIMELINE_ENV).is_some_and(|v| !v.is_empty() && v != "0"))
}

/// When something to be noted begins: `None` when the timeline is off.
#[inline]
pub fn begin() -> Option<u64> {
    enabled().then(monotonic_ns)
}

/// Notes `what` (its variant's name), begun at `began` (from [`begin`]), by `who`.
pub fn note(who: &str, what: &dyn Debug, began: Option<u64>) {
    let Some(began) = began else { return };
    let took = monotonic_ns().saturating_sub(began);
    let name = format!("{what:?}");
    let name = name.split([' ', '{', '(']).next().unwrap_or_default();
    LINES.line(|l| {
        let _ = write!(
            l,
            "timeline: {who} t={:.3} {name} {:.3}",
            began as f64 / 1e3,
            took as f64 / 1e3
        );
    });
}

/// Writes what is kept (gpushared and its workers call this as they end).
pub fn flush() {
    if enabled() {
        LINES.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_noted_call_is_its_variant_s_name_and_times() {
        #[allow(dead_code)]
        #[derive(Debug)]
        enum Call {
            LaunchGraph { stream: u32 },
        }
        // Off unless the environment says so: nothing is kept.
        if !enabled() {
            note("device", &Call::LaunchGraph { stream: 1 }, begin());
            assert!(LINES.take().is_empty());
            note("device", &Call::LaunchGraph { stream: 1 }, Some(1_500));
            let line = LINES.take();
            assert!(
                line.starts_with("timeline: device t=1.500 LaunchGraph "),
                "{line}"
            );
        }
    }
}

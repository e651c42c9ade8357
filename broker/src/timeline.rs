//! `GPUSHARE_TIMELINE=1`: each client command gpushared's data threads run and each call a
//! device runs, one line each on stderr:
//! `timeline: data|device t=<µs> <what> <µs it took> tid=<thread id>`, `t` on
//! CLOCK_MONOTONIC, the clock of the client driver's `GPUSHARE_CUDA_TRACE=3`, so that a
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
    let mut name = Name::default();
    // Formatting stops at the variant's name: a whole call's fields cost more than the gaps
    // the timeline is read for.
    let _ = write!(name, "{what:?}");
    line(who, began, name.as_str(), took);
}

/// Notes that `who` got to `what` (a point in time, written with a duration of 0), for where
/// a call's time goes between the notes of whole commands and calls.
#[inline]
pub fn point(who: &str, what: &'static str) {
    if enabled() {
        line(who, monotonic_ns(), what, 0);
    }
}

fn line(who: &str, at_ns: u64, what: &str, took_ns: u64) {
    thread_local! {
        // SAFETY: gettid has no preconditions and touches no memory of ours.
        static TID: i32 = unsafe { libc::gettid() };
    }
    let tid = TID.with(|t| *t);
    LINES.line(|l| {
        let _ = write!(
            l,
            "timeline: {who} t={}.{:03} {what} {}.{:03} tid={tid}",
            at_ns / 1_000,
            at_ns % 1_000,
            took_ns / 1_000,
            took_ns % 1_000
        );
    });
}

/// The start of a `Debug` text up to its first space, brace or parenthesis (a variant's
/// name); writing stops there.
#[derive(Default)]
struct Name {
    bytes: [u8; 32],
    len: usize,
}

impl Name {
    fn as_str(&self) -> &str {
        std::str::from_utf8(&self.bytes[..self.len]).unwrap_or("?")
    }
}

impl std::fmt::Write for Name {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let end = s.find([' ', '{', '(']);
        let part = &s[..end.unwrap_or(s.len())];
        let room = self.bytes.len() - self.len;
        // Cut at a character boundary, so that the name stays UTF-8.
        let mut take = part.len().min(room);
        while !part.is_char_boundary(take) {
            take -= 1;
        }
        self.bytes[self.len..self.len + take].copy_from_slice(&part.as_bytes()[..take]);
        self.len += take;
        match end {
            Some(_) => Err(std::fmt::Error),
            None => Ok(()),
        }
    }
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
            let noted = LINES.take();
            assert!(
                noted.starts_with("timeline: device t=1.500 LaunchGraph "),
                "{noted}"
            );
            point("worker", "got");
            assert!(LINES.take().is_empty());
            super::line("worker", 2_000_017, "got", 0);
            // SAFETY: gettid has no preconditions.
            let tid = unsafe { libc::gettid() };
            assert_eq!(
                LINES.take(),
                format!("timeline: worker t=2000.017 got 0.000 tid={tid}\n")
            );
        }
    }
}

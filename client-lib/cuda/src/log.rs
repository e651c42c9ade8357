//! The driver's lines on stderr, each starting `gpushare: `: one line, one line once, or a
//! timed trace of calls. A leaf: every part of the driver may say something, so this imports
//! none of them.

use std::collections::HashSet;
use std::sync::Mutex;

/// One line on stderr.
pub fn say(line: &str) {
    let _ = std::io::Write::write_all(
        &mut std::io::stderr(),
        format!("gpushare: {line}\n").as_bytes(),
    );
}

/// One line on stderr, once per distinct line.
pub fn say_once(line: &str) {
    static SAID: Mutex<Option<HashSet<String>>> = Mutex::new(None);
    let mut said = SAID.lock().unwrap_or_else(|p| p.into_inner());
    if said
        .get_or_insert_with(HashSet::new)
        .insert(line.to_string())
    {
        say(line);
    }
}

/// `GPUSHARE_CUDA_TRACE=3`: every call's line, `gpushare: t=<µs> tid=<thread> <name> <µs it
/// took>` (and ` -> <CUresult>` when not 0), `t` on CLOCK_MONOTONIC (the clock other
/// processes' traces can be lined up on), kept in memory and written in blocks and at exit,
/// so that the trace hardly moves the times it shows.
pub mod timed {
    use std::fmt::Write as _;
    use std::sync::Once;

    use gpushare_protocol::timed::TimedLines;

    static LINES: TimedLines = TimedLines::new();
    static AT_EXIT: Once = Once::new();

    /// CLOCK_MONOTONIC in nanoseconds.
    pub fn now_ns() -> u64 {
        AT_EXIT.call_once(|| {
            // SAFETY: registers a plain function without arguments; this library is never
            // unloaded before exit (its entry points stay in use).
            unsafe { libc::atexit(at_exit) };
        });
        gpushare_protocol::wake::monotonic_ns()
    }

    /// Notes a call that began at `began` (from `now_ns`) and ended now with `code`.
    pub fn call(name: &str, began: u64, code: i32) {
        let took = now_ns().saturating_sub(began);
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        LINES.line(|l| {
            let _ = write!(
                l,
                "gpushare: t={:.3} tid={tid} {name} {:.3}",
                began as f64 / 1e3,
                took as f64 / 1e3
            );
            if code != 0 {
                let _ = write!(l, " -> {code}");
            }
        });
    }

    extern "C" fn at_exit() {
        LINES.flush();
    }
}

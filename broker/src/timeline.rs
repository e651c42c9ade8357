//! `GPUSHARE_TIMELINE=1`: each client command gpushared's data threads run and each call a
//! device runs, one line each on stderr:
//! `timeline: data|device t=<µs> <what> <µs it took> tid=<thread id>`, `t` on
//! CLOCK_MONOTONIC, the clock of the client driver's `GPUSHARE_CUDA_TRACE=3`, so that a
//! program's calls and their way through gpushared and its device worker line up (that is how
//! a JAX step's lost 120 µs were found, docs/consolidated.md). `GPUSHARE_TIMELINE=2` adds to
//! each command and call ` oncpu=<µs> preempted=<n>`: how much of it the thread spent on a
//! core, and how often the kernel took the core away meanwhile (involuntary context
//! switches), which tell a thread kept off its core from one waiting or working (two
//! `getrusage` calls each). Lines are kept in memory and written in blocks by a thread of
//! their own, and when gpushared or a worker ends, so that writing them hardly moves the
//! times they show. Off, it costs one relaxed load per command and call.

use std::fmt::{Debug, Write as _};
use std::sync::OnceLock;

use gpushare_protocol::timed::TimedLines;
use gpushare_protocol::wake::monotonic_ns;

/// The environment variable that turns it on (`1`; `2` with each thread's CPU; empty or `0`:
/// off).
pub const TIMELINE_ENV: &str = "GPUSHARE_TIMELINE";

static LINES: TimedLines = TimedLines::new();

/// 0: off; 1: times; 2: times and the thread's time on its core.
fn level() -> u8 {
    static LEVEL: OnceLock<u8> = OnceLock::new();
    *LEVEL.get_or_init(|| match std::env::var(TIMELINE_ENV).as_deref() {
        Err(_) | Ok("" | "0") => 0,
        Ok("2") => 2,
        Ok(_) => 1,
    })
}

fn enabled() -> bool {
    level() > 0
}

/// When something to be noted began, and (level 2) the thread's CPU use then.
#[derive(Debug, Clone, Copy)]
pub struct Began {
    at_ns: u64,
    cpu: Option<ThreadCpu>,
}

/// A thread's time on a core and involuntary context switches so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ThreadCpu {
    on_cpu_us: u64,
    preempted: u64,
}

impl ThreadCpu {
    fn now() -> Option<ThreadCpu> {
        let mut usage = std::mem::MaybeUninit::<libc::rusage>::uninit();
        // SAFETY: getrusage writes the calling thread's usage into the struct it is given.
        if unsafe { libc::getrusage(libc::RUSAGE_THREAD, usage.as_mut_ptr()) } != 0 {
            return None;
        }
        // SAFETY: getrusage succeeded, so it filled the struct.
        let u = unsafe { usage.assume_init() };
        let us = |t: libc::timeval| (t.tv_sec.max(0) as u64) * 1_000_000 + t.tv_usec.max(0) as u64;
        Some(ThreadCpu {
            on_cpu_us: us(u.ru_utime) + us(u.ru_stime),
            preempted: u.ru_nivcsw.max(0) as u64,
        })
    }
}

/// When something to be noted begins: `None` when the timeline is off.
#[inline]
pub fn begin() -> Option<Began> {
    enabled().then(|| Began {
        at_ns: monotonic_ns(),
        cpu: (level() >= 2).then(ThreadCpu::now).flatten(),
    })
}

/// Notes `what` (its variant's name), begun at `began` (from [`begin`]), by `who`.
pub fn note(who: &str, what: &dyn Debug, began: Option<Began>) {
    let Some(began) = began else { return };
    let took = monotonic_ns().saturating_sub(began.at_ns);
    // Asked of the kernel only at level 2 (`began.cpu` is set only then).
    let cpu = began.cpu.and_then(|then| {
        ThreadCpu::now().map(|now| ThreadCpu {
            on_cpu_us: now.on_cpu_us.saturating_sub(then.on_cpu_us),
            preempted: now.preempted.saturating_sub(then.preempted),
        })
    });
    let mut name = Name::default();
    // Formatting stops at the variant's name: a whole call's fields cost more than the gaps
    // the timeline is read for.
    let _ = write!(name, "{what:?}");
    line(who, began.at_ns, name.as_str(), took, cpu);
}

/// Notes that `who` got to `what` (a point in time, written with a duration of 0), for where
/// a call's time goes between the notes of whole commands and calls.
#[inline]
pub fn point(who: &str, what: &'static str) {
    if enabled() {
        line(who, monotonic_ns(), what, 0, None);
    }
}

fn line(who: &str, at_ns: u64, what: &str, took_ns: u64, cpu: Option<ThreadCpu>) {
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
        if let Some(c) = cpu {
            let _ = write!(l, " oncpu={} preempted={}", c.on_cpu_us, c.preempted);
        }
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
            let began = Began {
                at_ns: 1_500,
                cpu: None,
            };
            note("device", &Call::LaunchGraph { stream: 1 }, Some(began));
            let noted = LINES.take();
            assert!(
                noted.starts_with("timeline: device t=1.500 LaunchGraph "),
                "{noted}"
            );
            point("worker", "got");
            assert!(LINES.take().is_empty());
            super::line("worker", 2_000_017, "got", 0, None);
            // SAFETY: gettid has no preconditions.
            let tid = unsafe { libc::gettid() };
            assert_eq!(
                LINES.take(),
                format!("timeline: worker t=2000.017 got 0.000 tid={tid}\n")
            );
            // Level 2: how much of a call the thread spent on its core.
            let on_cpu = |work: &dyn Fn()| {
                let began = Began {
                    at_ns: monotonic_ns(),
                    cpu: ThreadCpu::now(),
                };
                assert!(began.cpu.is_some(), "getrusage of the thread");
                work();
                note("device", &Call::LaunchGraph { stream: 1 }, Some(began));
                let noted = LINES.take();
                let field = |name: &str| -> u64 {
                    let at = noted
                        .find(name)
                        .unwrap_or_else(|| panic!("{name} in {noted}"));
                    noted[at + name.len()..]
                        .split(|c: char| !c.is_ascii_digit())
                        .next()
                        .and_then(|v| v.parse().ok())
                        .unwrap_or_else(|| panic!("{name} in {noted}"))
                };
                let _ = field(" preempted=");
                field(" oncpu=")
            };
            let spin = on_cpu(&|| {
                let until = std::time::Instant::now() + std::time::Duration::from_millis(30);
                while std::time::Instant::now() < until {
                    std::hint::spin_loop();
                }
            });
            assert!(spin >= 10_000, "30 ms of spinning on the core: {spin} µs");
            let slept = on_cpu(&|| std::thread::sleep(std::time::Duration::from_millis(30)));
            assert!(slept < 10_000, "30 ms asleep: {slept} µs on the core");
        }
    }
}

//! Eventfd wake-ups for the rings' spin-then-sleep protocol, for both sides: the broker
//! creates the two eventfds of a session, and each side signals the one the other sleeps on.
//! Also the clock both sides share ([`monotonic_ns`]).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::Duration;

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::eventfd::{EfdFlags, EventFd};

/// A non-blocking eventfd one side signals and the other sleeps on.
pub struct Wakeup {
    fd: OwnedFd,
}

impl Wakeup {
    pub fn new() -> std::io::Result<Wakeup> {
        let fd = EventFd::from_flags(EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)?;
        Ok(Wakeup { fd: fd.into() })
    }

    /// An eventfd received from the other side (the broker makes them non-blocking).
    pub fn from_fd(fd: OwnedFd) -> Wakeup {
        Wakeup { fd }
    }

    /// Wakes the sleeper. Never blocks: a saturated counter already means "wake up".
    pub fn signal(&self) {
        let _ = nix::unistd::write(&self.fd, &1u64.to_ne_bytes());
    }

    /// Sleeps until signalled or `timeout` passes; clears the pending signal.
    pub fn wait(&self, timeout: Option<Duration>) {
        self.poll_with(None, timeout);
    }

    /// Sleeps until signalled, `other` is readable, or `timeout` passes; clears the pending
    /// signal. Returns whether `other` is readable.
    pub fn wait_or(&self, other: BorrowedFd<'_>, timeout: Option<Duration>) -> bool {
        self.poll_with(Some(other), timeout)
    }

    fn poll_with(&self, other: Option<BorrowedFd<'_>>, timeout: Option<Duration>) -> bool {
        let timeout = match timeout {
            None => PollTimeout::NONE,
            Some(t) => PollTimeout::try_from(t).unwrap_or(PollTimeout::MAX),
        };
        let mut fds = vec![PollFd::new(self.fd.as_fd(), PollFlags::POLLIN)];
        if let Some(other) = other {
            fds.push(PollFd::new(other, PollFlags::POLLIN));
        }
        // EINTR and friends just mean "look again".
        let _ = poll(&mut fds, timeout);
        let other_ready = fds
            .get(1)
            .and_then(|f| f.revents())
            .is_some_and(|r| !r.is_empty());
        self.drain();
        other_ready
    }

    /// Clears a pending signal without sleeping.
    pub fn drain(&self) {
        let mut buf = [0u8; 8];
        let _ = nix::unistd::read(&self.fd, &mut buf);
    }

    /// A duplicate descriptor to hand to the other side.
    pub fn dup(&self) -> std::io::Result<OwnedFd> {
        self.fd.try_clone()
    }
}

/// Looks a spinning waiter takes per read of the clock.
const LOOKS_PER_READ: u32 = 8;

/// A spinning waiter's clock: it reads the time every few looks, not at each one. A read
/// costs 30–50 ns on the VMs measured, as much as the look at a shared word it rations: with
/// two reads per look, a waiter saw what it waited for about 50 ns later than it could, at
/// every hop of a round trip. The first read is at the first look that finds nothing.
#[derive(Debug, Default)]
pub struct SpinClock {
    started: Option<std::time::Instant>,
    looks: u32,
    spun: Duration,
}

impl SpinClock {
    pub const fn new() -> SpinClock {
        SpinClock {
            started: None,
            looks: 0,
            spun: Duration::ZERO,
        }
    }

    /// How long since the first call, as of the clock's last read (at most
    /// [`LOOKS_PER_READ`] calls ago).
    pub fn spun(&mut self) -> Duration {
        let Some(at) = self.started else {
            self.started = Some(std::time::Instant::now());
            return Duration::ZERO;
        };
        self.looks = self.looks.wrapping_add(1);
        if self.looks.is_multiple_of(LOOKS_PER_READ) {
            self.spun = at.elapsed();
        }
        self.spun
    }

    /// Starts again from zero (at the next call).
    pub fn restart(&mut self) {
        *self = SpinClock::new();
    }
}

/// How long a spinning waiter only pauses the CPU before it starts yielding: long enough for
/// an answer from a thread running on another core (a busy round trip through gpushared
/// takes about 0.3 µs) or, with cores to spare (8 or more), from a GPU (mostly within
/// 20 µs); short enough that on a small machine the thread it waits for gets a core.
fn pure_spin() -> Duration {
    static PURE: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *PURE.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Duration::from_micros(if cores >= 8 { 20 } else { 2 })
    })
}

/// One turn of a waiter's spin, `spun` into it; false when the waiter should stop spinning
/// and sleep. A CPU pause at first (see [`pure_spin`]); then, while the machine has a core to
/// spare ([`cores_to_spare`]), a yield, so that a waiter that goes on spinning gives its core
/// to any thread that needs one; once every core is wanted, no more spinning. On a 2-core
/// machine a client, the broker's data thread and a device worker's channel all spinning
/// left the worker, which had the actual work, no core: 31 ms for a request that takes
/// 0.3 ms (docs/benchmarks.md).
#[inline]
pub fn spin_turn(spun: Duration) -> bool {
    if spun < pure_spin() {
        std::hint::spin_loop();
        return true;
    }
    if !cores_to_spare() {
        return false;
    }
    std::thread::yield_now();
    true
}

/// How long a spinner trusts its last look at the run queue.
const LOOK_EVERY: Duration = Duration::from_micros(200);

/// Whether no thread waits for a core: the kernel's count of runnable threads (the fourth
/// field of `/proc/loadavg`, this spinner included) is at most the online cores. A thread
/// that spins beyond that takes a core from one that has work, so spinners give way: no
/// more of them spin than there are idle cores. Looked up at most every [`LOOK_EVERY`] per
/// thread (a read of `/proc/loadavg` takes a microsecond or two); `true` where it cannot
/// be read.
fn cores_to_spare() -> bool {
    use std::cell::Cell;
    use std::os::unix::fs::FileExt;
    use std::time::Instant;

    // One descriptor for the process (positioned reads share it), the last look per thread.
    static LOADAVG: std::sync::OnceLock<Option<std::fs::File>> = std::sync::OnceLock::new();
    thread_local! {
        static LOOK: Cell<Option<(Instant, bool)>> = const { Cell::new(None) };
    }
    let now = Instant::now();
    if let Some((at, spare)) = LOOK.get()
        && now.duration_since(at) < LOOK_EVERY
    {
        return spare;
    }
    let mut buf = [0u8; 128];
    let running = LOADAVG
        .get_or_init(|| std::fs::File::open("/proc/loadavg").ok())
        .as_ref()
        .and_then(|f| f.read_at(&mut buf, 0).ok())
        .and_then(|n| runnable(buf.get(..n)?));
    let spare = running.is_none_or(|r| r <= online_cores());
    LOOK.set(Some((now, spare)));
    spare
}

/// Runnable threads in a `/proc/loadavg` line: "0.52 0.58 0.59 3/467 12345" gives 3.
fn runnable(line: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(line).ok()?;
    let field = text.split_whitespace().nth(3)?;
    field.split_once('/')?.0.parse().ok()
}

fn online_cores() -> u64 {
    static CORES: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| {
        nix::unistd::sysconf(nix::unistd::SysconfVar::_NPROCESSORS_ONLN)
            .ok()
            .flatten()
            .and_then(|n| u64::try_from(n).ok())
            .filter(|&n| n > 0)
            .unwrap_or(1)
    })
}

/// CLOCK_MONOTONIC in ns: the clock of the broker's grants, of `bpf_ktime_get_ns`, and of the
/// traces of several processes (`GPUSHARE_CUDA_TRACE=3`, `GPUSHARE_TIMELINE=1`) that are to
/// be lined up.
pub fn monotonic_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).map_or(0, |t| {
        (t.tv_sec() as u64)
            .saturating_mul(1_000_000_000)
            .saturating_add(t.tv_nsec() as u64)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn a_spin_clock_reads_the_time_every_few_looks_and_counts_from_the_first() {
        let mut clock = SpinClock::new();
        assert_eq!(clock.spun(), Duration::ZERO, "the first look starts it");
        std::thread::sleep(Duration::from_millis(2));
        let early: Vec<Duration> = (1..LOOKS_PER_READ).map(|_| clock.spun()).collect();
        assert!(early.iter().all(|d| d.is_zero()), "{early:?}: not read yet");
        let read = clock.spun();
        assert!(read >= Duration::from_millis(2), "{read:?}");
        clock.restart();
        assert_eq!(clock.spun(), Duration::ZERO);
    }

    #[test]
    fn the_run_queue_is_read_from_loadavg() {
        assert_eq!(runnable(b"0.52 0.58 0.59 3/467 12345\n"), Some(3));
        assert_eq!(runnable(b"0.00 0.00 0.00 17/2000 1"), Some(17));
        assert_eq!(runnable(b"garbage"), None);
        assert_eq!(runnable(b"1 2 3 x/5 6"), None);
        // This machine's own: the test thread itself is runnable.
        let line = std::fs::read("/proc/loadavg").expect("/proc/loadavg");
        assert!(runnable(&line).is_some_and(|r| r >= 1), "{line:?}");
    }

    #[test]
    fn spinning_gives_way_once_every_core_is_wanted() {
        // As many busy threads as cores, and this one: a thread waits for a core, so a
        // spinner past its pure spin stops (the kernel's count is instantaneous: look a few
        // times while they run).
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let hogs: Vec<_> = (0..online_cores())
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                })
            })
            .collect();
        let started = Instant::now();
        let mut gave_way = false;
        while !gave_way && started.elapsed() < Duration::from_secs(10) {
            gave_way = !spin_turn(Duration::from_secs(1));
            std::thread::sleep(LOOK_EVERY);
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for h in hogs {
            let _ = h.join();
        }
        assert!(
            gave_way,
            "a spinner beside a busy thread on every core gave way"
        );
        // The pure spin never looks: a busy round trip is answered within it.
        assert!(spin_turn(Duration::ZERO));
    }

    #[test]
    fn a_signal_ends_a_wait_and_is_consumed() {
        let w = Wakeup::new().expect("eventfd");
        w.signal();
        w.signal();
        let started = Instant::now();
        w.wait(Some(Duration::from_secs(10)));
        assert!(started.elapsed() < Duration::from_secs(5), "woke at once");
        // Both signals were consumed: the next wait times out.
        let started = Instant::now();
        w.wait(Some(Duration::from_millis(20)));
        assert!(started.elapsed() >= Duration::from_millis(15));
    }

    #[test]
    fn a_duplicate_signals_the_same_counter() {
        let w = Wakeup::new().expect("eventfd");
        let other = Wakeup::from_fd(w.dup().expect("dup"));
        other.signal();
        let started = Instant::now();
        w.wait(Some(Duration::from_secs(10)));
        assert!(started.elapsed() < Duration::from_secs(5));
        // Draining an empty, non-blocking counter returns at once.
        other.drain();
    }
}

//! Eventfd wake-ups for the rings' spin-then-sleep protocol, for both sides: the broker
//! creates the two eventfds of a session, and each side signals the one the other sleeps on.

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

/// One turn of a waiter's spin, `spun` into it: a CPU pause at first (see [`pure_spin`]),
/// then a yield, so that a waiter that goes on spinning gives its core to any thread that
/// needs one. On a 2-core machine a client, the broker's data thread and a device worker's
/// channel all spinning left the worker, which had the actual work, no core: 31 ms for a
/// request that takes 0.3 ms (docs/benchmarks.md).
#[inline]
pub fn spin_pause(spun: Duration) {
    if spun < pure_spin() {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

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

//! Eventfd wake-ups for the spin-then-sleep ring protocol.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::time::Duration;

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::eventfd::{EfdFlags, EventFd};

/// A non-blocking eventfd one side signals and the other sleeps on.
pub struct Wakeup {
    fd: EventFd,
}

impl Wakeup {
    pub fn new() -> std::io::Result<Wakeup> {
        let fd = EventFd::from_flags(EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)?;
        Ok(Wakeup { fd })
    }

    /// Wakes the sleeper. Never blocks: a saturated counter already means "wake up".
    pub fn signal(&self) {
        let _ = self.fd.write(1);
    }

    /// Sleeps until signalled or `timeout` passes; clears the pending signal.
    pub fn wait(&self, timeout: Option<Duration>) {
        let timeout = match timeout {
            None => PollTimeout::NONE,
            Some(t) => PollTimeout::try_from(t).unwrap_or(PollTimeout::MAX),
        };
        let mut fds = [PollFd::new(self.fd.as_fd(), PollFlags::POLLIN)];
        // EINTR and friends just mean "look again".
        let _ = poll(&mut fds, timeout);
        self.drain();
    }

    /// Clears a pending signal without sleeping.
    pub fn drain(&self) {
        let _ = self.fd.read();
    }

    pub fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    pub fn raw(&self) -> i32 {
        self.fd.as_fd().as_raw_fd()
    }

    /// A duplicate descriptor to hand to the client.
    pub fn dup(&self) -> std::io::Result<OwnedFd> {
        self.fd.as_fd().try_clone_to_owned()
    }
}

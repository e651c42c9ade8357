//! The control socket's other traffic: requests with one reply each (status, modules), and
//! messages the broker sends unasked (shutdown, eviction, device-reset notices).

use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use gpushare_protocol::control::{BrokerMessage, ClientMessage, ModuleFormat};
use gpushare_protocol::stats::StatusReport;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use crate::error::{Error, Result};
use crate::notices::DeviceReset;
use crate::session::Session;
use crate::state::{Dead, lock};

impl Session {
    /// Reads a message the broker sent without being asked (shutdown, eviction, reset
    /// notice, hang-up), waiting up to `wait` for one.
    pub fn read_news(&self, wait: PollTimeout) {
        // Someone in a request exchange will read it instead.
        let Ok(_guard) = self.requests.try_lock() else {
            return;
        };
        let mut fds = [PollFd::new(self.socket.as_fd(), PollFlags::POLLIN)];
        if !matches!(poll(&mut fds, wait), Ok(n) if n > 0) {
            return;
        }
        match self.socket.recv() {
            Ok((BrokerMessage::ShuttingDown { kind, reason }, _)) => {
                self.mark_dead(Dead::Shutdown(kind, reason))
            }
            Ok((BrokerMessage::Evicted { reason }, _)) => self.mark_dead(Dead::Evicted(reason)),
            Ok((BrokerMessage::DeviceReset { gpu, reason, lost }, _)) => {
                self.note_reset(DeviceReset { gpu, reason, lost })
            }
            Ok(_) => {}
            Err(Error::BrokerGone) => self.mark_dead(Dead::Gone),
            Err(e @ Error::BrokerUnresponsive { .. }) => self.mark_dead(Dead::from_error(&e)),
            Err(e) => self.mark_dead(Dead::Protocol(e.to_string())),
        }
    }

    /// Waits (up to `timeout`) until the broker says what a reset took (a notice is pending,
    /// or more notices than `seen` arrived: another thread may have taken it already), or
    /// the session ends.
    pub fn wait_for_notice(&self, timeout: Duration, seen: u64) {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline
            && !self.notices.pending.load(Ordering::Acquire)
            && self.notices.count.load(Ordering::Acquire) == seen
            && !self.is_dead()
        {
            if self.requests.try_lock().is_ok() {
                self.read_news(PollTimeout::from(20u8));
            } else {
                // Another thread's request reads the notice.
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }

    fn note_reset(&self, reset: DeviceReset) {
        self.note_handles_lost();
        self.notices.note(reset);
    }

    /// Sends the request `build` makes from a fresh request number, with `fds` attached, and
    /// returns the broker's reply (notices that come first are noted on the way).
    pub fn request(
        &self,
        build: impl FnOnce(u64) -> ClientMessage,
        fds: &[i32],
    ) -> Result<BrokerMessage> {
        self.request_fds(build, fds).map(|(reply, _)| reply)
    }

    /// [`Session::request`], with the descriptors the reply carries.
    pub fn request_fds(
        &self,
        build: impl FnOnce(u64) -> ClientMessage,
        fds: &[i32],
    ) -> Result<(BrokerMessage, Vec<std::os::fd::OwnedFd>)> {
        self.check_alive()?;
        let mut next = lock(&self.requests);
        let id = *next;
        *next += 1;
        self.socket.send(&build(id), fds)?;
        // One reply per request, in order; shutdown and eviction may come instead, and
        // device-reset notices before it.
        let reply = loop {
            match self.socket.recv() {
                Ok((BrokerMessage::DeviceReset { gpu, reason, lost }, _)) => {
                    self.note_reset(DeviceReset { gpu, reason, lost })
                }
                other => break other,
            }
        };
        match reply {
            Ok((BrokerMessage::ShuttingDown { kind, reason }, _)) => {
                self.mark_dead(Dead::Shutdown(kind, reason.clone()));
                Err(Error::shutdown(kind, reason))
            }
            Ok((BrokerMessage::Evicted { reason }, _)) => {
                self.mark_dead(Dead::Evicted(reason.clone()));
                Err(Error::Evicted(reason))
            }
            Ok((BrokerMessage::RequestFailed { error, .. }, _)) => Err(Error::Request(error)),
            Ok(reply) => Ok(reply),
            Err(e) => {
                if e.is_fatal() {
                    self.mark_dead(Dead::from_error(&e));
                }
                Err(e)
            }
        }
    }

    /// Asks the broker whether it is there: fails (and the session is over) when it does not
    /// answer within the socket's timeout. A request of another thread under way answers the
    /// same question, with its own timeout: then nothing is asked.
    pub fn probe(&self) -> Result<()> {
        if self.requests.try_lock().is_err() {
            return Ok(());
        }
        match self.request(|request| ClientMessage::Ping { request }, &[])? {
            BrokerMessage::Pong { .. } => Ok(()),
            other => Err(Error::Protocol(format!("expected Pong, got {other:?}"))),
        }
    }

    /// The broker's status report.
    pub fn status(&self) -> Result<StatusReport> {
        match self.request(|request| ClientMessage::Status { request }, &[])? {
            BrokerMessage::Status { report, .. } => Ok(*report),
            other => Err(Error::Protocol(format!("expected Status, got {other:?}"))),
        }
    }

    /// Loads a module image; returns the broker's module id.
    pub fn load_module(&self, format: ModuleFormat, image: &[u8]) -> Result<u64> {
        use nix::sys::memfd::{MFdFlags, memfd_create};
        let fd =
            memfd_create("gpushare-module", MFdFlags::MFD_CLOEXEC).map_err(std::io::Error::from)?;
        let mut file = std::fs::File::from(fd);
        std::io::Write::write_all(&mut file, image)?;
        let raw = file.as_raw_fd();
        let reply = self.request(
            |request| ClientMessage::LoadModule {
                request,
                format,
                image_len: image.len() as u64,
            },
            &[raw],
        )?;
        match reply {
            BrokerMessage::ModuleLoaded { result: Ok(id), .. } => Ok(id),
            BrokerMessage::ModuleLoaded { result: Err(e), .. } => Err(Error::Request(e)),
            other => Err(Error::Protocol(format!(
                "expected ModuleLoaded, got {other:?}"
            ))),
        }
    }

    /// Looks up a function of a loaded module; returns the broker's function id.
    pub fn get_function(&self, module: u64, name: &str) -> Result<u64> {
        let reply = self.request(
            |request| ClientMessage::GetFunction {
                request,
                module,
                name: name.into(),
            },
            &[],
        )?;
        match reply {
            BrokerMessage::Function { result, .. } => result.map_err(Error::Request),
            other => Err(Error::Protocol(format!("expected Function, got {other:?}"))),
        }
    }

    pub fn unload_module(&self, module: u64) -> Result<()> {
        match self.request(
            |request| ClientMessage::UnloadModule { request, module },
            &[],
        )? {
            BrokerMessage::ModuleUnloaded { result, .. } => result.map_err(Error::Request),
            other => Err(Error::Protocol(format!(
                "expected ModuleUnloaded, got {other:?}"
            ))),
        }
    }
}

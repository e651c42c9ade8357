//! A governed session with `gpushared`: the same handshake and rings as a brokered client
//! (`Role::Governed`), used one request at a time.
//!
//! Deliberately small and blocking: the interposer asks for admission (a memory reservation,
//! a batch of launch tokens) and waits for the answer, or posts a notice (a release, an idle
//! report) whose completion nobody waits for. It never copies through the arena.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;
use std::ptr::NonNull;
use std::time::{Duration, Instant};

use gpushare_protocol::control::{BrokerMessage, ClientMessage, Hello, Role, WELCOME_FDS, Welcome};
use gpushare_protocol::ring::{ClientRings, SHM_MAGIC};
use gpushare_protocol::{Command, ErrorCode, PROTOCOL_VERSION, PriorityClass};
use memmap2::{MmapOptions, MmapRaw};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{AddressFamily, SockFlag, SockType, UnixAddr, connect, socket};

/// Submission entries asked for: one request and a few notices are ever in flight.
const SQ_ENTRIES: u32 = 64;
/// How long to spin for a completion before sleeping on the eventfd.
const SPIN: Duration = Duration::from_micros(20);

/// Why a request got no answer from the broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallError {
    /// The broker answered with this error.
    Refused(ErrorCode),
    /// The session is over (broker gone, shut down, eviction, broken ring); a sentence.
    Lost(String),
}

pub struct Connection {
    socket: OwnedFd,
    rings: ClientRings,
    /// Keeps the region mapped for as long as `rings` points into it.
    _map: MmapRaw,
    cq_entries: u32,
    submit_wake: OwnedFd,
    complete_wake: OwnedFd,
    next_tag: u64,
    /// Submitted and not yet reaped.
    in_flight: u32,
}

/// Who the program is, as it introduces itself.
pub struct Introduction<'a> {
    pub name: &'a str,
    pub class: Option<PriorityClass>,
    pub gpu: Option<u32>,
}

impl Connection {
    /// Connects and says hello as a governed client.
    pub fn connect(path: &Path, who: &Introduction<'_>) -> Result<(Connection, Welcome), String> {
        let socket = socket(
            AddressFamily::Unix,
            SockType::SeqPacket,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .map_err(|e| e.to_string())?;
        let addr = UnixAddr::new(path).map_err(|e| e.to_string())?;
        connect(socket.as_raw_fd(), &addr).map_err(|e| std::io::Error::from(e).to_string())?;
        let hello = ClientMessage::Hello(Hello {
            protocol_version: PROTOCOL_VERSION,
            role: Role::Governed,
            client_name: who.name.to_string(),
            requested_class: who.class,
            sq_entries: SQ_ENTRIES,
            arena_size: 0,
            gpu: who.gpu,
        });
        send(&socket, &hello)?;
        let (welcome, fds) = match recv(&socket)? {
            (BrokerMessage::Welcome(w), fds) => (*w, fds),
            (BrokerMessage::Rejected(e), _) => return Err(format!("refused: {}", e.message)),
            (BrokerMessage::ShuttingDown { reason, .. }, _) => return Err(reason),
            (other, _) => return Err(format!("unexpected answer to hello: {other:?}")),
        };
        let layout = welcome
            .layout
            .ok_or("the broker's welcome has no shared region")?;
        layout.validate().map_err(|e| e.to_string())?;
        let [memfd, submit_wake, complete_wake]: [OwnedFd; WELCOME_FDS] = fds
            .try_into()
            .map_err(|v: Vec<OwnedFd>| format!("welcome carried {} descriptors, not 3", v.len()))?;
        let map = MmapOptions::new()
            .len(layout.total_size())
            .map_raw(&memfd)
            .map_err(|e| e.to_string())?;
        drop(memfd);
        let base = NonNull::new(map.as_mut_ptr()).ok_or("the shared region mapped at null")?;
        // SAFETY: the mapping is page-aligned, `total_size()` long, initialised by the broker
        // before it sent Welcome, and kept in the connection as long as the rings.
        let header = unsafe { ClientRings::read_header(base) };
        if header.magic != SHM_MAGIC || header.sq_entries != layout.sq_entries {
            return Err("the shared region's header does not match the welcome".into());
        }
        // SAFETY: as above.
        let rings = unsafe { ClientRings::attach(base, &layout) };
        Ok((
            Connection {
                socket,
                rings,
                _map: map,
                cq_entries: layout.cq_entries,
                submit_wake,
                complete_wake,
                next_tag: 1,
                in_flight: 0,
            },
            welcome,
        ))
    }

    /// Submits `cmd` and waits for its completion: `(result, result2)`.
    pub fn call(&mut self, cmd: Command) -> Result<(u64, u64), CallError> {
        let tag = self.submit(cmd)?;
        let spin_until = Instant::now() + SPIN;
        loop {
            if let Some(c) = self.reap(Some(tag))? {
                return match c.status {
                    0 => Ok((c.result, c.result2)),
                    s => Err(CallError::Refused(
                        ErrorCode::from_u32(s).unwrap_or(ErrorCode::Internal),
                    )),
                };
            }
            if Instant::now() < spin_until {
                std::hint::spin_loop();
            } else {
                self.sleep()?;
            }
        }
    }

    /// Submits `cmd` without waiting; its completion is dropped when it comes.
    pub fn post(&mut self, cmd: Command) -> Result<(), CallError> {
        self.submit(cmd).map(|_| ())
    }

    fn submit(&mut self, cmd: Command) -> Result<u64, CallError> {
        loop {
            self.reap(None)?;
            let sq_room = self
                .rings
                .submissions
                .free_slots()
                .map_err(|e| CallError::Lost(e.to_string()))?
                > 0;
            if sq_room && self.in_flight < self.cq_entries {
                let tag = self.next_tag;
                self.next_tag += 1;
                let pushed = self
                    .rings
                    .submissions
                    .try_push(cmd.encode(tag))
                    .map_err(|e| CallError::Lost(e.to_string()))?;
                if pushed {
                    self.rings.submissions.publish();
                    self.in_flight += 1;
                    if self.rings.submissions.consumer_needs_wakeup() {
                        signal(&self.submit_wake);
                    }
                    return Ok(tag);
                }
            }
            self.sleep()?;
        }
    }

    /// Reads every completion there is; returns the one tagged `want`, if it came.
    fn reap(
        &mut self,
        want: Option<u64>,
    ) -> Result<Option<gpushare_protocol::ring::CompletionEntry>, CallError> {
        let n = self
            .rings
            .completions
            .available()
            .map_err(|e| CallError::Lost(e.to_string()))?;
        let mut found = None;
        for _ in 0..n {
            let c = self.rings.completions.pop();
            self.in_flight = self.in_flight.saturating_sub(1);
            if Some(c.user_tag) == want {
                found = Some(c);
            }
        }
        if n > 0 {
            self.rings.completions.release();
            if self.rings.completions.producer_waiting() {
                signal(&self.submit_wake);
            }
        }
        Ok(found)
    }

    /// Sleeps until the broker signals a completion, says something on the control socket,
    /// or 100 ms pass; fails if the session is over.
    fn sleep(&mut self) -> Result<(), CallError> {
        self.rings.completions.prepare_sleep();
        if matches!(self.rings.completions.available(), Ok(0)) {
            let mut fds = [
                PollFd::new(self.complete_wake.as_fd(), PollFlags::POLLIN),
                PollFd::new(self.socket.as_fd(), PollFlags::POLLIN),
            ];
            let _ = poll(&mut fds, PollTimeout::from(100u8));
            let news = fds[1].revents().is_some_and(|r| !r.is_empty());
            let mut buf = [0u8; 8];
            let _ = nix::unistd::read(&self.complete_wake, &mut buf);
            if news {
                self.rings.completions.finish_sleep();
                return self.read_notice();
            }
        }
        self.rings.completions.finish_sleep();
        Ok(())
    }

    /// The broker said something unasked: the end of the session, or news to ignore.
    fn read_notice(&mut self) -> Result<(), CallError> {
        match recv(&self.socket) {
            Ok((BrokerMessage::ShuttingDown { reason, .. }, _)) => Err(CallError::Lost(reason)),
            Ok((BrokerMessage::Evicted { reason }, _)) => {
                Err(CallError::Lost(format!("evicted: {reason}")))
            }
            Ok(_) => Ok(()),
            Err(e) => Err(CallError::Lost(e)),
        }
    }
}

fn signal(fd: &OwnedFd) {
    let _ = nix::unistd::write(fd, &1u64.to_ne_bytes());
}

fn send(socket: &OwnedFd, msg: &ClientMessage) -> Result<(), String> {
    gpushare_protocol::socket::send(socket.as_fd(), msg, &[]).map_err(|e| e.to_string())
}

fn recv(socket: &OwnedFd) -> Result<(BrokerMessage, Vec<OwnedFd>), String> {
    gpushare_protocol::socket::recv(socket.as_fd()).map_err(|e| e.to_string())
}

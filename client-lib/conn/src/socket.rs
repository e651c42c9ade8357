//! A connected control socket: blocking send and receive of one control message, with the
//! descriptors it carries, and the handshake every client kind starts with.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::path::Path;
use std::time::{Duration, Instant};

use gpushare_protocol::PROTOCOL_VERSION;
use gpushare_protocol::control::{BrokerMessage, ClientMessage, Hello, Role, Welcome};
use gpushare_protocol::socket::{self, SocketError};
use gpushare_protocol::stats::StatusReport;
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{AddressFamily, SockFlag, SockType, UnixAddr, connect, setsockopt, sockopt};
use nix::sys::time::TimeVal;

use crate::error::{Error, Result};

/// A connected control socket. Every blocking step on it (connecting, sending, waiting for
/// a message) gives up after its timeout, with [`Error::BrokerUnresponsive`].
pub struct ControlSocket {
    fd: OwnedFd,
    timeout: Duration,
}

impl ControlSocket {
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Connects, waiting at most the broker timeout (`GPUSHARE_TIMEOUT`) for each step.
    pub fn connect(path: &Path) -> Result<ControlSocket> {
        ControlSocket::connect_within(path, crate::env::broker_timeout())
    }

    /// Connects; `timeout` bounds the connect itself (a stopped broker's backlog may be full)
    /// and every later send and wait for a message.
    pub fn connect_within(path: &Path, timeout: Duration) -> Result<ControlSocket> {
        // (A zero timeout would mean none at all to the kernel.)
        let timeout = timeout.max(Duration::from_millis(1));
        let err = |cause: std::io::Error| Error::Connect {
            path: path.to_path_buf(),
            cause,
        };
        let fd = nix::sys::socket::socket(
            AddressFamily::Unix,
            SockType::SeqPacket,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .map_err(|e| err(e.into()))?;
        let limit = TimeVal::new(
            timeout.as_secs().min(i64::MAX as u64) as i64,
            i64::from(timeout.subsec_micros()),
        );
        setsockopt(&fd, sockopt::SendTimeout, &limit).map_err(|e| err(e.into()))?;
        let addr = UnixAddr::new(path).map_err(|e| err(e.into()))?;
        match connect(fd.as_raw_fd(), &addr) {
            Ok(()) => Ok(ControlSocket { fd, timeout }),
            Err(Errno::EAGAIN) => Err(Error::BrokerUnresponsive {
                waited_ms: timeout.as_millis() as u64,
            }),
            Err(e) => Err(err(e.into())),
        }
    }

    /// How long a send or a wait for a message may take.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    pub fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    pub fn send(&self, msg: &ClientMessage, fds: &[RawFd]) -> Result<()> {
        socket::send(self.fd.as_fd(), msg, fds).map_err(|e| self.error_of(e))
    }

    /// Receives one message with any descriptors attached, waiting at most the timeout for
    /// one to come.
    pub fn recv(&self) -> Result<(BrokerMessage, Vec<OwnedFd>)> {
        let started = Instant::now();
        loop {
            let left = self.timeout.saturating_sub(started.elapsed());
            let wait = PollTimeout::try_from(left).unwrap_or(PollTimeout::MAX);
            let mut fds = [PollFd::new(self.fd.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, wait) {
                Ok(0) => {
                    return Err(Error::BrokerUnresponsive {
                        waited_ms: started.elapsed().as_millis() as u64,
                    });
                }
                Ok(_) => break,
                Err(Errno::EINTR) => continue,
                Err(e) => return Err(Error::Io(e.into())),
            }
        }
        socket::recv(self.fd.as_fd()).map_err(|e| self.error_of(e))
    }

    /// Says hello and reads the broker's answer: the welcome and the descriptors that came
    /// with it, or why the broker refused.
    pub fn handshake(&self, hello: Hello) -> Result<(Welcome, Vec<OwnedFd>)> {
        self.send(&ClientMessage::Hello(hello), &[])?;
        match self.recv()? {
            (BrokerMessage::Welcome(w), fds) => Ok((*w, fds)),
            (BrokerMessage::Rejected(e), _) => Err(Error::Rejected(e)),
            (BrokerMessage::ShuttingDown { kind, reason }, _) => Err(Error::shutdown(kind, reason)),
            (other, _) => Err(Error::Protocol(format!("expected Welcome, got {other:?}"))),
        }
    }

    /// Connects to the broker at `path` as a monitor (no GPU session: status and
    /// administration).
    pub fn monitor(path: &Path) -> Result<(ControlSocket, Welcome)> {
        let socket = ControlSocket::connect(path)?;
        let (welcome, _) = socket.handshake(Hello {
            protocol_version: PROTOCOL_VERSION,
            role: Role::Monitor,
            client_name: "gpushare".into(),
            requested_class: None,
            sq_entries: 0,
            arena_size: 0,
            gpu: None,
        })?;
        Ok((socket, welcome))
    }

    /// Asks a monitor connection for the broker's status (`request` numbers the question).
    pub fn status(&self, request: u64) -> Result<StatusReport> {
        self.send(&ClientMessage::Status { request }, &[])?;
        loop {
            match self.recv()?.0 {
                BrokerMessage::Status { report, .. } => return Ok(*report),
                BrokerMessage::ShuttingDown { kind, reason } => {
                    return Err(Error::shutdown(kind, reason));
                }
                BrokerMessage::RequestFailed { error, .. } => return Err(Error::Request(error)),
                BrokerMessage::Evicted { reason } => return Err(Error::Evicted(reason)),
                _ => continue,
            }
        }
    }
}

impl ControlSocket {
    /// A failed send or receive as clients report it: a peer that went away is `BrokerGone`,
    /// a send that timed out (the broker reads nothing) `BrokerUnresponsive`.
    fn error_of(&self, e: SocketError) -> Error {
        let is = |e: &std::io::Error, errno: Errno| e.raw_os_error() == Some(errno as i32);
        match e {
            SocketError::Closed => Error::BrokerGone,
            SocketError::Io(e) if is(&e, Errno::EPIPE) || is(&e, Errno::ECONNRESET) => {
                Error::BrokerGone
            }
            SocketError::Io(e) if is(&e, Errno::EAGAIN) => Error::BrokerUnresponsive {
                waited_ms: self.timeout.as_millis() as u64,
            },
            SocketError::Io(e) => Error::Io(e),
            other => Error::Protocol(other.to_string()),
        }
    }
}

//! A connected control socket: blocking send and receive of one control message, with the
//! descriptors it carries, and the handshake every client kind starts with.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::path::Path;

use gpushare_protocol::control::{BrokerMessage, ClientMessage, Hello, Welcome};
use gpushare_protocol::socket::{self, SocketError};
use nix::errno::Errno;
use nix::sys::socket::{AddressFamily, SockFlag, SockType, UnixAddr, connect};

use crate::error::{Error, Result};

/// A connected control socket.
pub struct ControlSocket {
    fd: OwnedFd,
}

impl ControlSocket {
    pub fn connect(path: &Path) -> Result<ControlSocket> {
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
        let addr = UnixAddr::new(path).map_err(|e| err(e.into()))?;
        connect(fd.as_raw_fd(), &addr).map_err(|e| err(e.into()))?;
        Ok(ControlSocket { fd })
    }

    pub fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    pub fn send(&self, msg: &ClientMessage, fds: &[RawFd]) -> Result<()> {
        socket::send(self.fd.as_fd(), msg, fds).map_err(from_socket)
    }

    /// Receives one message (blocking) with any descriptors attached.
    pub fn recv(&self) -> Result<(BrokerMessage, Vec<OwnedFd>)> {
        socket::recv(self.fd.as_fd()).map_err(from_socket)
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
}

/// A failed send or receive as clients report it: a peer that went away is `BrokerGone`.
fn from_socket(e: SocketError) -> Error {
    let gone = |e: &std::io::Error| {
        e.raw_os_error()
            .is_some_and(|n| n == Errno::EPIPE as i32 || n == Errno::ECONNRESET as i32)
    };
    match e {
        SocketError::Closed => Error::BrokerGone,
        SocketError::Io(e) if gone(&e) => Error::BrokerGone,
        SocketError::Io(e) => Error::Io(e),
        other => Error::Protocol(other.to_string()),
    }
}

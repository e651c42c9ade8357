//! The blocking control-socket side of a client: connect, handshake, requests.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

use gpushare_protocol::control::{self, BrokerMessage, ClientMessage, MAX_CONTROL_MESSAGE};
use nix::sys::socket::{
    AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag, SockType, UnixAddr,
    connect, recvmsg, sendmsg, socket,
};

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
        let fd = socket(
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
        let bytes = control::encode(msg).map_err(|e| Error::Protocol(e.to_string()))?;
        let iov = [IoSlice::new(&bytes)];
        let cmsgs: Vec<ControlMessage<'_>> = if fds.is_empty() {
            vec![]
        } else {
            vec![ControlMessage::ScmRights(fds)]
        };
        loop {
            match sendmsg::<UnixAddr>(
                self.fd.as_raw_fd(),
                &iov,
                &cmsgs,
                MsgFlags::MSG_NOSIGNAL,
                None,
            ) {
                Ok(_) => return Ok(()),
                Err(nix::errno::Errno::EINTR) => continue,
                Err(nix::errno::Errno::EPIPE | nix::errno::Errno::ECONNRESET) => {
                    return Err(Error::BrokerGone);
                }
                Err(e) => return Err(Error::Io(e.into())),
            }
        }
    }

    /// Receives one message (blocking) with any descriptors attached.
    pub fn recv(&self) -> Result<(BrokerMessage, Vec<OwnedFd>)> {
        let mut buf = vec![0u8; MAX_CONTROL_MESSAGE];
        let mut cmsg_space = nix::cmsg_space!([RawFd; 8]);
        let (bytes, fds, truncated) = loop {
            let mut iov = [IoSliceMut::new(&mut buf)];
            match recvmsg::<UnixAddr>(
                self.fd.as_raw_fd(),
                &mut iov,
                Some(&mut cmsg_space),
                MsgFlags::MSG_CMSG_CLOEXEC,
            ) {
                Ok(msg) => {
                    let mut fds = Vec::new();
                    if let Ok(cmsgs) = msg.cmsgs() {
                        for c in cmsgs {
                            if let ControlMessageOwned::ScmRights(raw) = c {
                                // SAFETY: the kernel just installed these descriptors for us;
                                // nothing else owns them.
                                fds.extend(
                                    raw.into_iter()
                                        .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                                );
                            }
                        }
                    }
                    let truncated = msg.flags.contains(MsgFlags::MSG_TRUNC);
                    break (msg.bytes, fds, truncated);
                }
                Err(nix::errno::Errno::EINTR) => continue,
                Err(nix::errno::Errno::ECONNRESET) => return Err(Error::BrokerGone),
                Err(e) => return Err(Error::Io(e.into())),
            }
        };
        if bytes == 0 {
            return Err(Error::BrokerGone);
        }
        if truncated {
            return Err(Error::Protocol("control message too large".into()));
        }
        let msg = control::decode(&buf[..bytes]).map_err(|e| Error::Protocol(e.to_string()))?;
        Ok((msg, fds))
    }
}

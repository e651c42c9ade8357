//! The control socket's framing: one control message per datagram of a Unix SEQPACKET
//! socket, with the descriptors it carries as `SCM_RIGHTS`. One copy for the client library
//! and the interposer (feature `socket`).

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, UnixAddr, recvmsg, sendmsg};

use crate::control::{self, BrokerMessage, ClientMessage, MAX_CONTROL_MESSAGE};

/// Why a control message could not be sent or received.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    #[error("the broker closed the connection")]
    Closed,
    #[error("control message too large")]
    TooLarge,
    #[error("{0}")]
    Encode(String),
    #[error("{0}")]
    Decode(String),
    #[error("{0}")]
    Io(std::io::Error),
}

/// Sends `msg`, with `fds` attached, retrying on interruption.
pub fn send(socket: BorrowedFd<'_>, msg: &ClientMessage, fds: &[RawFd]) -> Result<(), SocketError> {
    send_message(socket, msg, fds)
}

/// Receives one message (blocking), with any descriptors attached, retrying on interruption.
pub fn recv(socket: BorrowedFd<'_>) -> Result<(BrokerMessage, Vec<OwnedFd>), SocketError> {
    recv_message(socket)
}

/// Sends any message of this framing (gpushared also speaks it to its device workers).
pub fn send_message<T: serde::Serialize>(
    socket: BorrowedFd<'_>,
    msg: &T,
    fds: &[RawFd],
) -> Result<(), SocketError> {
    let bytes = control::encode(msg).map_err(|e| SocketError::Encode(e.to_string()))?;
    let iov = [IoSlice::new(&bytes)];
    let rights = [ControlMessage::ScmRights(fds)];
    let cmsgs: &[ControlMessage<'_>] = if fds.is_empty() { &[] } else { &rights };
    loop {
        match sendmsg::<UnixAddr>(
            socket.as_raw_fd(),
            &iov,
            cmsgs,
            MsgFlags::MSG_NOSIGNAL,
            None,
        ) {
            Ok(_) => return Ok(()),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(SocketError::Io(e.into())),
        }
    }
}

/// Receives any message of this framing.
pub fn recv_message<T: serde::de::DeserializeOwned>(
    socket: BorrowedFd<'_>,
) -> Result<(T, Vec<OwnedFd>), SocketError> {
    let mut buf = vec![0u8; MAX_CONTROL_MESSAGE];
    let mut cmsg_space = nix::cmsg_space!([RawFd; 8]);
    let (bytes, fds, truncated) = loop {
        let mut iov = [IoSliceMut::new(&mut buf)];
        match recvmsg::<UnixAddr>(
            socket.as_raw_fd(),
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
                break (msg.bytes, fds, msg.flags.contains(MsgFlags::MSG_TRUNC));
            }
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(SocketError::Io(e.into())),
        }
    };
    if bytes == 0 {
        return Err(SocketError::Closed);
    }
    if truncated {
        return Err(SocketError::TooLarge);
    }
    let msg = control::decode(&buf[..bytes]).map_err(|e| SocketError::Decode(e.to_string()))?;
    Ok((msg, fds))
}

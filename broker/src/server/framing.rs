//! One control message on the socket: a `SOCK_SEQPACKET` datagram, with any descriptors
//! passed alongside it (`SCM_RIGHTS`).

use std::os::fd::{BorrowedFd, OwnedFd};

use nix::sys::socket::MsgFlags;

use gpushare_protocol::control::{self, BrokerMessage, ClientMessage, MAX_CONTROL_MESSAGE};
use gpushare_protocol::error::WireError;
use gpushare_protocol::{ErrorCode, PROTOCOL_VERSION};
use tokio_seqpacket::UnixSeqpacket;
use tokio_seqpacket::ancillary::{AncillaryMessageWriter, OwnedAncillaryMessage};
use tracing::info;

/// Room for the descriptors of one message; a message that carries more is refused.
const CMSG_SPACE: usize = 256;

#[derive(Debug, thiserror::Error)]
pub(super) enum RecvError {
    #[error("control socket error: {0}")]
    Io(#[from] std::io::Error),
    #[error("control message larger than {MAX_CONTROL_MESSAGE} bytes")]
    TooLarge,
    /// A hello of another protocol version (read before the rest of it).
    #[error("protocol version {0}")]
    Version(u32),
    #[error("{0}")]
    Codec(#[from] control::CodecError),
}

/// Receives one message and any descriptors that came with it; `None` at end of stream.
pub(super) async fn recv(
    sock: &UnixSeqpacket,
) -> Result<Option<(ClientMessage, Vec<OwnedFd>)>, RecvError> {
    // Wait for a message without holding a buffer (an idle connection then costs no memory),
    // then take one of its size: the kernel says it when asked with MSG_TRUNC.
    sock.peek(&mut []).await?;
    let peeked = nix::sys::socket::recv(
        sock.as_raw_fd(),
        &mut [],
        MsgFlags::MSG_PEEK | MsgFlags::MSG_TRUNC | MsgFlags::MSG_DONTWAIT,
    );
    // A message longer than the limit does not fit, and shows as truncated.
    let size = peeked.map_or(MAX_CONTROL_MESSAGE, |n| n.clamp(1, MAX_CONTROL_MESSAGE));
    let mut buf = vec![0u8; size];
    let mut cmsg = [0u8; CMSG_SPACE];
    let (info, ancillary) = sock.recv_with_ancillary(&mut buf, &mut cmsg).await?;
    // Taken before any check, so that a refused message's descriptors are closed.
    let mut fds = Vec::new();
    let truncated_fds = ancillary.is_truncated();
    for m in ancillary.into_messages() {
        if let OwnedAncillaryMessage::FileDescriptors(owned) = m {
            fds.extend(owned);
        }
    }
    if info.bytes_read() == 0 {
        return Ok(None);
    }
    if info.truncated() || truncated_fds {
        return Err(RecvError::TooLarge);
    }
    let bytes = &buf[..info.bytes_read()];
    if let Some(theirs) = control::hello_version(bytes)
        && theirs != PROTOCOL_VERSION
    {
        return Err(RecvError::Version(theirs));
    }
    let msg = control::decode(bytes)?;
    Ok(Some((msg, fds)))
}

/// Sends one message, with `fds` alongside it when there are any.
pub(super) async fn send(
    sock: &UnixSeqpacket,
    msg: &BrokerMessage,
    fds: &[BorrowedFd<'_>],
) -> std::io::Result<()> {
    let bytes = control::encode(msg).map_err(std::io::Error::other)?;
    if fds.is_empty() {
        sock.send(&bytes).await?;
    } else {
        let mut cmsg = [0u8; CMSG_SPACE];
        let mut writer = AncillaryMessageWriter::new(&mut cmsg);
        writer
            .add_fds(fds.iter().copied())
            .map_err(|_| std::io::Error::other("too many descriptors for one message"))?;
        sock.send_with_ancillary(&bytes, &mut writer).await?;
    }
    Ok(())
}

/// Tells a connection why it is refused; the caller then drops it.
pub(super) async fn reject(sock: &UnixSeqpacket, code: ErrorCode, message: &str) {
    info!(%code, message, "rejecting connection");
    let _ = send(
        sock,
        &BrokerMessage::Rejected(WireError::new(code, message)),
        &[],
    )
    .await;
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Seek, Write};
    use std::os::fd::AsFd;

    use gpushare_protocol::control::{Hello, ModuleFormat, Role};
    use nix::sys::socket::{setsockopt, sockopt};

    use super::*;
    use crate::server::testing::{self, hear_with_fds, pair};

    fn hello(version: u32) -> ClientMessage {
        ClientMessage::Hello(Hello {
            protocol_version: version,
            ..testing::hello(Role::Monitor)
        })
    }

    fn encoded(msg: &ClientMessage) -> Vec<u8> {
        control::encode(msg).expect("encode")
    }

    #[tokio::test]
    async fn a_message_arrives_with_its_descriptor() {
        let (broker, client) = pair();
        let mut image = tempfile::tempfile().expect("temp file");
        image.write_all(b"module").expect("write");
        let msg = ClientMessage::LoadModule {
            request: 7,
            format: ModuleFormat::Ptx,
            image_len: 6,
        };
        let mut cmsg = [0u8; CMSG_SPACE];
        let mut writer = AncillaryMessageWriter::new(&mut cmsg);
        writer.add_fds([image.as_fd()]).expect("room for one fd");
        client
            .send_with_ancillary(&encoded(&msg), &mut writer)
            .await
            .expect("send");

        let (got, fds) = recv(&broker).await.expect("valid").expect("not the end");
        assert_eq!(got, msg);
        assert_eq!(fds.len(), 1);
        let mut file = std::fs::File::from(fds.into_iter().next().expect("one fd"));
        let mut text = String::new();
        file.rewind().expect("rewind");
        file.read_to_string(&mut text).expect("read");
        assert_eq!(text, "module", "the descriptor is the client's file");
    }

    #[tokio::test]
    async fn the_peer_closing_is_the_end_of_the_stream() {
        let (broker, client) = pair();
        drop(client);
        assert!(matches!(recv(&broker).await, Ok(None)));
    }

    #[tokio::test]
    async fn a_hello_of_another_version_is_named_not_decoded() {
        let (broker, client) = pair();
        client
            .send(&encoded(&hello(PROTOCOL_VERSION + 1)))
            .await
            .expect("send");
        assert!(matches!(
            recv(&broker).await,
            Err(RecvError::Version(v)) if v == PROTOCOL_VERSION + 1
        ));

        // A hello of another version may be shaped differently: only its first two fields
        // (the variant and the version) are read.
        let mut other_shape = control::encode(&(0u32, 99u32)).expect("encode");
        other_shape.extend_from_slice(&[0xff; 16]);
        client.send(&other_shape).await.expect("send");
        assert!(matches!(recv(&broker).await, Err(RecvError::Version(99))));
    }

    #[tokio::test]
    async fn a_hello_of_this_version_decodes() {
        let (broker, client) = pair();
        let msg = hello(PROTOCOL_VERSION);
        client.send(&encoded(&msg)).await.expect("send");
        let (got, fds) = recv(&broker).await.expect("valid").expect("not the end");
        assert_eq!(got, msg);
        assert!(fds.is_empty());
    }

    #[tokio::test]
    async fn garbage_and_trailing_bytes_are_codec_errors() {
        let (broker, client) = pair();
        client.send(&[0xff; 8]).await.expect("send");
        assert!(matches!(recv(&broker).await, Err(RecvError::Codec(_))));

        let mut trailing = encoded(&ClientMessage::Goodbye);
        trailing.push(0);
        client.send(&trailing).await.expect("send");
        assert!(matches!(
            recv(&broker).await,
            Err(RecvError::Codec(control::CodecError::TrailingBytes(1)))
        ));

        // The socket still works after a bad message.
        client
            .send(&encoded(&ClientMessage::Goodbye))
            .await
            .expect("send");
        assert!(matches!(
            recv(&broker).await,
            Ok(Some((ClientMessage::Goodbye, _)))
        ));
    }

    #[tokio::test]
    async fn more_descriptors_than_fit_are_refused() {
        let (broker, client) = pair();
        let file = tempfile::tempfile().expect("temp file");
        let many: Vec<BorrowedFd<'_>> = (0..64).map(|_| file.as_fd()).collect();
        let mut cmsg = vec![0u8; 4096];
        let mut writer = AncillaryMessageWriter::new(&mut cmsg);
        writer.add_fds(many.iter().copied()).expect("room");
        client
            .send_with_ancillary(&encoded(&ClientMessage::Goodbye), &mut writer)
            .await
            .expect("send");
        assert!(matches!(recv(&broker).await, Err(RecvError::TooLarge)));
    }

    #[tokio::test]
    async fn a_message_over_the_limit_is_refused() {
        let (broker, client) = pair();
        // A Unix datagram cannot exceed the sender's buffer; raising it past the system's
        // limit needs CAP_NET_ADMIN.
        let want = 2 * MAX_CONTROL_MESSAGE;
        if setsockopt(&client, sockopt::SndBufForce, &want).is_err() {
            eprintln!("skipped: cannot raise the send buffer (needs CAP_NET_ADMIN)");
            return;
        }
        client
            .send(&vec![0u8; MAX_CONTROL_MESSAGE + 1])
            .await
            .expect("send");
        assert!(matches!(recv(&broker).await, Err(RecvError::TooLarge)));
    }

    #[tokio::test]
    async fn send_passes_descriptors_and_reject_says_why() {
        let (broker, client) = pair();
        let mut file = tempfile::tempfile().expect("temp file");
        file.write_all(b"region").expect("write");
        let reply = BrokerMessage::Evicted {
            reason: "test".into(),
        };
        send(&broker, &reply, &[file.as_fd()]).await.expect("send");
        let (got, fds) = hear_with_fds(&client).await;
        assert_eq!(got, reply);
        assert_eq!(fds.len(), 1);

        reject(&broker, ErrorCode::PermissionDenied, "not in the policy").await;
        let (got, fds) = hear_with_fds(&client).await;
        assert_eq!(
            got,
            BrokerMessage::Rejected(WireError::new(
                ErrorCode::PermissionDenied,
                "not in the policy"
            ))
        );
        assert!(fds.is_empty());
    }
}

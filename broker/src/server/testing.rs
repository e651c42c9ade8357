//! For the server's unit tests: a broker on sim devices, sessions registered in it as if
//! clients were connected, and the client's side of a connection.

use std::os::fd::OwnedFd;
use std::sync::Arc;

use gpushare_protocol::PROTOCOL_VERSION;
use gpushare_protocol::control::{
    self, BrokerMessage, ClientMessage, Hello, MAX_CONTROL_MESSAGE, Role,
};
use gpushare_protocol::stats::TelemetryStatus;
use tokio_seqpacket::UnixSeqpacket;
use tokio_seqpacket::ancillary::OwnedAncillaryMessage;

use super::Broker;
use crate::access::{Grant, Identity, Policy};
use crate::config::BrokerConfig;
use crate::device::Device;
use crate::device::sim::{SimDevice, SimOptions};
use crate::session::{Peer, SessionInfo};
use gpushare_protocol::wake::Wakeup;

/// A broker serving `gpus` sim devices, with the default policy and telemetry off. Its
/// socket path names nothing, so that no test removes a real broker's socket.
pub(super) fn sim_broker(gpus: u32) -> Arc<Broker> {
    sim_broker_with(
        gpus,
        BrokerConfig {
            socket: "/nonexistent/gpushare-unit-test.sock".into(),
            ..BrokerConfig::default()
        },
    )
}

/// A broker serving `gpus` sim devices with `config`.
pub(super) fn sim_broker_with(gpus: u32, config: BrokerConfig) -> Arc<Broker> {
    let devices = (0..gpus)
        .map(|index| {
            let sim = SimDevice::new(SimOptions {
                index,
                ..SimOptions::default()
            });
            Arc::new(Device::local(sim, None).expect("a sim device"))
        })
        .collect();
    Broker::new(
        devices,
        config,
        Policy::default(),
        None,
        TelemetryStatus {
            enabled: false,
            reason: Some("unit test".into()),
            dev_prefix: "/dev/nvidia".into(),
            uprobes: false,
        },
    )
}

/// Registers a session of process `pid` on `gpu`, as a connected client's would be.
pub(super) fn register(broker: &Broker, pid: i32, gpu: u32, governed: bool) -> Arc<SessionInfo> {
    let peer = Peer {
        id: broker.registry.next_id(),
        pid,
        uid: 1000,
        user: "alice".into(),
        name: format!("client{pid}"),
        gpu,
        governed,
        consolidated: false,
        trust_domain: "default".into(),
        job: None,
    };
    let wake = Wakeup::new().expect("eventfd");
    // Counted in its user's account as a session is; these sessions never end, so the seat
    // is never given up.
    let seat = broker.accounts.seat_for_tests(1000, "alice");
    let account = seat.account().clone();
    std::mem::forget(seat);
    let info = Arc::new(SessionInfo::new(peer, Grant::default(), account, wake));
    broker.registry.insert(info.clone());
    info
}

/// Registers a session of process `pid` in `job`, on the job's grant, as the handshake
/// admits one.
pub(super) fn register_in_job(
    broker: &Broker,
    pid: i32,
    job: &Arc<crate::jobs::Job>,
) -> Arc<SessionInfo> {
    let peer = Peer {
        id: broker.registry.next_id(),
        pid,
        uid: job.uid,
        user: job.user.clone(),
        name: format!("client{pid}"),
        gpu: job.gpus[0].gpu,
        governed: false,
        consolidated: true,
        trust_domain: "default".into(),
        job: Some(job.clone()),
    };
    let seat = broker.accounts.seat_for_tests(job.uid, &job.user);
    let account = seat.account().clone();
    std::mem::forget(seat);
    let info = Arc::new(SessionInfo::new(
        peer,
        job.grant(),
        account,
        Wakeup::new().expect("eventfd"),
    ));
    job.session_started();
    broker.registry.insert(info.clone());
    info
}

/// A connected pair: the broker's end and the client's.
pub(super) fn pair() -> (UnixSeqpacket, UnixSeqpacket) {
    UnixSeqpacket::pair().expect("socketpair")
}

/// Sends `msg` as a client does.
pub(super) async fn say(sock: &UnixSeqpacket, msg: &ClientMessage) {
    let bytes = control::encode(msg).expect("encode");
    sock.send(&bytes).await.expect("send");
}

/// Reads one broker message as a client does, with the descriptors that came with it.
pub(super) async fn hear_with_fds(sock: &UnixSeqpacket) -> (BrokerMessage, Vec<OwnedFd>) {
    let mut buf = vec![0u8; MAX_CONTROL_MESSAGE];
    let mut cmsg = [0u8; 256];
    let (info, ancillary) = sock
        .recv_with_ancillary(&mut buf, &mut cmsg)
        .await
        .expect("recv");
    let mut fds = Vec::new();
    for m in ancillary.into_messages() {
        if let OwnedAncillaryMessage::FileDescriptors(owned) = m {
            fds.extend(owned);
        }
    }
    assert!(info.bytes_read() > 0, "the broker closed the connection");
    let msg = control::decode(&buf[..info.bytes_read()]).expect("a broker message");
    (msg, fds)
}

/// Reads one broker message that carries no descriptors.
pub(super) async fn hear(sock: &UnixSeqpacket) -> BrokerMessage {
    let (msg, fds) = hear_with_fds(sock).await;
    assert!(fds.is_empty(), "unexpected descriptors with {msg:?}");
    msg
}

/// Whether the broker closed its end (the next read is the end of the stream).
pub(super) async fn closed(sock: &UnixSeqpacket) -> bool {
    let mut buf = [0u8; 64];
    sock.recv(&mut buf)
        .await
        .is_ok_and(|info| info.bytes_read() == 0)
}

/// Who asks: `uid` in the groups `groups` (root is uid 0).
pub(super) fn identity(uid: u32, groups: &[&str]) -> Identity {
    Identity {
        uid,
        user: Some(if uid == 0 {
            "root".into()
        } else {
            format!("user{uid}")
        }),
        gids: (0..groups.len() as u32).map(|g| 5000 + g).collect(),
        group_names: groups.iter().map(|g| g.to_string()).collect(),
        in_pod: false,
    }
}

/// A hello of this protocol version in `role`, letting the broker pick the GPU.
pub(super) fn hello(role: Role) -> Hello {
    Hello {
        protocol_version: PROTOCOL_VERSION,
        role,
        client_name: "unit-test".into(),
        requested_class: None,
        sq_entries: 0,
        arena_size: 0,
        gpu: None,
    }
}

/// `f`'s output, or a failure (not a hung test) when it takes more than 10 s.
pub(super) async fn within<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(std::time::Duration::from_secs(10), f)
        .await
        .expect("did not finish within 10 s")
}

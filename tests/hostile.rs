//! Bad input never hurts the broker: random and adversarial bytes on the ring and the control
//! socket fail one command (or drop that one client), while a well-behaved client keeps
//! getting correct results.

use std::process::Stdio;
use std::time::Duration;

use gpushare::{ErrorCode, Kernel};
use gpushare_protocol::command::opcode;
use gpushare_protocol::ring::SubmissionEntry;
use gpushare_protocol::{Command, control};
use gpushare_tests::raw::RawClient;
use gpushare_tests::{Broker, wait_until};
use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};

/// Submits `entries` in ring-sized batches and returns every completion.
fn submit_all(
    raw: &RawClient,
    entries: &[SubmissionEntry],
) -> Vec<gpushare_protocol::ring::CompletionEntry> {
    let done = raw.submit_all(entries);
    assert_eq!(
        done.len(),
        entries.len(),
        "broker stopped completing: {} of {}",
        done.len(),
        entries.len()
    );
    done
}

#[test]
fn random_and_adversarial_ring_entries_fail_with_typed_errors() {
    let broker = Broker::start();
    // A well-behaved client process runs the whole time.
    let good = broker
        .command("gpushare-demo")
        .args([
            "--name",
            "good",
            "--iterations",
            "30",
            "--size",
            "2048",
            "--json",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn");
    // And a victim in this process whose memory the hostile client aims at.
    let victim = broker.client_named("victim");
    let target = victim.alloc::<f32>(1024).expect("alloc");
    victim
        .launch(
            &victim.default_stream(),
            Kernel::FillF32 {
                dst: target.ptr(),
                n: 1024,
                value: 5.0,
            },
        )
        .expect("fill");
    victim.synchronize().expect("sync");

    let raw = RawClient::connect(&broker.socket);
    let mut rng = StdRng::seed_from_u64(0x6770_7573);
    let mut entries = Vec::new();
    // 1. Pure noise.
    for _ in 0..2000 {
        let mut bytes = [0u8; 64];
        rng.fill_bytes(&mut bytes);
        let mut e: SubmissionEntry =
            zerocopy::FromBytes::read_from_bytes(&bytes).expect("64 bytes");
        e.user_tag = entries.len() as u64;
        entries.push(e);
    }
    // 2. Valid opcodes with hostile arguments.
    let p = target.ptr();
    let evil = [
        Command::Memset {
            stream: 0,
            dst: p,
            value: 0,
            len: 4096,
        },
        Command::Launch {
            stream: 0,
            kernel: Kernel::FillF32 {
                dst: p,
                n: 1024,
                value: -1.0,
            },
        },
        Command::CopyDtoH {
            stream: 0,
            src: p,
            arena_offset: 0,
            len: 4096,
        },
        Command::CopyHtoD {
            stream: 0,
            arena_offset: u64::MAX - 3,
            dst: p,
            len: 8,
        },
        Command::Free { ptr: p },
        Command::Alloc { bytes: u64::MAX },
        Command::Launch {
            stream: 0,
            kernel: Kernel::GemmF32 {
                a: p,
                b: p,
                c: p,
                m: u32::MAX,
                n: u32::MAX,
                k: u32::MAX,
                alpha: 1.0,
                beta: 1.0,
            },
        },
        Command::StreamSync {
            stream: 4_000_000_000,
        },
        Command::EventElapsed { start: 1, end: 2 },
        Command::StreamDestroy { stream: 0 },
    ];
    for cmd in evil {
        let tag = entries.len() as u64;
        entries.push(cmd.encode(tag));
    }
    // 3. Opcode-shaped noise: right opcode, random everything else.
    for _ in 0..2000 {
        let mut e = SubmissionEntry {
            user_tag: entries.len() as u64,
            ..Default::default()
        };
        e.opcode = [
            opcode::COPY_HTOD,
            opcode::COPY_DTOH,
            opcode::MEMSET,
            opcode::KERNEL_GEMM_F32,
            opcode::LAUNCH_MODULE,
            opcode::EVENT_RECORD,
        ][rng.random_range(0..6)];
        e.stream = rng.random_range(0..3);
        for a in &mut e.args {
            *a = if rng.random_bool(0.5) {
                p.wrapping_add(rng.random_range(0..8192))
            } else {
                rng.random()
            };
        }
        entries.push(e);
    }
    let done = submit_all(&raw, &entries);
    assert_eq!(
        done.len(),
        entries.len(),
        "one completion per entry, none lost"
    );
    let mut tags: Vec<u64> = done.iter().map(|c| c.user_tag).collect();
    tags.sort_unstable();
    tags.dedup();
    assert_eq!(tags.len(), entries.len(), "every tag echoed exactly once");
    let failures = done.iter().filter(|c| c.status != 0).count();
    assert!(
        failures > entries.len() * 9 / 10,
        "most garbage fails ({failures} of {})",
        entries.len()
    );
    for c in &done[2000..2010] {
        assert_ne!(
            c.status,
            0,
            "hostile command {} must fail",
            c.user_tag - 2000
        );
    }
    assert_eq!(
        done[2000].status,
        ErrorCode::InvalidPointer.as_u32(),
        "another client's memory is out of reach"
    );
    assert_eq!(done[2003].status, ErrorCode::InvalidPointer.as_u32());

    // 4. Garbage on the control socket: answered with errors, session survives.
    for len in [0usize, 1, 7, 64, 4096] {
        let mut bytes = vec![0u8; len.max(1)];
        rng.fill_bytes(&mut bytes);
        raw.send_control(&bytes);
    }
    raw.send_control(
        &control::encode(&gpushare_protocol::control::ClientMessage::Hello(
            gpushare_protocol::control::Hello {
                protocol_version: 1,
                role: gpushare_protocol::control::Role::Client,
                client_name: "again".into(),
                requested_class: None,
                sq_entries: 0,
                arena_size: 0,
                gpu: None,
            },
        ))
        .expect("encode"),
    );
    assert!(raw.status_ok(), "hostile session still answered");

    // The victim's data is untouched and the good client succeeded.
    assert!(
        target.to_vec().expect("read").iter().all(|&v| v == 5.0),
        "victim memory changed"
    );
    let out = good.wait_with_output().expect("wait");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let summary: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).expect("json");
    assert_eq!(summary["mismatches"], 0);
}

#[test]
fn corrupt_ring_indices_drop_only_that_client() {
    let broker = Broker::start();
    let bystander = broker.client_named("bystander");
    let buf = bystander.alloc::<f32>(64).expect("alloc");

    let raw = RawClient::connect(&broker.socket);
    // Scribble over the header and the broker-owned words too: none of it is trusted.
    raw.scribble(0, &[0xff; 64]);
    raw.sq_head()
        .store(12345, std::sync::atomic::Ordering::Relaxed);
    raw.cq_tail()
        .store(999, std::sync::atomic::Ordering::Relaxed);
    // A tail that claims more entries than the ring holds.
    raw.publish(raw.layout.sq_entries * 3);
    assert!(
        broker.wait_for_log(
            "client dropped for breaking the ring protocol",
            Duration::from_secs(5)
        ),
        "{}",
        broker.log_text()
    );
    assert!(wait_until(Duration::from_secs(5), || broker
        .status()
        .clients
        .len()
        == 1));
    bystander
        .launch(
            &bystander.default_stream(),
            Kernel::FillF32 {
                dst: buf.ptr(),
                n: 64,
                value: 3.0,
            },
        )
        .expect("launch");
    assert_eq!(buf.to_vec().expect("read"), vec![3.0; 64]);
}

#[test]
fn wrong_protocol_versions_and_silent_peers_are_refused_politely() {
    let broker = Broker::start();
    let sock = std::os::unix::net::UnixDatagram::unbound().expect("unused");
    drop(sock);
    // A client that never says hello is cut off after the timeout, without harm.
    let silent = nix::sys::socket::socket(
        nix::sys::socket::AddressFamily::Unix,
        nix::sys::socket::SockType::SeqPacket,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        None,
    )
    .expect("socket");
    nix::sys::socket::connect(
        std::os::fd::AsRawFd::as_raw_fd(&silent),
        &nix::sys::socket::UnixAddr::new(&broker.socket).expect("addr"),
    )
    .expect("connect");
    // A different protocol version is rejected with a message that says what to do.
    let hello =
        gpushare_protocol::control::ClientMessage::Hello(gpushare_protocol::control::Hello {
            protocol_version: 999,
            role: gpushare_protocol::control::Role::Client,
            client_name: "old".into(),
            requested_class: None,
            sq_entries: 0,
            arena_size: 0,
            gpu: None,
        });
    let s = nix::sys::socket::socket(
        nix::sys::socket::AddressFamily::Unix,
        nix::sys::socket::SockType::SeqPacket,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        None,
    )
    .expect("socket");
    let fd = std::os::fd::AsRawFd::as_raw_fd(&s);
    nix::sys::socket::connect(
        fd,
        &nix::sys::socket::UnixAddr::new(&broker.socket).expect("addr"),
    )
    .expect("connect");
    // A later protocol's hello is shaped differently: here it carries fields this broker does
    // not know. The version is read first, so the answer is a version mismatch, not a
    // decoding error.
    let mut bytes = control::encode(&hello).expect("encode");
    bytes.extend_from_slice(&[3, 1, 4, 1, 5, 9, 2, 6]);
    nix::sys::socket::send(fd, &bytes, nix::sys::socket::MsgFlags::empty()).expect("send");
    let mut buf = vec![0u8; 65536];
    let n =
        nix::sys::socket::recv(fd, &mut buf, nix::sys::socket::MsgFlags::empty()).expect("recv");
    match control::decode::<gpushare_protocol::control::BrokerMessage>(&buf[..n]).expect("decode") {
        gpushare_protocol::control::BrokerMessage::Rejected(e) => {
            assert_eq!(e.code, ErrorCode::VersionMismatch);
            assert!(
                e.message.contains("999")
                    && e.message
                        .contains(&gpushare_protocol::PROTOCOL_VERSION.to_string())
                    && e.message.contains("matching"),
                "{}",
                e.message
            );
        }
        other => panic!("expected Rejected, got {other:?}"),
    }
    // The broker serves normal clients meanwhile.
    broker.client().nop().expect("nop");
    drop(silent);
}

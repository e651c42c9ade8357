//! A client that stops reading its completion ring holds nothing in the scheduler: a
//! best-effort client beside a stalled high-priority one is served at once, and the stalled
//! client is evicted after `--stalled-client-timeout`, and told why.

use std::sync::atomic::Ordering;
use std::time::Duration;

use gpushare::{Client, ConnectOptions, Kernel, PriorityClass};
use gpushare_protocol::Command;
use gpushare_protocol::control::BrokerMessage;
use gpushare_tests::raw::RawClient;
use gpushare_tests::{Broker, BrokerOptions, wait_until};

/// Fills `raw`'s submission ring with short kernels until its completion ring is full too
/// (it never reads one); false if that did not happen within 20 s.
fn stall(raw: &RawClient) -> bool {
    let (sq, cq) = (raw.layout.sq_entries, raw.layout.cq_entries);
    let mut tail = raw.sq_tail().load(Ordering::Relaxed);
    wait_until(Duration::from_secs(20), || {
        while tail.wrapping_sub(raw.sq_head().load(Ordering::Acquire)) < sq {
            let spin = Command::Launch {
                stream: 0,
                kernel: Kernel::Spin {
                    micros: 200,
                    blocks: 1,
                },
            };
            raw.write_entry(tail, spin.encode(u64::from(tail)));
            tail = tail.wrapping_add(1);
        }
        raw.publish(tail);
        let completed = raw.cq_tail().load(Ordering::Acquire);
        completed.wrapping_sub(raw.cq_head().load(Ordering::Relaxed)) >= cq
    })
}

#[test]
fn a_stalled_high_priority_client_cannot_hold_a_best_effort_one() {
    let broker = Broker::start_with(BrokerOptions {
        policy: Some("scheduler = \"priority\"\n[defaults]\nclass = \"high\"\n".into()),
        // Kernels take their modelled time on the wall clock, as on a GPU.
        extra_args: vec![
            "--sim-realtime".into(),
            "--stalled-client-timeout".into(),
            "5".into(),
        ],
        backend: Some("sim".into()),
        ..Default::default()
    });
    broker.dump_log_if_stuck(Duration::from_secs(60));
    let best_effort = Client::connect_with(ConnectOptions {
        class: Some(PriorityClass::BestEffort),
        ..broker.options("best-effort")
    })
    .expect("connect");
    // A high-priority client (the policy's default class) that submits kernels and never
    // reads a completion.
    let stalled = RawClient::connect(&broker.socket);
    assert!(stall(&stalled), "the stalled client's rings never filled");
    let listed = |name: &str| broker.status().clients.iter().any(|c| c.name == name);
    assert!(listed("hostile"));

    // A best-effort kernel longer than the priority policy's budget beside high-priority
    // work: it runs only when no high-priority kernel is in flight. The stalled client's
    // last kernels finished long ago, but before, the broker reported them done only after
    // the client read its completions: never.
    let stream = best_effort.default_stream();
    stream
        .launch(Kernel::Spin {
            micros: 2000,
            blocks: 1,
        })
        .expect("launch");
    stream.synchronize().expect("the best-effort kernel ran");
    assert!(
        listed("hostile"),
        "served only once the stalled client was gone: it held the best-effort client until then"
    );

    // The stalled client is evicted after the limit, and told why.
    assert!(
        wait_until(Duration::from_secs(30), || !listed("hostile")),
        "a client that never reads was not evicted"
    );
    let told = stalled.sock.recv().map(|(msg, _)| msg);
    match told {
        Ok(BrokerMessage::Evicted { reason }) => assert!(
            reason.starts_with("stopped reading its completions for 5 s"),
            "{reason}"
        ),
        other => panic!("the stalled client was told {other:?}"),
    }
    assert!(
        broker.log_contains("evicting a client that does not read"),
        "{}",
        broker.log_text()
    );
    // The best-effort client goes on.
    stream
        .launch(Kernel::Spin {
            micros: 100,
            blocks: 1,
        })
        .expect("launch");
    stream.synchronize().expect("still served");
}

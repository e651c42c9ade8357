//! GPU faults where gpushared holds the device in its own process (`--in-process-device`) and
//! the driver cannot recover it in place (CUDA; the sim device with `--sim-restart-on-fault`):
//! gpushared restarts itself, the culprit's process is refused by
//! the next image, the others come back, and suspects run on probation there.

use std::time::{Duration, Instant};

use gpushare_tests::faults::{Scripted, report_fault_times, restart_broker, verified_fill};
use gpushare_tests::{Broker, BrokerOptions, test_backend};

#[test]
fn after_a_restart_the_culprit_process_is_refused_and_the_others_come_back() {
    // The sim device behaves like the CUDA driver here: no recovery in place.
    let broker = restart_broker();
    let mut victim = Scripted::start(&broker);
    let mut culprit = Scripted::start(&broker);
    assert!(victim.run("connect").starts_with("connected"));
    assert!(culprit.run("connect").starts_with("connected"));
    assert_eq!(victim.run("fill"), "ok");

    let said = culprit.run("illegal");
    assert!(said.starts_with("error"), "{said}");
    let fatal = victim.run("wait-fatal");
    assert!(fatal.contains("restarts"), "victim told why: {fatal}");
    assert!(broker.wait_for_log("restarting gpushared", Duration::from_secs(5)));

    // The broker is back (same pid); the victim reconnects and works, the culprit is refused.
    let back = victim.run("reconnect");
    assert!(back.starts_with("connected"), "{back}");
    assert_eq!(victim.run("fill"), "ok");
    let refused = culprit.run("reconnect");
    assert!(
        refused.starts_with("refused PermissionDenied") && refused.contains("evicted"),
        "{refused}"
    );
    assert!(broker.wait_for_log(
        "carried over from before the restart",
        Duration::from_secs(5)
    ));
}

#[test]
fn across_a_restart_suspects_run_on_probation_and_a_second_fault_names_the_culprit() {
    let broker = restart_broker();
    let mut slow = Scripted::start(&broker);
    let mut culprit = Scripted::start(&broker);
    assert!(slow.run("connect").starts_with("connected"));
    assert!(culprit.run("connect").starts_with("connected"));
    // Both have work in flight when the fault comes: nobody can be blamed alone.
    assert_eq!(slow.run("hang"), "ok");
    assert!(culprit.run("illegal").starts_with("error"));
    assert!(slow.run("wait-fatal").starts_with("fatal"));
    assert!(broker.wait_for_log("restarting gpushared", Duration::from_secs(5)));

    // Both come back, on probation.
    assert!(slow.run("reconnect").starts_with("connected"));
    assert!(culprit.run("reconnect").starts_with("connected"));
    assert!(broker.wait_for_log("on probation", Duration::from_secs(5)));
    assert_eq!(slow.run("fill"), "ok");

    // The second fault has one suspect running: after the next restart it is refused and
    // the other carries on.
    assert!(culprit.run("illegal").starts_with("error"));
    assert!(slow.run("wait-fatal").starts_with("fatal"));
    assert!(slow.run("reconnect").starts_with("connected"));
    assert_eq!(slow.run("fill"), "ok");
    let refused = culprit.run("reconnect");
    assert!(
        refused.contains("evicted"),
        "{refused}\n{}",
        broker.log_text()
    );
}

/// Ten faults in a row on the restart path (the sim device with `--sim-restart-on-fault`;
/// CUDA's own on a GPU), each by a fresh culprit process, with telemetry
/// on where this machine allows it (root and eBPF) and off: every time, the victim's session
/// ends with the typed error, it reconnects and gets a correct result, and the culprit is
/// refused. Reports each fault's time from the culprit's fault to the victim's next correct
/// result (never asserted: this is a shared 2-core machine; docs/reliability.md has them).
#[test]
fn ten_faults_in_a_row_each_bring_the_others_back() {
    for telemetry in [false, true] {
        let broker = Broker::start_with(BrokerOptions {
            backend: Some(test_backend()),
            extra_args: [
                "--allow-fault-injection",
                "--in-process-device",
                "--sim-restart-on-fault",
                "--fault-probation",
                "60",
            ]
            .map(String::from)
            .to_vec(),
            telemetry,
            ..Default::default()
        });
        broker.dump_log_if_stuck(Duration::from_secs(300));
        let on = broker.status().telemetry;
        let mut victim = broker.client_named("victim");
        verified_fill(&victim, 1.0).expect("the victim works");
        let mut took = Vec::new();
        for i in 0..10 {
            let mut culprit = Scripted::start(&broker);
            assert!(culprit.run("connect").starts_with("connected"), "fault {i}");
            let faulted = Instant::now();
            assert!(culprit.run("illegal").starts_with("error"), "fault {i}");
            // The victim's session ends (the broker restarts); it comes back and works.
            let deadline = faulted + Duration::from_secs(60);
            let err = loop {
                match victim.nop() {
                    Err(e) => break e,
                    Ok(()) => assert!(Instant::now() < deadline, "fault {i}: no restart"),
                }
            };
            assert!(
                matches!(err, gpushare::Error::BrokerRestarting(_)),
                "fault {i}: {err}"
            );
            victim = loop {
                if let Ok(back) = victim.reconnect()
                    && verified_fill(&back, i as f32).is_ok()
                {
                    break back;
                }
                assert!(
                    Instant::now() < deadline,
                    "fault {i}: the victim never came back"
                );
                std::thread::sleep(Duration::from_millis(1));
            };
            took.push(faulted.elapsed());
            let refused = culprit.run("reconnect");
            assert!(refused.contains("evicted"), "fault {i}: {refused}");
        }
        // Where the time of the last fault went, from the broker's own log.
        let log = broker.log_text();
        let last = log.rfind("restarting gpushared").unwrap_or(0);
        let from = log[..last].rfind("GPU fault").unwrap_or(last);
        let keys = [
            "GPU fault",
            "restarting",
            "re-executing",
            "gpushared starting",
            "context",
            "ready",
            "telemetry",
            "client",
        ];
        report_fault_times("ten faults", &on, &mut took, &log, from, &keys);
    }
}

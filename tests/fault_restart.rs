//! GPU faults where the device cannot recover in place (CUDA's path; the sim device with
//! `--sim-restart-on-fault`): gpushared restarts itself, the culprit's process is refused by
//! the next image, the others come back, and suspects run on probation there.

use std::time::Duration;

use gpushare_tests::faults::{Scripted, restart_broker};

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

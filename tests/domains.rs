//! Trust domains: the policy file says who shares a GPU context (`trust_domain`). A domain
//! other than the default gets a device worker of its own (so a context of its own), one
//! scheduler still spans them all, a fault in one domain costs only that domain's clients
//! their device state (and the culprit its session), and a broker that holds the device in
//! its own process refuses other domains clearly. That a kernel of one domain cannot read
//! another's memory needs real kernels: `tests/gpu.rs`.

use std::time::Duration;

use gpushare_tests::faults::{Scripted, verified_fill};
use gpushare_tests::{Broker, BrokerOptions, SystemUser, other_users, wait_until};

fn policy(lab: &[&SystemUser]) -> String {
    lab.iter()
        .map(|u| format!("[[users]]\nuid = {}\ntrust_domain = \"lab\"\n", u.uid))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn a_fault_in_one_trust_domain_leaves_the_others_alone() {
    let test = "a_fault_in_one_trust_domain_leaves_the_others_alone";
    let Some((a, b)) = other_users(test) else {
        return;
    };
    let broker = Broker::start_with(BrokerOptions {
        policy: Some(policy(&[&a, &b])),
        extra_args: vec!["--allow-fault-injection".into()],
        ..Default::default()
    });
    broker.dump_log_if_stuck(Duration::from_secs(60));
    // Root is in the default domain: its buffer holds data through the other domain's fault.
    let root = broker.client_named("root-default");
    let held = root.alloc::<f32>(1024).expect("alloc");
    held.copy_from_host(&[4.5; 1024]).expect("upload");
    let before = broker.worker_pids();
    assert_eq!(
        before.len(),
        2,
        "the default domain's worker and spare: {before:?}"
    );

    // Two users of domain `lab`: their clients get a device (worker and spare) of their own.
    let mut bystander = Scripted::start_as(&broker, &b);
    assert!(bystander.run("connect").starts_with("connected"));
    let mut culprit = Scripted::start_as(&broker, &a);
    assert!(culprit.run("connect").starts_with("connected"));
    assert_eq!(bystander.run("fill"), "ok");
    assert_eq!(culprit.run("fill"), "ok");
    let mut workers = Vec::new();
    assert!(
        wait_until(Duration::from_secs(10), || {
            workers = broker.worker_pids();
            workers.len() == 4
        }),
        "two devices, each a worker and a spare: {workers:?}"
    );
    let status = broker.status();
    let domain_of = |user: u32| {
        status
            .clients
            .iter()
            .find(|c| c.uid == user)
            .map(|c| c.trust_domain.clone())
    };
    assert_eq!(domain_of(0).as_deref(), Some("default"));
    assert_eq!(domain_of(a.uid).as_deref(), Some("lab"));
    assert_eq!(domain_of(b.uid).as_deref(), Some("lab"));

    // A fault in `lab`: its culprit is evicted, its bystander loses its device state and goes
    // on, and the default domain does not notice.
    assert!(culprit.run("illegal").starts_with("error"));
    let fatal = culprit.run("wait-fatal");
    assert!(fatal.contains("faulted the GPU"), "{fatal}");
    assert!(
        wait_until(Duration::from_secs(10), || bystander.run("fill") == "ok"),
        "the bystander in the same domain carries on"
    );
    assert!(broker.wait_for_log("a new device worker took over", Duration::from_secs(5)));
    assert_eq!(
        held.to_vec()
            .expect("the default domain's buffer is intact"),
        vec![4.5; 1024]
    );
    assert!(
        root.take_device_reset().is_none(),
        "the default domain was not reset"
    );
    verified_fill(&root, 1.5).expect("the default domain works");
    assert!(
        broker.worker_pids().iter().any(|p| before.contains(p)),
        "the default domain's worker is the same"
    );
}

#[test]
fn other_trust_domains_are_refused_clearly_when_gpushared_holds_the_device_itself() {
    let test = "other_trust_domains_are_refused_clearly_when_gpushared_holds_the_device_itself";
    let Some((a, _)) = other_users(test) else {
        return;
    };
    let broker = Broker::start_with(BrokerOptions {
        policy: Some(policy(&[&a])),
        extra_args: vec!["--in-process-device".into()],
        ..Default::default()
    });
    let mut lab = Scripted::start_as(&broker, &a);
    let said = lab.run("connect");
    assert!(
        said.contains("refused") && said.contains("lab") && said.contains("--in-process-device"),
        "{said}"
    );
    // The default domain is served as ever.
    verified_fill(&broker.client(), 2.0).expect("root is served");
}

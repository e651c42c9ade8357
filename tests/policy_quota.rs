//! The policy file: classes, weights and memory quotas by user, enforced by the broker.

use gpushare::{ErrorCode, PriorityClass};
use gpushare_tests::{Broker, BrokerOptions};

fn my_uid() -> u32 {
    nix::unistd::getuid().as_raw()
}

fn broker_with(policy: String) -> Broker {
    Broker::start_with(BrokerOptions {
        policy: Some(policy),
        ..Default::default()
    })
}

#[test]
fn allocation_past_the_quota_fails_cleanly_and_changes_nothing() {
    let uid = my_uid();
    let broker = broker_with(format!(
        "[defaults]\nmemory_quota = \"unlimited\"\n\n[[users]]\nuid = {uid}\nclass = \"high\"\nweight = 3\nmemory_quota = \"1 MiB\"\n"
    ));
    let client = broker.client();
    let s = client.session();
    assert_eq!(
        (s.class, s.weight, s.memory_quota),
        (PriorityClass::High, 3, Some(1 << 20))
    );

    let a = client.alloc_raw(600 * 1024).expect("within quota");
    let err = client.alloc_raw(600 * 1024).expect_err("past quota");
    assert_eq!(err.code(), Some(ErrorCode::OutOfQuota), "{err}");
    let status = broker.status();
    let me = &status.clients[0];
    assert_eq!(
        me.memory_used,
        600 * 1024,
        "the failed allocation left no trace"
    );
    assert_eq!(me.memory_quota, Some(1 << 20));
    assert_eq!(me.class, PriorityClass::High);
    // The first allocation still works, and after freeing it there is room again.
    client
        .submit_wait(gpushare::Command::Memset {
            stream: 0,
            dst: a,
            value: 1,
            len: 600 * 1024,
        })
        .expect("memset");
    client.free_raw(a).expect("free");
    let b = client.alloc_raw(1 << 20).expect("the whole quota");
    client.free_raw(b).expect("free");
    assert_eq!(broker.status().clients[0].memory_peak, 1 << 20);
}

#[test]
fn a_client_may_lower_its_class_but_never_raise_it() {
    let uid = my_uid();
    let broker = broker_with(format!("[[users]]\nuid = {uid}\nclass = \"normal\"\n"));
    let ask = |class| {
        let opts = gpushare::ConnectOptions {
            class: Some(class),
            ..broker.options("asker")
        };
        gpushare::Client::connect_with(opts)
            .expect("connect")
            .session()
            .class
    };
    assert_eq!(ask(PriorityClass::BestEffort), PriorityClass::BestEffort);
    assert_eq!(
        ask(PriorityClass::High),
        PriorityClass::Normal,
        "cannot promote itself"
    );
}

#[test]
fn a_broken_policy_file_stops_the_broker_with_a_clear_message() {
    let dir = tempfile::tempdir().expect("tmp");
    let policy = dir.path().join("p.toml");
    std::fs::write(&policy, "[defaults]\nclass = \"urgent\"\n").expect("write");
    let out = std::process::Command::new(gpushare_tests::binary("gpushared"))
        .arg("--socket")
        .arg(dir.path().join("s.sock"))
        .arg("--backend")
        .arg("sim")
        .arg("--config")
        .arg(&policy)
        .output()
        .expect("run");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("p.toml") && stderr.contains("urgent"),
        "{stderr}"
    );
}

#[test]
fn sighup_reloads_the_policy_without_dropping_clients() {
    let uid = my_uid();
    let broker = broker_with(format!("[[users]]\nuid = {uid}\nclass = \"normal\"\n"));
    let before = broker.client_named("before");
    assert_eq!(before.session().class, PriorityClass::Normal);
    let policy = broker.dir.path().join("policy.toml");
    let hup = || {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(broker.pid()),
            nix::sys::signal::Signal::SIGHUP,
        )
        .expect("signal")
    };

    // A broken file is refused and the old policy stays.
    std::fs::write(&policy, "[defaults]\nclass = \"urgent\"\n").expect("write");
    hup();
    assert!(
        broker.wait_for_log(
            "keeping the previous policy",
            std::time::Duration::from_secs(5)
        ),
        "{}",
        broker.log_text()
    );
    assert_eq!(
        broker.client_named("still-old").session().class,
        PriorityClass::Normal
    );

    std::fs::write(
        &policy,
        format!("[[users]]\nuid = {uid}\nclass = \"high\"\nmemory_quota = \"1 MiB\"\n"),
    )
    .expect("write");
    hup();
    assert!(
        broker.wait_for_log("policy reloaded", std::time::Duration::from_secs(5)),
        "{}",
        broker.log_text()
    );
    let after = broker.client_named("after");
    assert_eq!(
        (after.session().class, after.session().memory_quota),
        (PriorityClass::High, Some(1 << 20))
    );
    // The earlier client is still connected and working, with its old grant.
    before.nop().expect("still connected");
    let status = broker.status();
    let old = status
        .clients
        .iter()
        .find(|c| c.name == "before")
        .expect("still listed");
    assert_eq!(old.class, PriorityClass::Normal);
}

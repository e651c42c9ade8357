//! The policy file: classes, weights and memory quotas by user, enforced by the broker; a
//! user's quota holds for all of their sessions together.

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use gpushare::{ErrorCode, PriorityClass};
use gpushare_conn::{Notices, Session, SessionOptions};
use gpushare_protocol::Command;
use gpushare_protocol::control::Role;
use gpushare_tests::{Broker, BrokerOptions, other_users, wait_until};

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
fn a_program_started_again_the_moment_the_last_one_ended_finds_its_quota_free() {
    let uid = my_uid();
    let broker = broker_with(format!(
        "[[users]]\nuid = {uid}\nmemory_quota = \"4 MiB\"\n"
    ));
    // A neighbour of the same user's keeps a session, so the user has others while each
    // program ends.
    let neighbour = broker.client();
    for round in 0..100 {
        let program = broker.client();
        program
            .alloc_raw(4 << 20)
            .unwrap_or_else(|e| panic!("round {round}: the whole quota: {e}"));
        drop(program);
    }
    drop(neighbour);
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

/// A terminal's hangup, or `kill -HUP` sent to gpushared's process group (what a harness that
/// wraps gpushared in `timeout` does with a SIGHUP it gets), reaches the device workers too:
/// they leave it to gpushared, which reloads its policy, and keep serving.
#[test]
fn a_hangup_sent_to_gpushareds_process_group_leaves_its_device_workers_serving() {
    let broker = Broker::start_with(BrokerOptions {
        policy: Some(String::new()),
        own_process_group: true,
        ..BrokerOptions::default()
    });
    let client = broker.client_named("before");
    let data: Vec<f32> = (0..256).map(|i| i as f32).collect();
    let buf = client.alloc::<f32>(256).expect("alloc");
    buf.copy_from_host(&data).expect("upload");
    let workers = broker.worker_pids();
    assert!(
        !workers.is_empty(),
        "device workers serve: {}",
        broker.log_text()
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(-broker.pid()),
        nix::sys::signal::Signal::SIGHUP,
    )
    .expect("signal the group");
    assert!(
        broker.wait_for_log("policy reloaded", std::time::Duration::from_secs(5)),
        "{}",
        broker.log_text()
    );
    for pid in &workers {
        assert!(
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(*pid), None).is_ok(),
            "device worker {pid} is gone; log:\n{}",
            broker.log_text()
        );
    }
    assert_eq!(buf.to_vec().expect("the memory, read back"), data);
    assert_eq!(broker.worker_pids(), workers, "{}", broker.log_text());
}

/// A governed or consolidated session of this process, as the interposer and the CUDA driver
/// open theirs.
fn session_as(broker: &Broker, role: Role) -> Session {
    let opts = SessionOptions {
        socket: broker.socket.clone(),
        name: format!("{role:?}"),
        ..SessionOptions::new(role)
    };
    Session::open(&opts, Arc::new(Notices::new(false))).expect("open a session")
}

#[test]
fn one_users_sessions_share_one_quota_and_another_users_is_untouched() {
    const MIB: u64 = 1 << 20;
    let broker = broker_with("[defaults]\nmemory_quota = \"4 MiB\"\n".into());
    // One user, three kinds of session: the library, a governed program's reservations, a
    // consolidated program's allocations.
    let library = broker.client_named("library");
    let governed = session_as(&broker, Role::Governed);
    let consolidated = session_as(&broker, Role::Consolidated);
    for quota in [
        library.session().memory_quota,
        governed.welcome().memory_quota,
        consolidated.welcome().memory_quota,
    ] {
        assert_eq!(quota, Some(4 * MIB));
    }
    let held = library.alloc_raw(3 * MIB / 2).expect("within the quota");
    governed
        .submit_wait(Command::GovernedReserve { bytes: 3 * MIB / 2 })
        .expect("the governed program's reservation, within the quota");
    // A consolidated program sees what is left of its user's quota.
    let (free, total) = consolidated
        .submit_wait(Command::MemInfo)
        .expect("cuMemGetInfo");
    assert_eq!((free, total), (MIB, 4 * MIB));
    let past = consolidated
        .submit_wait(Command::Alloc { bytes: MIB + 1 })
        .expect_err("past what the user's other sessions left");
    assert_eq!(past.code(), Some(ErrorCode::OutOfQuota), "{past}");
    consolidated
        .submit_wait(Command::Alloc { bytes: MIB })
        .expect("the rest of the quota");
    let err = library.alloc_raw(1).expect_err("the user's quota is spent");
    assert_eq!(err.code(), Some(ErrorCode::OutOfQuota), "{err}");

    // Another user has the whole of their own quota.
    let mut other = None;
    if let Some((daemon, _)) = other_users("one_users_sessions_share_one_quota: another user") {
        let mut child = broker
            .command_as(&daemon, "gpushare-testclient")
            .args(["hold", &(4 * MIB).to_string()])
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn the other user's client");
        let mut line = String::new();
        let stdout = child.stdout.take().expect("stdout");
        BufReader::new(stdout).read_line(&mut line).expect("read");
        assert_eq!(line.trim(), "ready", "the other user's 4 MiB");
        other = Some((child, daemon.uid));
    }

    let status = broker.status();
    let me = nix::unistd::getuid().as_raw();
    let mine = status
        .users
        .iter()
        .find(|u| u.uid == me)
        .expect("this user's totals");
    assert_eq!(
        (mine.sessions, mine.memory_used, mine.memory_quota),
        (3, 4 * MIB, Some(4 * MIB)),
        "{:?}",
        status.users
    );
    let per_client: u64 = status
        .clients
        .iter()
        .filter(|c| c.uid == me)
        .map(|c| c.memory_used)
        .sum();
    assert_eq!(per_client, 4 * MIB, "the clients' own figures add up");
    if let Some((_, uid)) = &other {
        let theirs = status.users.iter().find(|u| u.uid == *uid);
        assert_eq!(
            theirs.map(|u| (u.sessions, u.memory_used)),
            Some((1, 4 * MIB)),
            "{:?}",
            status.users
        );
    }
    // What one session gives back, another of the same user may take.
    governed
        .submit_wait(Command::GovernedRelease { bytes: 3 * MIB / 2 })
        .expect("release");
    let again = library.alloc_raw(MIB).expect("room again");
    library.free_raw(again).expect("free");
    library.free_raw(held).expect("free");
    drop((library, governed, consolidated));
    assert!(
        wait_until(Duration::from_secs(5), || broker
            .status()
            .users
            .iter()
            .all(|u| u.uid != me)),
        "a user without sessions leaves the totals: {:?}",
        broker.status().users
    );
    if let Some((mut child, _)) = other {
        let _ = child.kill();
        let _ = child.wait();
    }
}

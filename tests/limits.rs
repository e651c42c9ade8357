//! Bounds per user: sessions, page-locked host memory, connections of every kind and module
//! images, from the policy (64 sessions, 2 GiB, 128 connections and 1 GiB by default). Past
//! them a new session, connection or image is refused with a sentence naming the bound, the
//! broker's threads and memory stay bounded, and other users still connect. Idle monitor
//! connections are closed. A thousand idle clients cost no CPU and little memory.

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::Duration;

use gpushare::{Client, ConnectOptions, ErrorCode};
use gpushare_tests::faults::Scripted;
use gpushare_tests::{Broker, BrokerOptions, SystemUser, other_users, wait_until};

/// A line of `/proc/PID/status` (`Threads:`, `VmRSS:`), as a number (kB for sizes).
fn proc_status(pid: i32, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no `{field}` in /proc/{pid}/status"))
}

fn threads(broker: &Broker) -> u64 {
    proc_status(broker.pid(), "Threads:")
}

fn rss_kib(broker: &Broker) -> u64 {
    proc_status(broker.pid(), "VmRSS:")
}

/// CPU time the broker has used, user and system, in clock ticks.
fn cpu_ticks(broker: &Broker) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", broker.pid())).unwrap_or_default();
    // "pid (comm) state ppid …": utime and stime are the 12th and 13th fields after ')'.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let fields: Vec<u64> = rest
        .split_whitespace()
        .filter_map(|f| f.parse().ok())
        .collect();
    fields.get(10).copied().unwrap_or(0) + fields.get(11).copied().unwrap_or(0)
}

fn connect(broker: &Broker, name: &str, arena_size: u64) -> gpushare::Result<Client> {
    Client::connect_with(ConnectOptions {
        arena_size,
        ..broker.options(name)
    })
}

/// `connect-probe` as another user: `connected …` or `refused …`.
fn probe_as(broker: &Broker, user: &SystemUser) -> String {
    let mut child = broker
        .command_as(user, "gpushare-testclient")
        .arg("connect-probe")
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the probe");
    let mut line = String::new();
    let stdout = child.stdout.take().expect("stdout");
    BufReader::new(stdout).read_line(&mut line).expect("read");
    let _ = child.wait();
    line.trim().to_string()
}

#[test]
fn sessions_past_the_users_bound_are_refused_and_the_broker_stays_bounded() {
    // No policy file: the built-in bounds (64 sessions, 2 GiB pinned) apply.
    let broker = Broker::start();
    broker.dump_log_if_stuck(Duration::from_secs(120));
    let (threads_before, rss_before) = (threads(&broker), rss_kib(&broker));
    let mut held = Vec::new();
    let refused = loop {
        match connect(&broker, &format!("s{}", held.len()), 0) {
            Ok(c) => held.push(c),
            Err(e) => break e,
        }
        assert!(held.len() <= 64, "a 65th session was accepted");
    };
    assert_eq!(held.len(), 64, "the default max_sessions");
    assert_eq!(refused.code(), Some(ErrorCode::TooManyHandles), "{refused}");
    let text = refused.to_string();
    assert!(
        text.contains("has 64 sessions open, the most the policy's max_sessions allows"),
        "{text}"
    );
    // More attempts leave nothing behind: no thread, no region.
    for i in 0..100 {
        assert!(connect(&broker, &format!("more{i}"), 0).is_err());
    }
    let threads_full = threads(&broker);
    assert!(
        threads_full <= threads_before + 64 + 2,
        "broker threads {threads_before} -> {threads_full} for 64 sessions and 100 refusals"
    );
    let rss_full = rss_kib(&broker);
    assert!(
        rss_full <= rss_before + 64 * 1024,
        "broker RSS {rss_before} -> {rss_full} KiB for 64 idle sessions"
    );
    assert_eq!(broker.mapped_client_regions(), 64);
    let status = broker.status();
    let me = nix::unistd::getuid().as_raw();
    let mine = status
        .users
        .iter()
        .find(|u| u.uid == me)
        .expect("my totals");
    assert_eq!(
        (mine.sessions, mine.max_sessions, mine.max_pinned_bytes),
        (64, 64, Some(2 << 30)),
        "{mine:?}"
    );
    assert!(mine.pinned_bytes >= 64 * (16 << 20), "{mine:?}");
    // Another user is not held back by this one's sessions.
    if let Some((daemon, _)) = other_users("sessions_past_the_users_bound: another user") {
        let line = probe_as(&broker, &daemon);
        assert!(line.starts_with("connected"), "{line}");
    }
    // One session ended makes room for one more.
    held.pop();
    assert!(wait_until(Duration::from_secs(5), || {
        connect(&broker, "again", 0).map(|c| held.push(c)).is_ok()
    }));
    drop(held);
    assert!(
        wait_until(Duration::from_secs(10), || threads(&broker)
            <= threads_before + 1
            && broker.status().users.is_empty()),
        "threads {} (before {threads_before}), users {:?}",
        threads(&broker),
        broker.status().users
    );
}

#[test]
fn page_locked_memory_past_the_users_bound_is_refused() {
    let broker = Broker::start_with(BrokerOptions {
        policy: Some("[defaults]\nmax_pinned_memory = \"40 MiB\"\n".into()),
        ..Default::default()
    });
    let a = connect(&broker, "a", 16 << 20).expect("16 MiB arena");
    let b = connect(&broker, "b", 16 << 20).expect("another");
    let err = connect(&broker, "c", 16 << 20)
        .err()
        .expect("a third 16 MiB arena passes 40 MiB");
    assert_eq!(err.code(), Some(ErrorCode::TooManyHandles), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("of page-locked host memory in gpushared")
            && text.contains("max_pinned_memory of 40.0 MiB"),
        "{text}"
    );
    // A smaller arena still fits.
    let small = connect(&broker, "small", 1 << 20).expect("a 1 MiB arena fits");
    drop((a, b));
    let again = wait_until(Duration::from_secs(5), || {
        connect(&broker, "again", 16 << 20).is_ok()
    });
    assert!(again, "the memory of ended sessions is given back");
    drop(small);
}

#[test]
fn a_users_connections_and_module_images_are_bounded_and_others_are_served() {
    let test = "a_users_connections_and_module_images_are_bounded_and_others_are_served";
    let Some((a, b)) = other_users(test) else {
        return;
    };
    let policy = format!(
        "[[users]]\nname = \"{}\"\nmax_connections = 4\nmax_module_memory = \"1 MiB\"\n",
        a.name
    );
    let broker = Broker::start_with(BrokerOptions {
        policy: Some(policy),
        ..Default::default()
    });
    broker.dump_log_if_stuck(Duration::from_secs(60));
    let mut hog = Scripted::start_as(&broker, &a);
    assert!(hog.run("connect").starts_with("connected"));
    // The session is one connection: three monitors more, and the fourth is refused.
    let refused = hog.run("monitors 10");
    assert!(
        refused.starts_with("refused after 3:")
            && refused.contains("has 4 connections to gpushared open")
            && refused.contains("max_connections"),
        "{refused}"
    );
    // Everyone else is served meanwhile: another user, and root's `gpushare status`.
    let mut other = Scripted::start_as(&broker, &b);
    assert!(other.run("connect").starts_with("connected"));
    assert_eq!(other.run("fill"), "ok");
    let status = broker.status();
    let hogs = status
        .users
        .iter()
        .find(|u| u.uid == a.uid)
        .expect("the user's totals");
    assert_eq!((hogs.connections, hogs.max_connections), (4, 4), "{hogs:?}");

    // Module images: 600 KB fits the 1 MiB bound, a second distinct one does not, the same
    // bytes again cost nothing, and unloading gives the room back.
    assert_eq!(hog.run("load-image 600000 1"), "loaded");
    let past = hog.run("load-image 600000 2");
    assert!(
        past.contains("max_module_memory of 1.0 MiB") && past.contains("585.9 KiB more"),
        "{past}"
    );
    assert_eq!(
        hog.run("load-image 600000 1"),
        "loaded",
        "the same bytes again"
    );
    let held = broker.status();
    let hogs = held.users.iter().find(|u| u.uid == a.uid).expect("totals");
    assert_eq!(hogs.module_bytes, 600000, "counted once: {hogs:?}");
    assert_eq!(hog.run("unload-all"), "unloaded");
    assert!(wait_until(Duration::from_secs(5), || {
        broker
            .status()
            .users
            .iter()
            .any(|u| u.uid == a.uid && u.module_bytes == 0)
    }));
    assert_eq!(hog.run("load-image 600000 2"), "loaded");

    // Connections given back are room again.
    assert_eq!(hog.run("drop-monitors"), "dropped");
    assert!(wait_until(Duration::from_secs(5), || hog.run("monitors 1")
        == "monitors 1"));
}

#[test]
fn idle_monitor_connections_are_closed_and_top_reconnects() {
    let broker = Broker::start_with(BrokerOptions {
        extra_args: vec!["--monitor-idle-timeout".into(), "0.3".into()],
        ..Default::default()
    });
    let sock = gpushare_conn::ControlSocket::connect(&broker.socket).expect("connect");
    let hello = gpushare_protocol::control::Hello {
        protocol_version: gpushare_protocol::PROTOCOL_VERSION,
        role: gpushare_protocol::control::Role::Monitor,
        client_name: "idle".into(),
        requested_class: None,
        sq_entries: 0,
        arena_size: 0,
        gpu: None,
    };
    sock.handshake(hello).expect("welcomed");
    let timeout = nix::sys::time::TimeVal::new(10, 0);
    nix::sys::socket::setsockopt(
        &sock.as_fd(),
        nix::sys::socket::sockopt::ReceiveTimeout,
        &timeout,
    )
    .expect("receive timeout");
    match sock.recv() {
        Ok((gpushare_protocol::control::BrokerMessage::Evicted { reason }, _)) => {
            assert!(reason.contains("without a request"), "{reason}")
        }
        other => panic!("expected the idle monitor closed, got {other:?}"),
    }
    // `top` outlives the timeout between refreshes: it connects again, and says nothing of it.
    let out = broker
        .command("gpushare")
        .args(["top", "-b", "-n", "2", "-d", "0.6"])
        .output()
        .expect("run top");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert_eq!(text.matches("gpushared ").count(), 2, "two frames:\n{text}");
}

#[test]
fn a_thousand_idle_clients_cost_no_cpu_and_little_memory() {
    const CLIENTS: usize = 1000;
    let broker = Broker::start_with(BrokerOptions {
        policy: Some(format!(
            "[defaults]\nmax_sessions = {CLIENTS}\nmax_pinned_memory = \"unlimited\"\n"
        )),
        ..Default::default()
    });
    broker.dump_log_if_stuck(Duration::from_secs(300));
    let rss_before = rss_kib(&broker);
    let clients: Vec<Client> = (0..CLIENTS)
        .map(|i| {
            Client::connect_with(ConnectOptions {
                arena_size: 64 << 10,
                sq_entries: 16,
                ..broker.options(&format!("idle{i}"))
            })
            .unwrap_or_else(|e| panic!("client {i}: {e}"))
        })
        .collect();
    // Every client did one round trip, so every data thread ran and went back to sleep.
    for c in &clients {
        c.nop().expect("nop");
    }
    assert_eq!(broker.status().clients.len(), CLIENTS);
    let rss = rss_kib(&broker);
    let per_client = (rss.saturating_sub(rss_before)) / CLIENTS as u64;
    assert!(
        per_client <= 512,
        "broker RSS {rss_before} -> {rss} KiB: {per_client} KiB per idle client"
    );
    // Idle: the broker's CPU time barely moves. A spinning data thread would add a whole
    // core's worth (100 ticks a second) on its own.
    let ticks_before = cpu_ticks(&broker);
    std::thread::sleep(Duration::from_secs(2));
    let ticks = cpu_ticks(&broker) - ticks_before;
    assert!(
        ticks <= 20,
        "{CLIENTS} idle clients cost the broker {ticks} ticks of CPU in 2 s"
    );
    eprintln!(
        "{CLIENTS} idle clients: broker RSS {rss_before} -> {rss} KiB ({per_client} KiB each), {} threads, {ticks} CPU ticks in 2 s",
        threads(&broker)
    );
}

#[test]
fn idle_high_priority_clients_cost_neither_gpushared_nor_its_device_workers_cpu() {
    // High-class sessions spin longest after their work (gpushared's data thread, and the
    // device worker's thread for it): once idle, both must sleep, and so must the fault
    // guardian. `gpushare-demo cost` once found 100 idle demo clients under the priority
    // policy taking two cores, in the workers (threads that spun again after every timeout);
    // this smaller run checks the same property on every run.
    const CLIENTS: usize = 30;
    let broker = Broker::start_with(BrokerOptions {
        policy: Some(format!(
            "scheduler = \"priority\"\n[defaults]\nclass = \"high\"\nmax_sessions = {CLIENTS}\n"
        )),
        extra_args: vec!["--sim-realtime".into()],
        ..Default::default()
    });
    broker.dump_log_if_stuck(Duration::from_secs(120));
    // Programs that set up their buffers and then sit idle, as a notebook left open does.
    let mut clients: Vec<std::process::Child> = (0..CLIENTS)
        .map(|i| {
            broker
                .command("gpushare-demo")
                .args(["--name", &format!("idle{i}"), "--workload", "idle"])
                .args(["--until-eof", "--arena-kib", "256"])
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("client {i}: {e}"))
        })
        .collect();
    // Idle: every client connected, and none has sent a command for half a second (on a
    // loaded machine the last ones take a while to set up).
    let mut last = None;
    assert!(
        wait_until(Duration::from_secs(120), || {
            let s = broker.status();
            let commands: u64 = s.clients.iter().map(|c| c.commands).sum();
            let settled = s.clients.len() == CLIENTS && last == Some(commands);
            last = Some(commands);
            if !settled {
                std::thread::sleep(Duration::from_millis(500));
            }
            settled
        }),
        "every client connected and idle"
    );
    let before = broker.status().usage;
    std::thread::sleep(Duration::from_secs(2));
    let after = broker.status().usage;
    let ms = |a: u64, b: u64| a.saturating_sub(b) / 1_000_000;
    let (own, workers) = (
        ms(after.cpu_ns, before.cpu_ns),
        ms(after.workers_cpu_ns, before.workers_cpu_ns),
    );
    eprintln!(
        "{CLIENTS} idle high-class clients, 2 s: gpushared {own} ms of CPU, its device workers {workers} ms"
    );
    for c in &mut clients {
        drop(c.stdin.take());
    }
    for c in &mut clients {
        let _ = c.wait();
    }
    assert!(
        after.workers >= 1,
        "the status counts the device workers: {after:?}"
    );
    assert!(
        own <= 200 && workers <= 200,
        "{CLIENTS} idle clients cost gpushared {own} ms and its device workers {workers} ms of CPU in 2 s"
    );
}

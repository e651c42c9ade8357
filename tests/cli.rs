//! The `gpushare` command line against a live sim broker: status, clients, top's batch frames,
//! help and completions, and the admin commands `set` and `evict` with and without permission.

use std::process::Output;
use std::time::{Duration, Instant};

use gpushare::{Kernel, PriorityClass};
use gpushare_tests::{Broker, BrokerOptions, wait_until};

fn gpushare(broker: &Broker, args: &[&str]) -> Output {
    broker
        .command("gpushare")
        .args(args)
        .output()
        .expect("run gpushare")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[track_caller]
fn success(out: Output) -> String {
    assert!(
        out.status.success(),
        "gpushare failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        stdout(&out),
        stderr(&out)
    );
    stdout(&out)
}

/// A client that has done some work and still holds its memory.
struct Busy {
    // Buffers before the client: they free through it when dropped.
    _buffers: Vec<gpushare::DeviceBuffer<f32>>,
    client: gpushare::Client,
}

const BUSY_BYTES: u64 = 3 * 4 * (1 << 16);

fn busy_client(broker: &Broker, name: &str) -> Busy {
    let client = broker.client_named(name);
    let stream = client.create_stream().expect("stream");
    let n = 1 << 16;
    let a = client.alloc::<f32>(n).expect("alloc");
    let b = client.alloc::<f32>(n).expect("alloc");
    let c = client.alloc::<f32>(n).expect("alloc");
    a.copy_from_host(&vec![1.0; n]).expect("upload");
    b.copy_from_host(&vec![2.0; n]).expect("upload");
    for _ in 0..10 {
        stream
            .launch(Kernel::VecAddF32 {
                a: a.ptr(),
                b: b.ptr(),
                c: c.ptr(),
                n: n as u64,
            })
            .expect("launch");
    }
    stream.synchronize().expect("sync");
    Busy {
        _buffers: vec![a, b, c],
        client,
    }
}

#[test]
fn status_and_clients_show_a_live_client() {
    let broker = Broker::start();
    let busy = busy_client(&broker, "cli-alpha");
    let id = busy.client.session().client_id;

    let text = success(gpushare(&broker, &["status"]));
    let backend = format!("backend {}", gpushare_tests::test_backend());
    assert!(text.contains(&backend), "{text}");
    assert!(text.contains("clients: 1"), "{text}");
    assert!(text.contains("cli-alpha"), "{text}");

    let json: serde_json::Value =
        serde_json::from_str(&success(gpushare(&broker, &["status", "--json"]))).expect("JSON");
    assert_eq!(json["backend"], gpushare_tests::test_backend().as_str());
    let me = &json["clients"][0];
    assert_eq!(me["name"], "cli-alpha");
    assert_eq!(me["client_id"].as_u64(), Some(id));
    assert_eq!(me["kernels"].as_u64(), Some(10));
    assert_eq!(me["memory_used"].as_u64(), Some(BUSY_BYTES));

    let table = success(gpushare(&broker, &["clients"]));
    let mut lines = table.lines();
    let header = lines.next().unwrap_or_default();
    for column in [
        "ID", "PID", "USER", "NAME", "CLASS", "MEMORY", "QUOTA", "KERNELS",
    ] {
        assert!(header.contains(column), "{column} in {header}");
    }
    let row = lines.next().unwrap_or_default();
    assert!(
        row.contains("cli-alpha") && row.contains(&std::process::id().to_string()),
        "{row}"
    );
    assert_eq!(lines.next(), None, "one client, one line: {table}");

    let list: serde_json::Value =
        serde_json::from_str(&success(gpushare(&broker, &["clients", "--json"]))).expect("JSON");
    assert_eq!(list.as_array().map(Vec::len), Some(1), "{list}");
    assert_eq!(list[0]["name"], "cli-alpha");
    drop(busy);
    assert!(wait_until(Duration::from_secs(5), || broker
        .status()
        .clients
        .is_empty()));
    assert_eq!(
        success(gpushare(&broker, &["clients"])).trim(),
        "no clients"
    );
}

#[test]
fn names_chosen_to_attack_a_terminal_or_a_log_are_shown_escaped() {
    let broker = Broker::start();
    // Retitles and clears the terminal, forges a log line, reverses what follows.
    let hostile = "\x1b]0;owned\x07\x1b[2J\nINFO forged\u{202e}x";
    let _c = busy_client(&broker, hostile);
    for args in [
        &["status"][..],
        &["clients"],
        &["status", "--json"],
        &["top", "-b", "-n", "1"],
    ] {
        let text = success(gpushare(&broker, args));
        assert!(
            !text.contains(['\x1b', '\x07', '\u{202e}']),
            "{args:?} passed a control character through:\n{text:?}"
        );
        assert!(
            !text.lines().any(|l| l.starts_with("INFO forged")),
            "{args:?} printed a line the name made:\n{text}"
        );
        assert!(text.contains("\\x1b]0;owned"), "{args:?}:\n{text}");
    }
    assert!(broker.wait_for_log("client connected", Duration::from_secs(5)));
    let log = broker.log_text();
    assert!(
        !log.lines().any(|l| l.starts_with("INFO forged")),
        "a forged log line:\n{log}"
    );
    assert!(!log.contains('\u{202e}'), "{log}");
    assert!(log.contains("\\x1b]0;owned\\x07"), "{log}");
}

#[test]
fn top_batch_prints_text_frames() {
    let broker = Broker::start();
    let _a = busy_client(&broker, "top-alpha");
    let _b = busy_client(&broker, "top-beta");
    let started = Instant::now();
    let text = success(gpushare(&broker, &["top", "-b", "-n", "2", "-d", "0.2"]));
    assert!(
        started.elapsed() >= Duration::from_millis(200),
        "frames are -d apart"
    );
    assert_eq!(text.matches("gpushared ").count(), 2, "two frames:\n{text}");
    assert_eq!(text.matches("· 2 clients").count(), 2, "{text}");
    assert_eq!(text.matches("GPU 0 ").count(), 2, "{text}");
    assert_eq!(text.matches("COMMAND").count(), 2, "{text}");
    for name in ["top-alpha", "top-beta"] {
        let rows: Vec<&str> = text.lines().filter(|l| l.contains(name)).collect();
        assert_eq!(rows.len(), 2, "{name} once per frame:\n{text}");
        for row in rows {
            assert!(row.contains("library") && row.contains("normal"), "{row}");
            // Queue depth, latencies and ioctls are not reported yet: they show "-"; FIFO
            // holds nobody (THROT% 0.0).
            let last: Vec<&str> = row.split_whitespace().rev().take(2).collect();
            assert_eq!(last, ["0.0", "-"], "{row}");
        }
    }
}

#[test]
fn top_batch_json_prints_one_object_per_frame() {
    let broker = Broker::start();
    let _a = busy_client(&broker, "json-alpha");
    let text = success(gpushare(
        &broker,
        &["top", "-b", "-n", "2", "-d", "0.2", "--json"],
    ));
    let frames: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    assert_eq!(frames.len(), 2, "{text}");
    for (i, f) in frames.iter().enumerate() {
        assert_eq!(f["frame"].as_u64(), Some(i as u64 + 1));
        assert_eq!(f["connected"], true);
        assert_eq!(f["backend"], gpushare_tests::test_backend().as_str());
        assert_eq!(f["clients"].as_u64(), Some(1));
        if gpushare_tests::test_backend() == "sim" {
            assert_eq!(f["devices"][0]["memory_total"].as_u64(), Some(16 << 30));
        }
        let row = &f["rows"][0];
        assert_eq!(row["name"], "json-alpha");
        assert_eq!(row["kind"], "library");
        assert_eq!(row["pid"].as_u64(), Some(u64::from(std::process::id())));
        assert_eq!(row["memory_used"].as_u64(), Some(BUSY_BYTES));
        // The broker reports queue depth; ioctl rates need telemetry, which is off here.
        assert!(row["queue_depth"].is_u64(), "{row}");
        assert!(row["ioctls_per_s"].is_null(), "{row}");
    }
    // The first frame averages since the client connected; the second measures the interval.
    assert!(frames[0]["rows"][0]["kernels_per_s"].as_f64() > Some(0.0));
    assert!(frames[0]["interval_ms"].is_null());
    let interval = frames[1]["interval_ms"].as_u64().unwrap_or(0);
    assert!((150..5_000).contains(&interval), "interval {interval} ms");
    assert_eq!(frames[1]["rows"][0]["kernels_per_s"].as_f64(), Some(0.0));
}

#[test]
fn top_without_a_broker_says_so_and_fails() {
    let broker = Broker::start();
    let missing = broker.dir.path().join("nobody-here.sock");
    let out = broker
        .command("gpushare")
        .args(["top", "-b", "-n", "2", "-d", "0.1"])
        .env("GPUSHARE_SOCKET", &missing)
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert_eq!(
        stdout(&out).matches("disconnected").count(),
        2,
        "{}",
        stdout(&out)
    );
    assert!(
        stderr(&out).contains("cannot connect to gpushared"),
        "{}",
        stderr(&out)
    );
    let json = broker
        .command("gpushare")
        .args(["top", "--json", "-n", "1"])
        .env("GPUSHARE_SOCKET", &missing)
        .output()
        .expect("run");
    let frame: serde_json::Value =
        serde_json::from_str(stdout(&json).trim()).expect("a JSON frame even when disconnected");
    assert_eq!(frame["connected"], false);
    assert!(
        frame["error"]
            .as_str()
            .is_some_and(|e| e.contains("cannot connect"))
    );
}

#[test]
fn interactive_top_needs_a_terminal() {
    let broker = Broker::start();
    let out = gpushare(&broker, &["top"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("needs a terminal"),
        "{}",
        stderr(&out)
    );
    let out = gpushare(&broker, &["top", "-n", "1"]);
    assert!(
        stderr(&out).contains("-n counts batch frames"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn every_command_has_help_and_completions_exist() {
    let broker = Broker::start();
    for cmd in [
        &["--help"][..],
        &["status", "--help"],
        &["clients", "--help"],
        &["top", "--help"],
        &["set", "--help"],
        &["evict", "--help"],
        &["completions", "--help"],
    ] {
        let text = success(gpushare(&broker, cmd));
        assert!(text.contains("Usage: gpushare"), "{cmd:?}: {text}");
    }
    let top = success(gpushare(&broker, &["top", "--help"]));
    for flag in ["--batch", "--iterations", "--delay", "--json"] {
        assert!(top.contains(flag), "{flag} in {top}");
    }
    for shell in ["bash", "zsh", "fish"] {
        let script = success(gpushare(&broker, &["completions", shell]));
        assert!(
            script.contains("gpushare") && script.contains("evict"),
            "{shell}: {script}"
        );
    }
    let out = gpushare(&broker, &["set", "1"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("--class") && stderr(&out).contains("required"),
        "{}",
        stderr(&out)
    );
    let out = gpushare(&broker, &["set", "1", "--memory-quota", "lots"]);
    assert!(
        stderr(&out).contains("not a memory size"),
        "{}",
        stderr(&out)
    );
}

// ---- admin commands ------------------------------------------------------------------------

/// The caller's primary group, which the policy names as the admin group.
fn my_group() -> String {
    let gid = nix::unistd::getgid();
    nix::unistd::Group::from_gid(gid)
        .ok()
        .flatten()
        .map_or_else(|| gid.to_string(), |g| g.name)
}

fn admin_broker(admin_group: &str) -> Broker {
    Broker::start_with(BrokerOptions {
        policy: Some(format!("admin_group = \"{admin_group}\"\n")),
        ..Default::default()
    })
}

#[test]
fn set_changes_a_live_clients_class_weight_and_quota() {
    let broker = admin_broker(&my_group());
    let client = broker.client_named("victim");
    let id = client.session().client_id.to_string();
    let said = success(gpushare(
        &broker,
        &[
            "set",
            &id,
            "--class",
            "best-effort",
            "--weight",
            "3",
            "--memory-quota",
            "64MiB",
        ],
    ));
    assert_eq!(
        said.trim(),
        format!("client {id}: class best-effort, weight 3, memory quota 64.0 MiB")
    );
    let me = broker.status().clients.remove(0);
    assert_eq!(
        (me.class, me.weight, me.memory_quota),
        (PriorityClass::BestEffort, 3, Some(64 << 20))
    );
    success(gpushare(&broker, &["set", &id, "--memory-quota", "1MiB"]));
    let err = client.alloc_raw(2 << 20).expect_err("past the new quota");
    assert_eq!(err.code(), Some(gpushare::ErrorCode::OutOfQuota), "{err}");
    success(gpushare(
        &broker,
        &["set", &id, "--memory-quota", "unlimited"],
    ));
    assert_eq!(broker.status().clients[0].memory_quota, None);
    client.alloc_raw(2 << 20).expect("no quota any more");
}

#[test]
fn evict_drops_a_client_and_tells_it_why() {
    let broker = admin_broker(&my_group());
    let client = broker.client_named("victim");
    let bystander = broker.client_named("bystander");
    let id = client.session().client_id;
    let said = success(gpushare(
        &broker,
        &["evict", &id.to_string(), "--reason", "maintenance window"],
    ));
    assert_eq!(said.trim(), format!("client {id} evicted"));
    assert!(wait_until(Duration::from_secs(5), || broker
        .status()
        .clients
        .iter()
        .all(|c| c.client_id != id)));
    let err = client.alloc_raw(4096).expect_err("evicted");
    assert!(err.to_string().contains("maintenance window"), "{err}");
    bystander.alloc_raw(4096).expect("others are untouched");
}

#[test]
fn admin_commands_are_refused_without_permission() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    // An admin group nobody here is in; root is allowed regardless, so as root the refused
    // caller is `nobody`.
    let broker = admin_broker("root");
    let client = broker.client_named("victim");
    let id = client.session().client_id.to_string();
    let as_caller = |args: &[&str]| {
        let mut cmd = broker.command("gpushare");
        cmd.args(args);
        if nix::unistd::getuid().is_root() {
            // The socket's directory must let `nobody` in (the socket itself is 0666).
            std::fs::set_permissions(broker.dir.path(), std::fs::Permissions::from_mode(0o755))
                .expect("chmod");
            cmd.uid(65534).gid(65534);
        }
        cmd.output().expect("run gpushare")
    };
    for args in [
        &["set", &id, "--weight", "9"][..],
        &["evict", &id, "--reason", "no"],
    ] {
        let out = as_caller(args);
        assert!(!out.status.success(), "{args:?} must be refused");
        assert_eq!(
            stderr(&out).trim(),
            "gpushare: only root or members of the admin group `root` may change or evict clients",
            "{args:?}"
        );
    }
    let me = broker.status().clients.remove(0);
    assert_eq!(me.weight, 1, "nothing changed");
}

#[test]
fn admin_commands_name_an_unknown_client() {
    let broker = admin_broker(&my_group());
    for args in [
        &["set", "999999", "--weight", "2"][..],
        &["evict", "999999"],
    ] {
        let out = gpushare(&broker, args);
        assert!(!out.status.success());
        assert!(
            stderr(&out).contains("999999"),
            "{args:?}: {}",
            stderr(&out)
        );
    }
}

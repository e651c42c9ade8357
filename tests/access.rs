//! Access by Unix identity, with real unprivileged accounts of the machine (`daemon` and
//! `nobody`; none is created): socket permissions and the policy file decide who may connect,
//! one user cannot reach another's buffers nor change or evict another's clients, and what
//! `gpushare status` shows a non-admin.
//!
//! Needs root (to run processes as those users); says `SKIPPED … not root` otherwise, and
//! fails instead in CI (`CI` or `GPUSHARE_REQUIRE_ROOT` set).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::process::{Child, ChildStdin, Output, Stdio};
use std::time::Duration;

use gpushare::{ErrorCode, PriorityClass};
use gpushare_tests::{Broker, BrokerOptions, SystemUser, other_users, wait_until};

/// The two accounts: A owns things, B tries to reach them.
fn users(test: &str) -> Option<(SystemUser, SystemUser)> {
    other_users(test)
}

/// Runs the test client as `user` to completion.
fn testclient(broker: &Broker, user: &SystemUser, args: &[&str]) -> String {
    let out = broker
        .command_as(user, "gpushare-testclient")
        .args(args)
        .output()
        .expect("run the test client");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{args:?} as {}: {}\n{text}{}",
        user.name,
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// Runs the `gpushare` CLI as `user`.
fn gpushare_cli(broker: &Broker, user: &SystemUser, args: &[&str]) -> Output {
    broker
        .command_as(user, "gpushare")
        .args(args)
        .output()
        .expect("run gpushare")
}

/// A client process of `user` that owns `n` floats set to `value` (test client mode `own`).
struct Owner {
    child: Child,
    stdin: ChildStdin,
    lines: std::io::Lines<BufReader<std::process::ChildStdout>>,
    ptr: u64,
    bytes: u64,
}

impl Owner {
    fn start(broker: &Broker, user: &SystemUser, value: f32, n: usize) -> Owner {
        let mut child = broker
            .command_as(user, "gpushare-testclient")
            .args(["own", &value.to_string(), &n.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn the owner");
        let stdin = child.stdin.take().expect("stdin");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let ready = lines.next().and_then(Result::ok).unwrap_or_default();
        let words: Vec<&str> = ready.split_whitespace().collect();
        let (ptr, bytes) = match words[..] {
            ["ready", ptr, bytes] => (
                u64::from_str_radix(ptr.trim_start_matches("0x"), 16).expect("pointer"),
                bytes.parse().expect("bytes"),
            ),
            _ => panic!("owner as {} did not start: {ready:?}", user.name),
        };
        Owner {
            child,
            stdin,
            lines,
            ptr,
            bytes,
        }
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Reads its buffer back and says whether it still holds its value.
    fn intact(&mut self) -> String {
        writeln!(self.stdin, "check").expect("ask the owner");
        self.lines
            .next()
            .and_then(Result::ok)
            .unwrap_or_else(|| "owner gone".into())
    }

    fn client_id(&self, broker: &Broker) -> u64 {
        broker
            .status()
            .clients
            .iter()
            .find(|c| c.pid == self.pid())
            .map(|c| c.client_id)
            .expect("owner listed")
    }
}

impl Drop for Owner {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn socket_permissions_decide_who_may_connect() {
    let Some((a, b)) = users("socket_permissions_decide_who_may_connect") else {
        return;
    };
    // Owner root, group `daemon`, mode 660: root and the `daemon` group only.
    let broker = Broker::start_with(BrokerOptions {
        socket_mode: Some("660".into()),
        extra_args: vec!["--socket-group".into(), a.name.clone()],
        ..Default::default()
    });
    broker.open_to_other_users();
    let meta = std::fs::metadata(&broker.socket).expect("socket");
    assert_eq!(meta.permissions().mode() & 0o777, 0o660);
    assert_eq!(
        meta.gid(),
        a.gid,
        "the socket belongs to the --socket-group"
    );

    let said = testclient(&broker, &a, &["connect-probe"]);
    assert!(
        said.starts_with("connected "),
        "{} is in the socket's group: {said}",
        a.name
    );
    let said = testclient(&broker, &b, &["connect-probe"]);
    assert!(
        said.starts_with("refused errno=13:"),
        "{} is outside the socket's group and must get EACCES: {said}",
        b.name
    );
    // What the user sees from the CLI.
    let out = gpushare_cli(&broker, &b, &["status"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("cannot connect to gpushared") && err.contains("Permission denied"),
        "{err}"
    );
    eprintln!(
        "socket 660 root:{}: {} connects; {} refused: {}",
        a.name,
        a.name,
        b.name,
        err.trim()
    );
    // Root (the test itself) still connects, and the refusals left nothing behind.
    let me = broker.client_named("root");
    me.nop().expect("root connects");
    // The probe's session ends once the broker reads its hang-up: poll for it.
    assert!(
        wait_until(Duration::from_secs(10), || broker.status().clients.len()
            == 1),
        "{:?}",
        broker.status().clients
    );
}

#[test]
fn the_policy_file_refuses_users_and_groups_at_the_handshake() {
    let Some((a, b)) = users("the_policy_file_refuses_users_and_groups_at_the_handshake") else {
        return;
    };
    // 1. One user refused by name; everyone else allowed. Mode 666: only the policy decides.
    let broker = Broker::start_with(BrokerOptions {
        policy: Some(format!("[[users]]\nname = \"{}\"\nallow = false\n", b.name)),
        ..Default::default()
    });
    let said = testclient(&broker, &b, &["connect-probe"]);
    assert!(
        said.starts_with("refused code=PermissionDenied:")
            && said.contains(&format!(
                "does not allow user `{}` (uid {}) to use gpushare",
                b.name, b.uid
            )),
        "{said}"
    );
    assert!(broker.wait_for_log("rejecting connection", Duration::from_secs(5)));
    assert!(testclient(&broker, &a, &["connect-probe"]).starts_with("connected "));
    // Monitors too: the refused user cannot even look.
    let out = gpushare_cli(&broker, &b, &["status"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("permission denied"),
        "{err}"
    );
    eprintln!("policy refuses {}: {}", b.name, said.trim());

    // 2. Closed by default, one group let in.
    let broker = Broker::start_with(BrokerOptions {
        policy: Some(format!(
            "[defaults]\nallow = false\n\n[[groups]]\nname = \"{}\"\nallow = true\n",
            a.name
        )),
        ..Default::default()
    });
    assert!(testclient(&broker, &a, &["connect-probe"]).starts_with("connected "));
    assert!(
        testclient(&broker, &b, &["connect-probe"]).starts_with("refused code=PermissionDenied:")
    );
    broker
        .client_named("root")
        .nop()
        .expect("root is always allowed");

    // 3. A reload (SIGHUP) refuses new sessions; a session already running keeps going.
    let broker = Broker::start_with(BrokerOptions {
        policy: Some(String::new()),
        ..Default::default()
    });
    let mut running = Owner::start(&broker, &b, 7.0, 256);
    std::fs::write(
        broker.dir.path().join("policy.toml"),
        format!("[[users]]\nuid = {}\nallow = false\n", b.uid),
    )
    .expect("rewrite the policy");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(broker.pid()),
        nix::sys::signal::Signal::SIGHUP,
    )
    .expect("SIGHUP");
    assert!(broker.wait_for_log("policy reloaded", Duration::from_secs(5)));
    assert!(
        testclient(&broker, &b, &["connect-probe"]).starts_with("refused code=PermissionDenied:")
    );
    assert_eq!(
        running.intact(),
        "intact",
        "the running session is not cut off"
    );
}

#[test]
fn one_user_cannot_read_or_write_another_users_buffers() {
    let Some((a, b)) = users("one_user_cannot_read_or_write_another_users_buffers") else {
        return;
    };
    let broker = Broker::start();
    let mut owner = Owner::start(&broker, &a, 42.5, 1024);
    let said = testclient(
        &broker,
        &b,
        &[
            "raw-attack",
            &format!("{:#x}", owner.ptr),
            &owner.bytes.to_string(),
        ],
    );
    let results: BTreeMap<&str, &str> = said.lines().filter_map(|l| l.split_once(' ')).collect();
    let invalid_pointer = ErrorCode::InvalidPointer.as_u32().to_string();
    for name in ["own-memset", "own-fill", "sync"] {
        assert_eq!(
            results.get(name),
            Some(&"0"),
            "{name} on its own memory: {said}"
        );
    }
    let aimed = [
        "copy-dtoh-from-victim",
        "copy-dtod-from-victim",
        "copy-dtod-to-victim",
        "copy-htod-to-victim",
        "memset-victim",
        "memset-victim-interior",
        "memset-own-past-its-end",
        "fill-victim",
        "axpy-reads-victim",
        "axpy-writes-victim",
        "vec-add-reads-victim",
        "reduce-reads-victim",
        "gemm-reads-victim",
        "free-victim",
    ];
    for name in aimed {
        assert_eq!(
            results.get(name),
            Some(&invalid_pointer.as_str()),
            "{name} must fail with InvalidPointer: {said}"
        );
    }
    assert_eq!(
        results.get("arena-clean"),
        Some(&"true"),
        "no byte of A's buffer reached B: {said}"
    );
    assert_eq!(results.get("own-readback"), Some(&"true"), "{said}");
    assert_eq!(owner.intact(), "intact", "A's data unchanged");
    let status = broker.status();
    let mine = status
        .clients
        .iter()
        .find(|c| c.pid == owner.pid())
        .expect("A listed");
    assert_eq!(mine.memory_used, owner.bytes, "A still owns its buffer");

    // Nor through the kernel: B can open neither A's descriptors (its shared region) nor the
    // broker's.
    let said = testclient(
        &broker,
        &b,
        &["peek", &owner.pid().to_string(), &broker.pid().to_string()],
    );
    assert_eq!(
        said.lines().collect::<Vec<_>>(),
        [
            format!("{} denied", owner.pid()),
            format!("{} denied", broker.pid())
        ],
        "{said}"
    );
    eprintln!(
        "{} aimed {} ring entries at {}'s buffer: all InvalidPointer, its data intact",
        b.name,
        aimed.len(),
        a.name
    );
}

#[test]
fn only_root_and_the_admin_group_change_or_evict_other_users_clients() {
    let Some((a, b)) = users("only_root_and_the_admin_group_change_or_evict_other_users_clients")
    else {
        return;
    };
    // A's group is the admin group; B is nobody special.
    let broker = Broker::start_with(BrokerOptions {
        policy: Some(format!("admin_group = \"{}\"\n", a.name)),
        ..Default::default()
    });
    let mut a_client = Owner::start(&broker, &a, 1.0, 256);
    let mut b_client = Owner::start(&broker, &b, 2.0, 256);
    let (a_id, b_id) = (a_client.client_id(&broker), b_client.client_id(&broker));
    let refusal = format!(
        "error: permission denied: only root or members of the admin group `{}` may change or evict clients",
        a.name
    );
    let (a_arg, b_arg) = (a_id.to_string(), b_id.to_string());
    for action in [
        &["admin-class", &a_arg, "best-effort"][..],
        &["admin-quota", &a_arg, "1"],
        &["admin-evict", &a_arg],
        // Not even its own client: a grant comes from the policy, not from the user.
        &["admin-class", &b_arg, "high"],
    ] {
        let said = testclient(&broker, &b, action);
        assert_eq!(said.trim(), refusal, "{action:?} as {}", b.name);
    }
    let status = broker.status();
    let a_stats = status
        .clients
        .iter()
        .find(|c| c.client_id == a_id)
        .expect("A still there");
    assert_eq!(
        (a_stats.class, a_stats.memory_quota),
        (PriorityClass::Normal, None),
        "nothing changed"
    );
    assert_eq!(a_client.intact(), "intact");
    // Asking for a more important class at connect time gets the policy's class.
    let said = testclient(&broker, &b, &["connect-probe", "high"]);
    assert!(said.trim().ends_with(" normal"), "{said}");

    // A member of the admin group may.
    let said = testclient(
        &broker,
        &a,
        &["admin-class", &b_id.to_string(), "best-effort"],
    );
    assert_eq!(said.trim(), "ok");
    let b_stats = broker
        .status()
        .clients
        .into_iter()
        .find(|c| c.client_id == b_id)
        .expect("B listed");
    assert_eq!(b_stats.class, PriorityClass::BestEffort);
    assert_eq!(b_client.intact(), "intact");
    // And root.
    let mut root = gpushare::Monitor::connect(&broker.socket).expect("monitor");
    root.admin_evict(b_id, "access test").expect("root evicts");
    root.admin_set(a_id, Some(PriorityClass::High), None, None)
        .expect("root changes");
    assert!(wait_until(Duration::from_secs(5), || broker
        .status()
        .clients
        .iter()
        .all(|c| c.client_id != b_id)));
    assert_eq!(broker.status().clients.len(), 1, "only A is left");
    assert_eq!(broker.status().clients[0].class, PriorityClass::High);
    eprintln!("{} refused 4 admin actions: {refusal}", b.name);
}

#[test]
fn a_non_admin_sees_who_uses_the_gpu_but_no_pointers_or_contents() {
    let Some((a, b)) = users("a_non_admin_sees_who_uses_the_gpu_but_no_pointers_or_contents")
    else {
        return;
    };
    let broker = Broker::start();
    let value = 1234.5f32;
    let owner = Owner::start(&broker, &a, value, 1024);
    let ptr = owner.ptr;
    // What must not appear: A's pointer (decimal, hex either case), or its contents.
    let secrets = [
        ptr.to_string(),
        format!("{ptr:x}"),
        format!("{ptr:X}"),
        value.to_string(),
        value.to_bits().to_string(),
        format!("{:x}", value.to_bits()),
    ];
    for args in [
        &["status", "--json"][..],
        &["clients", "--json"],
        &["status"],
        &["clients"],
    ] {
        let out = gpushare_cli(&broker, &b, args);
        assert!(
            out.status.success(),
            "{args:?} as {}: {}",
            b.name,
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout);
        for s in &secrets {
            assert!(
                !text.contains(s.as_str()),
                "{args:?} shows `{s}` to {}:\n{text}",
                b.name
            );
        }
        // Who uses the GPU is shown on purpose.
        assert!(text.contains(&a.name), "{args:?}: {text}");
    }
    let out = gpushare_cli(&broker, &b, &["status", "--json"]);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let clients = report["clients"].as_array().expect("clients");
    assert_eq!(clients.len(), 1);
    let c = &clients[0];
    assert_eq!(c["user"], a.name.as_str());
    assert_eq!(c["uid"], a.uid);
    assert_eq!(c["pid"], owner.pid());
    assert_eq!(c["memory_used"], owner.bytes);
    // Every per-client field, so that a new one is looked at for what it reveals: counters,
    // totals and names are meant to be public, pointers and data are not.
    let shown: Vec<&str> = c
        .as_object()
        .expect("object")
        .keys()
        .map(String::as_str)
        .collect();
    let reviewed = [
        "client_id",
        "pid",
        "uid",
        "user",
        "name",
        "gpu",
        "class",
        "weight",
        "memory_used",
        "memory_peak",
        "memory_quota",
        "allocations",
        "streams",
        "commands",
        "kernels",
        "bytes_htod",
        "bytes_dtoh",
        "bytes_dtod",
        "gpu_time_ns",
        "errors",
        "connected_ms",
        "bypassing",
        "queue_depth",
        "latency_p50_ns",
        "latency_p99_ns",
        // How long its data thread spins before sleeping: a duration from the client's timing.
        "spin_ns",
        // Governed programs (`gpushare run`): a flag and a duration.
        "governed",
        "throttled_ns",
        // Programs under the consolidated driver: a flag.
        "consolidated",
        // The policy's name for whose GPU context a client shares: no memory of anyone's.
        "trust_domain",
        // The batch scheduler job it runs in: a number the scheduler shows everyone too.
        "job",
    ];
    for field in &shown {
        assert!(
            reviewed.contains(field),
            "status shows a new per-client field `{field}` to every user: check that it reveals no pointer or buffer contents, then add it to this list"
        );
    }
    eprintln!("{} sees in status: {}", b.name, shown.join(", "));
}

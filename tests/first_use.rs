//! What a new user meets first, as they meet it: output piped into `head`, `grep -q` or a pager
//! that closes early ends quietly; an idle GPU is at 0.0 %, not -0.0 %; `gpushare status` and
//! `top` take no client ids; whoever names the socket with `--socket` is not told to set
//! `GPUSHARE_SOCKET`; the broker refuses a socket in a missing directory instead of making it,
//! and names a missing policy file once; a demo client asked for a class it is not granted says
//! so.

use std::process::{Command, Output, Stdio};

use gpushare_tests::{Broker, BrokerOptions, binary};

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs `cmd` with its standard output a pipe whose reader has already gone, as `| head -1`
/// is once it has its line.
fn into_closed_pipe(mut cmd: Command) -> Output {
    let (reader, writer) = nix::unistd::pipe().expect("pipe");
    drop(reader);
    cmd.stdout(Stdio::from(writer))
        .stderr(Stdio::piped())
        .output()
        .expect("run")
}

#[test]
fn output_into_a_closed_pipe_ends_quietly() {
    let broker = Broker::start();
    let client = broker.client_named("piped");
    let _buf = client.alloc::<f32>(1024).expect("alloc");
    let runs: &[(&str, &[&str])] = &[
        ("gpushare", &["status"]),
        ("gpushare", &["status", "--json"]),
        ("gpushare", &["clients"]),
        ("gpushare", &["clients", "--json"]),
        ("gpushare", &["top", "-b", "-n", "2", "-d", "0.1"]),
        // Without -n it would run forever: the reader going away is what ends it.
        ("gpushare", &["top", "-b", "-d", "0.1"]),
        ("gpushare", &["top", "--json", "-d", "0.1"]),
        ("gpushare", &["completions", "bash"]),
        ("gpushare", &["--help"]),
        (
            "gpushare-demo",
            &["--iterations", "2", "--size", "256", "--json"],
        ),
    ];
    for (bin, args) in runs {
        let mut cmd = broker.command(bin);
        cmd.args(*args);
        let out = into_closed_pipe(cmd);
        let stderr = text(&out.stderr);
        assert!(
            out.status.success() && stderr.is_empty(),
            "{bin} {args:?} into a closed pipe: {}, stderr: {stderr}",
            out.status
        );
    }
}

#[test]
fn an_idle_gpu_is_at_zero_percent() {
    let broker = Broker::start();
    let out = broker
        .command("gpushare")
        .args(["top", "-b", "-n", "1"])
        .output()
        .expect("run");
    let frame = text(&out.stdout);
    assert!(out.status.success(), "{frame}{}", text(&out.stderr));
    assert!(frame.contains("util 0.0%"), "{frame}");
    assert!(!frame.contains("-0.0"), "{frame}");
}

#[test]
fn status_and_top_take_no_client_ids() {
    let broker = Broker::start();
    let first = broker.client_named("first").session().client_id;
    for args in [
        &["status"][..],
        &["clients"],
        &["top", "-b", "-n", "2", "-d", "0.1"],
    ] {
        let out = broker.command("gpushare").args(args).output().expect("run");
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
    }
    let second = broker.client_named("second").session().client_id;
    assert_eq!(second, first + 1, "CLI connections in between took ids");
}

#[test]
fn a_named_socket_gets_no_environment_hint() {
    let dir = tempfile::tempdir().expect("temp dir");
    let none = dir.path().join("none.sock");
    let run = |args: &[&str], env: bool| {
        let mut cmd = Command::new(binary("gpushare"));
        cmd.env_remove("GPUSHARE_SOCKET");
        if env {
            cmd.env("GPUSHARE_SOCKET", &none);
        } else {
            cmd.arg("--socket").arg(&none);
        }
        let out = cmd.args(args).output().expect("run");
        assert!(!out.status.success(), "{args:?} without a broker");
        text(&out.stderr)
    };
    for args in [&["status"][..], &["top", "-b", "-n", "1"]] {
        let named = run(args, false);
        assert!(
            named.contains("none.sock") && named.contains("is gpushared running on that socket"),
            "{args:?}: {named}"
        );
        assert!(!named.contains("GPUSHARE_SOCKET"), "{args:?}: {named}");
        let from_env = run(args, true);
        assert!(from_env.contains("GPUSHARE_SOCKET"), "{args:?}: {from_env}");
    }
}

#[test]
fn a_socket_in_a_missing_directory_is_refused_not_made() {
    let dir = tempfile::tempdir().expect("temp dir");
    let missing = dir.path().join("typo");
    let out = Command::new(binary("gpushared"))
        .arg("--socket")
        .arg(missing.join("gpushare.sock"))
        .args(["--backend", "sim", "--no-telemetry"])
        .output()
        .expect("run gpushared");
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&*missing.to_string_lossy()) && stderr.contains("does not exist"),
        "{stderr}"
    );
    assert!(!missing.exists(), "the broker made {}", missing.display());
}

#[test]
fn a_missing_policy_file_is_named_once() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = Command::new(binary("gpushared"))
        .arg("--socket")
        .arg(dir.path().join("s.sock"))
        .arg("--config")
        .arg(dir.path().join("nope.toml"))
        .args(["--backend", "sim", "--no-telemetry"])
        .output()
        .expect("run gpushared");
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("nope.toml"), "{stderr}");
    assert_eq!(
        stderr.matches("No such file or directory").count(),
        1,
        "{stderr}"
    );
}

#[test]
fn a_demo_client_asking_for_more_than_its_grant_says_so() {
    let broker = Broker::start_with(BrokerOptions {
        policy: Some("[defaults]\nclass = \"normal\"\n".into()),
        ..Default::default()
    });
    let out = broker
        .command("gpushare-demo")
        .args([
            "--class",
            "high",
            "--iterations",
            "1",
            "--size",
            "256",
            "--json",
        ])
        .output()
        .expect("run gpushare-demo");
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("asked for class high")
            && stderr.contains("at most normal")
            && stderr.contains("runs as normal"),
        "{stderr}"
    );
    let summary: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("the summary is JSON");
    assert_eq!(summary["class"], "normal");
    // Asking for what is granted, or less, is quiet.
    let out = broker
        .command("gpushare-demo")
        .args([
            "--class",
            "best-effort",
            "--iterations",
            "1",
            "--size",
            "256",
        ])
        .output()
        .expect("run gpushare-demo");
    assert!(out.status.success() && out.stderr.is_empty(), "{out:?}");
}

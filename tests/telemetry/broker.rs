//! Telemetry through the broker: a client's ioctls in `gpushare status`, a client that also
//! opens the GPU flagged as bypassing, and uprobes on the CUDA driver's calls.

use super::*;

/// The same through `gpushared` and `gpushare status --json`, once the broker has the
/// `--telemetry-dev-prefix` flag and the report has `processes`.
#[test]
fn broker_reports_the_childs_ioctls_in_status_and_keeps_them_through_a_gpu_fault() {
    let standin = StandIn::new();
    if !nix::unistd::geteuid().is_root() {
        skip("not running as root (eBPF needs CAP_BPF and CAP_PERFMON)");
        return;
    }
    let opts = BrokerOptions {
        extra_args: vec![
            "--telemetry-dev-prefix".into(),
            standin.prefix(),
            "--no-uprobes".into(),
            "--allow-fault-injection".into(),
        ],
        ..Default::default()
    };
    let broker = match gpushare_tests::Broker::try_start_with(opts) {
        Ok(b) => b,
        Err(e) if e.contains("unexpected argument") => {
            skip("gpushared has no --telemetry-dev-prefix flag yet");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let status = |broker: &gpushare_tests::Broker| -> serde_json::Value {
        let out = broker
            .command("gpushare")
            .args(["status", "--json"])
            .output()
            .expect("run gpushare status --json");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("status JSON")
    };
    let first = status(&broker);
    if first.get("processes").is_none() {
        skip("the status report has no `processes` field yet");
        return;
    }
    if first["telemetry"]["enabled"] != serde_json::Value::Bool(true) {
        skip(&format!(
            "the broker's telemetry is off: {}",
            first["telemetry"]["reason"]
        ));
        return;
    }

    let mut child = IoctlChild::spawn(&steps(&[
        &format!("open={}", standin.device(0)),
        "ioctl=23",
        "wait",
    ]));
    let pid = child.pid();
    child.wait_ready();
    let count_in = |report: &serde_json::Value| -> Option<u64> {
        let process = report["processes"]
            .as_array()?
            .iter()
            .find(|p| p["pid"].as_i64() == Some(i64::from(pid)))?;
        process["ioctls"]
            .as_array()?
            .iter()
            .find(|i| i["cmd"].as_u64() == Some(u64::from(RM_CONTROL)))?["count"]
            .as_u64()
    };
    let mut last = serde_json::Value::Null;
    let reported = wait_until(Duration::from_secs(10), || {
        last = status(&broker);
        count_in(&last) == Some(23)
    });
    assert!(reported, "pid {pid} with 23 RM_CONTROL not in: {last:#}");

    // A client's GPU fault replaces the device worker; gpushared, and its eBPF maps with the
    // counts in them, go on.
    let culprit = broker.client_named("culprit");
    gpushare_tests::faults::fault(&culprit, false);
    let _ = culprit.synchronize();
    assert!(
        broker.wait_for_log("device context recreated", Duration::from_secs(10)),
        "no recovery:\n{}",
        broker.log_text()
    );
    last = status(&broker);
    assert_eq!(
        count_in(&last),
        Some(23),
        "the counts went with the fault: {last:#}"
    );

    child.finish();
    let gone = wait_until(Duration::from_secs(10), || {
        last = status(&broker);
        last["processes"]
            .as_array()
            .is_some_and(|ps| ps.iter().all(|p| p["pid"].as_i64() != Some(i64::from(pid))))
    });
    assert!(gone, "pid {pid} exited but is still in: {last:#}");
}

/// A broker client that also uses the device directly is flagged as bypassing the broker.
#[test]
fn a_client_that_also_opens_the_gpu_is_flagged_as_bypassing() {
    let standin = StandIn::new();
    if !nix::unistd::geteuid().is_root() {
        skip("not running as root (eBPF needs CAP_BPF and CAP_PERFMON)");
        return;
    }
    let opts = BrokerOptions {
        extra_args: vec![
            "--telemetry-dev-prefix".into(),
            standin.prefix(),
            "--no-uprobes".into(),
        ],
        ..Default::default()
    };
    let broker = gpushare_tests::Broker::start_with(opts);
    if !broker.status().telemetry.enabled {
        skip(&format!(
            "the broker's telemetry is off: {:?}",
            broker.status().telemetry.reason
        ));
        return;
    }
    let client = broker.client_named("sneaky");
    let id = client.session().client_id;
    // This process, a broker client, now talks to the "GPU" itself.
    let device = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(standin.device(0))
        .expect("open stand-in");
    let mut arg = [0u8; 32];
    for _ in 0..5 {
        // SAFETY: a plain ioctl on a regular file with a 32-byte buffer; it fails with ENOTTY,
        // which is fine: the tracepoints see it either way.
        let _ = unsafe {
            libc::ioctl(
                std::os::fd::AsRawFd::as_raw_fd(&device),
                RM_CONTROL as _,
                arg.as_mut_ptr(),
            )
        };
    }
    let me = std::process::id() as i32;
    let mut last = None;
    let flagged = wait_until(Duration::from_secs(10), || {
        let s = broker.status();
        let ok = s.clients.iter().any(|c| c.client_id == id && c.bypassing)
            && s.processes.iter().any(|p| {
                p.pid == me
                    && p.kind == gpushare_protocol::stats::ProcessKind::Both
                    && p.client_id == Some(id)
            })
            && s.outside_load.processes >= 1;
        last = Some(s);
        ok
    });
    assert!(flagged, "not flagged as bypassing: {last:#?}");
    drop(device);
}

/// Uprobes go into a process once it is seen using the GPU, count its libcuda calls, and
/// never go into the broker.
#[test]
fn uprobes_count_the_libcuda_calls_of_an_observed_process() {
    use std::io::{BufRead, BufReader, Write};
    let standin = StandIn::new();
    if !nix::unistd::geteuid().is_root() {
        skip("not running as root (eBPF needs CAP_BPF and CAP_PERFMON)");
        return;
    }
    // Build the stand-in libcuda and a program that uses it.
    let dir = standin.dir.path();
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("c");
    if !src.join("fakecuda.c").exists() {
        skip("the C sources are not here (a bundle run away from the repository)");
        return;
    }
    let lib = dir.join("libcuda.so.1");
    let cc = |args: &[&std::ffi::OsStr]| {
        let out = std::process::Command::new("cc")
            .args(args)
            .output()
            .expect("run cc (scripts/setup.sh installs it)");
        assert!(
            out.status.success(),
            "cc: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    cc(&[
        "-shared".as_ref(),
        "-fPIC".as_ref(),
        "-O0".as_ref(),
        "-o".as_ref(),
        lib.as_os_str(),
        src.join("fakecuda.c").as_os_str(),
    ]);
    let user = dir.join("cuda_user");
    let rpath = format!("-Wl,-rpath,{}", dir.display());
    cc(&[
        "-O0".as_ref(),
        "-o".as_ref(),
        user.as_os_str(),
        src.join("cuda_user.c").as_os_str(),
        lib.as_os_str(),
        rpath.as_ref(),
    ]);
    let opts = BrokerOptions {
        extra_args: vec![
            "--telemetry-dev-prefix".into(),
            standin.prefix(),
            "--libcuda".into(),
            lib.to_string_lossy().into_owned(),
        ],
        ..Default::default()
    };
    let broker = gpushare_tests::Broker::start_with(opts);
    let status = broker.status().telemetry;
    if !status.enabled || !status.uprobes {
        skip(&format!("telemetry or uprobes are off: {status:?}"));
        return;
    }
    let mut child = std::process::Command::new(&user)
        .arg(standin.device(0))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn the CUDA user");
    let pid = child.id() as i32;
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    assert_eq!(lines.next().and_then(Result::ok).as_deref(), Some("ready"));
    // Seen by the ioctl tracepoints, then probed by the next sample (once a second).
    assert!(wait_until(Duration::from_secs(10), || broker
        .status()
        .processes
        .iter()
        .any(|p| p.pid == pid)));
    std::thread::sleep(Duration::from_millis(2_500));
    let mut stdin = child.stdin.take().expect("stdin");
    writeln!(stdin, "go").expect("signal");
    assert_eq!(lines.next().and_then(Result::ok).as_deref(), Some("done"));
    let mut last = None;
    let counted = wait_until(Duration::from_secs(10), || {
        let p = broker.status().processes.into_iter().find(|p| p.pid == pid);
        let ok = p.as_ref().is_some_and(|p| p.launches == 7 && p.allocs == 2);
        last = p;
        ok
    });
    assert!(counted, "launch/alloc counts of pid {pid}: {last:?}");
    drop(stdin);
    let _ = child.wait();
}

//! Governed clients (`gpushare run`): the libcuda interposer in front of a stand-in driver.
//!
//! `c/standin_libcuda.c` is a fake libcuda (every wrapped entry point, counted, with fake
//! device addresses; its `cuGetProcAddress` answers like the real driver's, versions and
//! per-thread variants included). `c/governed_app.c` is an unmodified program that opens it
//! with `dlopen` and finds its functions with `dlsym` and `cuGetProcAddress`, as the CUDA
//! runtime does. Both are compiled with the system C compiler (`tests/src/governed.rs`).
//! Losing the broker: `broker_away.rs`.
//!
//! The scheduling tests run the program as a best-effort training loop (several threads,
//! each entry-point variant) on a `--sim-realtime` broker beside a brokered client that keeps
//! the sim busy, and compare what it launched and how long it was held with a run where
//! nothing holds it.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use gpushare_tests::governed::{governed_app, interposer};
use gpushare_tests::{Broker, BrokerOptions, binary, wait_until};

#[path = "governed/scheduling.rs"]
mod scheduling;

/// Every libcuda entry point the interposer governs.
const GOVERNED: &[&str] = &[
    "cuInit",
    "cuGetProcAddress",
    "cuGetProcAddress_v2",
    "cuMemAlloc_v2",
    "cuMemAllocPitch_v2",
    "cuMemFree_v2",
    "cuMemAllocManaged",
    "cuMemAllocAsync",
    "cuMemAllocAsync_ptsz",
    "cuMemAllocFromPoolAsync",
    "cuMemAllocFromPoolAsync_ptsz",
    "cuMemFreeAsync",
    "cuMemFreeAsync_ptsz",
    "cuMemCreate",
    "cuMemRelease",
    "cuLaunchKernel",
    "cuLaunchKernel_ptsz",
    "cuLaunchKernelEx",
    "cuLaunchKernelEx_ptsz",
    "cuLaunchCooperativeKernel",
    "cuLaunchCooperativeKernel_ptsz",
    "cuGraphLaunch",
    "cuGraphLaunch_ptsz",
    "cuCtxCreate_v2",
    "cuCtxCreate_v3",
    "cuCtxCreate_v4",
    "cuDevicePrimaryCtxRetain",
    "cuCtxSynchronize",
    "cuCtxSynchronize_v2",
    "cuStreamSynchronize",
    "cuStreamSynchronize_ptsz",
    "cuEventSynchronize",
];

const MIB: u64 = 1 << 20;

fn text(output: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn the_interposer_exports_every_governed_entry_point() {
    let path = std::ffi::CString::new(interposer().into_os_string().into_encoded_bytes())
        .expect("path without NUL");
    // SAFETY: a NUL-terminated path. The interposer has no constructors, and opened locally
    // its exports (its `dlsym` among them) do not replace this process's.
    let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    assert!(!handle.is_null(), "cannot dlopen the interposer");
    let missing: Vec<&str> = GOVERNED
        .iter()
        .copied()
        .filter(|name| {
            let c = std::ffi::CString::new(*name).expect("name");
            // SAFETY: a handle from dlopen and a NUL-terminated name.
            unsafe { libc::dlsym(handle, c.as_ptr()) }.is_null()
        })
        .collect();
    assert!(missing.is_empty(), "not exported: {missing:?}");
}

#[test]
fn lookups_hand_out_the_wrapper_for_governed_functions_and_the_driver_for_others() {
    // No broker, and the program runs without one: the wrappers pass calls through.
    let output = governed_app(
        Path::new("/nonexistent/gpushare.sock"),
        &["--fallback", "direct"],
        &["symbols"],
    )
    .output()
    .expect("run the program");
    let (out, err) = text(&output);
    assert!(output.status.success(), "{out}{err}");
    let lines: Vec<&str> = out.lines().collect();
    // One line per lookup: every governed function comes back wrapped, in each version and
    // per-thread variant; a function the interposer does not wrap comes back as the driver's.
    for line in &lines {
        if line.starts_with("cuDeviceGetCount") {
            assert!(line.ends_with("-> real"), "{line}");
        } else if line.contains("->") {
            assert!(line.ends_with("-> wrapper"), "{line}");
        }
    }
    for expected in [
        "cuMemAlloc 12000 0 -> wrapper",
        "cuLaunchKernel 12000 2 -> wrapper",
        "cuCtxCreate 13000 0 -> wrapper",
        "cuGetProcAddress 11030 0 -> wrapper",
        "cuDeviceGetCount 12000 0 -> real",
        // dlopen + dlsym finds the wrapper of cuGetProcAddress_v2 too.
        "dlsym cuGetProcAddress_v2 -> wrapper",
        "v1 cuMemAlloc 11030 0 -> wrapper",
        // The wrapper reached the driver, once.
        "forwarded cuMemAlloc_v2 0 1",
    ] {
        assert!(lines.contains(&expected), "missing `{expected}` in:\n{out}");
    }
    assert_eq!(lines.len(), 35, "{out}");
}

/// What `governed_app quota 1MiB` prints under a 3 MiB quota: each family counts against it,
/// the allocation past it fails with CUDA_ERROR_OUT_OF_MEMORY (2) without reaching the driver,
/// and frees make room again.
const UNDER_QUOTA: &str = "\
alloc classic 0
alloc managed 0
alloc async 0
alloc pool 2
driver pool calls 0
free async 0
alloc pool 0
alloc vmm 2
alloc pitch 2
free classic 0
alloc vmm 0
free vmm 0
alloc pitch 0
free pitch 0
free managed 0
free pool 0
";

#[test]
fn allocations_past_the_quota_fail_with_out_of_memory_and_succeed_after_a_free() {
    let broker = broker_with_policy(&format!("[defaults]\nmemory_quota = {}\n", 3 * MIB));
    let output = governed_app(&broker.socket, &[], &["quota", &MIB.to_string()])
        .output()
        .expect("run the program");
    let (out, err) = text(&output);
    assert!(output.status.success(), "{out}{err}");
    assert_eq!(out, UNDER_QUOTA, "stderr: {err}");
    assert!(!err.contains("unmanaged"), "{err}");
    assert!(
        wait_until(Duration::from_secs(5), || broker
            .status()
            .clients
            .is_empty()),
        "the governed session did not end with the program"
    );
}

#[test]
fn a_governed_program_shows_in_status_with_its_memory_launches_and_grant() {
    let broker = broker_with_policy("[defaults]\nweight = 4\nmemory_quota = \"1 GiB\"\n");
    let mut child = governed_app(
        &broker.socket,
        &[
            "--class",
            "best-effort",
            "--weight",
            "2",
            "--name",
            "governed-trainer",
        ],
        &["hold", "50", &(5 * MIB).to_string()],
    )
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("start the program");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    assert_eq!(
        lines.next().and_then(Result::ok).as_deref(),
        Some("ready"),
        "the program did not get ready"
    );
    // Launches are reported when the program synchronizes (it did, before "ready").
    let mut report = broker.status();
    assert!(wait_until(Duration::from_secs(5), || {
        report = broker.status();
        report.clients.first().is_some_and(|c| c.kernels == 50)
    }));
    let c = &report.clients[0];
    assert!(c.governed, "{c:?}");
    assert_eq!(c.name, "governed-trainer");
    assert_eq!(
        c.pid,
        child.id() as i32,
        "the program itself, not a launcher"
    );
    assert_eq!(c.class, gpushare::PriorityClass::BestEffort);
    assert_eq!(c.weight, 2, "asked for less than the policy's 4");
    assert_eq!(c.memory_used, 5 * MIB);
    assert_eq!(c.memory_quota, Some(1 << 30));

    let table = Command::new(binary("gpushare"))
        .arg("--socket")
        .arg(&broker.socket)
        .arg("clients")
        .output()
        .expect("gpushare clients");
    let (table, _) = text(&table);
    let row = table
        .lines()
        .find(|l| l.contains("governed-trainer"))
        .unwrap_or_default();
    assert!(
        row.contains("governed") && row.contains("best-effort"),
        "{table}"
    );

    writeln!(child.stdin.as_mut().expect("stdin"), "done").expect("tell the program");
    let status = child.wait().expect("wait");
    assert!(status.success(), "{status}");
    assert!(wait_until(Duration::from_secs(5), || broker
        .status()
        .clients
        .is_empty()));
}

#[test]
fn without_a_broker_the_program_runs_unmanaged_only_with_fallback_direct() {
    let output = governed_app(
        Path::new("/nonexistent/gpushare.sock"),
        &["--fallback", "direct"],
        &["quota", &MIB.to_string()],
    )
    .output()
    .expect("run the program");
    let (out, err) = text(&output);
    assert!(output.status.success(), "{out}{err}");
    // No quota without a broker: every allocation reaches the driver and succeeds.
    for line in out
        .lines()
        .filter(|l| l.starts_with("alloc") || l.starts_with("free"))
    {
        assert!(line.ends_with(" 0"), "{line}\n{out}");
    }
    assert!(out.contains("driver pool calls 1"), "{out}");
    let warnings: Vec<&str> = err.lines().filter(|l| l.starts_with("gpushare:")).collect();
    assert_eq!(
        warnings,
        [
            "gpushare: broker not running at /nonexistent/gpushare.sock (No such file or directory (os error 2)); this program runs unmanaged (--fallback direct)"
        ],
        "{err}"
    );

    // Without the fallback it never runs unmanaged: cuInit fails (CUDA_ERROR_NO_DEVICE), and
    // so do its allocations and launches, without reaching the driver.
    let mut child = governed_app(
        Path::new("/nonexistent/gpushare.sock"),
        &[],
        &["steps", &MIB.to_string()],
    )
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("run the program");
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(format!("alloc {MIB}\nlaunch\n").as_bytes())
            .expect("steps");
    }
    let output = child.wait_with_output().expect("wait");
    let (out, err) = text(&output);
    assert!(output.status.success(), "{out}{err}");
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        ["ready 100", "alloc 802 0", "launch 802 0"],
        "{err}"
    );
    assert!(
        err.contains("CUDA has no device for this governed program")
            && err.contains("--fallback direct"),
        "{err}"
    );
}

#[test]
fn asking_for_a_more_important_class_than_granted_warns_once_and_runs_as_granted() {
    let broker = broker_with_policy("[defaults]\nclass = \"normal\"\n");
    let mut child = governed_app(&broker.socket, &["--class", "high"], &["hold", "1", "4096"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the program");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    assert_eq!(lines.next().and_then(Result::ok).as_deref(), Some("ready"));
    let report = broker.status();
    assert_eq!(report.clients.len(), 1, "{report:?}");
    assert_eq!(report.clients[0].class, gpushare::PriorityClass::Normal);
    writeln!(child.stdin.as_mut().expect("stdin"), "done").expect("tell the program");
    let output = child.wait_with_output().expect("wait");
    assert!(output.status.success(), "{}", output.status);
    let (_, err) = text(&output);
    let warnings: Vec<&str> = err.lines().filter(|l| l.starts_with("gpushare:")).collect();
    assert_eq!(
        warnings,
        [
            "gpushare: asked for class high, but the broker's policy grants this user at most normal; this program runs as normal (an administrator can raise the grant in the policy file)"
        ],
        "{err}"
    );
}

#[test]
fn interpose_debug_tells_how_each_governed_function_was_reached() {
    let broker = Broker::start();
    broker.dump_log_if_stuck(Duration::from_secs(60));
    let output = governed_app(&broker.socket, &[], &["loop", "50", "3", "mixed", "4"])
        .env("GPUSHARE_INTERPOSE_DEBUG", "1")
        .output()
        .expect("run the program");
    let (out, err) = text(&output);
    assert!(output.status.success(), "{out}{err}");
    let debug: Vec<&str> = err
        .lines()
        .filter_map(|l| l.strip_prefix("gpushare-debug: "))
        .collect();
    // Each entry point once, at its first call, with the lookup that handed it out.
    for expected in [
        "first call of cuGetProcAddress_v2 (thread ",
        "first call of cuInit (thread ",
        "first call of cuLaunchKernel (thread ",
        "first call of cuLaunchKernel_ptsz (thread ",
        "first call of cuLaunchKernelEx (thread ",
        "first call of cuCtxSynchronize (thread ",
    ] {
        let found: Vec<&&str> = debug.iter().filter(|l| l.starts_with(expected)).collect();
        assert_eq!(found.len(), 1, "`{expected}` in:\n{err}");
    }
    let line = |prefix: &str| {
        debug
            .iter()
            .find(|l| l.starts_with(prefix))
            .copied()
            .unwrap_or_default()
    };
    assert!(
        line("first call of cuGetProcAddress_v2 ")
            .ends_with(r#"obtained via dlsym(libcuda, "cuGetProcAddress_v2")"#),
        "{err}"
    );
    assert!(
        line("first call of cuLaunchKernel_ptsz ").ends_with(
            r#"obtained via cuGetProcAddress_v2("cuLaunchKernel", version 12000, flags 0x2)"#
        ),
        "{err}"
    );
    assert!(
        debug
            .iter()
            .any(|l| l.contains("connected to the broker") && l.contains("class normal")),
        "{err}"
    );
    // The summary at exit: governed, and every launch reported.
    let launched: u64 = out
        .strip_prefix("launched ")
        .and_then(|n| n.trim().parse().ok())
        .expect("launch count");
    let exit = line("at exit ");
    assert!(exit.contains("governed as client"), "{err}");
    assert!(
        exit.contains(&format!("launches reported {launched} (+0 not yet)")),
        "{launched} launches: {err}"
    );
}

#[test]
fn interpose_debug_names_a_lookup_it_cannot_wrap() {
    let broker = Broker::start();
    broker.dump_log_if_stuck(Duration::from_secs(60));
    let output = governed_app(&broker.socket, &[], &["internal"])
        .env("GPUSHARE_INTERPOSE_DEBUG", "1")
        .output()
        .expect("run the program");
    let (out, err) = text(&output);
    assert!(output.status.success(), "{out}{err}");
    assert_eq!(out, "internal launch 0\n");
    // The launch went around the interposer, and the diagnostics say where to.
    let missed: Vec<&str> = err.lines().filter(|l| l.contains("NOT governed")).collect();
    assert_eq!(missed.len(), 1, "{err}");
    assert!(
        missed[0].starts_with(
            r#"gpushare-debug: cuGetProcAddress_v2("cuLaunchKernel", version 13050, flags 0x0) -> 0x"#
        ) && missed[0].contains("(standin_internal_cuLaunchKernel+0x0 in ")
            && missed[0].ends_with(
                "is not a libcuda function the interposer wraps: calls through it are NOT governed"
            ),
        "{err}"
    );
    assert!(
        !err.contains("first call of cuLaunchKernel"),
        "the wrapper was not called: {err}"
    );
}

/// A broker on the test backend with this policy file.
fn broker_with_policy(policy: &str) -> Broker {
    let broker = Broker::start_with(BrokerOptions {
        policy: Some(policy.into()),
        ..Default::default()
    });
    broker.dump_log_if_stuck(Duration::from_secs(60));
    broker
}

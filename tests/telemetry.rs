//! eBPF telemetry: a child process issues ioctls on a stand-in GPU device file and telemetry
//! must count exactly those, for that pid and command; descriptors are followed through close,
//! reopen and dup; exited processes are swept; a process that never touches the device is never
//! reported.
//!
//! They need root and BPF (CI runs as root). Elsewhere each test prints
//! `SKIPPED telemetry: <reason>` and passes; `GPUSHARE_REQUIRE_BPF=1` turns a skip into a
//! failure. The stand-in is a regular file under a private prefix, so these tests never see
//! (or disturb) a real GPU and can run in parallel.

use std::io::{BufRead as _, BufReader, Write as _};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use gpushare_broker::telemetry::{ProcessActivity, Telemetry, TelemetryOptions};
use gpushare_tests::{BrokerOptions, binary, wait_until};

#[path = "telemetry/broker.rs"]
mod broker;

/// `_IOWR('F', 0x2a, [u8; 32])`: NVIDIA's RM_CONTROL, the child's default command.
const RM_CONTROL: u32 = 0xc020_462a;
/// `_IOWR('F', 0x2b, [u8; 48])`: RM_ALLOC.
const RM_ALLOC: u32 = 0xc030_462b;

fn skip(reason: &str) {
    // Straight to the stderr handle: the harness captures eprintln!, and a skip must show.
    let _ = std::io::Write::write_all(
        &mut std::io::stderr(),
        format!("SKIPPED telemetry: {reason}\n").as_bytes(),
    );
    if std::env::var_os("GPUSHARE_REQUIRE_BPF").is_some() {
        panic!("GPUSHARE_REQUIRE_BPF is set but the telemetry test was skipped: {reason}");
    }
}

/// A private directory whose `nvidia` prefix stands in for `/dev/nvidia`.
struct StandIn {
    dir: tempfile::TempDir,
}

impl StandIn {
    fn new() -> StandIn {
        StandIn {
            dir: tempfile::tempdir().expect("temp dir"),
        }
    }
    fn prefix(&self) -> String {
        self.dir
            .path()
            .join("nvidia")
            .to_string_lossy()
            .into_owned()
    }
    /// A "GPU" device file: under the prefix.
    fn device(&self, n: u32) -> String {
        format!("{}-standin{n}", self.prefix())
    }
    /// A file that is not under the prefix.
    fn other(&self) -> PathBuf {
        self.dir.path().join("plain-file")
    }
}

/// Telemetry for `prefix` in this test process, or `None` after a loud skip.
fn telemetry(prefix: &str) -> Option<Telemetry> {
    if !nix::unistd::geteuid().is_root() {
        skip("not running as root (eBPF needs CAP_BPF and CAP_PERFMON)");
        return None;
    }
    let opts = TelemetryOptions {
        dev_prefix: prefix.into(),
        uprobes: false,
        libcuda: None,
    };
    match Telemetry::start(&opts) {
        Ok(t) => Some(t),
        Err(reason) => {
            skip(&reason);
            None
        }
    }
}

/// A running `gpushare-ioctl-child`.
struct IoctlChild {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl IoctlChild {
    fn spawn(steps: &[String]) -> IoctlChild {
        let mut child = Command::new(binary("gpushare-ioctl-child"))
            .args(steps)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn gpushare-ioctl-child");
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("child stdout"));
        IoctlChild {
            child,
            stdin,
            stdout,
        }
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Waits for the child's next `wait` step.
    fn wait_ready(&mut self) {
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("read from child");
        assert_eq!(line.trim(), "ready", "the child stopped early");
    }

    /// Lets the child go past its current `wait` step.
    fn proceed(&mut self) {
        if let Some(stdin) = self.stdin.as_mut() {
            let _ = stdin.write_all(b"go\n");
            let _ = stdin.flush();
        }
    }

    /// Lets the child run to its end and reaps it.
    fn finish(mut self) {
        self.stdin = None;
        let status = self.child.wait().expect("wait for child");
        assert!(status.success(), "gpushare-ioctl-child failed: {status}");
    }
}

impl Drop for IoctlChild {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn find(processes: &[ProcessActivity], pid: i32) -> Option<&ProcessActivity> {
    processes.iter().find(|p| p.pid == pid)
}

fn count_of(p: &ProcessActivity, cmd: u32) -> u64 {
    p.ioctls
        .iter()
        .find(|i| i.cmd == cmd)
        .map_or(0, |i| i.count)
}

fn steps(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[test]
fn counts_exactly_the_ioctls_a_child_makes_and_sweeps_it_at_exit() {
    let standin = StandIn::new();
    let Some(telemetry) = telemetry(&standin.prefix()) else {
        return;
    };
    let device = standin.device(0);
    let mut child = IoctlChild::spawn(&steps(&[
        &format!("open={device}"),
        "ioctl=37",
        &format!("ioctl=5:{RM_ALLOC:#x}"),
        "wait",
    ]));
    child.wait_ready();
    let pid = child.pid();

    let snapshot = telemetry.snapshot();
    let me = find(&snapshot, pid).unwrap_or_else(|| panic!("pid {pid} missing: {snapshot:?}"));
    assert_eq!(me.ioctls.len(), 2, "{me:?}");
    let control = &me.ioctls[0];
    assert_eq!(
        (control.cmd, control.name.as_str(), control.count),
        (RM_CONTROL, "RM_CONTROL", 37)
    );
    // ENOTTY on a regular file: every call failed, and each counts as an error.
    assert_eq!(control.errors, 37);
    assert_eq!(control.arg_bytes, 37 * 32);
    assert!(control.total_ns > 0);
    let alloc = &me.ioctls[1];
    assert_eq!(
        (alloc.cmd, alloc.name.as_str(), alloc.count, alloc.arg_bytes),
        (RM_ALLOC, "RM_ALLOC", 5, 5 * 48)
    );
    assert_eq!(me.gpu_fds, 1);
    assert_eq!(me.comm, "gpushare-ioctl-", "comm is cut at 15 bytes");
    assert_eq!(me.uid, nix::unistd::getuid().as_raw());
    assert!(me.first_seen_ns > 0 && me.first_seen_ns <= me.last_seen_ns);
    assert_eq!(
        (me.launches, me.allocs, me.frees, me.ctx_creates),
        (0, 0, 0, 0)
    );

    child.finish();
    let snapshot = telemetry.snapshot();
    assert!(
        find(&snapshot, pid).is_none(),
        "pid {pid} exited but is still reported: {snapshot:?}"
    );
    let exited = telemetry.take_exited();
    let last = find(&exited, pid).unwrap_or_else(|| panic!("pid {pid} not in exited: {exited:?}"));
    assert_eq!(
        (
            count_of(last, RM_CONTROL),
            count_of(last, RM_ALLOC),
            last.gpu_fds
        ),
        (37, 5, 0),
        "final figures of the exited child"
    );
    assert!(
        telemetry.take_exited().is_empty(),
        "exited processes are handed out once"
    );
    assert_eq!(
        telemetry.entries_for(pid),
        (0, 0),
        "entries of the exited pid remain in the kernel maps"
    );
}

#[test]
fn follows_close_and_reopen() {
    let standin = StandIn::new();
    let Some(telemetry) = telemetry(&standin.prefix()) else {
        return;
    };
    let device = standin.device(0);
    let other = standin.other();
    // The plain file gets the descriptor number the device had: its ioctls must not count.
    let mut child = IoctlChild::spawn(&steps(&[
        &format!("open={device}"),
        "ioctl=3",
        "close",
        "wait",
        &format!("open={}", other.display()),
        "ioctl=4",
        "close",
        &format!("open={device}"),
        "ioctl=6",
        "wait",
    ]));
    let pid = child.pid();
    child.wait_ready();
    let snapshot = telemetry.snapshot();
    let me = find(&snapshot, pid).expect("child reported after its first ioctls");
    assert_eq!(count_of(me, RM_CONTROL), 3, "{me:?}");
    assert_eq!(me.gpu_fds, 0, "the device was closed: {me:?}");

    child.proceed();
    child.wait_ready();
    let snapshot = telemetry.snapshot();
    let me = find(&snapshot, pid).expect("child still reported");
    assert_eq!(count_of(me, RM_CONTROL), 9, "{me:?}");
    assert_eq!(me.gpu_fds, 1);
    child.finish();
}

#[test]
fn follows_dup_and_dup2() {
    let standin = StandIn::new();
    let Some(telemetry) = telemetry(&standin.prefix()) else {
        return;
    };
    let mut child = IoctlChild::spawn(&steps(&[
        &format!("open={}", standin.device(1)),
        "dup",
        "ioctl=4",
        "dup2=100",
        "ioctl=2",
        "wait",
    ]));
    let pid = child.pid();
    child.wait_ready();
    let snapshot = telemetry.snapshot();
    let me = find(&snapshot, pid).expect("child reported");
    assert_eq!(count_of(me, RM_CONTROL), 6, "{me:?}");
    assert_eq!(me.gpu_fds, 1, "only descriptor 100 is left open: {me:?}");
    child.finish();
}

#[test]
fn forgets_descriptors_at_exec() {
    let standin = StandIn::new();
    let Some(telemetry) = telemetry(&standin.prefix()) else {
        return;
    };
    // After exec the device descriptor is closed (O_CLOEXEC) and the plain file most likely
    // takes its number: none of the new program's ioctls are GPU ioctls.
    let mut child = IoctlChild::spawn(&steps(&[
        &format!("open={}", standin.device(0)),
        "ioctl=2",
        "exec",
        &format!("open={}", standin.other().display()),
        "ioctl=5",
        "wait",
    ]));
    let pid = child.pid();
    child.wait_ready();
    let snapshot = telemetry.snapshot();
    let me = find(&snapshot, pid).expect("child reported");
    assert_eq!(count_of(me, RM_CONTROL), 2, "{me:?}");
    assert_eq!(me.gpu_fds, 0, "{me:?}");
    child.finish();
}

#[test]
fn a_process_that_never_touches_the_device_is_never_reported() {
    let standin = StandIn::new();
    let Some(telemetry) = telemetry(&standin.prefix()) else {
        return;
    };
    let mut child = IoctlChild::spawn(&steps(&[
        &format!("open={}", standin.other().display()),
        "ioctl=50",
        "wait",
    ]));
    let pid = child.pid();
    child.wait_ready();
    let snapshot = telemetry.snapshot();
    assert!(find(&snapshot, pid).is_none(), "{snapshot:?}");
    let me = std::process::id() as i32;
    assert!(
        find(&snapshot, me).is_none(),
        "the test itself has no GPU file"
    );
    assert!(
        snapshot.is_empty(),
        "nothing else uses this prefix: {snapshot:?}"
    );
    child.finish();
}

#[test]
fn seeds_descriptors_opened_before_it_started() {
    let standin = StandIn::new();
    if !nix::unistd::geteuid().is_root() {
        skip("not running as root (eBPF needs CAP_BPF and CAP_PERFMON)");
        return;
    }
    let mut child = IoctlChild::spawn(&steps(&[
        &format!("open={}", standin.device(0)),
        "wait",
        "ioctl=8",
        "wait",
    ]));
    let pid = child.pid();
    child.wait_ready();
    let Some(telemetry) = telemetry(&standin.prefix()) else {
        return;
    };
    let snapshot = telemetry.snapshot();
    let me = find(&snapshot, pid).expect("the seeded process is reported before any ioctl");
    assert_eq!((me.gpu_fds, me.ioctls.len()), (1, 0), "{me:?}");
    child.proceed();
    child.wait_ready();
    let snapshot = telemetry.snapshot();
    let me = find(&snapshot, pid).expect("child reported");
    assert_eq!(count_of(me, RM_CONTROL), 8, "{me:?}");
    child.finish();
}

//! Helpers for gpushare's integration tests: start a real `gpushared`, find the built
//! binaries, wait for things.
//!
//! Binaries are looked up in `$GPUSHARE_BIN_DIR`, then next to the test executable, then in
//! its parent (cargo's `target/<profile>/deps/..`): build the workspace before testing
//! (`cargo build --workspace && cargo test --workspace`), or copy the binaries next to the
//! test executables on a machine without cargo.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Path of a workspace binary (`gpushared`, `gpushare`, `gpushare-demo`, …).
pub fn binary(name: &str) -> PathBuf {
    let mut dirs = Vec::new();
    if let Some(dir) = std::env::var_os("GPUSHARE_BIN_DIR") {
        dirs.push(PathBuf::from(dir));
    }
    if let Ok(exe) = std::env::current_exe()
        && let Some(dir) = exe.parent()
    {
        dirs.push(dir.to_path_buf());
        if let Some(up) = dir.parent() {
            dirs.push(up.to_path_buf());
        }
    }
    for dir in &dirs {
        let candidate = dir.join(name);
        if candidate.is_file() {
            return candidate;
        }
    }
    panic!(
        "binary `{name}` not found in {dirs:?}: run `cargo build --workspace` first, or set GPUSHARE_BIN_DIR"
    );
}

/// The directory that holds the `libgpushare.so` built with the tests.
pub fn library_dir() -> PathBuf {
    let lib = binary("libgpushare.so");
    lib.parent().map(Path::to_path_buf).unwrap_or_default()
}

/// A running `gpushared` on a private socket, killed when dropped.
pub struct Broker {
    pub child: Child,
    pub socket: PathBuf,
    pub dir: tempfile::TempDir,
    log: Arc<Mutex<Vec<String>>>,
}

/// How to start a test broker.
#[derive(Debug, Clone, Default)]
pub struct BrokerOptions {
    /// Policy file contents, if any.
    pub policy: Option<String>,
    pub extra_args: Vec<String>,
    /// `$GPUSHARE_TEST_BACKEND`, else `sim`, unless set.
    pub backend: Option<String>,
    /// Listen on this socket instead of a fresh one in a private directory.
    pub socket: Option<PathBuf>,
    /// Run eBPF telemetry. Off unless a test asks: otherwise a test's broker would report every
    /// other GPU process on the machine (other tests' brokers included).
    pub telemetry: bool,
    /// `--socket-mode` (octal), `666` unless set.
    pub socket_mode: Option<String>,
    /// Environment variables set for gpushared (`SLURM_CONF`, say).
    pub env: Vec<(String, String)>,
    /// Start gpushared in a process group of its own (as a shell or a terminal does), so a
    /// test can signal the group.
    pub own_process_group: bool,
}

impl Broker {
    pub fn start() -> Broker {
        Broker::start_with(BrokerOptions::default())
    }

    pub fn start_with(opts: BrokerOptions) -> Broker {
        Broker::try_start_with(opts).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Starts a broker, or says why it did not come up.
    pub fn try_start_with(opts: BrokerOptions) -> Result<Broker, String> {
        let dir = tempfile::tempdir().expect("temp dir");
        let socket = opts
            .socket
            .clone()
            .unwrap_or_else(|| dir.path().join("gpushare.sock"));
        let mut cmd = Command::new(binary("gpushared"));
        cmd.arg("--socket")
            .arg(&socket)
            .arg("--backend")
            .arg(opts.backend.clone().unwrap_or_else(test_backend))
            .arg("--socket-mode")
            .arg(opts.socket_mode.as_deref().unwrap_or("666"))
            .arg("--log")
            .arg("debug")
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if let Some(policy) = &opts.policy {
            let path = dir.path().join("policy.toml");
            std::fs::write(&path, policy).expect("write policy");
            cmd.arg("--config").arg(path);
        }
        let wants_telemetry =
            opts.telemetry || opts.extra_args.iter().any(|a| a.starts_with("--telemetry"));
        if !wants_telemetry {
            cmd.arg("--no-telemetry");
        }
        cmd.args(&opts.extra_args);
        cmd.envs(opts.env.iter().map(|(k, v)| (k, v)));
        if opts.own_process_group {
            std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        }
        let mut child = cmd.spawn().expect("spawn gpushared");
        let log = Arc::new(Mutex::new(Vec::new()));
        if let Some(stderr) = child.stderr.take() {
            let log = log.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    if std::env::var_os("GPUSHARE_TEST_LOG").is_some() {
                        eprintln!("[gpushared] {line}");
                    }
                    log.lock().unwrap_or_else(|p| p.into_inner()).push(line);
                }
            });
        }
        let mut broker = Broker {
            child,
            socket,
            dir,
            log,
        };
        broker.wait_ready(Duration::from_secs(30))?;
        // Telemetry starts beside serving: a test that asked for it gets it started (or
        // knows why not) first.
        if wants_telemetry
            && !wait_until(Duration::from_secs(30), || {
                broker.log_contains("telemetry on: eBPF sees")
                    || broker.log_contains("telemetry off:")
            })
        {
            return Err(format!(
                "gpushared's telemetry neither started nor said why in 30 s; log:\n{}",
                broker.log_text()
            ));
        }
        Ok(broker)
    }

    fn wait_ready(&mut self, timeout: Duration) -> Result<(), String> {
        let start = Instant::now();
        while start.elapsed() < timeout {
            if self.log_contains("gpushared ready") {
                return Ok(());
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                std::thread::sleep(Duration::from_millis(50)); // let the log reader catch up
                return Err(format!(
                    "gpushared exited ({status}) before it was ready; log:\n{}",
                    self.log_text()
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Err(format!(
            "gpushared did not become ready in {timeout:?}; log:\n{}",
            self.log_text()
        ))
    }

    /// If the test is still running after `after`, prints the broker's log and aborts the
    /// test process: a hang then shows what the broker was doing instead of nothing.
    pub fn dump_log_if_stuck(&self, after: Duration) {
        let log = Arc::downgrade(&self.log);
        let name = std::thread::current().name().unwrap_or("test").to_string();
        std::thread::spawn(move || {
            std::thread::sleep(after);
            // Gone (the broker was dropped and its log reader finished): the test is over.
            let Some(log) = log.upgrade() else { return };
            let text = log.lock().unwrap_or_else(|p| p.into_inner()).join("\n");
            let _ = std::io::Write::write_all(
                &mut std::io::stderr(),
                format!("{name} still running after {after:?}; broker log:\n{text}\n").as_bytes(),
            );
            std::process::abort();
        });
    }

    /// Everything the broker logged so far.
    pub fn log_text(&self) -> String {
        self.log
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .join("\n")
    }

    pub fn log_contains(&self, needle: &str) -> bool {
        self.log
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .any(|l| l.contains(needle))
    }

    /// Waits until the log contains `needle`.
    pub fn wait_for_log(&self, needle: &str, timeout: Duration) -> bool {
        wait_until(timeout, || self.log_contains(needle))
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Connects a client with default options.
    pub fn client(&self) -> gpushare::Client {
        self.client_named("test")
    }

    pub fn client_named(&self, name: &str) -> gpushare::Client {
        gpushare::Client::connect_with(self.options(name)).expect("connect to test broker")
    }

    pub fn options(&self, name: &str) -> gpushare::ConnectOptions {
        gpushare::ConnectOptions {
            socket: self.socket.clone(),
            name: name.into(),
            ..Default::default()
        }
    }

    pub fn status(&self) -> gpushare::StatusReport {
        gpushare::Monitor::connect(&self.socket)
            .and_then(|mut m| m.status())
            .expect("status")
    }

    /// The status row of the client named `name`, if it is connected.
    pub fn client_status(&self, name: &str) -> Option<gpushare::ClientStats> {
        self.status().clients.into_iter().find(|c| c.name == name)
    }

    /// Sends SIGTERM and waits for the process to exit; returns its exit status.
    pub fn terminate(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.pid()),
            nix::sys::signal::Signal::SIGTERM,
        );
        let start = Instant::now();
        while start.elapsed() < timeout {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }

    /// The broker's children that keep the CUDA driver initialised (`--hold-cuda-driver`).
    pub fn cuda_holders(&self) -> Vec<i32> {
        let me = self.pid();
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
            .filter(|pid| {
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
                // "pid (comm) state ppid ...": the comm may hold spaces, so split after ')'.
                let ppid = stat
                    .rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<i32>().ok());
                let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                ppid == Some(me)
                    && cmdline
                        .split(|&b| b == 0)
                        .any(|arg| arg == b"--hold-cuda-driver")
            })
            .collect()
    }

    /// How many descriptors the broker holds open.
    pub fn fd_count(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .map(|d| d.count())
            .unwrap_or(0)
    }

    /// How many clients' shared regions (`memfd:gpushare-client-N`) are mapped, by the broker
    /// or by any of its device workers (a region mapped by both counts once).
    pub fn mapped_client_regions(&self) -> usize {
        std::iter::once(self.pid())
            .chain(self.worker_pids())
            .flat_map(|pid| {
                let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
                maps.lines()
                    .filter_map(|l| {
                        l.split_whitespace()
                            .find(|f| f.contains("memfd:gpushare-client-"))
                            .map(str::to_string)
                    })
                    .collect::<Vec<_>>()
            })
            .collect::<std::collections::HashSet<_>>()
            .len()
    }

    /// The broker's device workers (`gpushared --device-worker`, the serving ones and the
    /// spares): its children running that flag.
    pub fn worker_pids(&self) -> Vec<i32> {
        let me = self.pid();
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        let mut pids: Vec<i32> = dir
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
            .filter(|pid| {
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
                // The parent pid is the second field after the command's closing parenthesis.
                let parent = stat
                    .rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                    .and_then(|p| p.parse::<i32>().ok());
                let cmdline =
                    std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                parent == Some(me) && cmdline.split('\0').any(|a| a == "--device-worker")
            })
            .collect();
        pids.sort_unstable();
        pids
    }

    /// The process that holds the GPU context its clients' work runs in: the device worker
    /// that has a client's region mapped (the serving one; a spare has none), else the broker
    /// itself (`--in-process-device`).
    pub fn device_holder(&self) -> i32 {
        self.worker_pids()
            .into_iter()
            .find(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/maps"))
                    .unwrap_or_default()
                    .contains("memfd:gpushare-client-")
            })
            .unwrap_or_else(|| self.pid())
    }

    /// Lets every user reach the socket (the private directory is 0700): from then on the
    /// socket's own mode and group decide who may connect.
    pub fn open_to_other_users(&self) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(self.dir.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod the broker's directory");
    }

    /// A workspace binary that other users can run: the built one where every directory above
    /// it lets others through, else a copy in this broker's directory (call
    /// [`Broker::open_to_other_users`] too).
    pub fn binary_for_other_users(&self, name: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let built = binary(name);
        let others_may = |p: &Path, bits: u32| {
            std::fs::metadata(p).is_ok_and(|m| m.permissions().mode() & bits == bits)
        };
        let reachable = others_may(&built, 0o005)
            && built
                .ancestors()
                .skip(1)
                .all(|d| d.as_os_str().is_empty() || others_may(d, 0o001));
        if reachable {
            return built;
        }
        let dir = self.dir.path().join("bin");
        std::fs::create_dir_all(&dir).expect("bin dir");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let copy = dir.join(name);
        if !copy.exists() {
            // Copied by `cp`, not here: a writable descriptor of the copy in this process
            // could leak into a child another test thread forks at that moment, and then
            // running the copy fails with ETXTBSY until that child execs.
            let copied = Command::new("cp")
                .arg(&built)
                .arg(&copy)
                .status()
                .expect("run cp");
            assert!(
                copied.success(),
                "cp {} {}: {copied}",
                built.display(),
                copy.display()
            );
            std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        }
        copy
    }

    /// A command for a workspace binary, run as `user`, with this broker's socket in its
    /// environment. Makes the socket's directory and the binary reachable for `user`.
    pub fn command_as(&self, user: &SystemUser, bin: &str) -> Command {
        self.open_to_other_users();
        let mut cmd = Command::new(self.binary_for_other_users(bin));
        cmd.env("GPUSHARE_SOCKET", &self.socket).current_dir("/");
        user.apply(&mut cmd);
        cmd
    }

    /// A command for a workspace binary with this broker's socket in its environment.
    pub fn command(&self, bin: &str) -> Command {
        let mut cmd = Command::new(binary(bin));
        cmd.env("GPUSHARE_SOCKET", &self.socket);
        cmd
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if std::thread::panicking() && std::env::var_os("GPUSHARE_TEST_BROKER_LOG").is_some() {
            let _ = std::io::Write::write_all(
                &mut std::io::stderr(),
                format!("broker log:\n{}\n", self.log_text()).as_bytes(),
            );
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The backend integration tests run against: `$GPUSHARE_TEST_BACKEND` (`sim` or `cuda`),
/// `sim` by default.
pub fn test_backend() -> String {
    std::env::var("GPUSHARE_TEST_BACKEND").unwrap_or_else(|_| "sim".into())
}

/// A broker on the GPU for GPU-only tests, or `None` (with a loud note) where there is none.
pub fn gpu_broker() -> Option<Broker> {
    gpu_broker_with(BrokerOptions::default())
}

/// [`gpu_broker`] with these options (the backend is always `cuda`).
pub fn gpu_broker_with(mut opts: BrokerOptions) -> Option<Broker> {
    // One GPU, whatever the machine has: the tests' clients must meet on one device (on a
    // machine of two, placement would put a second client on the idle one).
    if !opts.extra_args.iter().any(|a| a == "--gpu") {
        opts.extra_args.extend(["--gpu".into(), "0".into()]);
    }
    let opts = BrokerOptions {
        backend: Some("cuda".into()),
        ..opts
    };
    match Broker::try_start_with(opts) {
        Ok(b) => Some(b),
        Err(e) => {
            let why = e
                .lines()
                .rev()
                .find(|l| l.contains("cannot use GPU") || l.contains("Error"))
                .unwrap_or("no GPU");
            // Straight to the stderr handle: the test harness captures `eprintln!`, and a skip
            // must show in CI logs.
            let _ = std::io::Write::write_all(
                &mut std::io::stderr(),
                format!(
                    "SKIPPED {} (no usable GPU): {why}\n",
                    std::thread::current().name().unwrap_or("test")
                )
                .as_bytes(),
            );
            if std::env::var_os("GPUSHARE_REQUIRE_GPU").is_some() {
                panic!("GPUSHARE_REQUIRE_GPU is set but no GPU broker could start:\n{e}");
            }
            None
        }
    }
}

/// A process's mappings: (start, end, what), from /proc.
pub fn mappings(pid: i32) -> Vec<(u64, u64, String)> {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .expect("the process's maps")
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (lo, hi) = f.next()?.split_once('-')?;
            let what = f.nth(4).unwrap_or("").to_string();
            Some((
                u64::from_str_radix(lo, 16).ok()?,
                u64::from_str_radix(hi, 16).ok()?,
                what,
            ))
        })
        .collect()
}

/// Below this address a device worker maps everything it maps itself (it runs in the
/// bottom-up layout, from a third of the address space up), and above it programs in the
/// usual top-down layout map their libraries and mmaps (from below the stack down), and
/// their executable and heap (from two thirds of the address space).
pub const WORKER_MAPPINGS_BELOW: u64 = 0x5000_0000_0000;

/// Polls `check` every 5 ms until it holds or `timeout` passes.
pub fn wait_until(timeout: Duration, mut check: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if check() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    check()
}

pub mod cc;
pub mod cuda_program;
pub mod faults;
pub mod governed;
pub mod hostile;
pub mod kubelet;
pub mod raw;
pub mod slurm;
mod users;

pub use users::{SystemUser, other_users, root_or_skip, root_required, skip_or_fail};

/// `y[i] = a * x[i] + y[i]` for `i < n`, hand-written PTX so the test needs no compiler.
/// Parameters, packed: y (u64 @0), x (u64 @8), a (f32 @16), n (u32 @20): 24 bytes.
pub const SCALE_ADD_PTX: &str = r#"
.version 8.0
.target sm_90
.address_size 64

.visible .entry scale_add(
    .param .u64 y,
    .param .u64 x,
    .param .f32 a,
    .param .u32 n
)
{
    .reg .pred %p;
    .reg .b32 %r<6>;
    .reg .f32 %f<4>;
    .reg .b64 %rd<8>;

    ld.param.u64 %rd1, [y];
    ld.param.u64 %rd2, [x];
    ld.param.f32 %f1, [a];
    ld.param.u32 %r1, [n];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.s32 %r5, %r2, %r3, %r4;
    setp.ge.u32 %p, %r5, %r1;
    @%p bra DONE;
    cvta.to.global.u64 %rd3, %rd1;
    cvta.to.global.u64 %rd4, %rd2;
    mul.wide.u32 %rd5, %r5, 4;
    add.s64 %rd6, %rd3, %rd5;
    add.s64 %rd7, %rd4, %rd5;
    ld.global.f32 %f2, [%rd7];
    ld.global.f32 %f3, [%rd6];
    fma.rn.f32 %f3, %f1, %f2, %f3;
    st.global.f32 [%rd6], %f3;
DONE:
    ret;
}
"#;

/// Row-major `A·B` on the host, in f32 (A is m×k, B is k×n): what a GEMM should give.
pub fn host_gemm(a: &[f32], b: &[f32], m: usize, n: usize, k: usize) -> Vec<f32> {
    let mut c = vec![0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            c[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
        }
    }
    c
}

/// Deterministic test data.
pub fn pattern(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 1000) as f32 / 100.0)
        .collect()
}

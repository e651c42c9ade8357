//! Nothing fails open when gpushared is away. A library client's calls and new connections
//! give up with a clear error when the broker is stopped (SIGSTOP) or killed, while a long
//! synchronization on a live broker is never cut short; a consolidated program's calls fail
//! with CUDA's error and say why. A governed program that loses its broker waits for it,
//! connects again and registers what it holds; until then its launches and allocations wait
//! and then fail, and never reach the driver unmanaged.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpushare::{Client, ConnectOptions, Error, Kernel};
use gpushare_tests::cuda_program::{CudaProgram, Running};
use gpushare_tests::governed::governed_app;
use gpushare_tests::{Broker, BrokerOptions, wait_until};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

const MIB: u64 = 1 << 20;
const SECOND: Duration = Duration::from_secs(1);

fn signal(broker: &Broker, sig: Signal) {
    kill(Pid::from_raw(broker.pid()), sig).expect("signal the broker");
}

/// Stops the broker (SIGSTOP) and waits until every thread of it has stopped: the signal is
/// delivered asynchronously, and a thread running on another CPU could still answer.
fn stop(broker: &Broker) {
    signal(broker, Signal::SIGSTOP);
    let all_stopped = || {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{}/task", broker.pid())) else {
            return false;
        };
        tasks.filter_map(Result::ok).all(|t| {
            let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
            // "tid (comm) STATE …": the state follows the last ')'.
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next())
                == Some("T")
        })
    };
    assert!(
        wait_until(Duration::from_secs(10), all_stopped),
        "the broker did not stop"
    );
}

/// A broker on `socket` (so that another can take its place there).
fn broker_on(socket: &Path, extra: &[&str]) -> Broker {
    let broker = Broker::start_with(BrokerOptions {
        socket: Some(socket.to_path_buf()),
        extra_args: extra.iter().map(|a| a.to_string()).collect(),
        ..Default::default()
    });
    broker.dump_log_if_stuck(Duration::from_secs(120));
    broker
}

fn client(broker: &Broker, name: &str, timeout: Duration) -> gpushare::Result<Client> {
    Client::connect_with(ConnectOptions {
        timeout,
        ..broker.options(name)
    })
}

fn assert_unresponsive(err: &Error) {
    assert!(
        matches!(err, Error::BrokerUnresponsive { .. }) && err.is_fatal(),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.starts_with("gpushared did not answer for") && text.contains("GPUSHARE_TIMEOUT"),
        "{text}"
    );
}

#[test]
fn a_stopped_broker_fails_waiting_calls_and_new_connections_with_a_clear_error() {
    let broker = Broker::start();
    broker.dump_log_if_stuck(Duration::from_secs(120));
    let waiting = client(&broker, "waiting", SECOND).expect("connect");
    let buf = waiting.alloc::<f32>(1024).expect("alloc");
    stop(&broker);
    // A call waiting for a completion: no completion, and no answer to the ping either.
    let err = buf.to_vec().expect_err("a stopped broker answers nothing");
    assert_unresponsive(&err);
    // The session is over for good, even once the broker runs again.
    // A new connection: the kernel takes it into the listening socket's backlog, but nobody
    // says welcome.
    let err = client(&broker, "new", SECOND)
        .err()
        .expect("no session from a stopped broker");
    assert_unresponsive(&err);
    // The command line tool too.
    let out = broker
        .command("gpushare")
        .arg("status")
        .env("GPUSHARE_TIMEOUT", "1")
        .output()
        .expect("run gpushare status");
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("gpushared did not answer for"), "{said}");
    signal(&broker, Signal::SIGCONT);
    let again = waiting.nop().expect_err("the session stays over");
    assert_unresponsive(&again);
    let fresh = client(&broker, "fresh", SECOND).expect("a new session once it runs again");
    let b = fresh.alloc::<f32>(16).expect("alloc");
    b.copy_from_host(&[1.5; 16]).expect("copy");
    assert_eq!(b.to_vec().expect("read"), vec![1.5; 16]);
}

#[test]
fn a_long_synchronization_on_a_live_broker_is_not_cut_short() {
    // Kernels take their modelled time on the wall clock: a 3 s kernel keeps the client's
    // sync waiting three times its 1 s timeout, and the broker answers its pings meanwhile.
    let broker = Broker::start_with(BrokerOptions {
        extra_args: vec!["--sim-realtime".into()],
        backend: Some("sim".into()),
        ..Default::default()
    });
    broker.dump_log_if_stuck(Duration::from_secs(120));
    let c = client(&broker, "patient", SECOND).expect("connect");
    let stream = c.default_stream();
    stream
        .launch(Kernel::Spin {
            micros: 3_000_000,
            blocks: 1,
        })
        .expect("launch");
    stream.synchronize().expect("a long sync on a live broker");
}

#[test]
fn a_killed_broker_ends_a_waiting_call_with_broker_gone() {
    let broker = Arc::new(Mutex::new(Broker::start_with(BrokerOptions {
        extra_args: vec!["--sim-realtime".into()],
        backend: Some("sim".into()),
        ..Default::default()
    })));
    let c = {
        let b = broker.lock().expect("broker");
        client(&b, "victim", Duration::from_secs(30)).expect("connect")
    };
    let stream = c.default_stream();
    stream
        .launch(Kernel::Spin {
            micros: 20_000_000,
            blocks: 1,
        })
        .expect("launch");
    let syncing = Arc::new(AtomicBool::new(false));
    let killer = {
        let (broker, syncing) = (broker.clone(), syncing.clone());
        std::thread::spawn(move || {
            assert!(wait_until(Duration::from_secs(10), || syncing.load(Ordering::Acquire)));
            let mut b = broker.lock().expect("broker");
            b.child.kill().expect("kill");
            let _ = b.child.wait();
        })
    };
    syncing.store(true, Ordering::Release);
    let err = stream.synchronize().expect_err("the broker is gone");
    assert!(matches!(err, Error::BrokerGone), "{err:?}");
    killer.join().expect("killer");
}

#[test]
fn a_consolidated_programs_calls_fail_when_its_broker_stops_and_say_why() {
    let broker = Broker::start();
    broker.dump_log_if_stuck(Duration::from_secs(120));
    let program = CudaProgram::build(broker.dir.path(), false);
    let mut cmd = program.command(&broker.socket, &["away"]);
    cmd.stdin(Stdio::piped()).env("GPUSHARE_TIMEOUT", "1");
    let mut running = Running::spawn(cmd);
    running.wait_for_line("ready", Duration::from_secs(30));
    stop(&broker);
    running.send_line("go");
    let out = running.finish(Duration::from_secs(60));
    signal(&broker, Signal::SIGCONT);
    assert!(
        out.stdout.contains(
            "after copy=CUDA_ERROR_DEVICE_UNAVAILABLE sync=CUDA_ERROR_DEVICE_UNAVAILABLE again=CUDA_ERROR_DEVICE_UNAVAILABLE"
        ),
        "{}{}",
        out.stdout,
        out.stderr
    );
    assert!(
        out.stderr.contains("gpushared did not answer for")
            && out.stderr.contains("this program's GPU work cannot go on"),
        "{}",
        out.stderr
    );
}

/// A governed program driven one step at a time (`governed_app steps`).
struct Program {
    child: Child,
    stdin: ChildStdin,
    lines: std::io::Lines<BufReader<ChildStdout>>,
    stderr: Arc<Mutex<String>>,
}

impl Program {
    /// Starts the program against `socket`, holding `held` bytes; `env` as the environment
    /// adds.
    fn start(socket: &Path, held: u64, env: &[(&str, &str)]) -> Program {
        let mut cmd = governed_app(
            socket,
            &["--name", "governed"],
            &["steps", &held.to_string()],
        );
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("start the program");
        let stdin = child.stdin.take().expect("stdin");
        let lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let stderr = Arc::new(Mutex::new(String::new()));
        let err = child.stderr.take().expect("stderr");
        let collected = stderr.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                let mut all = collected.lock().unwrap_or_else(|p| p.into_inner());
                all.push_str(&line);
                all.push('\n');
            }
        });
        let mut p = Program {
            child,
            stdin,
            lines,
            stderr,
        };
        let ready = p.line();
        assert_eq!(ready, "ready 0", "{}", p.stderr());
        p
    }

    fn line(&mut self) -> String {
        match self.lines.next() {
            Some(Ok(l)) => l,
            other => panic!("the program said {other:?}; stderr:\n{}", self.stderr()),
        }
    }

    /// Runs one step; its answer.
    fn step(&mut self, step: &str) -> String {
        writeln!(self.stdin, "{step}").expect("write a step");
        self.stdin.flush().expect("flush");
        self.line()
    }

    fn stderr(&self) -> String {
        self.stderr
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Waits until the program has said `needle` on stderr.
    fn said(&self, needle: &str) -> bool {
        wait_until(Duration::from_secs(10), || self.stderr().contains(needle))
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The governed program's memory as the broker counts it, once it is connected.
fn governed_memory(broker: &Broker) -> Option<u64> {
    broker
        .status()
        .clients
        .iter()
        .find(|c| c.governed && c.name == "governed")
        .map(|c| c.memory_used)
}

#[test]
fn a_governed_program_connects_again_after_a_restart_and_registers_what_it_holds() {
    let dir = tempfile::tempdir().expect("tmp");
    let socket = dir.path().join("gpushare.sock");
    let mut first = broker_on(&socket, &[]);
    let mut program = Program::start(
        &socket,
        4 * MIB,
        &[
            ("GPUSHARE_TIMEOUT", "2"),
            ("GPUSHARE_RECONNECT_TIMEOUT", "60"),
        ],
    );
    assert_eq!(program.step("launch"), "launch 0 1");
    assert_eq!(governed_memory(&first), Some(4 * MIB));

    // The broker dies and another takes its place.
    first.child.kill().expect("kill");
    let _ = first.child.wait();
    let second = broker_on(&socket, &[]);
    // The next call that needs the broker (an allocation always does; a launch once the
    // tokens granted before have run out) finds it gone, connects again and registers the
    // 4 MiB the program holds; then the allocation is counted as usual.
    assert_eq!(program.step(&format!("alloc {MIB}")), "alloc 0 2");
    assert!(program.said("lost the broker"), "{}", program.stderr());
    assert!(
        program.said("registered 4194304 bytes of device memory this program holds"),
        "{}",
        program.stderr()
    );
    assert_eq!(governed_memory(&second), Some(5 * MIB), "registered again");
    assert_eq!(program.step("launch"), "launch 0 2");
    assert_eq!(program.step("free"), "free 0");
    assert!(wait_until(Duration::from_secs(5), || governed_memory(
        &second
    ) == Some(4 * MIB)));
    assert!(
        !program.stderr().contains("unmanaged"),
        "{}",
        program.stderr()
    );
}

#[test]
fn while_the_broker_is_away_a_governed_program_waits_then_fails_and_never_runs_unmanaged() {
    let dir = tempfile::tempdir().expect("tmp");
    let socket = dir.path().join("gpushare.sock");
    let mut first = broker_on(&socket, &[]);
    let mut program = Program::start(
        &socket,
        MIB,
        &[
            ("GPUSHARE_TIMEOUT", "1"),
            ("GPUSHARE_RECONNECT_TIMEOUT", "1"),
        ],
    );
    assert_eq!(program.step("launch"), "launch 0 1");
    first.child.kill().expect("kill");
    let _ = first.child.wait();
    // No broker comes back within the second it waits: the allocation, and the launch after
    // it (the tokens of the lost broker are void), fail (CUDA_ERROR_SYSTEM_NOT_READY)
    // without reaching the driver.
    assert_eq!(program.step(&format!("alloc {MIB}")), "alloc 802 1");
    assert_eq!(program.step("launch"), "launch 802 1");
    assert!(program.said("still away"), "{}", program.stderr());
    // Once a broker is back, the next call connects again.
    let second = broker_on(&socket, &[]);
    assert_eq!(program.step("launch"), "launch 0 2");
    assert_eq!(governed_memory(&second), Some(MIB));
}

#[test]
fn a_stopped_broker_makes_a_governed_program_wait_then_fail_and_it_carries_on_after() {
    let dir = tempfile::tempdir().expect("tmp");
    let socket = dir.path().join("gpushare.sock");
    let broker = broker_on(&socket, &[]);
    let mut program = Program::start(
        &socket,
        MIB,
        &[
            ("GPUSHARE_TIMEOUT", "1"),
            ("GPUSHARE_RECONNECT_TIMEOUT", "2"),
        ],
    );
    assert_eq!(program.step("launch"), "launch 0 1");
    stop(&broker);
    // The reservation gets no answer: the broker is lost after the timeout, and not back
    // (every new session's hello times out too) within the reconnect bound. The launch after
    // it has no valid tokens either.
    assert_eq!(program.step(&format!("alloc {MIB}")), "alloc 802 1");
    assert!(program.said("did not answer"), "{}", program.stderr());
    assert_eq!(program.step("launch"), "launch 802 1");
    signal(&broker, Signal::SIGCONT);
    assert_eq!(program.step("launch"), "launch 0 2");
    assert!(
        wait_until(Duration::from_secs(5), || governed_memory(&broker)
            == Some(MIB)
            && broker
                .status()
                .clients
                .iter()
                .filter(|c| c.governed)
                .count()
                == 1),
        "the new session holds the program's memory, the old one is gone: {:?}",
        broker.status().clients
    );
}

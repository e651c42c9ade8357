//! `gpushare run` starting unmodified programs consolidated (the default): gpushare's CUDA
//! driver in place of libcuda on every path a program finds its driver by, each CUDA
//! process a client of its own, and what happens without a broker.
//!
//! `c/consolidated_app.c` is the program: it opens the driver as the CUDA runtime does
//! (`dlopen` by soname, or of a path to a real libcuda) or is linked against a libcuda by an
//! absolute path. `c/standin_libcuda.c`, built without a soname as `real/libcuda.so.1`, plays
//! the machine's real driver. Both are compiled here with the system C compiler.

use std::io::{BufRead, BufReader, Lines};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use gpushare_tests::{Broker, BrokerOptions, binary, wait_until};

const MIB: u64 = 1 << 20;
/// What `cuInit` answers when there is no broker: CUDA_ERROR_NO_DEVICE.
const NO_DEVICE: &str = "100";

struct Built {
    dir: tempfile::TempDir,
    /// The program, reaching its driver with `dlopen`.
    app: PathBuf,
    /// The program linked against `real/libcuda.so.1` by that absolute path.
    linked: PathBuf,
}

impl Built {
    /// The stand-in for the machine's driver.
    fn real_dir(&self) -> PathBuf {
        self.dir.path().join("real")
    }

    fn real_libcuda(&self) -> PathBuf {
        self.real_dir().join("libcuda.so.1")
    }
}

fn built() -> &'static Built {
    static BUILT: OnceLock<Built> = OnceLock::new();
    BUILT.get_or_init(|| {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("c");
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::create_dir(dir.path().join("real")).expect("mkdir real");
        let real = dir.path().join("real/libcuda.so.1");
        let app = dir.path().join("consolidated_app");
        let linked = dir.path().join("consolidated_linked");
        let program = src.join("consolidated_app.c");
        let real_arg = real.to_string_lossy().into_owned();
        // No -soname: a program linked against it names it by the path given here.
        let builds: [(&Path, Vec<&str>, &Path); 3] = [
            (
                &src.join("standin_libcuda.c"),
                vec!["-shared", "-fPIC"],
                &real,
            ),
            (&program, vec!["-ldl"], &app),
            (&program, vec!["-DLINKED", &real_arg, "-ldl"], &linked),
        ];
        for (source, flags, out) in builds {
            gpushare_tests::cc::compile(source, &flags, out);
        }
        Built { dir, app, linked }
    })
}

/// `gpushare run [run_args] -- program args` against `socket`, with no loader settings of
/// this test process's own.
fn run(socket: &Path, run_args: &[&str], program: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(binary("gpushare"));
    cmd.arg("--socket")
        .arg(socket)
        .arg("run")
        .args(run_args)
        .arg("--")
        .arg(program)
        .args(args)
        .env_remove("LD_PRELOAD")
        .env_remove("LD_AUDIT")
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("GPUSHARE_CUDA_DRIVER");
    cmd
}

fn text(output: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// The lines gpushare itself wrote on stderr.
fn said(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| l.starts_with("gpushare:"))
        .collect()
}

/// The value of `key` in `init` mode's output (`driver PATH`, `cuInit A B`, `env NAME V`).
fn field<'a>(out: &'a str, key: &str) -> &'a str {
    out.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no `{key}` in:\n{out}"))
}

/// Whether `path` is the consolidated driver this build made (the same file: cargo links
/// one file under several names).
fn is_gpushare_driver(path: &str) -> bool {
    use std::os::unix::fs::MetadataExt;
    let id = |p: &Path| std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()));
    let ours = id(&binary("libcuda.so"));
    ours.is_some() && id(Path::new(path)) == ours
}

/// A program under `gpushare run` that said `ready PID` (one line per process).
struct Running {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Running {
    fn start(mut cmd: Command) -> Running {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the program");
        let lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        Running { child, lines }
    }

    /// The pid in the next `ready PID` line.
    fn ready(&mut self) -> i32 {
        let line = self.lines.next().and_then(Result::ok).unwrap_or_default();
        line.strip_prefix("ready ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("the program said `{line}`, not `ready PID`"))
    }

    /// Ends its input, and waits for it to exit successfully.
    fn finish(mut self) {
        drop(self.child.stdin.take());
        let status = self.child.wait().expect("wait");
        assert!(status.success(), "{status}");
    }
}

/// The consolidated client of `pid` holding `bytes`, once status shows it.
fn wait_for_client(broker: &Broker, pid: i32, bytes: u64) -> gpushare::ClientStats {
    let mut found = None;
    let seen = wait_until(Duration::from_secs(10), || {
        found = broker
            .status()
            .clients
            .into_iter()
            .find(|c| c.pid == pid && c.memory_used == bytes);
        found.is_some()
    });
    assert!(
        seen,
        "status never showed pid {pid} holding {bytes} bytes: {:?}",
        broker.status().clients
    );
    found.expect("found")
}

fn started_broker() -> Broker {
    let broker = Broker::start();
    broker.dump_log_if_stuck(Duration::from_secs(120));
    broker
}

#[test]
fn a_program_that_opens_libcuda_by_soname_runs_consolidated_and_shows_in_status() {
    let broker = started_broker();
    let b = built();
    let mut program = Running::start(run(
        &broker.socket,
        &["--name", "soname-app"],
        &b.app,
        &["hold", "libcuda.so.1", &(3 * MIB).to_string()],
    ));
    let pid = program.ready();
    let c = wait_for_client(&broker, pid, 3 * MIB);
    assert!(c.consolidated && !c.governed, "{c:?}");
    assert_eq!(c.name, "soname-app");
    assert!(c.bytes_htod > 0 && c.bytes_dtoh > 0, "{c:?}");
    // Its copies ran on the broker's device, which times them (modelled on sim) and charges
    // them at the end of each batch.
    assert!(
        wait_until(Duration::from_secs(10), || broker
            .status()
            .clients
            .iter()
            .any(|c| c.pid == pid && c.gpu_time_ns > 0)),
        "no GPU time charged: {:?}",
        broker.status().clients
    );

    let status = Command::new(binary("gpushare"))
        .arg("--socket")
        .arg(&broker.socket)
        .arg("status")
        .output()
        .expect("gpushare status");
    let (table, err) = text(&status);
    assert!(status.status.success(), "{err}");
    let row = table
        .lines()
        .find(|l| l.contains("soname-app"))
        .unwrap_or_else(|| panic!("no row in:\n{table}"));
    assert!(
        row.contains("consolidated") && row.contains("3.0 MiB") && row.contains(&pid.to_string()),
        "{row}"
    );

    program.finish();
    assert!(
        wait_until(Duration::from_secs(5), || broker
            .status()
            .clients
            .is_empty()),
        "the session did not end with the program"
    );
}

#[test]
fn a_consolidated_program_gets_the_smaller_weight_it_asks_for_and_never_a_larger_one() {
    let broker = Broker::start_with(BrokerOptions {
        policy: Some("[defaults]\nweight = 4\n".into()),
        ..BrokerOptions::default()
    });
    broker.dump_log_if_stuck(Duration::from_secs(120));
    let b = built();
    for (asked, granted) in [("2", 2), ("9", 4)] {
        let mut cmd = run(
            &broker.socket,
            &["--weight", asked],
            &b.app,
            &["hold", "libcuda.so.1", &MIB.to_string()],
        );
        cmd.stderr(Stdio::piped());
        let mut program = Running::start(cmd);
        let pid = program.ready();
        let c = wait_for_client(&broker, pid, MIB);
        assert_eq!(c.weight, granted, "asked for {asked}: {c:?}");
        let mut stderr = program.child.stderr.take().expect("stderr");
        program.finish();
        let mut err = String::new();
        std::io::Read::read_to_string(&mut stderr, &mut err).expect("stderr");
        let complaints = said(&err).iter().filter(|l| l.contains("weight")).count();
        assert_eq!(
            complaints,
            usize::from(granted == 4),
            "asked for {asked}: {err}"
        );
    }
}

#[test]
fn on_two_gpus_a_program_runs_on_the_one_named_by_gpu_or_cuda_visible_devices_and_sees_only_it() {
    let broker = Broker::start_with(BrokerOptions {
        extra_args: vec!["--sim-gpus".into(), "2".into()],
        ..BrokerOptions::default()
    });
    broker.dump_log_if_stuck(Duration::from_secs(120));
    let b = built();
    for (run_args, visible) in [(&["--gpu", "1"][..], None), (&[][..], Some("1"))] {
        let mut cmd = run(
            &broker.socket,
            run_args,
            &b.app,
            &["hold", "libcuda.so.1", &MIB.to_string()],
        );
        if let Some(v) = visible {
            cmd.env("CUDA_VISIBLE_DEVICES", v);
        }
        cmd.stderr(Stdio::piped());
        let mut program = Running::start(cmd);
        let pid = program.ready();
        let c = wait_for_client(&broker, pid, MIB);
        assert_eq!(c.gpu, 1, "{run_args:?} {visible:?}: {c:?}");
        let mut stderr = program.child.stderr.take().expect("stderr");
        program.finish();
        let mut err = String::new();
        std::io::Read::read_to_string(&mut stderr, &mut err).expect("stderr");
        // Its question for a device 1 was refused with one line saying why.
        let said = said(&err);
        assert_eq!(said.len(), 1, "{err}");
        assert!(said[0].contains("one GPU"), "{err}");
    }
}

#[test]
fn a_path_to_the_real_libcuda_finds_gpushares_driver_whether_linked_or_opened() {
    let broker = started_broker();
    let b = built();
    let real = b.real_libcuda();
    // The control: run as it is, the linked program gets the driver at the path it names.
    let direct = Command::new(&b.linked)
        .args(["init", "-"])
        .output()
        .expect("run the linked program");
    let (out, err) = text(&direct);
    assert!(direct.status.success(), "{out}{err}");
    assert_eq!(Path::new(field(&out, "driver")), real, "{out}");

    let real_arg = real.to_string_lossy().into_owned();
    for (program, lib, name) in [
        (&b.linked, "-", "linked-app"),
        (&b.app, real_arg.as_str(), "abs-dlopen-app"),
    ] {
        let out = run(&broker.socket, &[], program, &["init", lib])
            .output()
            .expect("run");
        let (text_out, err) = text(&out);
        assert!(out.status.success(), "{text_out}{err}");
        assert!(
            is_gpushare_driver(field(&text_out, "driver")),
            "{name}: {text_out}"
        );
        assert_eq!(field(&text_out, "cuInit"), "0 0", "{name}: {err}");

        // And it is a client: it shows in status while it holds memory.
        let mut running = Running::start({
            let mut cmd = run(
                &broker.socket,
                &["--name", name],
                program,
                &["hold", lib, &MIB.to_string()],
            );
            cmd.stderr(Stdio::inherit());
            cmd
        });
        let pid = running.ready();
        let c = wait_for_client(&broker, pid, MIB);
        assert!(c.consolidated && c.name == name, "{c:?}");
        running.finish();
    }
}

#[test]
fn a_child_process_started_with_fork_and_exec_is_a_client_of_its_own() {
    let broker = started_broker();
    let b = built();
    let mut program = Running::start(run(
        &broker.socket,
        &[],
        &b.app,
        &[
            "spawn",
            "libcuda.so.1",
            &(2 * MIB).to_string(),
            &(5 * MIB).to_string(),
        ],
    ));
    // The child's line and the parent's, in either order.
    let (first, second) = (program.ready(), program.ready());
    assert_ne!(first, second);
    let (parent, child) = if program.child.id() as i32 == first {
        (first, second)
    } else {
        (second, first)
    };
    assert_eq!(parent, program.child.id() as i32, "the program itself");
    let p = wait_for_client(&broker, parent, 2 * MIB);
    let c = wait_for_client(&broker, child, 5 * MIB);
    assert!(p.consolidated && c.consolidated, "{p:?} {c:?}");
    assert_ne!(p.client_id, c.client_id);
    program.finish();
}

#[test]
fn without_a_broker_cuinit_fails_once_with_a_message_that_says_what_to_do() {
    let b = built();
    let socket = b.dir.path().join("no-broker.sock");
    let output = run(&socket, &[], &b.app, &["init", "libcuda.so.1"])
        .output()
        .expect("run");
    let (out, err) = text(&output);
    assert!(output.status.success(), "{out}{err}");
    assert!(is_gpushare_driver(field(&out, "driver")), "{out}");
    assert_eq!(
        field(&out, "cuInit"),
        format!("{NO_DEVICE} {NO_DEVICE}"),
        "{err}"
    );
    let lines = said(&err);
    assert_eq!(lines.len(), 1, "one line, for two calls:\n{err}");
    for part in [
        socket.to_string_lossy().as_ref(),
        "is gpushared running?",
        "gpushare run --fallback direct",
    ] {
        assert!(lines[0].contains(part), "`{part}` in: {}", lines[0]);
    }
}

#[test]
fn fallback_direct_without_a_broker_runs_the_program_on_the_real_driver_and_says_so() {
    let b = built();
    let socket = b.dir.path().join("no-broker.sock");
    let real_dir = b.real_dir();
    let output = run(
        &socket,
        &["--fallback", "direct"],
        &b.app,
        &["init", "libcuda.so.1"],
    )
    .env("LD_LIBRARY_PATH", &real_dir)
    .output()
    .expect("run");
    let (out, err) = text(&output);
    assert!(output.status.success(), "{out}{err}");
    assert_eq!(Path::new(field(&out, "driver")), b.real_libcuda(), "{out}");
    assert_eq!(field(&out, "cuInit"), "0 0", "{out}");
    // The user's library path as it was, and no audit library.
    assert_eq!(Path::new(field(&out, "env LD_LIBRARY_PATH")), real_dir);
    assert_eq!(field(&out, "env LD_AUDIT"), "-");
    assert_eq!(
        said(&err),
        [format!(
            "gpushare: gpushared is not reachable at {} (No such file or directory (os error 2)): running {} directly on the GPU's own driver, outside gpushare (--fallback direct)",
            socket.display(),
            b.app.display()
        )],
        "{err}"
    );

    // With the same library path and no fallback, gpushare's driver comes first — a
    // directory whose libcuda.so.1 is gpushare's, which finds it without the audit library
    // too — and the user's path after it.
    let output = run(&socket, &[], &b.app, &["init", "libcuda.so.1"])
        .env("LD_LIBRARY_PATH", &real_dir)
        .output()
        .expect("run");
    let (out, err) = text(&output);
    assert!(output.status.success(), "{out}{err}");
    assert!(is_gpushare_driver(field(&out, "driver")), "{out}");
    let path = field(&out, "env LD_LIBRARY_PATH");
    let (first, rest) = path.split_once(':').unwrap_or((path, ""));
    let shadowed = Path::new(first).join("libcuda.so.1");
    assert!(is_gpushare_driver(&shadowed.to_string_lossy()), "{path}");
    assert_eq!(Path::new(rest), real_dir, "{path}");
}

#[test]
fn a_program_run_directly_from_a_consolidated_one_drops_the_inherited_driver() {
    // The outer run leaves gpushare's driver directory and audit library in the environment;
    // the inner one, falling back to the real driver, takes them out again.
    let b = built();
    let socket = b.dir.path().join("no-broker.sock");
    let real_dir = b.real_dir();
    let gpushare = binary("gpushare");
    let inner = [
        "--socket",
        &socket.to_string_lossy(),
        "run",
        "--fallback",
        "direct",
        "--",
        &b.app.to_string_lossy(),
        "init",
        "libcuda.so.1",
    ]
    .map(str::to_string);
    let inner: Vec<&str> = inner.iter().map(String::as_str).collect();
    let output = run(&socket, &[], &gpushare, &inner)
        .env("LD_LIBRARY_PATH", &real_dir)
        .output()
        .expect("run");
    let (out, err) = text(&output);
    assert!(output.status.success(), "{out}{err}");
    assert_eq!(Path::new(field(&out, "driver")), b.real_libcuda(), "{out}");
    assert_eq!(Path::new(field(&out, "env LD_LIBRARY_PATH")), real_dir);
    assert_eq!(field(&out, "env LD_AUDIT"), "-");
}

#[test]
fn fallback_in_governed_mode_is_handed_to_the_interposer() {
    let b = built();
    let socket = b.dir.path().join("no-broker.sock");
    for (fallback, seen) in [
        (Some("direct"), "direct"),
        (Some("fail"), "fail"),
        (None, ""),
    ] {
        let mut args = vec!["--mode", "governed"];
        if let Some(f) = fallback {
            args.extend(["--fallback", f]);
        }
        let output = run(
            &socket,
            &args,
            Path::new("sh"),
            &["-c", "echo \"fallback=$GPUSHARE_FALLBACK\""],
        )
        .env("GPUSHARE_INTERPOSER", binary("libgpushare_interpose.so"))
        .env_remove("GPUSHARE_FALLBACK")
        .output()
        .expect("run");
        let (out, err) = text(&output);
        assert!(output.status.success(), "{err}");
        assert_eq!(out.trim(), format!("fallback={seen}"), "{fallback:?}");
    }
}

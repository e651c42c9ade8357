//! The stand-in CUDA program (`tests/c/cuda_standin.c`): compiled at test time, run with
//! gpushare's `libcuda.so.1` (`client-lib/cuda`) found by soname, the way the CUDA runtime
//! finds the driver.
//!
//! Needs `cc` and the workspace built (`cargo build --workspace`) for `libcuda.so`; a test
//! using it fails, loudly, when either is missing.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The program's sources, first the one with `main`.
const SOURCES: [&str; 10] = [
    "cuda_standin.c",
    "cuda_standin_common.c",
    "cuda_standin_memory.c",
    "cuda_standin_streams.c",
    "cuda_standin_vmm.c",
    "cuda_standin_ipc.c",
    "cuda_standin_export.c",
    "cuda_standin_graphs.c",
    "cuda_standin_reuse.c",
    "cuda_standin_gpus.c",
];

/// The driver fuzzer's sources (`tests/driver_fuzz.rs`), first the one with `main`.
pub const FUZZER_SOURCES: [&str; 5] = [
    "driver_fuzz.c",
    "cuda_standin_common.c",
    "driver_fuzz_context.c",
    "driver_fuzz_memory.c",
    "driver_fuzz_work.c",
];

/// A built stand-in program and the directory that holds it and `libcuda.so.1`.
pub struct CudaProgram {
    pub exe: PathBuf,
    pub lib_dir: PathBuf,
}

fn c_compiler() -> OsString {
    let cc = std::env::var_os("CC").unwrap_or_else(|| "cc".into());
    match Command::new(&cc).arg("--version").output() {
        Ok(_) => cc,
        Err(e) if e.kind() == ErrorKind::NotFound => panic!(
            "the C compiler `{}` is missing: the consolidated driver's tests need one (install gcc or clang, or set CC)",
            cc.to_string_lossy()
        ),
        Err(e) => panic!("cannot run {}: {e}", cc.to_string_lossy()),
    }
}

impl CudaProgram {
    /// Compiles the program into `dir`, and puts `libcuda.so.1` there: a symbolic link to the
    /// built `libcuda.so`, or (`copy_library`, for other users, who may not reach the build
    /// tree) a copy of it.
    pub fn build(dir: &Path, copy_library: bool) -> CudaProgram {
        CudaProgram::build_from(dir, "cuda_standin", &SOURCES, copy_library)
    }

    /// [`CudaProgram::build`] into a folder of `broker`'s that other users reach, with a
    /// copy of the library they can read; the broker's socket is opened to them too.
    pub fn build_for_other_users(broker: &crate::Broker) -> CudaProgram {
        broker.open_to_other_users();
        let dir = broker.dir.path().join("app");
        std::fs::create_dir(&dir).expect("app dir");
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .expect("chmod");
        CudaProgram::build(&dir, true)
    }

    /// [`CudaProgram::build`] of another program, `name`, from `sources` in `tests/c/` (first
    /// the one with `main`). Programs built into one directory share its `libcuda.so.1`.
    pub fn build_from(dir: &Path, name: &str, sources: &[&str], copy_library: bool) -> CudaProgram {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("c");
        let exe = dir.join(name);
        let mut cmd = Command::new(c_compiler());
        cmd.args([
            "-std=gnu11",
            "-Wall",
            "-Wextra",
            "-Wstrict-prototypes",
            "-Werror",
            "-O1",
            "-pthread",
        ]);
        for file in sources {
            cmd.arg(src.join(file));
        }
        cmd.arg("-ldl").arg("-o").arg(&exe);
        let out = cmd.output().unwrap_or_else(|e| panic!("run {cmd:?}: {e}"));
        assert!(
            out.status.success(),
            "{cmd:?} failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let built = crate::binary("libcuda.so");
        let lib = dir.join("libcuda.so.1");
        let placed = if lib.symlink_metadata().is_ok() {
            Ok(())
        } else if copy_library {
            std::fs::copy(&built, &lib).map(drop)
        } else {
            std::os::unix::fs::symlink(&built, &lib)
        };
        placed.unwrap_or_else(|e| panic!("{} -> {}: {e}", built.display(), lib.display()));
        CudaProgram {
            exe,
            lib_dir: dir.to_path_buf(),
        }
    }

    /// A command running the program with `args` against the broker at `socket`, with
    /// gpushare's driver first on the library path.
    pub fn command(&self, socket: &Path, args: &[&str]) -> Command {
        let mut cmd = Command::new(&self.exe);
        cmd.args(args)
            .env("LD_LIBRARY_PATH", &self.lib_dir)
            .env("GPUSHARE_SOCKET", socket)
            .env("GPUSHARE_TEST_LIBCUDA", self.lib_dir.join("libcuda.so.1"))
            .env_remove("CUDA_VISIBLE_DEVICES")
            .env_remove("GPUSHARE_GPU")
            .env_remove("GPUSHARE_CLASS")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    }
}

/// What a finished run of the program printed.
#[derive(Debug)]
pub struct Finished {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// A running program whose output is read as it comes.
pub struct Running {
    child: Child,
    stdout: mpsc::Receiver<String>,
    lines: Vec<String>,
    stderr: Option<std::thread::JoinHandle<String>>,
}

impl Running {
    /// Starts `cmd` (its stdout and stderr piped).
    pub fn spawn(mut cmd: Command) -> Running {
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
        let out = child.stdout.take().expect("stdout piped");
        let err = child.stderr.take().expect("stderr piped");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = std::io::Read::read_to_string(&mut BufReader::new(err), &mut text);
            text
        });
        Running {
            child,
            stdout: rx,
            lines: Vec::new(),
            stderr: Some(stderr),
        }
    }

    /// Waits for a stdout line that starts with `prefix`; panics with what came after
    /// `timeout` or when the program ends first.
    pub fn wait_for_line(&mut self, prefix: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.stdout.recv_timeout(left) {
                Ok(line) => {
                    self.lines.push(line.clone());
                    if line.starts_with(prefix) {
                        return line;
                    }
                }
                Err(e) => {
                    self.kill();
                    panic!(
                        "no `{prefix}` line ({e}); the program said:\n{}",
                        self.lines.join("\n")
                    );
                }
            }
        }
    }

    /// Writes a line to the program's stdin.
    pub fn send_line(&mut self, line: &str) {
        let stdin = self.child.stdin.as_mut().expect("stdin piped");
        writeln!(stdin, "{line}").expect("write to the program");
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits for the program to end, killing it (and failing the test) after `timeout`: the
    /// driver must never hang a program.
    pub fn finish(mut self, timeout: Duration) -> Finished {
        let deadline = Instant::now() + timeout;
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                other => {
                    self.kill();
                    self.lines.extend(self.stdout.try_iter());
                    panic!(
                        "the program did not finish in {timeout:?} ({other:?}); it said:\n{}",
                        self.lines.join("\n")
                    );
                }
            }
        };
        // The reader ends at end of file, which follows the exit.
        self.lines.extend(self.stdout.iter());
        let stderr = self
            .stderr
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default();
        Finished {
            status,
            stdout: self.lines.join("\n") + "\n",
            stderr,
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.stderr.is_some() {
            self.kill();
        }
    }
}

/// Runs `cmd` to completion within `timeout`.
pub fn run(cmd: Command, timeout: Duration) -> Finished {
    Running::spawn(cmd).finish(timeout)
}

/// Asserts that the program passed every check, and ran each of `sections`.
pub fn assert_passed(out: &Finished, sections: &[&str], broker_log: &str) {
    let missing: Vec<&&str> = sections
        .iter()
        .filter(|s| !out.stdout.contains(&format!("section {s}: ok")))
        .collect();
    assert!(
        out.status.success()
            && out.stdout.contains("cuda standin: all checks passed")
            && missing.is_empty(),
        "the stand-in CUDA program failed ({}; sections not passed: {missing:?}):\n--- stdout\n{}--- stderr\n{}--- broker log\n{broker_log}",
        out.status,
        out.stdout,
        out.stderr
    );
}

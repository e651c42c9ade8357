//! What the benchmarks run beside: worker processes that print JSON, a private `gpushared`,
//! the NVIDIA MPS daemon, and a line that names the machine.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::Value;

/// Runs a worker process to its end and returns the JSON it printed last.
pub fn run_for_json(cmd: &mut Command, what: &str) -> Result<Value> {
    let out = cmd
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("cannot start the {what}"))?;
    if !out.status.success() {
        bail!("{what} exited with {}", out.status);
    }
    last_json_line(&String::from_utf8_lossy(&out.stdout), what)
}

/// The JSON a worker prints as its last line of output.
pub fn last_json_line(text: &str, what: &str) -> Result<Value> {
    let line = text.lines().last().unwrap_or_default();
    serde_json::from_str(line).with_context(|| format!("{what} printed no JSON: {text}"))
}

/// Runs `f` with a fresh `gpushared --backend cuda` on a private socket.
pub fn with_broker<T>(
    bin: &Path,
    extra: &[String],
    f: impl FnOnce(&Path) -> Result<T>,
) -> Result<T> {
    let dir = tempfile::tempdir()?;
    let socket = dir.path().join("gpushare.sock");
    let mut child: Child = Command::new(bin)
        .args([
            "--backend",
            "cuda",
            "--socket-mode",
            "600",
            "--log",
            "warn",
            "--max-arena-size",
            "1 GiB",
            "--socket",
        ])
        .arg(&socket)
        .args(extra)
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("cannot start {}", bin.display()))?;
    let ready = Instant::now();
    while !socket.exists() {
        if ready.elapsed() > Duration::from_secs(30) || child.try_wait()?.is_some() {
            let _ = child.kill();
            bail!("gpushared did not start");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let result = f(&socket);
    // SAFETY-free: plain signal to our own child.
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = child.wait();
    result
}

/// Runs `f` with the NVIDIA MPS control daemon up (private pipe and log folders), and always
/// stops it afterwards.
pub fn with_mps<T>(f: impl FnOnce(&[(&str, &std::ffi::OsStr)]) -> Result<T>) -> Result<T> {
    let dir = tempfile::tempdir()?;
    let pipe = dir.path().join("pipe");
    let log = dir.path().join("log");
    std::fs::create_dir_all(&pipe)?;
    std::fs::create_dir_all(&log)?;
    let envs: [(&str, &std::ffi::OsStr); 2] = [
        ("CUDA_MPS_PIPE_DIRECTORY", pipe.as_os_str()),
        ("CUDA_MPS_LOG_DIRECTORY", log.as_os_str()),
    ];
    let status = Command::new("nvidia-cuda-mps-control")
        .arg("-d")
        .envs(envs.iter().map(|(k, v)| (*k, *v)))
        .status()
        .context("cannot run nvidia-cuda-mps-control (is MPS installed?)")?;
    if !status.success() {
        bail!("nvidia-cuda-mps-control -d failed: {status}");
    }
    std::thread::sleep(Duration::from_millis(300));
    let result = f(&envs);
    let quit = Command::new("nvidia-cuda-mps-control")
        .envs(envs.iter().map(|(k, v)| (*k, *v)))
        .stdin(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            if let Some(mut stdin) = c.stdin.take() {
                let _ = stdin.write_all(b"quit\n");
            }
            c.wait()
        });
    if let Err(e) = quit {
        eprintln!("warning: could not stop the MPS daemon: {e}");
    }
    std::thread::sleep(Duration::from_millis(500));
    result
}

pub fn machine_description() -> String {
    let gpu = Command::new("nvidia-smi")
        .args([
            "--query-gpu=name,driver_version,memory.total",
            "--format=csv,noheader",
        ])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown GPU".into());
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!("{gpu}; {cpus} CPUs; Linux {}", kernel.trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_answers_with_its_last_line_of_json() {
        let out = "starting\n{\"a\": 1}\n{\"b\": 2}\n";
        let v = last_json_line(out, "worker").expect("the last line is JSON");
        assert_eq!(v, serde_json::json!({"b": 2}));
        let err = last_json_line("{\"a\": 1}\nbye\n", "trace worker")
            .expect_err("the last line is not JSON");
        assert!(
            format!("{err:#}").contains("trace worker printed no JSON"),
            "{err:#}"
        );
        assert!(last_json_line("", "worker").is_err());
    }

    #[test]
    fn a_worker_that_fails_is_an_error_naming_it() {
        let err = run_for_json(Command::new("false").stdout(Stdio::null()), "probe worker")
            .expect_err("`false` exits with 1");
        assert!(
            format!("{err:#}").contains("probe worker exited with"),
            "{err:#}"
        );
        let v = run_for_json(Command::new("echo").arg("[1, 2]"), "echo").expect("echo prints JSON");
        assert_eq!(v, serde_json::json!([1, 2]));
    }
}

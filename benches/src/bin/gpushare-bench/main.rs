//! `gpushare-bench`: GPU scenarios run three ways side by side in one run — direct CUDA in a
//! fresh process, through a real `gpushared`, and direct CUDA under NVIDIA MPS — printed as
//! markdown tables with ratios and written as JSON.
//!
//! Every (scenario, mode) runs in its own worker process (this binary, `worker` subcommand),
//! so no mode inherits another's CUDA context, and MPS clients start after the MPS daemon.

mod brokered;
mod direct;
mod report;
mod workload;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand, ValueEnum};
use serde_json::{Value, json};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Scenario {
    /// Empty kernel: asynchronous launch rate and launch-to-complete latency.
    Launch,
    /// Host↔device bandwidth, 4 KiB to 256 MiB, pinned/arena and pageable/staged.
    Copy,
    /// DNN-like iterations (MLP, transformer block) of GEMMs and element-wise kernels.
    Iteration,
    /// Cost of single driver calls on the broker's hot paths (direct mode only).
    Probe,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// Direct CUDA (cudarc) in the worker process.
    Direct,
    /// Through gpushared with the gpushare client library.
    Broker,
    /// Direct CUDA with the NVIDIA MPS daemon running.
    Mps,
}

/// GPU scenario benchmarks: direct CUDA vs gpushare vs MPS, side by side.
#[derive(Debug, Parser)]
#[command(name = "gpushare-bench", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Option<Cmd>,
    /// Scenarios to run.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Scenario::Launch, Scenario::Copy, Scenario::Iteration])]
    scenarios: Vec<Scenario>,
    /// Modes to compare.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Mode::Direct, Mode::Broker, Mode::Mps])]
    modes: Vec<Mode>,
    /// Where to write the JSON results.
    #[arg(long, default_value = "gpushare-bench.json")]
    json: PathBuf,
    /// Fewer repetitions (a smoke run).
    #[arg(long)]
    quick: bool,
    /// Rounds per scenario; modes take turns within each round and every figure reported is
    /// the median over rounds (GPU timings vary from run to run).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// The broker binary (default: `gpushared` next to this one).
    #[arg(long)]
    broker: Option<PathBuf>,
    /// An extra argument for gpushared (repeatable), e.g. `--broker-arg=--no-telemetry`.
    #[arg(long = "broker-arg", allow_hyphen_values = true)]
    broker_args: Vec<String>,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Runs one scenario in one mode and prints its JSON (used by the orchestrator).
    #[command(hide = true)]
    Worker {
        #[arg(long, value_enum)]
        scenario: Scenario,
        #[arg(long, value_enum)]
        mode: Mode,
        #[arg(long)]
        quick: bool,
    },
}

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpushare-bench: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
    let cli = Cli::parse();
    if let Some(Cmd::Worker {
        scenario,
        mode,
        quick,
    }) = cli.command
    {
        let result = match (scenario, mode) {
            (Scenario::Launch, Mode::Broker) => brokered::launch(quick),
            (Scenario::Copy, Mode::Broker) => brokered::copy(quick),
            (Scenario::Iteration, Mode::Broker) => brokered::iteration(quick),
            (Scenario::Launch, _) => direct::launch(quick),
            (Scenario::Copy, _) => direct::copy(quick),
            (Scenario::Iteration, _) => direct::iteration(quick),
            (Scenario::Probe, _) => direct::probe(),
        }?;
        println!("{result}");
        return Ok(());
    }
    orchestrate(&cli)
}

fn orchestrate(cli: &Cli) -> Result<()> {
    let me = std::env::current_exe().context("cannot find this executable")?;
    let broker_bin = cli
        .broker
        .clone()
        .unwrap_or_else(|| me.with_file_name("gpushared"));
    let machine = machine_description();
    eprintln!("gpushare-bench on {machine}");
    let mut results = serde_json::Map::new();
    for &scenario in &cli.scenarios {
        let mut runs: Vec<(Mode, Vec<Value>)> =
            cli.modes.iter().map(|&m| (m, Vec::new())).collect();
        let mut errors = serde_json::Map::new();
        let modes = if scenario == Scenario::Probe {
            vec![Mode::Direct]
        } else {
            cli.modes.clone()
        };
        for round in 1..=cli.rounds.max(1) {
            for &mode in &modes {
                let started = Instant::now();
                eprintln!("[{} round {round}] {} …", name(scenario), mode_name(mode));
                let outcome = match mode {
                    Mode::Direct => worker(&me, scenario, Mode::Direct, cli.quick, &[]),
                    Mode::Broker => with_broker(&broker_bin, &cli.broker_args, |socket| {
                        worker(
                            &me,
                            scenario,
                            Mode::Broker,
                            cli.quick,
                            &[("GPUSHARE_SOCKET", socket.as_os_str())],
                        )
                    }),
                    Mode::Mps => with_mps(|envs| worker(&me, scenario, Mode::Mps, cli.quick, envs)),
                };
                match outcome {
                    Ok(v) => {
                        eprintln!(
                            "[{} round {round}] {} done in {:.1?}",
                            name(scenario),
                            mode_name(mode),
                            started.elapsed()
                        );
                        if let Some((_, vs)) = runs.iter_mut().find(|(m, _)| *m == mode) {
                            vs.push(v);
                        }
                    }
                    Err(e) => {
                        eprintln!(
                            "[{} round {round}] {} FAILED: {e:#}",
                            name(scenario),
                            mode_name(mode)
                        );
                        errors.insert(mode_name(mode).into(), json!(format!("{e:#}")));
                    }
                }
            }
        }
        let mut by_mode = serde_json::Map::new();
        for (mode, values) in runs {
            if !values.is_empty() {
                by_mode.insert(mode_name(mode).into(), report::median_of(&values));
            } else if let Some(e) = errors.remove(mode_name(mode)) {
                by_mode.insert(mode_name(mode).into(), json!({"error": e}));
            }
        }
        results.insert(name(scenario).into(), Value::Object(by_mode));
    }
    let doc =
        json!({"machine": machine, "quick": cli.quick, "rounds": cli.rounds, "results": results});
    std::fs::write(&cli.json, serde_json::to_string_pretty(&doc)?)
        .with_context(|| format!("cannot write {}", cli.json.display()))?;
    println!("{}", report::markdown(&doc));
    eprintln!("JSON written to {}", cli.json.display());
    Ok(())
}

pub fn name(s: Scenario) -> &'static str {
    match s {
        Scenario::Launch => "launch",
        Scenario::Copy => "copy",
        Scenario::Iteration => "iteration",
        Scenario::Probe => "probe",
    }
}

pub fn mode_name(m: Mode) -> &'static str {
    match m {
        Mode::Direct => "direct",
        Mode::Broker => "gpushare",
        Mode::Mps => "mps",
    }
}

fn worker(
    me: &Path,
    scenario: Scenario,
    mode: Mode,
    quick: bool,
    envs: &[(&str, &std::ffi::OsStr)],
) -> Result<Value> {
    let mode_arg = match mode {
        Mode::Direct => "direct",
        Mode::Broker => "broker",
        Mode::Mps => "mps",
    };
    let mut cmd = Command::new(me);
    cmd.args(["worker", "--scenario", name(scenario), "--mode", mode_arg]);
    if quick {
        cmd.arg("--quick");
    }
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let out = cmd
        .stderr(Stdio::inherit())
        .output()
        .context("cannot start worker")?;
    if !out.status.success() {
        bail!("worker exited with {}", out.status);
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().last().unwrap_or_default();
    serde_json::from_str(line).with_context(|| format!("worker printed no JSON: {text}"))
}

/// Runs `f` with a fresh `gpushared --backend cuda` on a private socket.
fn with_broker<T>(bin: &Path, extra: &[String], f: impl FnOnce(&Path) -> Result<T>) -> Result<T> {
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
fn with_mps<T>(f: impl FnOnce(&[(&str, &std::ffi::OsStr)]) -> Result<T>) -> Result<T> {
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

fn machine_description() -> String {
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

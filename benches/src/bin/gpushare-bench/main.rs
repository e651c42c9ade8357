//! `gpushare-bench`: GPU scenarios run three ways side by side in one run — direct CUDA in a
//! fresh process, through a real `gpushared`, and direct CUDA under NVIDIA MPS — printed as
//! markdown tables with ratios and written as JSON.
//!
//! Every (scenario, mode) runs in its own worker process (this binary, `worker` subcommand),
//! so no mode inherits another's CUDA context, and MPS clients start after the MPS daemon.

mod brokered;
mod colocate;
mod direct;
mod report;
mod trace;
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
    /// A high-priority inference client (Poisson arrivals) beside 1 and 4 best-effort
    /// clients, each its own process: dedicated vs time-slicing (the `direct` mode) vs MPS
    /// vs gpushare (priority policy).
    Colocate,
    /// Salus-style trace: jobs arriving online, each its own client, under gpushared's FIFO,
    /// SRTF, PACK and exclusive job-FIFO policies; mean job completion time.
    Trace,
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
    /// colocate: seconds each setup runs (3 with --quick).
    #[arg(long, default_value_t = 10.0)]
    colocate_seconds: f64,
    /// colocate: mean gap between the high-priority client's request arrivals (ms).
    #[arg(long, default_value_t = 2.0)]
    hp_gap_ms: f64,
    /// colocate: the high-priority client's workload (one request is one iteration).
    #[arg(long, default_value = colocate::HIGH_WORKLOAD)]
    hp_workload: String,
    /// colocate: best-effort workloads, taken in turn for the best-effort clients.
    #[arg(long, value_delimiter = ',', default_values_t = ["mlp_train".to_string(), "transformer".to_string()])]
    be_workloads: Vec<String>,
    /// colocate: how many best-effort clients beside the high-priority one.
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 4])]
    be_counts: Vec<usize>,
    /// colocate: how long the high-priority gpushare client spins for a completion before
    /// sleeping, in µs (the client library's default otherwise).
    #[arg(long)]
    hp_spin_us: Option<u64>,
    /// trace: how many jobs.
    #[arg(long, default_value_t = 24)]
    trace_jobs: usize,
    /// trace: how long each job's client spins for a completion before sleeping, in µs (the
    /// client library's default otherwise).
    #[arg(long)]
    trace_spin_us: Option<u64>,
    /// trace: the scheduling policies to compare.
    #[arg(long, value_delimiter = ',', default_values_t = ["fifo".to_string(), "srtf".to_string(), "pack".to_string(), "job-fifo".to_string()])]
    trace_policies: Vec<String>,
    /// colocate: the scheduling policy gpushared runs.
    #[arg(long, default_value = "priority")]
    colocate_scheduler: String,
    /// colocate: the shares of the SMs best-effort clients run on beside the high-priority
    /// client (`[priority] lower_sm_share`), one gpushare setup each; 1 is no partition.
    #[arg(long, value_delimiter = ',', default_values_t = [1.0f64])]
    sm_shares: Vec<f64>,
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
    /// Runs every job of the trace against `$GPUSHARE_SOCKET` (used by the orchestrator).
    #[command(hide = true)]
    TraceWorker {
        #[arg(long)]
        seed: u64,
        #[arg(long)]
        jobs: usize,
        #[arg(long)]
        spin_us: Option<u64>,
    },
    /// Runs one process of a colocate setup (used by the orchestrator).
    #[command(hide = true)]
    ColocateWorker {
        #[arg(long)]
        via: String,
        #[arg(long, value_enum)]
        role: colocate::Role,
        #[arg(long)]
        workload: String,
        #[arg(long)]
        seconds: f64,
        #[arg(long)]
        mean_gap_ms: f64,
        #[arg(long)]
        seed: u64,
        #[arg(long)]
        spin_us: Option<u64>,
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
    if let Some(Cmd::TraceWorker {
        seed,
        jobs,
        spin_us,
    }) = &cli.command
    {
        let spin = spin_us.map(Duration::from_micros);
        println!("{}", trace::worker(*seed, *jobs, spin)?);
        return Ok(());
    }
    if let Some(Cmd::ColocateWorker {
        via,
        role,
        workload,
        seconds,
        mean_gap_ms,
        seed,
        spin_us,
    }) = &cli.command
    {
        let via = match via.as_str() {
            "direct" => colocate::Via::Direct,
            "broker" => colocate::Via::Broker,
            other => bail!("unknown --via {other}"),
        };
        let spec = colocate::WorkerSpec {
            role: *role,
            workload: workload.clone(),
            seconds: *seconds,
            mean_gap_ms: *mean_gap_ms,
            seed: *seed,
            spin_us: *spin_us,
        };
        println!("{}", colocate::worker(via, &spec)?);
        return Ok(());
    }
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
            (Scenario::Colocate | Scenario::Trace, _) => {
                bail!("colocate and trace run through their own workers")
            }
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
        if scenario == Scenario::Trace {
            results.insert(name(scenario).into(), trace_rounds(cli, &me, &broker_bin)?);
            continue;
        }
        if scenario == Scenario::Colocate {
            results.insert(
                name(scenario).into(),
                colocate_rounds(cli, &me, &broker_bin)?,
            );
            continue;
        }
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
                let step = format!("{} round {round}", name(scenario));
                let outcome = timed(&step, mode_name(mode), || match mode {
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
                });
                match outcome {
                    Ok(v) => {
                        if let Some((_, vs)) = runs.iter_mut().find(|(m, _)| *m == mode) {
                            vs.push(v);
                        }
                    }
                    Err(e) => {
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
        Scenario::Colocate => "colocate",
        Scenario::Trace => "trace",
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
    run_for_json(&mut cmd, "worker")
}

/// Runs a worker process to its end and returns the JSON it printed last.
fn run_for_json(cmd: &mut Command, what: &str) -> Result<Value> {
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

/// Runs one step of a benchmark, saying on stderr when it starts and how it ended:
/// `[round] what …`.
fn timed(round: &str, what: &str, f: impl FnOnce() -> Result<Value>) -> Result<Value> {
    let started = Instant::now();
    eprintln!("[{round}] {what} …");
    let outcome = f();
    match &outcome {
        Ok(_) => eprintln!("[{round}] {what} done in {:.1?}", started.elapsed()),
        Err(e) => eprintln!("[{round}] {what} FAILED: {e:#}"),
    }
    outcome
}

/// Writes a policy file into `dir` and returns gpushared's arguments with it.
fn broker_args_with_policy(cli: &Cli, dir: &Path, name: &str, policy: &str) -> Result<Vec<String>> {
    let file = dir.join(format!("{name}.toml"));
    std::fs::write(&file, policy)?;
    let mut args = cli.broker_args.clone();
    args.push("--config".into());
    args.push(file.display().to_string());
    Ok(args)
}

/// A step's result, or its error as the JSON the report shows.
fn or_error(outcome: Result<Value>) -> Value {
    outcome.unwrap_or_else(|e| json!({"error": format!("{e:#}")}))
}

/// The colocate scenario, every setup in every round; setups take turns within a round and
/// the high-priority client sees the same arrivals in each setup of a round.
fn colocate_rounds(cli: &Cli, me: &Path, broker_bin: &Path) -> Result<Value> {
    use colocate::{Member, Role, Via, WorkerSpec};
    let seconds = if cli.quick { 3.0 } else { cli.colocate_seconds };
    if cli.be_workloads.is_empty() {
        bail!("--be-workloads names no workload");
    }
    let known: Vec<&str> = workload::iterations()
        .iter()
        .chain(&workload::probes())
        .map(|i| i.name)
        .collect();
    if let Some(bad) = std::iter::once(&cli.hp_workload)
        .chain(&cli.be_workloads)
        .find(|w| !known.contains(&w.as_str()))
    {
        bail!("unknown workload `{bad}` (known: {})", known.join(", "));
    }
    if let Some(bad) = cli.sm_shares.iter().find(|s| !(**s > 0.0 && **s <= 1.0)) {
        bail!("--sm-shares: {bad} is not a share of the SMs (above 0, at most 1)");
    }
    let policy_dir = tempfile::tempdir()?;
    // Every worker runs as this user: the policy grants it `high`, and the best-effort
    // workers ask for less. One policy per SM share.
    let broker_args = |share: f64| {
        let partition = if share < 1.0 {
            format!("[priority]\nlower_sm_share = {share}\n")
        } else {
            String::new()
        };
        broker_args_with_policy(
            cli,
            policy_dir.path(),
            &format!("colocate-{}", (share * 1000.0).round() as u64),
            &format!(
                "scheduler = \"{}\"\n{partition}[defaults]\nclass = \"high\"\n",
                cli.colocate_scheduler
            ),
        )
    };
    let whole_gpu_args = broker_args(1.0)?;
    let mut rounds = Vec::new();
    for round in 1..=cli.rounds.max(1) {
        let seed = round as u64;
        let high = |via| Member {
            label: "high".into(),
            via,
            spec: WorkerSpec {
                role: Role::High,
                workload: cli.hp_workload.clone(),
                seconds,
                mean_gap_ms: cli.hp_gap_ms,
                seed,
                spin_us: cli.hp_spin_us,
            },
        };
        let best_effort = |i: usize, via| Member {
            label: format!("be{i}"),
            via,
            spec: WorkerSpec {
                role: Role::BestEffort,
                workload: cli.be_workloads[i % cli.be_workloads.len()].clone(),
                seconds,
                mean_gap_ms: cli.hp_gap_ms,
                seed,
                spin_us: None,
            },
        };
        let mut r = serde_json::Map::new();
        let mut run = |key: String, f: &mut dyn FnMut() -> Result<Value>| {
            let v = or_error(timed(&format!("colocate round {round}"), &key, f));
            r.insert(key, v);
        };
        run("dedicated".into(), &mut || {
            colocate::run_group(me, &[high(Via::Direct)], &[])
        });
        let mut workloads = cli.be_workloads.clone();
        workloads.dedup();
        for (i, w) in workloads.iter().enumerate() {
            let idx = cli.be_workloads.iter().position(|x| x == w).unwrap_or(i);
            run(format!("standalone {w}"), &mut || {
                let alone = Member {
                    label: "be".into(),
                    ..best_effort(idx, Via::Direct)
                };
                colocate::run_group(me, &[alone], &[])
            });
        }
        if cli.modes.contains(&Mode::Broker) {
            run("gpushare alone".into(), &mut || {
                with_broker(broker_bin, &whole_gpu_args, |socket| {
                    let envs = [("GPUSHARE_SOCKET", socket.as_os_str())];
                    colocate::run_group(me, &[high(Via::Broker)], &envs)
                })
            });
        }
        for &n in &cli.be_counts {
            for &mode in &cli.modes {
                let via = if mode == Mode::Broker {
                    Via::Broker
                } else {
                    Via::Direct
                };
                let members: Vec<Member> = std::iter::once(high(via))
                    .chain((0..n).map(|i| best_effort(i, via)))
                    .collect();
                let shares: &[f64] = if mode == Mode::Broker {
                    &cli.sm_shares
                } else {
                    &[1.0]
                };
                for &share in shares {
                    let key = format!("{n} best-effort, {}", colocate_setup_label(mode, share));
                    run(key, &mut || match mode {
                        Mode::Direct => colocate::run_group(me, &members, &[]),
                        Mode::Mps => with_mps(|envs| colocate::run_group(me, &members, envs)),
                        Mode::Broker => with_broker(broker_bin, &broker_args(share)?, |socket| {
                            let envs = [("GPUSHARE_SOCKET", socket.as_os_str())];
                            colocate::run_group(me, &members, &envs)
                        }),
                    });
                }
            }
        }
        rounds.push(Value::Object(r));
    }
    Ok(json!({
        "seconds": seconds,
        "hp_gap_ms": cli.hp_gap_ms,
        "high_workload": cli.hp_workload,
        "be_workloads": cli.be_workloads,
        "be_counts": cli.be_counts,
        "scheduler": cli.colocate_scheduler,
        "sm_shares": cli.sm_shares,
        "median": report::median_of(&rounds),
        "rounds": rounds,
    }))
}

/// The trace scenario: the same jobs under each policy, the policies taking turns per round.
fn trace_rounds(cli: &Cli, me: &Path, broker_bin: &Path) -> Result<Value> {
    let policy_dir = tempfile::tempdir()?;
    let mut rounds = Vec::new();
    for round in 1..=cli.rounds.max(1) {
        let mut r = serde_json::Map::new();
        for policy in &cli.trace_policies {
            let args = broker_args_with_policy(
                cli,
                policy_dir.path(),
                policy,
                &format!("scheduler = \"{policy}\"\n"),
            )?;
            let outcome = timed(&format!("trace round {round}"), policy, || {
                with_broker(broker_bin, &args, |socket| {
                    let mut worker = Command::new(me);
                    worker
                        .args(["trace-worker", "--seed", "7", "--jobs"])
                        .arg(cli.trace_jobs.to_string());
                    if let Some(us) = cli.trace_spin_us {
                        worker.arg(format!("--spin-us={us}"));
                    }
                    run_for_json(worker.env("GPUSHARE_SOCKET", socket), "trace worker")
                })
            });
            r.insert(policy.clone(), or_error(outcome));
        }
        rounds.push(Value::Object(r));
    }
    Ok(json!({
        "jobs": cli.trace_jobs,
        "policies": cli.trace_policies,
        "median": report::median_of(&rounds),
        "rounds": rounds,
    }))
}

/// A colocate setup's name in the report: the mode, and a gpushare setup's SM partition.
pub fn colocate_setup_label(m: Mode, sm_share: f64) -> String {
    let name = colocate_setup_name(m);
    if m == Mode::Broker && sm_share < 1.0 {
        format!("{name}, BE on {:.0}% of SMs", sm_share * 100.0)
    } else {
        name.to_string()
    }
}

pub fn colocate_setup_name(m: Mode) -> &'static str {
    match m {
        Mode::Direct => "time-slicing",
        Mode::Broker => "gpushare",
        Mode::Mps => "mps",
    }
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

//! `gpushare-bench`: GPU scenarios run three ways side by side in one run — direct CUDA in a
//! fresh process, through a real `gpushared`, and direct CUDA under NVIDIA MPS — printed as
//! markdown tables with ratios and written as JSON.
//!
//! Every (scenario, mode) runs in its own worker process (this binary, `worker` subcommand),
//! so no mode inherits another's CUDA context, and MPS clients start after the MPS daemon.
//!
//! Where each part lives: this file (the command line and the worker entry points),
//! `orchestrate.rs` (rounds of scenarios and setups, taking turns), `harness.rs` (worker
//! processes, a private gpushared, the MPS daemon), `direct.rs`, `brokered.rs`, `colocate.rs`
//! and `trace.rs` (the scenarios' workers), `workload.rs` (the GPU work), `report.rs` and
//! `table.rs` (the markdown report).

mod brokered;
mod colocate;
mod direct;
mod harness;
mod orchestrate;
mod report;
mod table;
mod trace;
mod workload;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Result, bail};
use clap::{Parser, Subcommand, ValueEnum};

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
    /// colocate: how many kernels each best-effort client may have on the GPU beside a busy
    /// high-priority client (`[priority] lower_depth`; the policy's default otherwise).
    #[arg(long)]
    lower_depth: Option<u32>,
    /// colocate: whether best-effort kernels wait at the priority gate while high-priority
    /// kernels are in flight (`[priority] gate`; the policy's default otherwise).
    #[arg(long)]
    gate: Option<bool>,
    /// colocate: every this many iterations, each best-effort client does `--be-churn` once
    /// (0: never).
    #[arg(long, default_value_t = 0)]
    be_churn_every: u64,
    /// colocate: what a best-effort client does every `--be-churn-every` iterations.
    #[arg(long, value_enum, default_value_t = colocate::Churn::Alloc)]
    be_churn: colocate::Churn,
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
        #[arg(long, default_value_t = 0)]
        churn_every: u64,
        #[arg(long, value_enum, default_value_t = colocate::Churn::Alloc)]
        churn: colocate::Churn,
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
        churn_every,
        churn,
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
            churn_every: *churn_every,
            churn: *churn,
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
    orchestrate::orchestrate(&cli)
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

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn the_command_line_is_consistent_and_defaults_to_three_scenarios_three_ways() {
        Cli::command().debug_assert();
        let cli = Cli::parse_from(["gpushare-bench"]);
        assert_eq!(
            cli.scenarios,
            [Scenario::Launch, Scenario::Copy, Scenario::Iteration]
        );
        assert_eq!(cli.modes, [Mode::Direct, Mode::Broker, Mode::Mps]);
        assert!(cli.command.is_none());
    }

    #[test]
    fn a_colocate_setup_names_its_partition_only_when_there_is_one() {
        assert_eq!(colocate_setup_label(Mode::Direct, 0.5), "time-slicing");
        assert_eq!(colocate_setup_label(Mode::Broker, 1.0), "gpushare");
        assert_eq!(
            colocate_setup_label(Mode::Broker, 0.25),
            "gpushare, BE on 25% of SMs"
        );
        assert_eq!(mode_name(Mode::Broker), "gpushare");
        assert_eq!(name(Scenario::Colocate), "colocate");
    }
}

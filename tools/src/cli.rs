//! The `gpushare` command line as clap defines it: the binary parses it, and `gpushare-gen`
//! writes the man pages and completions from it.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgGroup, Args, Parser, Subcommand};
use gpushare::PriorityClass;

/// See and manage the gpushare GPU-sharing broker.
#[derive(Debug, Parser)]
#[command(name = "gpushare", version)]
pub struct Cli {
    /// Broker socket.
    #[arg(long, global = true, env = "GPUSHARE_SOCKET", default_value = gpushare_protocol::DEFAULT_SOCKET_PATH)]
    pub socket: PathBuf,
    #[command(subcommand)]
    pub command: Commands,
}

#[derive(Debug, Subcommand)]
pub enum Commands {
    /// Broker version, backend, devices and the connected clients with their usage.
    Status {
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// The connected clients only, one line each.
    Clients {
        /// Print the clients as a JSON array.
        #[arg(long)]
        json: bool,
    },
    /// Live view of who uses the GPU, like top (press ? inside for help).
    Top(TopArgs),
    /// Change a live client's class, weight or memory quota (root or the admin group only).
    #[command(group(ArgGroup::new("change").required(true).multiple(true).args(["class", "weight", "memory_quota"])))]
    Set {
        /// The client's id (the ID column of `gpushare clients`).
        client: u64,
        /// New priority class: high, normal or best-effort.
        #[arg(long, value_parser = parse_class)]
        class: Option<PriorityClass>,
        /// New fair-share weight (1 or more).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        weight: Option<u32>,
        /// New device-memory quota: a size such as 4GiB or 512MB, or `unlimited`.
        #[arg(long, value_name = "SIZE", value_parser = parse_quota)]
        memory_quota: Option<Quota>,
    },
    /// Drop a client: its work stops and everything it held is freed (root or the admin group
    /// only).
    Evict {
        /// The client's id (the ID column of `gpushare clients`).
        client: u64,
        /// Why, as the evicted client will be told.
        #[arg(long, value_name = "TEXT")]
        reason: Option<String>,
    },
    /// Run an unmodified CUDA program under the broker (consolidated unless --mode governed).
    ///
    /// Consolidated (the default): gpushare's CUDA driver stands in for libcuda in the program
    /// and in every process it starts, and all their GPU work runs in gpushared's context,
    /// scheduled kernel by kernel beside other clients' work, within your memory quota. What
    /// that driver does not support fails with CUDA's error and one line on stderr naming the
    /// call: managed memory, peer access, CUDA arrays, external memory and
    /// semaphores, graphics interop, event and conditional graph nodes. Without a broker
    /// the program's cuInit fails, saying why, unless --fallback direct.
    ///
    /// Governed (--mode governed): the program keeps its own CUDA context and driver; the
    /// broker admits its memory (past the quota it gets CUDA's out-of-memory error) and its
    /// launches follow the broker's scheduling. Without a broker its cuInit fails, unless
    /// --fallback direct; if it loses the broker, its launches and allocations wait for it to
    /// come back (GPUSHARE_RECONNECT_TIMEOUT seconds, 30 by default), then fail.
    Run(RunArgs),
    /// Slurm's Prolog, Epilog and TaskProlog: jobs' GPU shards as gpushared grants (slurmd runs them).
    ///
    /// slurm.conf names the wrappers in /usr/share/gpushare/slurm/: `prolog` (root, at job
    /// start) grants the job what `scontrol show job` says it holds of this node's GPUs;
    /// `epilog` (root, at job end) ends the grant, evicting sessions still open;
    /// `task-prolog` (the job's user, before each task) prints the environment that runs the
    /// task's CUDA programs on gpushare, as `gpushare run` would.
    Slurm {
        #[command(subcommand)]
        command: SlurmCommand,
    },
    /// Print a shell completion script: `gpushare completions bash > /etc/bash_completion.d/gpushare`.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

#[derive(Debug, Args)]
pub struct TopArgs {
    /// Batch mode: print plain-text frames instead of the interactive screen.
    #[arg(short, long)]
    pub batch: bool,
    /// Batch mode: stop after this many frames (default: run until interrupted).
    #[arg(short = 'n', long = "iterations", value_name = "N")]
    pub iterations: Option<u64>,
    /// Seconds between refreshes.
    #[arg(short = 'd', long = "delay", value_name = "SECONDS", default_value = "1.0", value_parser = parse_interval)]
    pub delay: Duration,
    /// Print one JSON object per frame, one per line (implies --batch).
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Ask for a class (high, normal or best-effort) no more important than the policy
    /// grants; if the policy grants less, the program warns once and runs as granted.
    #[arg(long, value_parser = parse_class)]
    pub class: Option<PriorityClass>,
    /// Ask for a smaller fair-share weight than the policy grants (1 or more); a larger one is
    /// refused with a warning.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub weight: Option<u32>,
    /// The GPU to run on, by gpushared's index (default: `GPUSHARE_GPU`, else the GPU the
    /// program's `CUDA_VISIBLE_DEVICES` names, by index or UUID (naming several: a job of
    /// them, as `--gpus`), else the least loaded GPU by measured load). The program sees it
    /// as device 0, in CUDA and in NVML alike.
    #[arg(long, value_name = "N")]
    pub gpu: Option<u32>,
    /// Give a job of one process per GPU N GPUs (the least loaded, in gpushared's order):
    /// each process sees them as devices 0..N-1, in CUDA and in NVML, and runs its work on
    /// its local rank's (`LOCAL_RANK`, as torchrun sets it; `SLURM_LOCALID`;
    /// `OMPI_COMM_WORLD_LOCAL_RANK`), the first without one.
    #[arg(long, value_name = "N", conflicts_with = "gpu", value_parser = clap::value_parser!(u32).range(1..))]
    pub gpus: Option<u32>,
    /// Say on stderr which GPU the program runs on, and why there.
    #[arg(long, short)]
    pub verbose: bool,
    /// The name shown in `gpushare status` and `top` (default: the program's name).
    #[arg(long)]
    pub name: Option<String>,
    /// How the program runs: consolidated (its GPU work in gpushared's context) or governed
    /// (its own CUDA context, with the broker's admission for memory and launches).
    #[arg(long, value_enum, default_value_t = RunMode::Consolidated)]
    pub mode: RunMode,
    /// When gpushared cannot be reached as the program starts: `fail` (the program's cuInit
    /// fails, saying why) or `direct` (it runs on the GPU's own driver, outside gpushare,
    /// after one line on stderr). In governed mode `direct` also lets a program that loses
    /// the broker run on unmanaged. [default: fail]
    #[arg(long, value_enum)]
    pub fallback: Option<Fallback>,
    /// Governed mode: the interposer library to preload (default: next to this binary, then
    /// the install's library directory).
    #[arg(long, value_name = "PATH", env = gpushare_conn::env::INTERPOSER_ENV)]
    pub interposer: Option<PathBuf>,
    /// The program to run and its arguments (after `--`).
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "COMMAND"
    )]
    pub command: Vec<OsString>,
}

/// The programs slurmd runs for each job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Subcommand)]
pub enum SlurmCommand {
    /// Slurm's Prolog (root, at job start): ask gpushared for the job's grant on this node.
    ///
    /// Reads SLURM_JOB_ID, SLURM_JOB_UID, SLURM_JOB_USER, SLURMD_NODENAME and
    /// SLURM_JOB_PARTITION, and the job's GRES on this node and QOS from `scontrol show job`
    /// (GPUSHARE_SCONTROL, else PATH, /usr/bin, /usr/local/bin, /usr/sbin, /opt/slurm/bin).
    /// A job without GPUs or shards here: nothing. Exit status 1 (Slurm then drains the node)
    /// when the grant cannot be made.
    Prolog,
    /// Slurm's Epilog (root, at job end): end the job's grant; its sessions still open are
    /// evicted.
    ///
    /// Exit status 0 whatever gpushared answers (a node whose gpushared misbehaves is
    /// drained by the next prolog); 1 only without SLURM_JOB_ID.
    Epilog,
    /// Slurm's TaskProlog (the job's user, before each task): print the task's environment.
    ///
    /// For a task Slurm gave a GPU or shards of one, prints `export`/`unset` lines that give it
    /// the environment of `gpushare run` (consolidated), which slurmstepd applies. Prints
    /// nothing when the job's environment has GPUSHARE_SLURM=off.
    TaskProlog,
}

/// How `gpushare run` runs a program.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RunMode {
    /// gpushare's CUDA driver stands in for libcuda: the program's GPU work runs in
    /// gpushared's context.
    Consolidated,
    /// The libcuda interposer: the program keeps its own CUDA context; the broker admits its
    /// memory and launches.
    Governed,
}

/// What a consolidated program does when gpushared cannot be reached as it starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Fallback {
    /// Its cuInit fails, with a message that says why.
    Fail,
    /// It runs on the GPU's own driver, outside gpushare.
    Direct,
}

/// A memory quota on the command line: `None` is unlimited.
#[derive(Debug, Clone, Copy)]
pub struct Quota(pub Option<u64>);

pub fn parse_class(s: &str) -> Result<PriorityClass, String> {
    s.parse()
}

pub fn parse_quota(s: &str) -> Result<Quota, String> {
    let s = s.trim();
    if s.eq_ignore_ascii_case("unlimited") || s.eq_ignore_ascii_case("none") {
        return Ok(Quota(None));
    }
    s.parse::<bytesize::ByteSize>()
        .map(|b| Quota(Some(b.as_u64())))
        .map_err(|e| format!("not a memory size (like 4GiB, 512MB or unlimited): {e}"))
}

pub fn parse_interval(s: &str) -> Result<Duration, String> {
    let secs: f64 = s
        .parse()
        .map_err(|_| format!("`{s}` is not a number of seconds"))?;
    if !(0.05..=3600.0).contains(&secs) {
        return Err("the delay must be between 0.05 and 3600 seconds".into());
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn run_is_consolidated_by_default_and_takes_a_mode_and_a_fallback() {
        let run = |args: &[&str]| match Cli::try_parse_from(args) {
            Ok(Cli {
                command: Commands::Run(r),
                ..
            }) => Ok((r.mode, r.fallback, r.command)),
            Ok(other) => panic!("{other:?}"),
            Err(e) => Err(e.kind()),
        };
        assert_eq!(
            run(&["gpushare", "run", "python", "-c", "1"]),
            Ok((
                RunMode::Consolidated,
                None,
                vec!["python".into(), "-c".into(), "1".into()]
            ))
        );
        assert_eq!(
            run(&[
                "gpushare", "run", "--mode", "governed", "--", "app", "--mode"
            ]),
            Ok((RunMode::Governed, None, vec!["app".into(), "--mode".into()]))
        );
        assert_eq!(
            run(&["gpushare", "run", "--fallback", "direct", "app"]).map(|r| r.1),
            Ok(Some(Fallback::Direct))
        );
        assert_eq!(
            run(&["gpushare", "run", "--mode", "mps", "app"]),
            Err(clap::error::ErrorKind::InvalidValue)
        );
    }

    #[test]
    fn slurm_takes_its_three_programs() {
        let slurm = |args: &[&str]| match Cli::try_parse_from(args) {
            Ok(Cli {
                command: Commands::Slurm { command },
                socket,
            }) => Ok((command, socket)),
            Ok(other) => panic!("{other:?}"),
            Err(e) => Err(e.kind()),
        };
        assert_eq!(
            slurm(&["gpushare", "slurm", "task-prolog", "--socket", "/s"]),
            Ok((SlurmCommand::TaskProlog, PathBuf::from("/s")))
        );
        assert_eq!(
            slurm(&["gpushare", "slurm", "prolog"]).map(|s| s.0),
            Ok(SlurmCommand::Prolog)
        );
        assert_eq!(
            slurm(&["gpushare", "slurm", "epilog"]).map(|s| s.0),
            Ok(SlurmCommand::Epilog)
        );
        assert_eq!(
            slurm(&["gpushare", "slurm", "teardown"]),
            Err(clap::error::ErrorKind::InvalidSubcommand)
        );
    }

    #[test]
    fn quotas_and_intervals_parse() {
        assert_eq!(parse_quota("unlimited").map(|q| q.0), Ok(None));
        assert_eq!(parse_quota("4 GiB").map(|q| q.0), Ok(Some(4 << 30)));
        assert_eq!(parse_quota("512MB").map(|q| q.0), Ok(Some(512_000_000)));
        assert!(parse_quota("lots").is_err());
        assert_eq!(parse_interval("0.2"), Ok(Duration::from_millis(200)));
        assert!(parse_interval("0").is_err());
        assert!(parse_interval("NaN").is_err());
        assert!(parse_interval("-1").is_err());
    }
}

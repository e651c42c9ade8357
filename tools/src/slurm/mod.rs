//! `gpushare slurm prolog|epilog|task-prolog`: the programs slurmd runs for each job on a
//! node whose GPUs gpushared shares out as Slurm's GRES shards.
//!
//! - `prolog` (root, at job start): reads what the job holds on this node from `scontrol show
//!   job`, and asks gpushared to start the job's grant. A broker that cannot be reached or
//!   refuses fails the prolog, and Slurm drains the node: a GPU that cannot be shared should
//!   take no jobs.
//! - `epilog` (root, at job end): ends the grant; sessions still open are evicted.
//! - `task-prolog` (the job's user, before each task): prints the environment of a
//!   consolidated `gpushare run` for slurmstepd to give the task ([`task`]).

use std::ffi::OsString;
use std::time::Duration;

use bytesize::ByteSize;
use gpushare::{ErrorCode, JobGpu, JobStart, JobStats, Monitor};
use gpushare_tools::cli::SlurmCommand;
use gpushare_tools::output::write_to;
use gpushare_tools::socket::BrokerSocket;

mod gres;
mod hostlist;
mod scontrol;
mod task;

pub fn run(command: SlurmCommand, socket: &BrokerSocket) -> anyhow::Result<()> {
    match command {
        SlurmCommand::Prolog => prolog(socket),
        SlurmCommand::Epilog => epilog(socket),
        SlurmCommand::TaskProlog => {
            write_to(&mut std::io::stdout().lock(), &task::output(&socket.path))?;
            Ok(())
        }
    }
}

/// The job as slurmd describes it to its prolog and epilog.
struct JobEnv {
    id: u64,
    uid: u32,
    user: String,
    node: String,
    partition: Option<String>,
}

fn var(name: &str) -> Option<String> {
    std::env::var_os(name)
        .map(OsString::into_string)
        .and_then(Result::ok)
        .filter(|v| !v.is_empty())
}

/// A number slurmd must have set.
fn number<T: std::str::FromStr>(name: &str, what: &str) -> anyhow::Result<T> {
    let Some(text) = var(name) else {
        let program = if what == "prolog" { "Prolog" } else { "Epilog" };
        anyhow::bail!(
            "{name} is not set: `gpushare slurm {what}` is Slurm's {program}, for slurmd to run (slurm.conf: {program}=/usr/share/gpushare/slurm/{what})"
        );
    };
    text.parse()
        .map_err(|_| anyhow::anyhow!("{name}={text} is not a number"))
}

impl JobEnv {
    fn read() -> anyhow::Result<JobEnv> {
        let id = number("SLURM_JOB_ID", "prolog")?;
        let uid = number("SLURM_JOB_UID", "prolog")?;
        let user = var("SLURM_JOB_USER")
            .or_else(|| {
                nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
                    .ok()
                    .flatten()
                    .map(|u| u.name)
            })
            .unwrap_or_else(|| format!("uid {uid}"));
        let node = match var("SLURMD_NODENAME") {
            Some(n) => n,
            None => short_hostname()?,
        };
        Ok(JobEnv {
            id,
            uid,
            user,
            node,
            partition: var("SLURM_JOB_PARTITION"),
        })
    }
}

/// The host name up to its first dot, as Slurm names nodes by default.
fn short_hostname() -> anyhow::Result<String> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").map_err(|e| {
        anyhow::anyhow!("SLURMD_NODENAME is not set and the host name cannot be read: {e}")
    })?;
    let name = name.trim();
    Ok(name.split('.').next().unwrap_or(name).to_string())
}

fn prolog(socket: &BrokerSocket) -> anyhow::Result<()> {
    let job = JobEnv::read()?;
    let who = format!("Slurm job {} ({})", job.id, job.user);
    // Every failure below leaves a GPU that cannot be shared as the job was promised it.
    let fails = format!("so the prolog fails and Slurm drains {}", job.node);
    let record = scontrol::find()
        .and_then(|scontrol| {
            let record = scontrol::show_job(&scontrol, &job.id.to_string())?;
            match scontrol::narrower(&record, job.id) {
                Some(own) => scontrol::show_job(&scontrol, &own),
                None => Ok(record),
            }
        })
        .map_err(|e| {
            anyhow::anyhow!(
                "{who}: cannot learn what it holds on {}, {fails}: {e}",
                job.node
            )
        })?;
    let allocation = match scontrol::allocation(&record, job.id, &job.node) {
        Ok(a) => a,
        // The job's own doing: it runs without a grant rather than draining the node.
        Err(e @ scontrol::RecordError::Ambiguous { .. }) => {
            eprintln!("gpushare: {who}: it gets no GPU shares here: {e}");
            return Ok(());
        }
        Err(e) => anyhow::bail!(
            "{who}: cannot read what it holds on {}, {fails}: {e}",
            job.node
        ),
    };
    if allocation.gpus.is_empty() {
        return Ok(());
    }
    let start = JobStart {
        job: job.id,
        uid: job.uid,
        user: job.user.clone(),
        gpus: allocation.gpus.clone(),
        partition: job.partition,
        qos: allocation.qos,
    };
    let stats = Monitor::connect(&socket.path)
        .and_then(|mut monitor| monitor.job_start(start))
        .map_err(|e| match e {
            gpushare::Error::Request(w) => {
                anyhow::anyhow!(
                    "{who}: gpushared refused its GPU shares, {fails}: {}",
                    w.message
                )
            }
            other => anyhow::anyhow!(
                "{who}: cannot ask gpushared for its GPU shares, {fails}: {}",
                socket.describe(&other)
            ),
        })?;
    eprintln!("gpushare: {}", started(&stats, &allocation.gpus));
    Ok(())
}

/// `Slurm job 12 (alice): 3 shards of GPU 0, 6.0 GiB of device memory, class normal, weight 3`.
fn started(stats: &JobStats, asked: &[JobGpu]) -> String {
    format!(
        "Slurm job {} ({}): {}, {} of device memory, class {}, weight {}",
        stats.job,
        stats.user,
        held(asked),
        ByteSize(stats.memory_quota),
        stats.class.as_str(),
        stats.weight
    )
}

/// `3 shards of GPU 0 + all of GPU 1`.
fn held(gpus: &[JobGpu]) -> String {
    let parts: Vec<String> = gpus
        .iter()
        .map(|g| match g.shards {
            None => format!("all of GPU {}", g.gpu),
            Some(1) => format!("1 shard of GPU {}", g.gpu),
            Some(n) => format!("{n} shards of GPU {}", g.gpu),
        })
        .collect();
    parts.join(" + ")
}

/// Never fails once it knows the job: a node whose gpushared misbehaves is drained by the
/// next prolog, which cannot start a grant there either.
fn epilog(socket: &BrokerSocket) -> anyhow::Result<()> {
    let id: u64 = number("SLURM_JOB_ID", "epilog")?;
    let ended = Monitor::connect(&socket.path).and_then(|mut m| m.job_end(id));
    match ended {
        Ok(stats) => eprintln!("gpushare: {}", ended_line(&stats)),
        // Not a job of gpushare's: one without GPUs, or one whose prolog granted nothing.
        Err(gpushare::Error::Request(w)) if w.code == ErrorCode::NotFound => {}
        Err(e) if gone(&e) => eprintln!(
            "gpushare: Slurm job {id}: nothing to end, gpushared is not running: {}",
            socket.describe(&e)
        ),
        Err(gpushare::Error::Request(w)) => eprintln!(
            "gpushare: Slurm job {id}: gpushared did not end its grant: {}",
            w.message
        ),
        Err(e) => eprintln!(
            "gpushare: Slurm job {id}: gpushared did not end its grant: {}",
            socket.describe(&e)
        ),
    }
    Ok(())
}

/// Whether gpushared is not there: then it holds nothing of any job. (A socket root may not
/// use is another matter.)
fn gone(e: &gpushare::Error) -> bool {
    use std::io::ErrorKind::{ConnectionRefused, NotFound};
    match e {
        gpushare::Error::Connect { cause, .. } => {
            matches!(cause.kind(), NotFound | ConnectionRefused)
        }
        _ => matches!(
            e,
            gpushare::Error::BrokerGone
                | gpushare::Error::BrokerShutdown(_)
                | gpushare::Error::BrokerRestarting(_)
        ),
    }
}

/// `Slurm job 12 (alice) ended: 2.39 s of GPU time in 4 sessions, 1 evicted`.
fn ended_line(stats: &JobStats) -> String {
    format!(
        "Slurm job {} ({}) ended after {}: {} of GPU time in {} session{}, {} evicted",
        stats.job,
        stats.user,
        crate::format::duration(Duration::from_millis(stats.age_ms)),
        crate::format::gpu_time(stats.gpu_time_ns),
        stats.sessions_total,
        if stats.sessions_total == 1 { "" } else { "s" },
        stats.evicted_at_end
    )
}

#[cfg(test)]
mod tests {
    use gpushare::PriorityClass;

    use super::*;

    fn stats() -> JobStats {
        JobStats {
            job: 12,
            uid: 1001,
            user: "alice".into(),
            gpus: vec![JobGpu {
                gpu: 0,
                shards: Some(3),
            }],
            partition: Some("debug".into()),
            qos: None,
            class: PriorityClass::Normal,
            weight: 3,
            memory_quota: 6 << 30,
            memory_used: 0,
            sessions: 0,
            sessions_total: 4,
            gpu_time_ns: 2_390_000_000,
            age_ms: 754_000,
            evicted_at_end: 1,
            pod: None,
        }
    }

    #[test]
    fn the_prolog_and_epilog_lines() {
        let s = stats();
        assert_eq!(
            started(&s, &s.gpus),
            "Slurm job 12 (alice): 3 shards of GPU 0, 6.0 GiB of device memory, class normal, weight 3"
        );
        assert_eq!(
            ended_line(&s),
            "Slurm job 12 (alice) ended after 12m34s: 2.39 s of GPU time in 4 sessions, 1 evicted"
        );
        assert_eq!(
            held(&[
                JobGpu {
                    gpu: 0,
                    shards: Some(1)
                },
                JobGpu {
                    gpu: 1,
                    shards: None
                }
            ]),
            "1 shard of GPU 0 + all of GPU 1"
        );
    }
}

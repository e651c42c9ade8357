//! `scontrol show job -d --oneliner ID`: running it from a prolog (no `PATH`, bounded in
//! time) and reading what a job holds on this node from it.
//!
//! The record mixes Slurm's fields with the job's own text: its name, comment and paths,
//! which may hold anything, spaces, newlines and `Nodes=… GRES=gpu:8(IDX:0-7)` included.
//! So the fields read here are taken only where nothing of the job's can be:
//! - the output must be one record (a second `JobId=` at a line's start is the job's text
//!   pretending); the id of an array job's first task, or of a heterogeneous job's first
//!   component, shows them all, so those are asked for again as `A_T` or `H+0`, as the
//!   first record's header (the fields before its name, all Slurm's) names them;
//! - each of `JOB_GRES=`, `MinCPUsNode=` and `QOS=` must appear once;
//! - the node groups are read only between `JOB_GRES=` and `MinCPUsNode=`, where Slurm
//!   prints nothing but `Nodes= CPU_IDs= Mem= GRES=` (`slurm_sprint_job_info`).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gpushare::JobGpu;
use gpushare_protocol::job::{SCONTROL_DIRS, SCONTROL_ENV, scontrol_path};

use super::{gres, hostlist};

/// How long scontrol may take: slurmctld answers in milliseconds when it is well.
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// What the job holds on one node, and its QOS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocation {
    pub gpus: Vec<JobGpu>,
    pub qos: Option<String>,
}

/// Why a record cannot be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordError {
    /// A field Slurm prints once appears more or less often: the job's own text (its name,
    /// comment, a path) repeats Slurm's field names. Nothing can be trusted.
    Ambiguous {
        field: &'static str,
        times: usize,
    },
    /// Not the record of a running job as Slurm 22.05 and later print it.
    Unexpected(String),
    /// The job's groups name no node of this name.
    NodeNotListed {
        node: String,
        groups: Vec<String>,
    },
    Gres(gres::GresError),
}

impl std::fmt::Display for RecordError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RecordError::Ambiguous { field, times } => write!(
                f,
                "`{field}` appears {times} times in `scontrol show job`, where Slurm prints it once: the job's name, comment or a path repeats Slurm's field names, so what it holds cannot be read"
            ),
            RecordError::Unexpected(what) => write!(f, "its record is not as expected: {what}"),
            RecordError::NodeNotListed { node, groups } => write!(
                f,
                "its record lists no node {node} (it lists {}): is SLURMD_NODENAME this node's NodeName?",
                if groups.is_empty() {
                    "none".to_string()
                } else {
                    groups.join(", ")
                }
            ),
            RecordError::Gres(e) => write!(f, "{e}"),
        }
    }
}

/// The scontrol to run ([`scontrol_path`]), or why there is none.
pub fn find() -> Result<PathBuf, String> {
    scontrol_path().ok_or_else(|| {
        format!(
            "cannot find scontrol on PATH or in {}: set {SCONTROL_ENV} to its path",
            SCONTROL_DIRS.join(", ")
        )
    })
}

/// `scontrol --details --oneliner show job JOB`'s output (`JOB`: an id, `A_T`, `H+O`), or
/// why there is none. The environment passes through (`SLURM_CONF` says where the cluster
/// is).
pub fn show_job(scontrol: &Path, job: &str) -> Result<String, String> {
    let mut cmd = Command::new(scontrol);
    cmd.args(["--details", "--oneliner", "show", "job", job]);
    let out =
        run_bounded(cmd, TIMEOUT).map_err(|e| format!("cannot run {}: {e}", scontrol.display()))?;
    if !out.status.success() {
        let said = String::from_utf8_lossy(&out.stderr);
        return Err(format!(
            "`{} show job {job}` failed ({}): {}",
            scontrol.display(),
            out.status,
            said.trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs `cmd` (no input), killing it if it runs past `limit`.
fn run_bounded(mut cmd: Command, limit: Duration) -> std::io::Result<std::process::Output> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    // Read both pipes as the child writes, so that it never blocks on a full one.
    let readers = [
        child.stdout.take().map(|o| reader(Box::new(o))),
        child.stderr.take().map(|e| reader(Box::new(e))),
    ];
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if Instant::now() >= deadline {
            // It may have exited just now; either way it is reaped here.
            let _ = child.kill();
            let _ = child.wait();
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no answer within {} s", limit.as_secs()),
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let [stdout, stderr] = readers.map(|r| {
        r.and_then(|h| h.join().ok())
            .and_then(Result::ok)
            .unwrap_or_default()
    });
    Ok(std::process::Output {
        status,
        stdout,
        stderr,
    })
}

type Reader = std::thread::JoinHandle<std::io::Result<Vec<u8>>>;

fn reader(mut from: Box<dyn Read + Send>) -> Reader {
    std::thread::spawn(move || {
        let mut all = Vec::new();
        from.read_to_end(&mut all).map(|_| all)
    })
}

/// Whether a record starts at a line's start after the first.
fn several(output: &str) -> bool {
    output.contains("\nJobId=")
}

/// When `output` (of `show job JOB`) holds several records, the name of `job`'s own: `A_T`
/// for the task of array job `A` that kept the array's id, `H+O` for component `O` of
/// heterogeneous job `H`. The first record's header says which; it is Slurm's text, the
/// job's own starts at `JobName=`.
pub fn narrower(output: &str, job: u64) -> Option<String> {
    if !several(output) {
        return None;
    }
    let header: Vec<&str> = output
        .split_ascii_whitespace()
        .take_while(|t| !t.starts_with("JobName="))
        .collect();
    let field = |key: &str| {
        header
            .iter()
            .find_map(|t| t.strip_prefix(key))
            .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
    };
    if header.first() != Some(&format!("JobId={job}").as_str()) {
        return None;
    }
    if let (Some(array), Some(task)) = (field("ArrayJobId="), field("ArrayTaskId=")) {
        return Some(format!("{array}_{task}"));
    }
    if let (Some(het), Some(offset)) = (field("HetJobId="), field("HetJobOffset=")) {
        return Some(format!("{het}+{offset}"));
    }
    None
}

/// What job `job`'s record says it holds on `node`.
pub fn allocation(record: &str, job: u64, node: &str) -> Result<Allocation, RecordError> {
    if !record.starts_with(&format!("JobId={job} ")) {
        return Err(RecordError::Unexpected(format!(
            "it does not start with `JobId={job} `"
        )));
    }
    if several(record.trim_end()) {
        return Err(RecordError::Ambiguous {
            field: "JobId=",
            times: record.trim_end().matches("\nJobId=").count() + 1,
        });
    }
    let tokens: Vec<&str> = record.split_ascii_whitespace().collect();
    let job_gres = only(&tokens, "JOB_GRES=")?;
    let end = only(&tokens, "MinCPUsNode=")?;
    let qos = only(&tokens, "QOS=")?;
    if job_gres >= end {
        return Err(RecordError::Unexpected(
            "`JOB_GRES=` does not come before `MinCPUsNode=`".into(),
        ));
    }
    let groups = groups(&tokens[job_gres + 1..end])?;
    let Some((_, value)) = groups
        .iter()
        .find(|(nodes, _)| hostlist::contains(nodes, node))
    else {
        return Err(RecordError::NodeNotListed {
            node: node.to_string(),
            groups: groups.into_iter().map(|(n, _)| n.to_string()).collect(),
        });
    };
    let gpus = gres::gpus(value).map_err(RecordError::Gres)?;
    let qos = value_of(tokens[qos], "QOS=");
    Ok(Allocation {
        gpus,
        qos: (!qos.is_empty() && qos != "(null)").then(|| qos.to_string()),
    })
}

/// The index of the one token that starts with `key`.
fn only(tokens: &[&str], key: &'static str) -> Result<usize, RecordError> {
    let mut at = tokens
        .iter()
        .enumerate()
        .filter(|(_, t)| t.starts_with(key))
        .map(|(i, _)| i);
    match (at.next(), at.count()) {
        (Some(i), 0) => Ok(i),
        (None, _) => Err(RecordError::Unexpected(format!(
            "no `{key}` (does the job hold anything yet?)"
        ))),
        (Some(_), more) => Err(RecordError::Ambiguous {
            field: key,
            times: 1 + more,
        }),
    }
}

fn value_of<'a>(token: &'a str, key: &str) -> &'a str {
    token.strip_prefix(key).unwrap_or("")
}

/// The node groups (`Nodes=` hostlist, `GRES=` value) of the record's detail lines.
fn groups<'a>(tokens: &[&'a str]) -> Result<Vec<(&'a str, &'a str)>, RecordError> {
    let mut groups: Vec<(&str, &str)> = Vec::new();
    for token in tokens {
        let (key, value) = token.split_once('=').unwrap_or((token, ""));
        match (key, groups.last_mut()) {
            ("Nodes", _) => groups.push((value, "")),
            ("GRES", Some(group)) => group.1 = value,
            ("CPU_IDs" | "Mem", Some(_)) => {}
            _ => {
                return Err(RecordError::Unexpected(format!(
                    "`{token}` among its node groups"
                )));
            }
        }
    }
    Ok(groups)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Slurm 22.05.8, `sbatch --gres=shard:3 --wrap …`, as this machine printed it.
    const SHARDS: &str = "JobId=2 JobName=wrap UserId=gsalice(1001) GroupId=gsalice(1001) MCS_label=N/A Priority=4294901758 Nice=0 Account=(null) QOS=(null) JobState=RUNNING Reason=None Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 DerivedExitCode=0:0 RunTime=00:00:02 TimeLimit=UNLIMITED TimeMin=N/A SubmitTime=2026-11-29T09:50:22 EligibleTime=2026-11-29T09:50:22 AccrueTime=2026-11-29T09:50:22 StartTime=2026-11-29T09:50:23 EndTime=Unknown Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-11-29T09:50:23 Scheduler=Main Partition=debug AllocNode:Sid=localhost:20308 ReqNodeList=(null) ExcNodeList=(null) NodeList=vm BatchHost=vm NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=1,node=1,billing=1 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* JOB_GRES=shard:3   Nodes=vm CPU_IDs=0 Mem=0 GRES=shard:3(IDX:0) MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=YES Contiguous=0 Licenses=(null) Network=(null) Command=(null) WorkDir=/tmp StdErr=/tmp/slurm-2.out StdIn=/dev/null StdOut=/tmp/slurm-2.out Power= TresPerNode=gres:shard:3 \n";

    /// `SHARDS` with another name, QOS, job GRES and node groups.
    fn record(name: &str, qos: &str, job_gres: &str, groups: &str) -> String {
        SHARDS
            .replace("JobName=wrap", &format!("JobName={name}"))
            .replace("QOS=(null)", &format!("QOS={qos}"))
            .replace("JOB_GRES=shard:3", &format!("JOB_GRES={job_gres}"))
            .replace("Nodes=vm CPU_IDs=0 Mem=0 GRES=shard:3(IDX:0)", groups)
    }

    fn shards(gpu: u32, n: u32) -> JobGpu {
        JobGpu {
            gpu,
            shards: Some(n),
        }
    }

    fn whole(gpu: u32) -> JobGpu {
        JobGpu { gpu, shards: None }
    }

    #[test]
    fn the_real_record_gives_three_shards_of_gpu_0_and_no_qos() {
        assert_eq!(
            allocation(SHARDS, 2, "vm"),
            Ok(Allocation {
                gpus: vec![shards(0, 3)],
                qos: None
            })
        );
        // The multi-line form reads the same.
        let lines = SHARDS
            .replace(" JOB_GRES", "\n   JOB_GRES")
            .replace("   Nodes=", "\n     Nodes=");
        assert_eq!(allocation(&lines, 2, "vm"), allocation(SHARDS, 2, "vm"));
    }

    #[test]
    fn whole_gpus_typed_gres_and_a_qos() {
        let r = record(
            "train",
            "scavenger",
            "gpu:h200:2",
            "Nodes=vm CPU_IDs=0-3 Mem=1024 GRES=gpu:h200:2(IDX:0-1)",
        );
        assert_eq!(
            allocation(&r, 2, "vm"),
            Ok(Allocation {
                gpus: vec![whole(0), whole(1)],
                qos: Some("scavenger".into())
            })
        );
    }

    #[test]
    fn this_nodes_group_is_found_in_a_host_list() {
        let r = record(
            "mpi",
            "normal",
            "gpu:4",
            "Nodes=gpu[01-03] CPU_IDs=0-7 Mem=0 GRES=gpu:1(IDX:0)   Nodes=gpu[04,07] CPU_IDs=0-7 Mem=0 GRES=gpu:2(IDX:1-2)",
        );
        assert_eq!(
            allocation(&r, 2, "gpu02").map(|a| a.gpus),
            Ok(vec![whole(0)])
        );
        assert_eq!(
            allocation(&r, 2, "gpu07").map(|a| a.gpus),
            Ok(vec![whole(1), whole(2)])
        );
        assert!(matches!(
            allocation(&r, 2, "gpu05"),
            Err(RecordError::NodeNotListed { .. })
        ));
    }

    #[test]
    fn a_job_without_gpus_holds_none() {
        let r = record("cpu", "(null)", "(null)", "Nodes=vm CPU_IDs=0 Mem=0 GRES=");
        assert_eq!(allocation(&r, 2, "vm").map(|a| a.gpus), Ok(vec![]));
    }

    #[test]
    fn the_jobs_own_text_cannot_pass_for_slurms() {
        // This machine's Slurm keeps a job name as given, spaces and newlines included.
        for name in [
            "x Nodes=vm GRES=gpu:8(IDX:0-7)",
            "x JOB_GRES=gpu:8   Nodes=vm CPU_IDs=0 Mem=0 GRES=gpu:8(IDX:0-7) MinCPUsNode=1",
            "x\n   JOB_GRES=gpu:8\n     Nodes=vm CPU_IDs=0 Mem=0 GRES=gpu:8(IDX:0-7)\n   MinCPUsNode=1",
            "x QOS=interactive",
        ] {
            let r = record(
                name,
                "(null)",
                "shard:3",
                "Nodes=vm CPU_IDs=0 Mem=0 GRES=shard:3(IDX:0)",
            );
            match allocation(&r, 2, "vm") {
                // A name that names no field of ours changes nothing.
                Ok(a) => assert_eq!(a.gpus, vec![shards(0, 3)], "{name}"),
                Err(e) => assert!(matches!(e, RecordError::Ambiguous { .. }), "{name}: {e}"),
            }
        }
        let r = record(
            "x JOB_GRES=gpu:8",
            "(null)",
            "shard:3",
            "Nodes=vm CPU_IDs=0 Mem=0 GRES=shard:3(IDX:0)",
        );
        assert_eq!(
            allocation(&r, 2, "vm"),
            Err(RecordError::Ambiguous {
                field: "JOB_GRES=",
                times: 2
            })
        );
        // After the groups (a path, a comment) too.
        let r = SHARDS.replace(
            "WorkDir=/tmp",
            "WorkDir=/tmp/a MinCPUsNode=1 Nodes=vm GRES=gpu:8(IDX:0-7)",
        );
        assert!(matches!(
            allocation(&r, 2, "vm"),
            Err(RecordError::Ambiguous {
                field: "MinCPUsNode=",
                ..
            })
        ));
    }

    #[test]
    fn several_records_are_narrowed_to_the_jobs_own_or_refused() {
        // `show job 16`, where 16 is the id of array job 16's task 2, shows every task.
        let task = |id: u32, t: u32| {
            SHARDS.replace(
                "JobId=2 ",
                &format!("JobId={id} ArrayJobId=16 ArrayTaskId={t} "),
            )
        };
        let array = format!("{}{}{}", task(16, 2), task(18, 1), task(17, 0));
        assert_eq!(narrower(&array, 16), Some("16_2".into()));
        assert!(matches!(
            allocation(&array, 16, "vm"),
            Err(RecordError::Ambiguous {
                field: "JobId=",
                times: 3
            })
        ));
        assert_eq!(narrower(&task(16, 2), 16), None);
        assert!(allocation(&task(16, 2), 16, "vm").is_ok());
        // `show job 14`, the first component of heterogeneous job 14.
        let component = |id: u32, o: u32| {
            SHARDS.replace(
                "JobId=2 JobName=wrap ",
                &format!(
                    "JobId={id} HetJobId=14 HetJobOffset={o} JobName=het.sh HetJobIdSet=14-15 "
                ),
            )
        };
        let het = format!("{}{}", component(14, 0), component(15, 1));
        assert_eq!(narrower(&het, 14), Some("14+0".into()));
        assert!(allocation(&component(14, 0), 14, "vm").is_ok());
        // A name that starts a line as a record does: never narrowed, refused.
        let forged = record(
            "x QOS=a JOB_GRES=gpu:8   Nodes=vm CPU_IDs=0 Mem=0 GRES=gpu:8(IDX:0-7) MinCPUsNode=1\nJobId=99 y",
            "(null)",
            "shard:3",
            "Nodes=vm CPU_IDs=0 Mem=0 GRES=shard:3(IDX:0)",
        );
        assert_eq!(narrower(&forged, 2), None);
        assert!(matches!(
            allocation(&forged, 2, "vm"),
            Err(RecordError::Ambiguous {
                field: "JobId=",
                ..
            })
        ));
        let forged = task(16, 2).replace(
            "JobName=wrap",
            "JobName=x\nJobId=16 ArrayJobId=16 ArrayTaskId=7 y",
        );
        assert_eq!(narrower(&forged, 16), Some("16_2".into()));
    }

    #[test]
    fn another_jobs_record_or_a_strange_one_is_refused() {
        assert!(matches!(
            allocation(SHARDS, 3, "vm"),
            Err(RecordError::Unexpected(_))
        ));
        let r = SHARDS.replace("CPU_IDs=0", "CPU_IDs=0 Extra=1");
        assert!(matches!(
            allocation(&r, 2, "vm"),
            Err(RecordError::Unexpected(_))
        ));
        let r = SHARDS.replace("GRES=shard:3(IDX:0)", "GRES=shard(CNT:3)");
        assert!(matches!(
            allocation(&r, 2, "vm"),
            Err(RecordError::Gres(gres::GresError::NoIndices(_)))
        ));
    }

    #[test]
    fn a_slow_scontrol_is_cut_short() {
        let mut sleep = Command::new("sh");
        sleep.args(["-c", "sleep 5"]);
        let started = Instant::now();
        let err = run_bounded(sleep, Duration::from_millis(200)).map(|o| o.status);
        assert_eq!(err.map_err(|e| e.kind()), Err(std::io::ErrorKind::TimedOut));
        assert!(started.elapsed() < Duration::from_secs(4));
        let mut echo = Command::new("sh");
        echo.args(["-c", "echo out; echo err >&2; exit 3"]);
        let out = run_bounded(echo, Duration::from_secs(5)).map(|o| {
            (
                o.status.code(),
                String::from_utf8_lossy(&o.stdout).into_owned(),
                String::from_utf8_lossy(&o.stderr).into_owned(),
            )
        });
        assert_eq!(
            out.ok(),
            Some((Some(3), "out\n".to_string(), "err\n".to_string()))
        );
    }
}

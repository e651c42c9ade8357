//! Which Slurm job a process is in, asked of Slurm itself, never of the process: its cgroup
//! when Slurm's cgroup plugin placed it (`…/job_12/step_0/…`), else slurmd, through
//! `scontrol pidinfo PID`, which works whatever Slurm tracks processes with.

use std::time::Duration;

use gpushare_protocol::job::scontrol_path;

/// How long slurmd has to answer.
const PIDINFO_TIMEOUT: Duration = Duration::from_secs(5);

/// The job `pid` is in, or `None` when it is in none (or Slurm cannot say).
pub async fn job_of(pid: i32) -> Option<u64> {
    if pid <= 0 {
        return None;
    }
    if let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        && let Some(job) = job_in_cgroup(&text)
    {
        return Some(job);
    }
    let scontrol = scontrol_path()?;
    let run = tokio::process::Command::new(&scontrol)
        .arg("pidinfo")
        .arg(pid.to_string())
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    match tokio::time::timeout(PIDINFO_TIMEOUT, run).await {
        Ok(Ok(out)) => job_in_pidinfo(&String::from_utf8_lossy(&out.stdout)),
        Ok(Err(e)) => {
            tracing::warn!(scontrol = %scontrol.display(), error = %e, "cannot ask Slurm which job a client is in");
            None
        }
        Err(_) => {
            tracing::warn!(
                pid,
                "slurmd did not say within 5 s which job a client is in"
            );
            None
        }
    }
}

/// Whether Slurm still runs job `id`: `Some(false)` when it says the job is over or unknown,
/// `None` when it cannot say (no scontrol, no answer).
pub async fn still_running(id: u64) -> Option<bool> {
    let scontrol = scontrol_path()?;
    let run = tokio::process::Command::new(&scontrol)
        .args(["show", "job", "--oneliner", &id.to_string()])
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(PIDINFO_TIMEOUT, run)
        .await
        .ok()?
        .ok()?;
    job_state(
        &String::from_utf8_lossy(&out.stdout),
        &String::from_utf8_lossy(&out.stderr),
    )
}

/// What `scontrol show job --oneliner` says of a job's life: running (or about to, or
/// suspended, or its epilog under way) or over; `None` when it says neither.
fn job_state(stdout: &str, stderr: &str) -> Option<bool> {
    if stderr.contains("Invalid job id") {
        return Some(false);
    }
    let state = stdout
        .split_whitespace()
        .find_map(|f| f.strip_prefix("JobState="))?;
    Some(matches!(
        state,
        "RUNNING"
            | "CONFIGURING"
            | "COMPLETING"
            | "SUSPENDED"
            | "PENDING"
            | "REQUEUED"
            | "RESIZING"
            | "SIGNALING"
            | "STAGE_OUT"
            | "STOPPED"
    ))
}

/// The job in a `/proc/PID/cgroup` text: a path component `job_N` (Slurm's cgroup plugin, v1
/// `/slurm/uid_U/job_N/step_S` and v2 `/system.slice/slurmstepd.scope/job_N/step_S`).
fn job_in_cgroup(text: &str) -> Option<u64> {
    text.lines()
        .filter_map(|line| line.splitn(3, ':').nth(2))
        .flat_map(|path| path.split('/'))
        .find_map(|part| part.strip_prefix("job_").and_then(|n| n.parse().ok()))
}

/// The job in `scontrol pidinfo`'s answer: `Slurm JobId=12 ends at …` (22.05 and later) or
/// `Slurm job id 12 ends at …` (older).
fn job_in_pidinfo(text: &str) -> Option<u64> {
    let first = text.lines().next()?.trim();
    let rest = first
        .strip_prefix("Slurm JobId=")
        .or_else(|| first.strip_prefix("Slurm job id "))?;
    rest.split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_job_is_read_from_slurm_s_cgroups_v1_and_v2() {
        let v2 = "0::/system.slice/slurmstepd.scope/job_4711/step_0/user/task_0\n";
        assert_eq!(job_in_cgroup(v2), Some(4711));
        let v1 = "12:pids:/\n4:memory:/slurm/uid_1000/job_12/step_batch/task_0\n1:cpu:/\n";
        assert_eq!(job_in_cgroup(v1), Some(12));
        let outside = "0::/user.slice/user-1000.slice/session-3.scope\n4:memory:/job_x/\n";
        assert_eq!(job_in_cgroup(outside), None);
    }

    #[test]
    fn a_job_s_life_is_read_from_scontrol_show_job() {
        assert_eq!(
            job_state("JobId=12 JobName=wrap JobState=RUNNING Reason=None", ""),
            Some(true)
        );
        assert_eq!(
            job_state("JobId=12 JobState=COMPLETED Reason=None", ""),
            Some(false)
        );
        assert_eq!(
            job_state("JobId=12 JobState=CANCELLED Reason=None", ""),
            Some(false)
        );
        assert_eq!(
            job_state("", "slurm_load_jobs error: Invalid job id specified\n"),
            Some(false)
        );
        assert_eq!(
            job_state(
                "",
                "slurm_load_jobs error: Unable to contact slurm controller\n"
            ),
            None
        );
    }

    #[test]
    fn the_job_is_read_from_scontrol_pidinfo() {
        assert_eq!(
            job_in_pidinfo(
                "Slurm JobId=3 ends at Mon Nov 29 09:47:07 2027\nJob remaining time is 31535998 seconds\n"
            ),
            Some(3)
        );
        assert_eq!(
            job_in_pidinfo("Slurm job id 77 ends at Tue Jan 01 00:00:00 2030\n"),
            Some(77)
        );
        assert_eq!(job_in_pidinfo(""), None);
        assert_eq!(
            job_in_pidinfo("slurm_pid2jobid: Process not managed by Slurm\n"),
            None
        );
    }
}

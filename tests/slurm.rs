//! gpushare under a real Slurm (issue 33): slurmctld and slurmd of this one machine
//! (tests/src/slurm.rs) with gpushare's prolog, epilog and task prolog, a node whose one GPU
//! is 8 shards, and a sim gpushared whose policy turns a job's shards into its grant. Jobs of
//! two users (`daemon` and `nobody`) run `c/consolidated_app.c` through `srun` and `sbatch`:
//! each runs on its job's grant (memory quota, class, weight), an allocation past it is
//! refused, a job that ends or is cancelled leaves nothing held, and a program left running
//! after its job has ended loses its session (the epilog's eviction). Outside a job only root
//! may use the GPU (`jobs_only`).
//!
//! Needs root and Slurm (scripts/setup.sh installs it as root): it says SKIPPED without them,
//! and fails where tests needing root must run (`CI` or `GPUSHARE_REQUIRE_ROOT` set). The
//! scenarios share one cluster and one broker, and run one after another; each one's failure
//! is reported with the cluster's state, and the others still run.

use std::io::Read;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use gpushare::{PriorityClass, StatusReport};
use gpushare_tests::slurm::{SlurmCluster, lines_of, output_within};
use gpushare_tests::{Broker, BrokerOptions, SystemUser, other_users, wait_until};

#[path = "slurm/scenarios.rs"]
mod scenarios;

use scenarios::{
    a_job_cancelled_mid_run_leaves_nothing_held,
    a_program_left_running_when_its_job_ends_loses_its_session,
    an_allocation_past_the_jobs_shards_is_refused, outside_a_job_only_root_may_use_the_gpu,
    two_users_jobs_run_side_by_side_on_their_grants_and_nothing_stays_after_they_end,
};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
/// The sim GPU's memory (gpushared's `--sim-memory` default): 2 GiB a shard.
const GPU_MEMORY: u64 = 16 * GIB;
const SHARD: u64 = GPU_MEMORY / gpushare_tests::slurm::SHARDS_PER_GPU as u64;
/// How long a job may take to start, a program to say it is ready, a job's end to reach
/// gpushared: generous, as a loaded CI machine needs.
const PATIENCE: Duration = Duration::from_secs(60);

const POLICY: &str = r#"
[slurm]
shards_per_gpu = 8
class = "normal"
jobs_only = true

[slurm.partitions]
interactive = "high"
"#;

/// The cluster, the broker its hooks talk to, the program jobs run, and the two users.
/// Dropped in this order: the cluster's jobs are cancelled while the broker still serves
/// their epilogs.
struct Setup {
    slurm: SlurmCluster,
    broker: Broker,
    /// `consolidated_app`, where every user may run it.
    app: PathBuf,
    /// `daemon`.
    a: SystemUser,
    /// `nobody`.
    b: SystemUser,
}

impl Setup {
    fn start(test: &str) -> Option<Setup> {
        let (a, b) = other_users(test)?;
        let slurm = SlurmCluster::start(test)?;
        let app = slurm.bin_dir().join("consolidated_app");
        gpushare_tests::cc::compile(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("c/consolidated_app.c"),
            &["-ldl"],
            &app,
        );
        std::fs::set_permissions(&app, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .expect("chmod the program");
        let broker = start_broker(&slurm);
        Some(Setup {
            slurm,
            broker,
            app,
            a,
            b,
        })
    }

    fn app(&self) -> String {
        self.app.display().to_string()
    }

    /// Stops gpushared and starts it again on the same socket, as `systemctl restart` does.
    fn restart_broker(&mut self) {
        self.broker.terminate(PATIENCE);
        self.broker = start_broker(&self.slurm);
    }

    /// The cluster's state and the end of the broker's log, for a failure's message.
    fn diagnostics(&self) -> String {
        let log = self.broker.log_text();
        let lines: Vec<&str> = log.lines().collect();
        format!(
            "{}--- gpushared (last 80 lines) ---\n{}\n",
            self.slurm.diagnostics(),
            lines[lines.len().saturating_sub(80)..].join("\n")
        )
    }

    /// Polls status until `check` holds; panics saying `what` did not happen otherwise.
    fn wait_status(&self, what: &str, check: impl Fn(&StatusReport) -> bool) -> StatusReport {
        let mut last = None;
        let held = wait_until(PATIENCE, || {
            let status = self.broker.status();
            let ok = check(&status);
            last = Some(status);
            ok
        });
        let last = last.expect("a status");
        assert!(
            held,
            "{what}: not so after {PATIENCE:?}; last status: jobs {:#?}\nclients {:#?}\nusers {:#?}\n{}",
            last.jobs,
            last.clients,
            last.users,
            self.diagnostics()
        );
        last
    }

    /// `gpushare run` of the program holding `bytes`, outside any job, as `user` (root if
    /// `None`), with a clean environment.
    fn run_outside_a_job(&self, user: Option<&SystemUser>, bytes: u64) -> Command {
        let mut cmd = Command::new(self.slurm.gpushare());
        cmd.env_clear()
            .env("PATH", "/usr/bin:/bin")
            .current_dir(self.slurm.work_dir())
            .arg("--socket")
            .arg(self.slurm.socket())
            .args(["run", "--"])
            .arg(&self.app)
            .args(["hold", "libcuda.so.1", &bytes.to_string()]);
        if let Some(user) = user {
            user.apply(&mut cmd);
        }
        cmd
    }

    /// Waits until batch job `job`'s program says `ready PID`; its pid.
    fn batch_ready(&self, job: &gpushare_tests::slurm::BatchJob) -> i32 {
        let mut pid = None;
        wait_until(PATIENCE, || {
            pid = ready_pid(&job.output_text());
            pid.is_some()
                || self
                    .slurm
                    .job_state(job.id)
                    .is_some_and(|s| s != "RUNNING" && s != "PENDING" && s != "CONFIGURING")
        });
        pid.unwrap_or_else(|| {
            panic!(
                "batch job {} ({:?}) never said `ready PID`; its output:\n{}\n{}",
                job.id,
                self.slurm.job_state(job.id),
                job.output_text(),
                self.diagnostics()
            )
        })
    }
}

/// The pid in a `ready PID` line of `text`.
fn ready_pid(text: &str) -> Option<i32> {
    text.lines()
        .find_map(|l| l.strip_prefix("ready ")?.trim().parse().ok())
}

/// gpushared on the cluster's socket, with the test's policy.
fn start_broker(slurm: &SlurmCluster) -> Broker {
    Broker::start_with(BrokerOptions {
        policy: Some(POLICY.into()),
        socket: Some(slurm.socket()),
        // gpushared asks this cluster which job a client's process is in.
        env: vec![("SLURM_CONF".into(), slurm.conf().display().to_string())],
        ..BrokerOptions::default()
    })
}

/// A program run by `srun`, its input piped from the test (srun hands it to the task).
struct Step {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: Receiver<String>,
    stderr: Option<std::thread::JoinHandle<String>>,
}

impl Step {
    fn start(mut cmd: Command) -> Step {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start srun");
        let stdin = child.stdin.take();
        let stdout = lines_of(child.stdout.take().expect("stdout"));
        let mut err = child.stderr.take().expect("stderr");
        let stderr = Some(std::thread::spawn(move || {
            let mut text = String::new();
            let _ = err.read_to_string(&mut text);
            text
        }));
        Step {
            child,
            stdin,
            stdout,
            stderr,
        }
    }

    /// The pid in the program's `ready PID` line.
    fn ready(&mut self, setup: &Setup) -> i32 {
        let deadline = Instant::now() + PATIENCE;
        let mut said = Vec::new();
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.stdout.recv_timeout(left) {
                Ok(line) => match ready_pid(&line) {
                    Some(pid) => return pid,
                    None => said.push(line),
                },
                Err(_) => break,
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        panic!(
            "the step never said `ready PID`; it said {said:?}, and on stderr:\n{}\n{}",
            self.stderr_text(),
            setup.diagnostics()
        );
    }

    /// Ends the program's input and waits for srun to exit; its status and stderr.
    fn finish(mut self) -> (ExitStatus, String) {
        drop(self.stdin.take());
        let mut status = None;
        wait_until(PATIENCE, || {
            status = self.child.try_wait().ok().flatten();
            status.is_some()
        });
        let status = status
            .unwrap_or_else(|| panic!("srun did not exit in {PATIENCE:?} after its input ended"));
        (status, self.stderr_text())
    }

    /// What srun wrote on stderr, once it has exited.
    fn stderr_text(&mut self) -> String {
        self.stderr
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for Step {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn no_trace_of_job(status: &StatusReport, job: u64) -> bool {
    !status.jobs.iter().any(|j| j.job == job) && !status.clients.iter().any(|c| c.job == Some(job))
}

fn user_holds_nothing(status: &StatusReport, uid: u32) -> bool {
    status
        .users
        .iter()
        .filter(|u| u.uid == uid)
        .all(|u| u.memory_used == 0 && u.sessions == 0)
}

#[test]
fn slurm_jobs_of_two_users_run_on_their_grants_and_leave_nothing_held() {
    let Some(setup) =
        Setup::start("slurm_jobs_of_two_users_run_on_their_grants_and_leave_nothing_held")
    else {
        return;
    };
    type Scenario = fn(&Setup);
    let scenarios: [(&str, Scenario); 5] = [
        (
            "outside a job only root may use the GPU",
            outside_a_job_only_root_may_use_the_gpu,
        ),
        (
            "two users' jobs run side by side on their grants, and nothing stays after they end",
            two_users_jobs_run_side_by_side_on_their_grants_and_nothing_stays_after_they_end,
        ),
        (
            "an allocation past the job's shards is refused",
            an_allocation_past_the_jobs_shards_is_refused,
        ),
        (
            "a job cancelled mid-run leaves nothing held",
            a_job_cancelled_mid_run_leaves_nothing_held,
        ),
        (
            "a program left running when its job ends loses its session",
            a_program_left_running_when_its_job_ends_loses_its_session,
        ),
    ];
    let mut failed = Vec::new();
    let mut scenarios = scenarios.into_iter();
    for (name, scenario) in scenarios.by_ref() {
        let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| scenario(&setup)));
        // Whatever it left running goes before the next one starts.
        let cleared = setup.slurm.cancel_all(PATIENCE);
        if outcome.is_err() {
            eprintln!("scenario `{name}` failed (its panic is above)");
            failed.push(name);
        } else if !cleared {
            eprintln!(
                "scenario `{name}` left jobs that did not end:\n{}",
                setup.diagnostics()
            );
            failed.push(name);
        }
        // A failed prolog drains the node: the scenarios after it would only wait in vain.
        if let Some(why) = setup.slurm.node_unusable() {
            eprintln!("{why}: the scenarios after `{name}` are not run");
            failed.extend(scenarios.map(|(name, _)| name));
            break;
        }
    }
    assert!(failed.is_empty(), "failed (or not run): {failed:#?}");
}

#[test]
fn a_restarted_gpushared_takes_back_a_running_job_s_grant() {
    let Some(mut s) = Setup::start("a_restarted_gpushared_takes_back_a_running_job_s_grant") else {
        return;
    };
    let (fifo, _gate) = s.slurm.input_fifo("restart");
    let job = s.slurm.sbatch_as(
        &s.a,
        &["--job-name=gpushare-restart", "--gres=shard:2"],
        &format!("exec cat < {}", fifo.display()),
    );
    s.wait_status("the job holds its shares", |st| {
        st.jobs
            .iter()
            .any(|j| j.job == job.id && j.memory_quota == 2 * SHARD)
    });

    s.restart_broker();
    s.wait_status(
        "the restarted gpushared holds the job's shares again",
        |st| {
            st.jobs
                .iter()
                .any(|j| j.job == job.id && j.memory_quota == 2 * SHARD)
        },
    );
    // A new step of the running job: its program runs on the job's grant.
    let app = s.app();
    let gib = GIB.to_string();
    let mut step = Step::start(s.slurm.srun_as(
        &s.a,
        &[
            &format!("--jobid={}", job.id),
            "--overlap",
            &app,
            "hold",
            "libcuda.so.1",
            &gib,
        ],
    ));
    let pid = step.ready(&s);
    s.wait_status("the new step's program runs on the job's grant", |st| {
        st.clients
            .iter()
            .any(|c| c.pid == pid && c.job == Some(job.id) && c.memory_quota == Some(2 * SHARD))
    });
    let (status, stderr) = step.finish();
    assert!(status.success(), "the step: {status:?}\n{stderr}");
    s.slurm.scancel(job.id);
    assert!(
        s.slurm.wait_job_gone(job.id, PATIENCE),
        "job {} did not end: {}",
        job.id,
        s.diagnostics()
    );
    s.wait_status("the ended job leaves nothing held", |st| {
        no_trace_of_job(st, job.id)
    });
}

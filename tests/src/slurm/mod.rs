//! A Slurm cluster of this one machine, for the Slurm integration test (tests/slurm.rs):
//! slurmctld and slurmd as Debian packages them, on ports and in directories of their own (a
//! Slurm the machine already runs is left alone), with gpushare's hooks as slurmd's Prolog,
//! Epilog and TaskProlog. The node has one GPU of 8 shards (`Gres=gpu:1,shard:8`) and two
//! partitions, `debug` (the default) and `interactive`, that every job may share
//! (`OverSubscribe=FORCE`).
//!
//! Needs root (slurmd runs jobs as their users) and the packages slurmd, slurmctld,
//! slurm-client and munge (scripts/setup.sh installs them as root). It starts munged if it is
//! not running, and leaves it running: it is the machine's, as the packages set it up.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::{SystemUser, binary, root_or_skip, skip_or_fail, wait_until};

mod setup;
use setup::*;

/// The programs the cluster runs, from the Debian packages slurmctld, slurmd, slurm-client
/// and munge.
const PROGRAMS: [&str; 9] = [
    "slurmctld",
    "slurmd",
    "srun",
    "sbatch",
    "scancel",
    "scontrol",
    "squeue",
    "sinfo",
    "munged",
];

/// Where munged listens, as Debian's package runs it.
const MUNGE_SOCKET: &str = "/run/munge/munge.socket.2";

/// The shards the node's one GPU is cut into (gres.conf's `Count`).
pub const SHARDS_PER_GPU: u32 = 8;

/// gpushare's files that jobs' users run: the CLI, and the libraries `gpushare run` and the
/// task prolog put in front of a program (found beside the CLI).
const GPUSHARE_FILES: [&str; 4] = [
    "gpushare",
    "libcuda.so",
    "libgpushare_audit.so",
    "libgpushare_interpose.so",
];

/// Job states in which a job is over, its epilog included (a job whose epilog still runs is
/// `COMPLETING`).
const ENDED: [&str; 9] = [
    "COMPLETED",
    "CANCELLED",
    "FAILED",
    "TIMEOUT",
    "NODE_FAIL",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
    "OUT_OF_MEMORY",
];

/// A running one-node Slurm cluster; its jobs are cancelled and its daemons stopped when it
/// is dropped.
pub struct SlurmCluster {
    dir: tempfile::TempDir,
    node: String,
    programs: BTreeMap<&'static str, PathBuf>,
    /// slurmctld, then slurmd.
    daemons: Vec<(&'static str, Child)>,
}

/// A batch job: its id and the file its output goes to.
#[derive(Debug, Clone)]
pub struct BatchJob {
    pub id: u64,
    pub output: PathBuf,
}

impl BatchJob {
    /// What the job has written so far.
    pub fn output_text(&self) -> String {
        std::fs::read_to_string(&self.output).unwrap_or_default()
    }
}

impl SlurmCluster {
    /// Starts the cluster, its hooks talking to a gpushared on [`SlurmCluster::socket`], and
    /// waits until its node is idle. `None` where `test` cannot run (not root, or Slurm not
    /// installed): it then says SKIPPED, or fails where tests needing root must run
    /// ([`crate::root_required`]).
    pub fn start(test: &str) -> Option<SlurmCluster> {
        if !root_or_skip(test) {
            return None;
        }
        let mut programs = BTreeMap::new();
        let mut missing = Vec::new();
        for name in PROGRAMS {
            match find_program(name) {
                Some(path) => {
                    programs.insert(name, path);
                }
                None => missing.push(name),
            }
        }
        if !missing.is_empty() {
            skip_or_fail(
                test,
                &format!(
                    "Slurm is not installed (no {}): scripts/setup.sh installs the packages slurmd, slurmctld, slurm-client and munge when run as root",
                    missing.join(", ")
                ),
            );
            return None;
        }
        let dir = tempfile::Builder::new()
            .prefix("gpushare-slurm")
            .tempdir()
            .expect("temp dir");
        set_mode(dir.path(), 0o755);
        for (sub, mode) in [
            ("state", 0o700),
            ("spool", 0o755),
            ("log", 0o755),
            ("bin", 0o755),
            ("work", 0o1777),
        ] {
            let path = dir.path().join(sub);
            std::fs::create_dir(&path).expect("mkdir");
            set_mode(&path, mode);
        }
        let unreachable: Vec<&Path> = dir
            .path()
            .ancestors()
            .skip(1)
            .filter(|d| std::fs::metadata(d).is_ok_and(|m| m.permissions().mode() & 0o001 == 0))
            .collect();
        assert!(
            unreachable.is_empty(),
            "{test}: jobs' users cannot reach the cluster's directory {} (no search permission on {unreachable:?}): set TMPDIR to a directory every user may enter",
            dir.path().display()
        );
        ensure_munged(&dir.path().join("log/munged.out"))
            .unwrap_or_else(|e| panic!("{test}: munged is installed but does not run: {e}"));

        let mut cluster = SlurmCluster {
            node: short_hostname(),
            dir,
            programs,
            daemons: Vec::new(),
        };
        cluster.copy_gpushare();
        cluster.write_hooks();
        cluster.write_config();
        for daemon in ["slurmctld", "slurmd"] {
            let out = cluster.log_dir().join(format!("{daemon}.out"));
            let out = std::fs::File::create(out).expect("daemon output file");
            let child = cluster
                .command(daemon)
                .arg("-D")
                .stdin(Stdio::null())
                .stdout(out.try_clone().expect("dup"))
                .stderr(out)
                .spawn()
                .unwrap_or_else(|e| panic!("{test}: cannot start {daemon}: {e}"));
            cluster.daemons.push((daemon, child));
        }
        if let Err(e) = cluster.wait_node_idle(Duration::from_secs(60)) {
            // Dropped as the panic unwinds, the cluster prints its logs.
            panic!("{test}: the Slurm node did not come up: {e}");
        }
        Some(cluster)
    }

    /// The cluster's slurm.conf: what `SLURM_CONF` must name for Slurm's commands (and
    /// gpushared's own calls of them) to reach this cluster.
    pub fn conf(&self) -> PathBuf {
        self.dir.path().join("slurm.conf")
    }

    /// Where the hooks expect gpushared's socket (a directory every user may enter).
    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("gpushare.sock")
    }

    /// A directory every user may read, holding copies of gpushare's CLI and libraries (the
    /// hooks run these), and what a test puts there for jobs to run.
    pub fn bin_dir(&self) -> PathBuf {
        self.dir.path().join("bin")
    }

    /// The `gpushare` CLI every user may run (with its libraries beside it).
    pub fn gpushare(&self) -> PathBuf {
        self.bin_dir().join("gpushare")
    }

    /// The jobs' working directory: every user may write there (mode 1777).
    pub fn work_dir(&self) -> PathBuf {
        self.dir.path().join("work")
    }

    /// The node's name (this machine's short host name).
    pub fn node(&self) -> &str {
        &self.node
    }

    fn log_dir(&self) -> PathBuf {
        self.dir.path().join("log")
    }

    fn program(&self, name: &str) -> &Path {
        self.programs
            .get(name)
            .unwrap_or_else(|| panic!("{name} is not one of the cluster's programs"))
    }

    /// One of Slurm's programs, run as root with a clean environment that names this
    /// cluster's configuration.
    pub fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(self.program(program));
        cmd.env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
            .env("SLURM_CONF", self.conf())
            .env("LANG", "C")
            .current_dir(self.work_dir());
        cmd
    }

    /// [`SlurmCluster::command`], run as `user` (HOME and USER set as a login sets them).
    pub fn command_as(&self, user: &SystemUser, program: &str) -> Command {
        let mut cmd = self.command(program);
        cmd.env("USER", &user.name).env("HOME", "/");
        user.apply(&mut cmd);
        cmd
    }

    /// `srun` as `user`, in the jobs' working directory, with `args` (options, then the
    /// program and its arguments). The step's standard input is srun's: piped in, it reaches
    /// the task.
    pub fn srun_as(&self, user: &SystemUser, args: &[&str]) -> Command {
        let mut cmd = self.command_as(user, "srun");
        cmd.arg(format!("--chdir={}", self.work_dir().display()))
            .arg("--time=10")
            .args(args);
        cmd
    }

    /// Submits `script` (a shell script's body) as a batch job of `user`, with `args`
    /// (sbatch's options); its output goes to a file in the working directory.
    pub fn sbatch_as(&self, user: &SystemUser, args: &[&str], script: &str) -> BatchJob {
        use std::sync::atomic::{AtomicU32, Ordering};
        static SCRIPTS: AtomicU32 = AtomicU32::new(0);
        let n = SCRIPTS.fetch_add(1, Ordering::Relaxed);
        let path = self.work_dir().join(format!("batch-{n}.sh"));
        std::fs::write(&path, format!("#!/bin/sh\n{script}\n")).expect("write the batch script");
        set_mode(&path, 0o755);
        let output_pattern = self.work_dir().join("job-%j.out");
        let out = self
            .command_as(user, "sbatch")
            .arg("--parsable")
            .arg(format!("--chdir={}", self.work_dir().display()))
            .arg(format!("--output={}", output_pattern.display()))
            .arg("--time=10")
            .args(args)
            .arg(&path)
            .output()
            .expect("run sbatch");
        let text = String::from_utf8_lossy(&out.stdout);
        let id = text
            .trim()
            .split(';')
            .next()
            .and_then(|id| id.parse().ok())
            .filter(|_| out.status.success())
            .unwrap_or_else(|| {
                panic!(
                    "sbatch {args:?} as {} failed ({}): {text}{}\n{}",
                    user.name,
                    out.status,
                    String::from_utf8_lossy(&out.stderr),
                    self.diagnostics()
                )
            });
        BatchJob {
            id,
            output: self.work_dir().join(format!("job-{id}.out")),
        }
    }

    /// Cancels job `id` (as root, as an administrator would).
    pub fn scancel(&self, id: u64) {
        let out = self
            .command("scancel")
            .arg(id.to_string())
            .output()
            .expect("run scancel");
        assert!(
            out.status.success(),
            "scancel {id}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The job's state as slurmctld reports it (`RUNNING`, `COMPLETING`, `CANCELLED`, …), or
    /// `None` if it knows no such job.
    pub fn job_state(&self, id: u64) -> Option<String> {
        let out = self
            .command("scontrol")
            .args(["show", "job", "--oneliner", &id.to_string()])
            .output()
            .ok()?;
        if !out.status.success() {
            return None;
        }
        field(&String::from_utf8_lossy(&out.stdout), "JobState")
    }

    /// Waits until job `id` is over, its epilog included.
    pub fn wait_job_gone(&self, id: u64, timeout: Duration) -> bool {
        wait_until(timeout, || {
            self.job_state(id)
                .is_none_or(|s| ENDED.contains(&s.as_str()))
        })
    }

    /// The id of the newest job named `name` (sbatch's and srun's `--job-name`), whatever its
    /// state.
    pub fn job_id_named(&self, name: &str) -> Option<u64> {
        let out = self
            .command("squeue")
            .args(["--noheader", "--states=all", "--format=%i", "--name", name])
            .output()
            .ok()?;
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .max()
    }

    /// The jobs slurmctld still has pending, running or completing.
    pub fn active_jobs(&self) -> Vec<u64> {
        let out = self
            .command("squeue")
            .args(["--noheader", "--format=%i"])
            .output()
            .expect("run squeue");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    /// Cancels every job and waits (up to `timeout`) until all are over; whether they are.
    pub fn cancel_all(&self, timeout: Duration) -> bool {
        let jobs = self.active_jobs();
        for id in &jobs {
            let _ = self.command("scancel").arg(id.to_string()).status();
        }
        jobs.iter().all(|&id| self.wait_job_gone(id, timeout))
    }

    /// Why the node takes no jobs, if it does not: drained (a prolog failed, say) or down.
    pub fn node_unusable(&self) -> Option<String> {
        let out = self
            .command("scontrol")
            .args(["show", "node", "--oneliner", &self.node])
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout);
        let state = field(&text, "State").unwrap_or_default();
        (state.contains("DRAIN") || state.contains("DOWN")).then(|| {
            let reason = text.split_once("Reason=").map_or("", |(_, r)| r.trim());
            format!("the node is {state}: {reason}")
        })
    }

    /// slurmd's log so far.
    pub fn slurmd_log(&self) -> String {
        std::fs::read_to_string(self.log_dir().join("slurmd.log")).unwrap_or_default()
    }

    /// What the hooks (prolog, epilog, task prolog) logged: one line as each starts and ends,
    /// and gpushare's own messages.
    pub fn hooks_log(&self) -> String {
        let mut text = String::new();
        for name in ["hooks.log", "task-prolog.log"] {
            text += &std::fs::read_to_string(self.log_dir().join(name)).unwrap_or_default();
        }
        text
    }

    /// The node's state, the jobs, the hooks' log and the ends of the daemons' logs: for a
    /// failure's message.
    pub fn diagnostics(&self) -> String {
        let run = |program: &str, args: &[&str]| {
            self.command(program)
                .args(args)
                .output()
                .map(|o| {
                    String::from_utf8_lossy(&o.stdout).into_owned()
                        + &String::from_utf8_lossy(&o.stderr)
                })
                .unwrap_or_else(|e| format!("cannot run {program}: {e}"))
        };
        let mut text = format!(
            "--- Slurm cluster {} ---\nnode: {}jobs:\n{}",
            self.dir.path().display(),
            run("scontrol", &["show", "node", "--oneliner", &self.node]),
            run("squeue", &["--states=all", "--format=%i %u %P %j %T %r"]),
        );
        text += &format!("--- hooks ---\n{}", tail(&self.hooks_log(), 60));
        for (name, file) in [("slurmctld", "slurmctld.log"), ("slurmd", "slurmd.log")] {
            let log = std::fs::read_to_string(self.log_dir().join(file)).unwrap_or_default();
            text += &format!("--- {name} ---\n{}", tail(&log, 40));
        }
        // What the daemons said before their logs opened (a configuration they refused).
        for name in ["slurmctld", "slurmd"] {
            let out = std::fs::read_to_string(self.log_dir().join(format!("{name}.out")))
                .unwrap_or_default();
            text += &format!("--- {name}'s first words ---\n{}", head(&out, 10));
        }
        text
    }

    /// Makes a FIFO in the working directory that jobs may read, and opens it: a program
    /// reading it sees end of input once the returned file is dropped.
    pub fn input_fifo(&self, name: &str) -> (PathBuf, std::fs::File) {
        let path = self.work_dir().join(name);
        nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o644))
            .unwrap_or_else(|e| panic!("mkfifo {}: {e}", path.display()));
        set_mode(&path, 0o644);
        // Read and write: the open does not wait for a reader, and a reader's open does not
        // wait either, since there is a writer.
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
        (path, file)
    }
}

impl Drop for SlurmCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let _ =
                std::io::Write::write_all(&mut std::io::stderr(), self.diagnostics().as_bytes());
        }
        if !self.cancel_all(Duration::from_secs(30)) {
            let _ = std::io::Write::write_all(
                &mut std::io::stderr(),
                format!(
                    "the Slurm test cluster's jobs did not all end in 30 s:\n{}",
                    self.diagnostics()
                )
                .as_bytes(),
            );
        }
        // slurmd first: it stops talking to slurmctld, which then has nobody to wait for.
        for (_, child) in self.daemons.iter_mut().rev() {
            let pid = nix::unistd::Pid::from_raw(child.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            let ended = wait_until(Duration::from_secs(10), || {
                matches!(child.try_wait(), Ok(Some(_)))
            });
            if !ended {
                let _ = child.kill();
            }
            let _ = child.wait();
        }
    }
}

/// Runs `cmd` with its output captured, for at most `timeout`: killed past it, its output so
/// far comes back with `None` for a status.
pub fn output_within(
    cmd: &mut Command,
    timeout: Duration,
) -> (Option<std::process::ExitStatus>, String, String) {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
    let readers = [
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    ]
    .map(|stream| {
        std::thread::spawn(move || {
            let mut text = String::new();
            if let Some(mut s) = stream {
                let _ = s.read_to_string(&mut text);
            }
            text
        })
    });
    let mut status = None;
    wait_until(timeout, || {
        status = child.try_wait().ok().flatten();
        status.is_some()
    });
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    let [out, err] = readers.map(|r| r.join().unwrap_or_default());
    (status, out, err)
}

/// Reads `reader`'s lines on a thread of their own, so that a test can wait for one with a
/// timeout: each line arrives on the returned channel.
pub fn lines_of(reader: impl Read + Send + 'static) -> std::sync::mpsc::Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(reader).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

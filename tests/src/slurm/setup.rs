//! Setting up the test cluster: gpushare's files where jobs' users reach them, the hooks,
//! slurm.conf and gres.conf, munged, and what that needs of the machine.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::*;

impl SlurmCluster {
    /// Copies gpushare's CLI and libraries into the bin directory (the built ones may be
    /// where other users cannot reach, under /root), with the `cuda/` directory of links to
    /// the driver that `gpushare run` makes beside a cargo build's binary.
    pub(super) fn copy_gpushare(&self) {
        let bin = self.bin_dir();
        // By `cp`: a writable descriptor of a copy held by this process could leak into a
        // child another test thread forks, and running the copy would then fail (ETXTBSY).
        let copied = Command::new("cp")
            .args(GPUSHARE_FILES.map(binary))
            .arg(&bin)
            .status()
            .expect("run cp");
        assert!(copied.success(), "copying gpushare's files: {copied}");
        for name in GPUSHARE_FILES {
            set_mode(&bin.join(name), 0o755);
        }
        let cuda = bin.join("cuda");
        std::fs::create_dir(&cuda).expect("mkdir cuda");
        set_mode(&cuda, 0o755);
        for name in ["libcuda.so.1", "libcuda.so"] {
            std::os::unix::fs::symlink("../libcuda.so", cuda.join(name)).expect("symlink");
        }
    }

    /// The wrapper scripts slurmd runs as Prolog, Epilog (as root, in an environment of
    /// Slurm's only) and TaskProlog (as the job's user): gpushare's hooks with this cluster's
    /// configuration and the test broker's socket, logging as each starts and ends.
    pub(super) fn write_hooks(&self) {
        let log = self.log_dir().join("hooks.log");
        let task_log = self.log_dir().join("task-prolog.log");
        for file in [&log, &task_log] {
            std::fs::write(file, "").expect("hooks log");
        }
        // The task prolog runs as the job's user.
        set_mode(&task_log, 0o666);
        for (script, subcommand, log) in [
            ("prolog", "prolog", &log),
            ("epilog", "epilog", &log),
            ("task-prolog", "task-prolog", &task_log),
        ] {
            let log = sh_quote(log);
            let text = format!(
                "#!/bin/sh\n\
                 # slurmd's {script} for gpushare's Slurm test (tests/src/slurm.rs).\n\
                 echo \"{script} job $SLURM_JOB_ID step ${{SLURM_STEP_ID:--}} as $(id -un)\" >>{log}\n\
                 SLURM_CONF={conf} GPUSHARE_SOCKET={socket} {gpushare} slurm {subcommand} 2>>{log}\n\
                 rc=$?\n\
                 echo \"{script} job $SLURM_JOB_ID: exit $rc\" >>{log}\n\
                 exit $rc\n",
                conf = sh_quote(&self.conf()),
                socket = sh_quote(&self.socket()),
                gpushare = sh_quote(&self.gpushare()),
            );
            let path = self.bin_dir().join(script);
            std::fs::write(&path, text).expect("write hook");
            set_mode(&path, 0o755);
        }
    }

    pub(super) fn write_config(&self) {
        let dir = self.dir.path();
        let gpu = dir.join("gpu0");
        std::fs::write(&gpu, "").expect("the GPU's device file");
        let (ctld_port, slurmd_port) = free_ports();
        let cpus = self.cpus();
        let node = &self.node;
        let d = dir.display();
        let cluster = format!("gpushare{}", std::process::id());
        let conf = format!(
            "# gpushare's Slurm test cluster (tests/src/slurm.rs): one node, this machine.\n\
             ClusterName={cluster}\n\
             SlurmctldHost={node}(127.0.0.1)\n\
             SlurmctldPort={ctld_port}\n\
             SlurmdPort={slurmd_port}\n\
             SlurmUser=root\n\
             SlurmdUser=root\n\
             AuthType=auth/munge\n\
             ProctrackType=proctrack/linuxproc\n\
             TaskPlugin=task/none\n\
             SelectType=select/cons_tres\n\
             SelectTypeParameters=CR_Core\n\
             GresTypes=gpu,shard\n\
             StateSaveLocation={d}/state\n\
             SlurmdSpoolDir={d}/spool\n\
             SlurmctldPidFile={d}/slurmctld.pid\n\
             SlurmdPidFile={d}/slurmd.pid\n\
             SlurmctldLogFile={d}/log/slurmctld.log\n\
             SlurmdLogFile={d}/log/slurmd.log\n\
             AccountingStorageType=accounting_storage/none\n\
             JobAcctGatherType=jobacct_gather/none\n\
             JobCompType=jobcomp/none\n\
             MpiDefault=none\n\
             ReturnToService=2\n\
             KillWait=5\n\
             PrologEpilogTimeout=60\n\
             PrologFlags=Alloc\n\
             Prolog={d}/bin/prolog\n\
             Epilog={d}/bin/epilog\n\
             TaskProlog={d}/bin/task-prolog\n\
             NodeName={node} NodeAddr=127.0.0.1 NodeHostname={node} CPUs={cpus} Gres=gpu:1,shard:{SHARDS_PER_GPU} State=UNKNOWN\n\
             PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:8\n\
             PartitionName=interactive Nodes={node} MaxTime=INFINITE State=UP OverSubscribe=FORCE:8\n"
        );
        let gres = format!(
            "Name=gpu File={gpu}\nName=shard Count={SHARDS_PER_GPU} File={gpu}\n",
            gpu = gpu.display()
        );
        for (name, text) in [("slurm.conf", conf), ("gres.conf", gres)] {
            let path = dir.join(name);
            std::fs::write(&path, text).expect("write the configuration");
            set_mode(&path, 0o644);
        }
    }

    /// The CPUs slurmd finds here (`slurmd -C`): fewer configured than found is fine, more
    /// would drain the node.
    pub(super) fn cpus(&self) -> usize {
        let found = Command::new(self.program("slurmd"))
            .arg("-C")
            .output()
            .ok()
            .and_then(|o| {
                field(&String::from_utf8_lossy(&o.stdout), "CPUs")?
                    .parse()
                    .ok()
            });
        found.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
    }

    pub(super) fn wait_node_idle(&mut self, timeout: Duration) -> Result<(), String> {
        let start = Instant::now();
        let mut state = String::new();
        while start.elapsed() < timeout {
            for (name, child) in &mut self.daemons {
                if let Ok(Some(status)) = child.try_wait() {
                    return Err(format!("{name} exited ({status})"));
                }
            }
            let out = self
                .command("scontrol")
                .args(["show", "node", "--oneliner", &self.node])
                .output()
                .map_err(|e| format!("cannot run scontrol: {e}"))?;
            let text = String::from_utf8_lossy(&out.stdout);
            state = field(&text, "State").unwrap_or_default();
            if state.contains("DRAIN") {
                return Err(format!("the node is drained: {}", text.trim()));
            }
            if state == "IDLE" {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(format!(
            "the node is still `{state}` after {timeout:?}, not IDLE"
        ))
    }
}

/// Starts munged as Debian's package would, unless it is running already. Tests of one binary
/// start clusters side by side: one of them starts munged, the others wait for it.
pub(super) fn ensure_munged(output: &Path) -> Result<(), String> {
    static STARTING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = STARTING.lock().unwrap_or_else(|e| e.into_inner());
    let live = || std::os::unix::net::UnixStream::connect(MUNGE_SOCKET).is_ok();
    if live() {
        return Ok(());
    }
    let munged = find_program("munged").ok_or("no munged")?;
    let munge = SystemUser::lookup("munge").ok_or("no `munge` account")?;
    // The package makes these the munge account's, and munged refuses to start otherwise;
    // /run/munge is gone after a reboot (systemd's tmpfiles would make it again).
    for dir in [
        "/run/munge",
        "/etc/munge",
        "/var/lib/munge",
        "/var/log/munge",
    ] {
        std::fs::create_dir_all(dir).map_err(|e| format!("mkdir {dir}: {e}"))?;
        let chown = Command::new("chown")
            .args(["-R", "munge:munge", dir])
            .status()
            .map_err(|e| format!("chown: {e}"))?;
        if !chown.success() {
            return Err(format!("chown -R munge:munge {dir}: {chown}"));
        }
    }
    set_mode(Path::new("/run/munge"), 0o755);
    set_mode(Path::new("/etc/munge"), 0o700);
    if !Path::new("/etc/munge/munge.key").exists() {
        // The package's installation makes the key; make one where that did not happen.
        let mut make_key = Command::new(
            find_program("mungekey").ok_or("no munge key, and no mungekey to make one")?,
        );
        munge.apply(make_key.arg("--create"));
        let made = make_key.status().map_err(|e| format!("mungekey: {e}"))?;
        if !made.success() {
            return Err(format!("mungekey --create: {made}"));
        }
    }
    let out = std::fs::File::create(output).map_err(|e| e.to_string())?;
    let mut cmd = Command::new(munged);
    cmd.stdin(Stdio::null())
        .stdout(out.try_clone().map_err(|e| e.to_string())?)
        .stderr(out);
    munge.apply(&mut cmd);
    // munged forks into the background once it serves.
    let status = cmd
        .status()
        .map_err(|e| format!("cannot run munged: {e}"))?;
    // Another process (another test binary) may have started it first: munged then says the
    // socket is taken, and the one that runs serves us too.
    let patience = Duration::from_secs(if status.success() { 10 } else { 2 });
    if wait_until(patience, live) {
        return Ok(());
    }
    Err(format!(
        "munged ({status}) said: {}\nits log: {}",
        std::fs::read_to_string(output).unwrap_or_default(),
        tail(
            &std::fs::read_to_string("/var/log/munge/munged.log").unwrap_or_default(),
            10
        )
    ))
}

/// `name` on `$PATH`, or in the system directories root's `$PATH` may lack (slurmctld,
/// slurmd and munged are in /usr/sbin).
pub(super) fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// This machine's host name up to the first dot: the name slurmd knows its node by.
pub(super) fn short_hostname() -> String {
    // The kernel's name of this machine (its UTS namespace's), as gethostname(2) gives it.
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    match name.trim().split('.').next() {
        Some(short) if !short.is_empty() => short.to_string(),
        _ => "localhost".into(),
    }
}

/// Two TCP ports nothing listens on now.
pub(super) fn free_ports() -> (u16, u16) {
    let bind = || std::net::TcpListener::bind("0.0.0.0:0").expect("bind a free port");
    let (a, b) = (bind(), bind());
    let port = |l: &std::net::TcpListener| l.local_addr().expect("local address").port();
    (port(&a), port(&b))
}

/// The value of `Key=value` in Slurm's one-line output (up to the next space).
pub(super) fn field(text: &str, key: &str) -> Option<String> {
    text.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
        .map(str::to_string)
}

pub(super) fn set_mode(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {mode:o} {}: {e}", path.display()));
}

/// `path` quoted for the shell.
pub(super) fn sh_quote(path: &Path) -> String {
    format!("'{}'", path.display().to_string().replace('\'', r"'\''"))
}

pub(super) fn head(text: &str, lines: usize) -> String {
    let mut out = text.lines().take(lines).collect::<Vec<_>>().join("\n");
    out.push('\n');
    out
}

pub(super) fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    let mut out = all[all.len().saturating_sub(lines)..].join("\n");
    out.push('\n');
    out
}

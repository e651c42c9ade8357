//! A private gpushared for the demo's measurements (`tour`, `cost`), and the demo client
//! processes they run against it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use gpushare::{Monitor, StatusReport};

use super::work::Summary;

/// Which broker, on which device.
#[derive(Debug, clap::Args)]
pub struct BrokerArgs {
    /// The device: auto (the GPU when one is usable, else the sim device), cuda or sim.
    #[arg(long, default_value = "auto")]
    pub backend: String,
    /// The broker binary (default: gpushared next to this program).
    #[arg(long, value_name = "PATH")]
    pub gpushared: Option<PathBuf>,
    /// Run the broker without eBPF telemetry.
    #[arg(long)]
    pub no_telemetry: bool,
}

/// A binary installed or built next to this one.
pub fn sibling(name: &str) -> anyhow::Result<PathBuf> {
    let me = std::env::current_exe().context("cannot find this program's path")?;
    let path = me.with_file_name(name);
    if !path.is_file() {
        bail!(
            "{} not found next to {}: build the workspace (cargo build --release)",
            path.display(),
            me.display()
        );
    }
    Ok(path)
}

/// A private broker: killed, if it is still running, when dropped.
pub struct Broker {
    child: Child,
    pub socket: PathBuf,
    log: PathBuf,
    policy: PathBuf,
}

impl Broker {
    /// Starts gpushared in `dir` with `policy` as its policy file, and waits until it serves.
    pub fn start(args: &BrokerArgs, dir: &Path, policy: &str) -> anyhow::Result<Broker> {
        let bin = match &args.gpushared {
            Some(p) => p.clone(),
            None => sibling("gpushared")?,
        };
        let socket = dir.join("gpushare.sock");
        let log = dir.join("gpushared.log");
        let policy_path = dir.join("policy.toml");
        std::fs::write(&policy_path, policy).context("cannot write the policy file")?;
        let mut cmd = Command::new(&bin);
        cmd.arg("--socket")
            .arg(&socket)
            .args(["--backend", &args.backend, "--socket-mode", "600"])
            .arg("--config")
            .arg(&policy_path)
            .arg("--sim-realtime")
            .args(["--log", "info"])
            .env_remove("RUST_LOG")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).context("cannot create the broker log")?);
        if args.no_telemetry {
            cmd.arg("--no-telemetry");
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("cannot start {}", bin.display()))?;
        let mut broker = Broker {
            child,
            socket,
            log,
            policy: policy_path,
        };
        let started = Instant::now();
        while Monitor::connect(&broker.socket).is_err() {
            if let Some(status) = broker.child.try_wait()? {
                bail!(
                    "gpushared exited ({status}) before it was ready:\n{}",
                    broker.log_text()
                );
            }
            if started.elapsed() > Duration::from_secs(60) {
                bail!("gpushared was not ready in 60 s:\n{}", broker.log_text());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(broker)
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn status(&self) -> anyhow::Result<StatusReport> {
        Ok(Monitor::connect(&self.socket)?.status()?)
    }

    /// Waits until `done` holds for the broker's status.
    pub fn wait_for(&self, what: &str, done: impl Fn(&StatusReport) -> bool) -> anyhow::Result<()> {
        let started = Instant::now();
        loop {
            if done(&self.status()?) {
                return Ok(());
            }
            if started.elapsed() > Duration::from_secs(30) {
                bail!("gave up waiting for {what}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Switches to `policy`, whose scheduler is `scheduler`, as an administrator would: edit,
    /// then reload (SIGHUP).
    pub fn switch_to(&self, scheduler: &str, policy: &str) -> anyhow::Result<()> {
        std::fs::write(&self.policy, policy).context("cannot rewrite the policy")?;
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGHUP,
        )
        .context("cannot signal gpushared")?;
        self.wait_for(&format!("the {scheduler} policy"), |s| {
            s.policy == scheduler
        })
    }

    /// SIGTERM, then the exit status; the socket must be gone.
    pub fn stop(mut self) -> anyhow::Result<()> {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .context("cannot signal gpushared")?;
        let status = self.child.wait()?;
        if !status.success() {
            bail!("gpushared exited with {status}:\n{}", self.log_text());
        }
        if self.socket.exists() {
            bail!("gpushared left its socket behind");
        }
        Ok(())
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A demo client process (this program), reporting its summary as JSON when it ends.
pub struct Worker {
    name: &'static str,
    child: Child,
}

impl Worker {
    /// One that works until its standard input closes (`finish` closes it).
    pub fn start(broker: &Broker, name: &'static str, extra: &[&str]) -> anyhow::Result<Worker> {
        Worker::spawn(broker, name, &[&["--until-eof"], extra].concat())
    }

    /// One that works as `args` say; connected when this returns.
    pub fn spawn(broker: &Broker, name: &'static str, args: &[&str]) -> anyhow::Result<Worker> {
        let child = Command::new(sibling("gpushare-demo")?)
            .args(["--name", name, "--json"])
            .args(args)
            .env("GPUSHARE_SOCKET", &broker.socket)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("cannot start the {name} client"))?;
        let worker = Worker { name, child };
        broker.wait_for(&format!("the {name} client to connect"), |s| {
            s.clients.iter().any(|c| c.name == name)
        })?;
        Ok(worker)
    }

    /// Ends its work and reads its summary; fails unless every result was right.
    pub fn finish(self) -> anyhow::Result<Summary> {
        let name = self.name;
        let summary = self.finish_idle()?;
        if summary.mismatches != 0 || summary.iterations == 0 {
            bail!(
                "the {name} client got {} wrong results in {} iterations",
                summary.mismatches,
                summary.iterations
            );
        }
        Ok(summary)
    }

    /// Ends a client that may have done nothing, and reads its summary.
    pub fn finish_idle(mut self) -> anyhow::Result<Summary> {
        drop(self.child.stdin.take());
        let out = self.child.wait_with_output()?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() {
            bail!("the {} client failed ({}): {stderr}", self.name, out.status);
        }
        let summary: Summary = serde_json::from_slice(&out.stdout).with_context(|| {
            format!(
                "the {} client's summary: {}",
                self.name,
                String::from_utf8_lossy(&out.stdout)
            )
        })?;
        Ok(summary)
    }
}

//! The plugin's side of gpushared: what it serves, and the shares it starts, places and ends,
//! over gpushared's control socket as an administrator. Each call is a connection of its own,
//! so a restarted gpushared is found again.

use std::path::PathBuf;

use anyhow::Context;
use gpushare::Monitor;
use gpushare_protocol::ErrorCode;
use gpushare_protocol::job::{JobGpu, JobStats, PodGrant, PodIdentity};

#[derive(Debug, Clone)]
pub struct Gpushared {
    pub socket: PathBuf,
}

impl Gpushared {
    async fn ask<T: Send + 'static>(
        &self,
        what: &'static str,
        call: impl FnOnce(&mut Monitor) -> gpushare::Result<T> + Send + 'static,
    ) -> anyhow::Result<T> {
        let socket = self.socket.clone();
        tokio::task::spawn_blocking(move || {
            let mut monitor = Monitor::connect(&socket)
                .with_context(|| format!("cannot reach gpushared at {}", socket.display()))?;
            call(&mut monitor).with_context(|| format!("gpushared refused to {what}"))
        })
        .await
        .context("the call to gpushared panicked")?
    }

    /// How many GPUs gpushared serves.
    pub async fn gpus(&self) -> anyhow::Result<usize> {
        self.ask("report its status", |m| m.status().map(|s| s.devices.len()))
            .await
    }

    /// The jobs (Slurm's and containers') gpushared holds now.
    pub async fn jobs(&self) -> anyhow::Result<Vec<JobStats>> {
        self.ask("report its status", |m| m.status().map(|s| s.jobs))
            .await
    }

    /// The UUID of GPU `gpu`, as NVML writes it.
    pub async fn uuid(&self, gpu: u32) -> anyhow::Result<String> {
        self.ask("report its status", move |m| m.status())
            .await?
            .devices
            .iter()
            .find(|d| d.index == gpu)
            .map(|d| d.uuid_text())
            .with_context(|| format!("gpushared serves no GPU {gpu}"))
    }

    /// Starts the shares `gpus` of a container: its job and its socket directory.
    pub async fn start(&self, gpus: Vec<JobGpu>) -> anyhow::Result<PodGrant> {
        self.ask("start a container's shares", move |m| m.pod_start(gpus))
            .await
    }

    /// Tells gpushared which pod holds job `job`.
    pub async fn identify(&self, job: u64, pod: PodIdentity) -> anyhow::Result<JobStats> {
        self.ask("place a container's shares", move |m| {
            m.pod_identify(job, pod)
        })
        .await
    }

    /// Ends job `job` (one gpushared no longer holds is ended already).
    pub async fn end(&self, job: u64) -> anyhow::Result<()> {
        self.ask("end a container's shares", move |m| match m.job_end(job) {
            Err(gpushare::Error::Request(e)) if e.code == ErrorCode::NotFound => Ok(()),
            other => other.map(drop),
        })
        .await
    }
}

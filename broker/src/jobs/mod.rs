//! Batch scheduler jobs (Slurm) that hold shares of this machine's GPUs: each job's grant, the
//! device memory its sessions hold against it, and what they have used. Slurm's prolog starts a
//! job here and its epilog ends it (`server/jobs.rs`); a session runs on its job's grant when
//! its process is in the job (`slurm.rs` finds out which job a process is in).
//!
//! A Kubernetes container's shares are a job as well, numbered here from
//! [`POD_JOB_BASE`] up (`server/pods.rs`): its sessions are those through its own socket, and
//! its class (and the user it counts as) changes once the kubelet plugin says which pod holds
//! it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use gpushare_protocol::ErrorCode;
use gpushare_protocol::PriorityClass;
use gpushare_protocol::job::{JobGpu, JobStart, JobStats, POD_JOB_BASE, PodIdentity, total_shards};

use crate::access::{Grant, SlurmPolicy};
use crate::accounts::MemoryTally;

pub mod saved;
pub mod slurm;

/// One job's grant and its use.
#[derive(Debug)]
pub struct Job {
    pub id: u64,
    pub uid: u32,
    pub user: String,
    /// Each GPU it holds shares of, shards resolved; never empty.
    pub gpus: Vec<JobGpu>,
    pub partition: Option<String>,
    pub qos: Option<String>,
    /// Its class, and for a Kubernetes container's shares the pod that holds them and the
    /// user the policy maps it to (all change once the pod is known).
    placed: Mutex<Placed>,
    weight: u32,
    /// Device memory its sessions hold, against what they together may.
    memory: MemoryTally,
    /// The memory of the GPUs it holds shares of: its quota at most.
    gpus_memory: u64,
    sessions_total: AtomicU64,
    /// GPU time of its sessions that have ended.
    ended_gpu_ns: AtomicU64,
    started: Instant,
}

#[derive(Debug, Clone)]
struct Placed {
    class: PriorityClass,
    pod: Option<PodIdentity>,
    /// Uid and name it counts as instead of `Job::uid`, `Job::user`.
    owner: Option<(u32, String)>,
}

impl Job {
    fn placed(&self) -> MutexGuard<'_, Placed> {
        self.placed.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The pod that holds these shares (once known), the class that gives them, and the user
    /// the policy counts them as (`None`: whoever started them).
    pub fn set_pod(&self, pod: PodIdentity, class: PriorityClass, owner: Option<(u32, String)>) {
        *self.placed() = Placed {
            class,
            pod: Some(pod),
            owner,
        };
    }

    pub fn pod(&self) -> Option<PodIdentity> {
        self.placed().pod.clone()
    }

    /// Whether gpushared numbered it for a Kubernetes container.
    pub fn is_pod(&self) -> bool {
        self.id >= POD_JOB_BASE
    }

    /// What its sessions run on.
    pub fn grant(&self) -> Grant {
        Grant {
            class: self.placed().class,
            weight: self.weight,
            memory_quota: Some(self.quota()),
        }
    }

    pub fn quota(&self) -> u64 {
        self.memory.quota().unwrap_or(u64::MAX)
    }

    /// An administrator's new quota for the job (`None`: as much as its GPUs have; never
    /// more).
    pub fn set_quota(&self, quota: Option<u64>) {
        let most = self.gpus_memory;
        self.memory
            .set_quota(Some(quota.map_or(most, |q| q.min(most))));
    }

    pub fn memory_used(&self) -> u64 {
        self.memory.used()
    }

    /// The GPU a session of the job runs on: the one it asked for if the job holds shares of
    /// it, else the job's first. A GPU the job lacks is not refused: a program asks by
    /// `CUDA_VISIBLE_DEVICES`, which Slurm may number from 0 for the task's own devices.
    pub fn gpu_for(&self, asked: Option<u32>) -> u32 {
        match asked {
            Some(g) if self.gpus.iter().any(|j| j.gpu == g) => g,
            _ => self.gpus[0].gpu,
        }
    }

    /// Counts `bytes` more if the job's sessions together stay within its quota (else
    /// `OutOfQuota`, and nothing changes).
    pub fn charge(&self, bytes: u64) -> Result<(), ErrorCode> {
        self.memory.charge(bytes)
    }

    /// Counts `bytes` the job's session holds already, whatever the quota.
    pub fn charge_held(&self, bytes: u64) {
        self.memory.charge_held(bytes);
    }

    /// Gives `bytes` back (never below zero).
    pub fn release(&self, bytes: u64) {
        self.memory.release(bytes);
    }

    /// A session of the job has started.
    pub fn session_started(&self) {
        self.sessions_total.fetch_add(1, Ordering::Relaxed);
    }

    /// A session of the job has ended, having used `gpu_ns` of GPU time.
    pub fn session_ended(&self, gpu_ns: u64) {
        let _ = self
            .ended_gpu_ns
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
                Some(t.saturating_add(gpu_ns))
            });
    }

    /// Its figures, with `live` (sessions open now and their GPU time so far) from the
    /// registry.
    pub fn stats(&self, live: (u32, u64)) -> JobStats {
        let Placed { class, pod, owner } = self.placed().clone();
        let (uid, user) = owner.unwrap_or_else(|| (self.uid, self.user.clone()));
        JobStats {
            job: self.id,
            uid,
            user,
            gpus: self.gpus.clone(),
            partition: self.partition.clone(),
            qos: self.qos.clone(),
            class,
            weight: self.weight,
            memory_quota: self.quota(),
            memory_used: self.memory_used(),
            sessions: live.0,
            sessions_total: self.sessions_total.load(Ordering::Relaxed),
            gpu_time_ns: self
                .ended_gpu_ns
                .load(Ordering::Relaxed)
                .saturating_add(live.1),
            age_ms: self.started.elapsed().as_millis() as u64,
            evicted_at_end: 0,
            pod,
        }
    }
}

/// Why a job could not start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JobRefusal {
    #[error(
        "this gpushared's policy has no [slurm] section, so it takes no Slurm jobs; add one (docs/slurm.md)"
    )]
    NoSlurm,
    #[error("Slurm job {job} names GPU {gpu}, but this gpushared serves GPU{} 0..={}", if *.count > 1 { "s" } else { "" }, .count.saturating_sub(1))]
    NoSuchGpu { job: u64, gpu: u32, count: usize },
    #[error("Slurm job {0} holds no shares of any GPU here")]
    NoShares(u64),
}

impl JobRefusal {
    pub fn code(&self) -> ErrorCode {
        match self {
            JobRefusal::NoSlurm => ErrorCode::NotSupported,
            JobRefusal::NoSuchGpu { .. } | JobRefusal::NoShares(_) => ErrorCode::InvalidArgument,
        }
    }
}

/// What shares of a GPU are worth, and the class they run in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shares {
    pub shards_per_gpu: u32,
    pub class: PriorityClass,
}

impl Shares {
    /// Device memory `shards` of a GPU of `gpu_memory` bytes are worth (never more than all).
    pub fn memory_for(&self, shards: u32, gpu_memory: u64) -> u64 {
        let per_gpu = self.shards_per_gpu.max(1);
        let shards = shards.min(per_gpu) as u128;
        (gpu_memory as u128 * shards / per_gpu as u128) as u64
    }
}

/// The jobs holding shares here, by id.
#[derive(Debug, Default)]
pub struct Jobs {
    jobs: Mutex<BTreeMap<u64, Arc<Job>>>,
    /// Kubernetes containers' shares numbered so far.
    pods: AtomicU64,
}

impl Jobs {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<u64, Arc<Job>>> {
        self.jobs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts `start` on the grant `policy` gives it; `gpu_memory` is each GPU's memory by
    /// index. A job that is here already (its prolog ran twice) stays as it is: its sessions
    /// hold memory against that grant.
    pub fn start(
        &self,
        start: &JobStart,
        policy: &SlurmPolicy,
        gpu_memory: &[u64],
    ) -> Result<Arc<Job>, JobRefusal> {
        let shares = policy.shares(start.partition.as_deref(), start.qos.as_deref());
        self.start_with(start, shares, gpu_memory)
    }

    /// Starts shares of the GPUs a Kubernetes container was allocated, under a job id of its
    /// own; the pod that holds them is not known yet.
    pub fn start_pod(
        &self,
        gpus: &[JobGpu],
        shares: Shares,
        gpu_memory: &[u64],
    ) -> Result<Arc<Job>, JobRefusal> {
        let n = self.pods.fetch_add(1, Ordering::Relaxed);
        self.pod_as(POD_JOB_BASE.saturating_add(n), gpus, shares, gpu_memory)
    }

    /// Starts a Kubernetes container's shares again under the id they had (gpushared
    /// restarted); containers started later are numbered after it.
    pub fn restart_pod(
        &self,
        job: u64,
        gpus: &[JobGpu],
        shares: Shares,
        gpu_memory: &[u64],
    ) -> Result<Arc<Job>, JobRefusal> {
        let next = job.saturating_sub(POD_JOB_BASE).saturating_add(1);
        self.pods.fetch_max(next, Ordering::Relaxed);
        self.pod_as(job, gpus, shares, gpu_memory)
    }

    fn pod_as(
        &self,
        job: u64,
        gpus: &[JobGpu],
        shares: Shares,
        gpu_memory: &[u64],
    ) -> Result<Arc<Job>, JobRefusal> {
        let start = JobStart {
            job,
            uid: 0,
            user: "kubernetes".into(),
            gpus: gpus.to_vec(),
            partition: None,
            qos: None,
        };
        self.start_with(&start, shares, gpu_memory)
    }

    /// Every Kubernetes container's shares here, to be kept across a restart.
    pub fn pod_starts(&self) -> Vec<saved::SavedPod> {
        self.all()
            .iter()
            .filter(|j| j.is_pod())
            .map(|j| saved::SavedPod {
                job: j.id,
                gpus: j.gpus.clone(),
                pod: j.pod(),
            })
            .collect()
    }

    fn start_with(
        &self,
        start: &JobStart,
        shares: Shares,
        gpu_memory: &[u64],
    ) -> Result<Arc<Job>, JobRefusal> {
        let per_gpu = shares.shards_per_gpu;
        let mut gpus: Vec<JobGpu> = Vec::new();
        for g in &start.gpus {
            if g.gpu as usize >= gpu_memory.len() {
                return Err(JobRefusal::NoSuchGpu {
                    job: start.job,
                    gpu: g.gpu,
                    count: gpu_memory.len(),
                });
            }
            let shards = g.shards.unwrap_or(per_gpu).min(per_gpu);
            match gpus.iter_mut().find(|j| j.gpu == g.gpu) {
                Some(j) => {
                    j.shards = Some(j.shards.unwrap_or(0).saturating_add(shards).min(per_gpu))
                }
                None => gpus.push(JobGpu {
                    gpu: g.gpu,
                    shards: Some(shards),
                }),
            }
        }
        gpus.retain(|g| g.shards.unwrap_or(0) > 0);
        if gpus.is_empty() {
            return Err(JobRefusal::NoShares(start.job));
        }
        let quota = gpus
            .iter()
            .map(|g| {
                let memory = gpu_memory.get(g.gpu as usize).copied().unwrap_or(0);
                shares.memory_for(g.shards.unwrap_or(0), memory)
            })
            .fold(0, u64::saturating_add);
        let gpus_memory = gpus
            .iter()
            .map(|g| gpu_memory.get(g.gpu as usize).copied().unwrap_or(0))
            .fold(0, u64::saturating_add);
        let shards = total_shards(&gpus);
        let mut jobs = self.lock();
        if let Some(job) = jobs.get(&start.job) {
            return Ok(job.clone());
        }
        let job = Arc::new(Job {
            id: start.job,
            uid: start.uid,
            user: start.user.clone(),
            gpus,
            partition: start.partition.clone(),
            qos: start.qos.clone(),
            placed: Mutex::new(Placed {
                class: shares.class,
                pod: None,
                owner: None,
            }),
            weight: shards.max(1),
            memory: MemoryTally::new(Some(quota)),
            gpus_memory,
            sessions_total: AtomicU64::new(0),
            ended_gpu_ns: AtomicU64::new(0),
            started: Instant::now(),
        });
        jobs.insert(start.job, job.clone());
        Ok(job)
    }

    /// Every Slurm job here as its prolog started it (shards resolved), to be kept across a
    /// restart (containers' shares are kept apart: `pod_starts`).
    pub fn slurm_starts(&self) -> Vec<JobStart> {
        self.all()
            .iter()
            .filter(|j| !j.is_pod())
            .map(|j| JobStart {
                job: j.id,
                uid: j.uid,
                user: j.user.clone(),
                gpus: j.gpus.clone(),
                partition: j.partition.clone(),
                qos: j.qos.clone(),
            })
            .collect()
    }

    /// The job `id`, if it holds shares here.
    pub fn get(&self, id: u64) -> Option<Arc<Job>> {
        self.lock().get(&id).cloned()
    }

    /// Ends job `id`: its grant goes (its sessions still open are the caller's to evict).
    pub fn end(&self, id: u64) -> Option<Arc<Job>> {
        self.lock().remove(&id)
    }

    /// Every job here, by id.
    pub fn all(&self) -> Vec<Arc<Job>> {
        self.lock().values().cloned().collect()
    }
}

#[cfg(test)]
mod tests;

//! Batch scheduler jobs as administrators (Slurm's prolog and epilog) start and end them, and
//! their figures in the status report.

use std::sync::Arc;
use std::time::{Duration, Instant};

use gpushare_protocol::ErrorCode;
use gpushare_protocol::error::WireError;
use gpushare_protocol::job::{JobStart, JobStats};
use gpushare_protocol::stats::ClientStats;
use tracing::{info, warn};

use super::Broker;
use crate::access::Identity;
use crate::jobs::Job;

/// How long an ending job's evicted sessions have to give their memory back before the
/// epilog is answered.
const END_WAIT: Duration = Duration::from_secs(5);

impl Broker {
    /// Starts job `start` here on the grant the policy's `[slurm]` gives its shares.
    pub(super) fn admin_job_start(
        &self,
        who: &Identity,
        start: JobStart,
    ) -> Result<JobStats, WireError> {
        self.may_administer(who, "start and end jobs")?;
        let slurm = self.policy.read().ok().and_then(|p| p.slurm());
        let gpu_memory = self.gpu_memory();
        let job = match slurm {
            Some(slurm) => self.jobs.start(&start, &slurm, &gpu_memory),
            None => Err(crate::jobs::JobRefusal::NoSlurm),
        }
        .map_err(|why| WireError::new(why.code(), why.to_string()))?;
        let stats = job.stats(self.live_in(&job, &self.registry.snapshot()));
        info!(job = job.id, user = %job.user, shards = stats.shards(), quota = stats.memory_quota, class = %stats.class, by = who.uid, "Slurm job started");
        self.save_jobs();
        Ok(stats)
    }

    /// Each GPU's memory, by index: what shares of it are worth.
    pub(super) fn gpu_memory(&self) -> Vec<u64> {
        self.gpus
            .iter()
            .map(|g| g.device().info().total_memory)
            .collect()
    }

    /// Keeps the Slurm jobs here in their file, for a restart (`jobs/saved.rs`).
    fn save_jobs(&self) {
        let path = crate::jobs::saved::path_for(&self.config.socket);
        if let Err(e) = crate::jobs::saved::save(&path, self.jobs.slurm_starts()) {
            warn!(file = %path.display(), error = %e, "cannot keep the Slurm jobs' grants for a restart");
        }
    }

    /// Takes back the Slurm jobs a previous gpushared kept, on the grants the policy gives them
    /// now, but those Slurm says (`running`) have ended meanwhile.
    pub(super) async fn restore_jobs<F>(&self, running: impl Fn(u64) -> F)
    where
        F: std::future::Future<Output = Option<bool>>,
    {
        let path = crate::jobs::saved::path_for(&self.config.socket);
        let kept = match crate::jobs::saved::load(&path) {
            Ok(kept) => kept,
            Err(e) => {
                warn!(file = %path.display(), error = %e, "cannot read the Slurm jobs a previous gpushared kept; they are not restored");
                return;
            }
        };
        if kept.is_empty() {
            return;
        }
        let Some(slurm) = self.policy.read().ok().and_then(|p| p.slurm()) else {
            warn!(jobs = kept.len(), file = %path.display(), "Slurm jobs were kept, but the policy has no [slurm] section now: not restored");
            return;
        };
        let gpu_memory = self.gpu_memory();
        for start in kept {
            if running(start.job).await == Some(false) {
                info!(
                    job = start.job,
                    "a kept Slurm job has ended meanwhile: not restored"
                );
                continue;
            }
            match self.jobs.start(&start, &slurm, &gpu_memory) {
                Ok(job) => {
                    info!(job = job.id, user = %job.user, quota = job.quota(), "Slurm job's grant restored")
                }
                Err(why) => {
                    warn!(job = start.job, %why, "a kept Slurm job cannot be restored")
                }
            }
        }
        self.save_jobs();
    }

    /// Ends job `id`: its grant goes and its sessions still open are evicted; answers once
    /// they have left (or after [`END_WAIT`]) with the job's last figures.
    pub(super) async fn admin_job_end(
        &self,
        who: &Identity,
        id: u64,
    ) -> Result<JobStats, WireError> {
        self.may_administer(who, "start and end jobs")?;
        let job = self.jobs.end(id).ok_or_else(|| {
            WireError::new(
                ErrorCode::NotFound,
                format!("no Slurm job {id} holds shares here"),
            )
        })?;
        // A container's socket first: nothing new comes in while its sessions leave.
        self.pods.close(id);
        if job.is_pod() {
            self.save_pods();
        } else {
            self.save_jobs();
        }
        let why = match job.is_pod() {
            true => format!("the container's GPU shares (job {id}) have ended"),
            false => format!("Slurm job {id} has ended"),
        };
        let open: Vec<u64> = self
            .registry
            .snapshot()
            .iter()
            .filter(|c| c.job == Some(id))
            .map(|c| c.client_id)
            .collect();
        for client in &open {
            if let Some(info) = self.registry.get(*client) {
                info.evict(why.clone());
            }
        }
        let deadline = Instant::now() + END_WAIT;
        while open.iter().any(|c| self.registry.get(*c).is_some()) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let mut stats = job.stats(self.live_in(&job, &self.registry.snapshot()));
        stats.evicted_at_end = open.len() as u32;
        info!(job = id, user = %job.user, gpu_time_ns = stats.gpu_time_ns, evicted = open.len(), by = who.uid, "Slurm job ended");
        Ok(stats)
    }

    /// Every job's figures, its live sessions' from `clients`.
    pub(super) fn job_stats(&self, clients: &[ClientStats]) -> Vec<JobStats> {
        self.jobs
            .all()
            .iter()
            .map(|job| job.stats(self.live_in(job, clients)))
            .collect()
    }

    /// The sessions of `job` among `clients`, and their GPU time.
    pub(super) fn live_in(&self, job: &Arc<Job>, clients: &[ClientStats]) -> (u32, u64) {
        clients
            .iter()
            .filter(|c| c.job == Some(job.id))
            .fold((0, 0), |(n, t), c| {
                (n + 1, u64::saturating_add(t, c.gpu_time_ns))
            })
    }
}

#[cfg(test)]
mod tests {
    use gpushare_protocol::PriorityClass;
    use gpushare_protocol::job::JobGpu;

    use super::*;
    use crate::access::Policy;
    use crate::server::testing::{identity, register_in_job, sim_broker};

    fn slurm_broker() -> Arc<Broker> {
        let broker = sim_broker(1);
        let policy = Policy::parse(
            "[slurm]\nshards_per_gpu = 4\n[slurm.partitions]\ninteractive = \"high\"\n",
            "test",
        )
        .expect("policy");
        *broker.policy.write().expect("policy lock") = policy;
        broker
    }

    fn start(job: u64, shards: u32) -> JobStart {
        JobStart {
            job,
            uid: 1000,
            user: "alice".into(),
            gpus: vec![JobGpu {
                gpu: 0,
                shards: Some(shards),
            }],
            partition: Some("interactive".into()),
            qos: None,
        }
    }

    #[tokio::test]
    async fn only_admins_start_and_end_jobs() {
        let broker = slurm_broker();
        let alice = identity(1000, &[]);
        let refused = broker.admin_job_start(&alice, start(5, 1));
        assert_eq!(
            refused.map_err(|e| e.code),
            Err(ErrorCode::PermissionDenied)
        );
        let ended = broker.admin_job_end(&alice, 5).await;
        assert_eq!(ended.map_err(|e| e.code), Err(ErrorCode::PermissionDenied));
    }

    #[tokio::test]
    async fn a_started_job_shows_its_grant_and_its_sessions_in_the_status() {
        let broker = slurm_broker();
        let root = identity(0, &[]);
        let granted = broker
            .admin_job_start(&root, start(12, 2))
            .expect("started");
        let gpu_memory = broker.gpus[0].device().info().total_memory;
        assert_eq!(granted.memory_quota, gpu_memory / 2);
        assert_eq!((granted.class, granted.weight), (PriorityClass::High, 2));
        let job = broker.jobs.get(12).expect("held");
        let session = register_in_job(&broker, 4242, &job);
        session.counters.add_gpu_time(1_000);
        let report = broker.status();
        assert_eq!(report.jobs.len(), 1);
        assert_eq!(report.jobs[0].sessions, 1);
        assert_eq!(report.jobs[0].gpu_time_ns, 1_000);
        let client = report
            .clients
            .iter()
            .find(|c| c.pid == 4242)
            .expect("client");
        assert_eq!(client.job, Some(12));
        assert_eq!(client.memory_quota, Some(gpu_memory / 2));
    }

    #[tokio::test]
    async fn an_ended_job_s_sessions_are_evicted_and_it_is_gone() {
        let broker = slurm_broker();
        let root = identity(0, &[]);
        broker.admin_job_start(&root, start(7, 1)).expect("started");
        let job = broker.jobs.get(7).expect("held");
        let session = register_in_job(&broker, 4343, &job);
        // The session's data thread: it leaves once told to stop.
        let leaving = {
            let (broker, session) = (broker.clone(), session.clone());
            tokio::spawn(async move {
                while session.eviction().is_none() {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                broker.registry.remove(session.id);
            })
        };
        let ended = broker.admin_job_end(&root, 7).await.expect("ended");
        leaving.await.expect("the session left");
        assert_eq!(ended.evicted_at_end, 1);
        assert_eq!(session.eviction().as_deref(), Some("Slurm job 7 has ended"));
        assert!(broker.status().jobs.is_empty());
        let again = broker.admin_job_end(&root, 7).await;
        assert_eq!(again.map_err(|e| e.code), Err(ErrorCode::NotFound));
    }

    /// A broker of one sim GPU with `[slurm]`, listening (in name) in `dir`.
    fn slurm_broker_in(dir: &std::path::Path) -> Arc<Broker> {
        let broker = crate::server::testing::sim_broker_with(
            1,
            crate::config::BrokerConfig {
                socket: dir.join("gpushare.sock"),
                ..crate::config::BrokerConfig::default()
            },
        );
        let policy = Policy::parse("[slurm]\nshards_per_gpu = 4\n", "test").expect("policy");
        *broker.policy.write().expect("policy lock") = policy;
        broker
    }

    #[tokio::test]
    async fn a_restarted_broker_takes_back_the_slurm_jobs_still_running() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = identity(0, &[]);
        let first = slurm_broker_in(dir.path());
        first.admin_job_start(&root, start(12, 2)).expect("started");
        first.admin_job_start(&root, start(13, 1)).expect("started");
        first.admin_job_start(&root, start(14, 1)).expect("started");
        first.admin_job_end(&root, 14).await.expect("ended");
        let quota = first.jobs.get(12).expect("held").quota();
        drop(first);

        // Slurm says job 13 ended while gpushared was away.
        let second = slurm_broker_in(dir.path());
        second
            .restore_jobs(|id| std::future::ready((id == 13).then_some(false)))
            .await;
        let restored: Vec<u64> = second.status().jobs.iter().map(|j| j.job).collect();
        assert_eq!(restored, [12]);
        assert_eq!(second.jobs.get(12).expect("restored").quota(), quota);
        second.admin_job_end(&root, 12).await.expect("ended");

        let third = slurm_broker_in(dir.path());
        third.restore_jobs(|_| std::future::ready(None)).await;
        assert!(third.status().jobs.is_empty(), "an ended job stays ended");
    }

    #[test]
    fn a_broker_without_slurm_in_its_policy_takes_no_jobs() {
        let broker = sim_broker(1);
        let refused = broker.admin_job_start(&identity(0, &[]), start(1, 1));
        assert_eq!(refused.map_err(|e| e.code), Err(ErrorCode::NotSupported));
    }
}

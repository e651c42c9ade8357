//! Kubernetes containers' shares across a restart of gpushared: kept in `pods/pods.toml`
//! whenever one starts, is placed or ends (`jobs/saved.rs`), and taken back when gpushared
//! starts, each under its old id, placed as its pod was, and with its socket opened again in
//! the directory the container has mounted. A container whose directory is gone is not taken
//! back; directories no kept container owns are removed.

use std::collections::BTreeSet;

use tracing::{info, warn};

use super::Broker;
use crate::jobs::saved;

impl Broker {
    /// Keeps the containers' shares here in their file, for a restart.
    pub(super) fn save_pods(&self) {
        let path = self.pods_dir().join(saved::PODS_FILE);
        if let Err(e) = saved::save_pods(&path, self.jobs.pod_starts()) {
            warn!(file = %path.display(), error = %e, "cannot keep the Kubernetes containers' shares for a restart");
        }
    }

    /// Takes back the containers' shares a previous gpushared kept.
    pub(super) fn restore_pods(&self) {
        let dir = self.pods_dir();
        let path = dir.join(saved::PODS_FILE);
        let kept = match saved::load_pods(&path) {
            Ok(kept) => kept,
            Err(e) => {
                warn!(file = %path.display(), error = %e, "cannot read the Kubernetes containers' shares a previous gpushared kept; they are not restored");
                Vec::new()
            }
        };
        let kubernetes = self.policy.read().ok().and_then(|p| p.kubernetes());
        if kubernetes.is_none() && !kept.is_empty() {
            warn!(
                containers = kept.len(),
                "Kubernetes containers' shares were kept, but the policy has no [kubernetes] section now: not restored"
            );
        }
        let gpu_memory = self.gpu_memory();
        let mut restored = BTreeSet::new();
        for pod in kept.into_iter().filter(|_| kubernetes.is_some()) {
            let Some(shares) = kubernetes.as_ref().map(|k| k.shares(None)) else {
                break;
            };
            if !dir.join(pod.job.to_string()).is_dir() {
                info!(
                    job = pod.job,
                    "a kept container's socket directory is gone: not restored"
                );
                continue;
            }
            let job = match self
                .jobs
                .restart_pod(pod.job, &pod.gpus, shares, &gpu_memory)
            {
                Ok(job) => job,
                Err(why) => {
                    warn!(job = pod.job, %why, "a kept container's shares cannot be restored");
                    continue;
                }
            };
            if let Some(identity) = pod.pod {
                self.place_pod(&job, identity);
            }
            match self.open_pod_socket(&job, false) {
                Ok(socket) => {
                    restored.insert(job.id.to_string());
                    info!(job = job.id, socket = %socket.display(), "Kubernetes container's shares restored");
                }
                Err(e) => {
                    self.jobs.end(job.id);
                    warn!(job = job.id, error = %e, "cannot open a kept container's socket again: not restored");
                }
            }
        }
        // What no kept container owns: left by a gpushared that did not keep it.
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if entry.path().is_dir() && !restored.contains(&name) {
                    let _ = std::fs::remove_dir_all(entry.path());
                }
            }
        }
        self.save_pods();
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use gpushare_protocol::PriorityClass;
    use gpushare_protocol::control::{BrokerMessage, ClientMessage, Role};
    use gpushare_protocol::job::POD_SOCKET_NAME;
    use tokio_seqpacket::UnixSeqpacket;

    use crate::access::Policy;
    use crate::config::BrokerConfig;
    use crate::server::pods::tests::{POLICY, pod, shares};
    use crate::server::testing::{hear_with_fds, hello, identity, say, sim_broker_with};

    #[tokio::test]
    async fn a_restarted_gpushared_takes_back_containers_shares_in_their_own_directories() {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = || BrokerConfig {
            socket: dir.path().join("gpushare.sock"),
            ..BrokerConfig::default()
        };
        let root = identity(0, &[]);
        let pod = pod("ml-prod");
        let first = sim_broker_with(1, config());
        first.set_policy(Policy::parse(POLICY, "test").expect("policy"));
        let kept = first.admin_pod_start(&root, shares(2)).expect("started");
        let a = kept.stats.job;
        first
            .admin_pod_identify(&root, a, pod.clone())
            .expect("identified");
        let gone = first.admin_pod_start(&root, shares(1)).expect("started");
        let inode = |p: &str| std::fs::metadata(p).expect("there").ino();
        let before = inode(&kept.socket_dir);
        // gpushared stops; meanwhile one container goes, and a stray directory is left.
        first.pods.close_all();
        drop(first);
        std::fs::remove_dir_all(&gone.socket_dir).expect("the container went");
        let stray = dir.path().join("pods/12345");
        std::fs::create_dir(&stray).expect("mkdir");

        let second = sim_broker_with(1, config());
        second.set_policy(Policy::parse(POLICY, "test").expect("policy"));
        second.restore_pods();
        let job = second
            .jobs
            .get(a)
            .expect("its shares are back under their id");
        assert_eq!(job.pod(), Some(pod));
        assert_eq!(
            job.grant().class,
            PriorityClass::High,
            "placed as its pod was"
        );
        assert!(second.jobs.get(gone.stats.job).is_none());
        assert!(!stray.exists(), "what no container owns is removed");
        assert_eq!(
            inode(&kept.socket_dir),
            before,
            "the directory the container has mounted"
        );
        let socket = std::path::Path::new(&kept.socket_dir).join(POD_SOCKET_NAME);
        let client = UnixSeqpacket::connect(&socket).await.expect("connect");
        say(&client, &ClientMessage::Hello(hello(Role::Client))).await;
        match hear_with_fds(&client).await.0 {
            BrokerMessage::Welcome(w) => assert_eq!(w.class, PriorityClass::High),
            other => panic!("expected a Welcome, got {other:?}"),
        }
        let next = second.admin_pod_start(&root, shares(1)).expect("started");
        assert!(
            next.stats.job > a,
            "new containers are numbered after the kept ones"
        );
        second.admin_job_end(&root, a).await.expect("ended");
        second
            .admin_job_end(&root, next.stats.job)
            .await
            .expect("ended");
        let saved = dir.path().join("pods").join(crate::jobs::saved::PODS_FILE);
        assert!(!saved.exists(), "no containers, nothing kept");
    }
}

//! Kubernetes containers' shares of the GPUs, as gpushare's kubelet plugin starts them: each is
//! a job (`jobs/`) with a socket of its own, in a directory the container gets mounted. Every
//! session through that socket runs on the job's grant: which pod it is comes from where it
//! connected, which a program cannot forge (docs/kubernetes.md).
//!
//! The sockets live in `pods/` beside the control socket, a directory only root may enter, so
//! that no one on the machine reaches a container's socket except through the container.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use gpushare_protocol::error::WireError;
use gpushare_protocol::job::{JobGpu, JobStats, POD_SOCKET_NAME, PodGrant, PodIdentity};
use gpushare_protocol::{ErrorCode, PriorityClass};
use tokio::task::AbortHandle;
use tokio_seqpacket::UnixSeqpacketListener;
use tracing::{info, warn};

use super::Broker;
use crate::access::Identity;
use crate::jobs::Job;

/// The directory of each container's socket directory, beside the control socket.
const PODS_DIR: &str = "pods";

/// The containers' sockets open now, by job id.
#[derive(Debug, Default)]
pub(super) struct PodSockets {
    open: Mutex<BTreeMap<u64, PodSocket>>,
}

#[derive(Debug)]
struct PodSocket {
    dir: PathBuf,
    accepting: AbortHandle,
}

impl PodSockets {
    fn insert(&self, id: u64, socket: PodSocket) {
        self.open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, socket);
    }

    /// Stops accepting on job `id`'s socket and removes its directory.
    pub(super) fn close(&self, id: u64) {
        let closed = self
            .open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
        if let Some(socket) = closed {
            socket.close();
        }
    }

    /// Every container's socket, as the broker stops. Their directories stay: the next
    /// gpushared opens the sockets again in them (`pods_kept.rs`).
    pub(super) fn close_all(&self) {
        let all = std::mem::take(&mut *self.open.lock().unwrap_or_else(|p| p.into_inner()));
        for socket in all.into_values() {
            socket.accepting.abort();
            let _ = std::fs::remove_file(socket.dir.join(POD_SOCKET_NAME));
        }
    }
}

impl PodSocket {
    fn close(self) {
        self.accepting.abort();
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            warn!(dir = %self.dir.display(), error = %e, "cannot remove a container's socket directory");
        }
    }
}

impl Broker {
    pub(super) fn pods_dir(&self) -> PathBuf {
        self.config
            .socket
            .parent()
            .unwrap_or(Path::new("/"))
            .join(PODS_DIR)
    }

    /// Starts the shares of `gpus` a Kubernetes container was allocated, on the grant the
    /// policy's `[kubernetes]` gives them, and opens their socket.
    pub(super) fn admin_pod_start(
        &self,
        who: &Identity,
        gpus: Vec<JobGpu>,
    ) -> Result<PodGrant, WireError> {
        self.may_administer(who, "start and end jobs")?;
        let Some(kubernetes) = self.policy.read().ok().and_then(|p| p.kubernetes()) else {
            return Err(WireError::new(
                ErrorCode::NotSupported,
                "this gpushared's policy has no [kubernetes] section, so it takes no Kubernetes containers; add one (docs/kubernetes.md)",
            ));
        };
        let gpu_memory = self.gpu_memory();
        let job = self
            .jobs
            .start_pod(&gpus, kubernetes.shares(None), &gpu_memory)
            .map_err(|why| WireError::new(why.code(), why.to_string()))?;
        let dir = match self.open_pod_socket(&job, true) {
            Ok(dir) => dir,
            Err(e) => {
                self.jobs.end(job.id);
                return Err(WireError::new(
                    ErrorCode::Internal,
                    format!("cannot open a socket for the container's shares: {e}"),
                ));
            }
        };
        self.save_pods();
        let stats = job.stats((0, 0));
        info!(job = job.id, shards = stats.shards(), quota = stats.memory_quota, socket = %dir.display(), by = who.uid, "Kubernetes container's shares started");
        Ok(PodGrant {
            stats,
            socket_dir: dir.to_string_lossy().into_owned(),
        })
    }

    /// `job`'s shares are held by `pod`: they take the class (and the user) the policy gives
    /// it, else keep their class. Returns the class.
    pub(super) fn place_pod(&self, job: &Job, pod: PodIdentity) -> PriorityClass {
        let placed = self.policy.read().ok().and_then(|p| p.place_pod(&pod));
        let (class, owner) = match placed {
            Some(p) => (p.class, p.user),
            None => (job.grant().class, None),
        };
        let user = owner.as_ref().map(|(_, name)| name.as_str());
        info!(job = job.id, namespace = %pod.namespace, pod = %pod.pod, container = %pod.container, service_account = ?pod.service_account, user = ?user, %class, "Kubernetes container's shares are its pod's");
        job.set_pod(pod, class, owner);
        class
    }

    /// Opens the socket of `job`'s container and takes its connections: in a new directory
    /// (`fresh`), or again in the one it had (a restart: the container has it mounted).
    pub(super) fn open_pod_socket(&self, job: &Arc<Job>, fresh: bool) -> std::io::Result<PathBuf> {
        let (listener, dir) = bind_pod_socket(&self.pods_dir(), job.id, fresh)?;
        let accepting = tokio::spawn(accept(self.me.clone(), listener, job.clone()));
        self.pods.insert(
            job.id,
            PodSocket {
                dir: dir.clone(),
                accepting: accepting.abort_handle(),
            },
        );
        Ok(dir)
    }

    /// Kubernetes job `id` is held by `pod`: it counts as the user the policy maps the pod's
    /// namespace and service account to, and its class becomes the one the policy gives
    /// (that user's, else the namespace's), for its sessions open now too.
    pub(super) fn admin_pod_identify(
        &self,
        who: &Identity,
        id: u64,
        pod: PodIdentity,
    ) -> Result<JobStats, WireError> {
        self.may_administer(who, "start and end jobs")?;
        let job = self.jobs.get(id).filter(|j| j.is_pod()).ok_or_else(|| {
            WireError::new(
                ErrorCode::NotFound,
                format!("no Kubernetes container's shares are job {id} here"),
            )
        })?;
        let class = self.place_pod(&job, pod);
        self.save_pods();
        let clients = self.registry.snapshot();
        for client in clients.iter().filter(|c| c.job == Some(id)) {
            if let Some(info) = self.registry.get(client.client_id) {
                let mut grant = info.grant();
                grant.class = class;
                info.set_grant(grant);
                if let Some(gpu) = self.gpus.get(info.gpu as usize) {
                    gpu.scheduler
                        .update_client(info.id, grant.class, grant.weight);
                }
            }
        }
        Ok(job.stats(self.live_in(&job, &clients)))
    }
}

/// Makes `pods/ID/gpushare.sock`: `pods/` only root may enter, `ID/` anyone (the container's
/// programs, whatever their uid, reach it through the mount), the socket anyone may connect
/// to. `fresh`: a directory left by an earlier gpushared for the same id is replaced; else the
/// directory must be there (a container that has it mounted sees the new socket only there).
fn bind_pod_socket(
    pods: &Path,
    id: u64,
    fresh: bool,
) -> std::io::Result<(UnixSeqpacketListener, PathBuf)> {
    std::fs::create_dir_all(pods)?;
    std::fs::set_permissions(pods, std::fs::Permissions::from_mode(0o700))?;
    let dir = pods.join(id.to_string());
    let path = dir.join(POD_SOCKET_NAME);
    if fresh {
        if dir.exists() {
            std::fs::remove_dir_all(&dir)?;
        }
        std::fs::create_dir(&dir)?;
    } else if let Err(e) = std::fs::remove_file(&path)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        return Err(e);
    }
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?;
    let listener = UnixSeqpacketListener::bind(&path)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666))?;
    Ok((listener, dir))
}

/// Accepts the container's connections until the job ends (the task is aborted) or the broker
/// is gone.
async fn accept(broker: Weak<Broker>, mut listener: UnixSeqpacketListener, job: Arc<Job>) {
    loop {
        match listener.accept().await {
            Ok(sock) => {
                let Some(broker) = broker.upgrade() else {
                    return;
                };
                let stop = broker.stop.subscribe();
                tokio::spawn(broker.connection(sock, stop, Some(job.clone())));
            }
            Err(e) => {
                warn!(job = job.id, error = %e, "cannot accept a container's connection");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use gpushare_protocol::PriorityClass;
    use gpushare_protocol::control::{BrokerMessage, ClientMessage, Role};
    use gpushare_protocol::job::JobStart;
    use tokio_seqpacket::UnixSeqpacket;

    use super::*;
    use crate::access::Policy;
    use crate::config::BrokerConfig;
    use crate::server::testing::{
        hear, hear_with_fds, hello, identity, say, sim_broker, sim_broker_with,
    };

    pub(in crate::server) const POLICY: &str =
        "[kubernetes]\nshards_per_gpu = 4\n[kubernetes.namespaces]\nml-prod = \"high\"\n";

    pub(in crate::server) fn shares(n: u32) -> Vec<JobGpu> {
        vec![JobGpu {
            gpu: 0,
            shards: Some(n),
        }]
    }

    pub(in crate::server) fn pod(namespace: &str) -> PodIdentity {
        PodIdentity {
            namespace: namespace.into(),
            pod: "trainer-0".into(),
            container: "main".into(),
            service_account: None,
        }
    }

    #[tokio::test]
    async fn only_admins_start_containers_and_only_under_a_kubernetes_policy() {
        let broker = sim_broker(1);
        let refused = broker.admin_pod_start(&identity(0, &[]), shares(1));
        assert_eq!(refused.map_err(|e| e.code), Err(ErrorCode::NotSupported));
        broker.set_policy(Policy::parse(POLICY, "test").expect("policy"));
        let refused = broker.admin_pod_start(&identity(1000, &[]), shares(1));
        assert_eq!(
            refused.map_err(|e| e.code),
            Err(ErrorCode::PermissionDenied)
        );
    }

    #[tokio::test]
    async fn a_container_s_socket_runs_its_sessions_on_its_shares_until_they_end() {
        let dir = tempfile::tempdir().expect("temp dir");
        let broker = sim_broker_with(
            1,
            BrokerConfig {
                socket: dir.path().join("gpushare.sock"),
                ..BrokerConfig::default()
            },
        );
        broker.set_policy(Policy::parse(POLICY, "test").expect("policy"));
        let root = identity(0, &[]);
        let granted = broker.admin_pod_start(&root, shares(2)).expect("started");
        let id = granted.stats.job;
        assert!(id >= gpushare_protocol::job::POD_JOB_BASE);
        let gpu_memory = broker.gpus[0].device().info().total_memory;
        assert_eq!(granted.stats.memory_quota, gpu_memory / 2);
        let socket_dir = PathBuf::from(&granted.socket_dir);
        assert_eq!(socket_dir, dir.path().join("pods").join(id.to_string()));
        let mode = |p: &Path| std::fs::metadata(p).expect("exists").permissions().mode() & 0o777;
        assert_eq!(
            mode(&dir.path().join("pods")),
            0o700,
            "only root enters pods/"
        );

        let client = UnixSeqpacket::connect(socket_dir.join(POD_SOCKET_NAME))
            .await
            .expect("connect");
        say(&client, &ClientMessage::Hello(hello(Role::Client))).await;
        match hear_with_fds(&client).await.0 {
            BrokerMessage::Welcome(w) => {
                assert_eq!(w.memory_quota, Some(gpu_memory / 2));
                assert_eq!(w.class, PriorityClass::Normal, "the pod is not known yet");
            }
            other => panic!("expected a Welcome, got {other:?}"),
        }
        let session = loop {
            if let Some(c) = broker
                .registry
                .snapshot()
                .into_iter()
                .find(|c| c.job == Some(id))
            {
                break broker.registry.get(c.client_id).expect("registered");
            }
            tokio::task::yield_now().await;
        };
        // Whatever uid the container's program has, it is no administrator here.
        say(
            &client,
            &ClientMessage::AdminJobStart {
                request: 1,
                start: JobStart {
                    job: 1,
                    uid: 0,
                    user: "root".into(),
                    gpus: shares(4),
                    partition: None,
                    qos: None,
                },
            },
        )
        .await;
        match hear(&client).await {
            BrokerMessage::Job { result, .. } => {
                assert_eq!(result.map_err(|e| e.code), Err(ErrorCode::PermissionDenied))
            }
            other => panic!("expected an answer, got {other:?}"),
        }

        let identified = broker
            .admin_pod_identify(&root, id, pod("ml-prod"))
            .expect("identified");
        assert_eq!(identified.class, PriorityClass::High);
        assert_eq!(identified.pod, Some(pod("ml-prod")));
        assert_eq!(
            session.grant().class,
            PriorityClass::High,
            "live sessions too"
        );

        let ended = broker.admin_job_end(&root, id).await.expect("ended");
        assert_eq!(ended.evicted_at_end, 1);
        assert_eq!(
            session.eviction().as_deref(),
            Some(format!("the container's GPU shares (job {id}) have ended").as_str())
        );
        assert!(!socket_dir.exists(), "its socket is gone");
    }

    #[tokio::test]
    async fn a_pod_s_service_account_makes_it_count_as_the_user_the_policy_maps_it_to() {
        let dir = tempfile::tempdir().expect("temp dir");
        let broker = sim_broker_with(
            1,
            BrokerConfig {
                socket: dir.path().join("gpushare.sock"),
                ..BrokerConfig::default()
            },
        );
        let policy = format!(
            "{POLICY}[[kubernetes.identities]]\nnamespace = \"ml-prod\"\nservice_account = \"trainer\"\nuser = \"gpushare-test-alice\"\n[[users]]\nname = \"gpushare-test-alice\"\nclass = \"best-effort\"\n"
        );
        broker.set_policy(Policy::parse(&policy, "test").expect("policy"));
        let root = identity(0, &[]);
        let id = broker
            .admin_pod_start(&root, shares(1))
            .expect("started")
            .stats
            .job;
        let trainer = PodIdentity {
            service_account: Some("trainer".into()),
            ..pod("ml-prod")
        };
        let placed = broker
            .admin_pod_identify(&root, id, trainer)
            .expect("identified");
        assert_eq!(
            (placed.user.as_str(), placed.class),
            ("gpushare-test-alice", PriorityClass::BestEffort)
        );
        // Its account unknown (no token): the namespace's class, as whoever started it.
        let unknown = broker
            .admin_pod_identify(&root, id, pod("ml-prod"))
            .expect("identified");
        assert_eq!(
            (unknown.user.as_str(), unknown.class),
            ("kubernetes", PriorityClass::High)
        );
        broker.admin_job_end(&root, id).await.expect("ended");
    }
}

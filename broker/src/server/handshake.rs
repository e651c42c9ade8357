//! A new connection: who it is (`SO_PEERCRED`, never what it claims), its hello, and whether
//! and how it may start a session (policy, a fault's culprit refused after a restart, the
//! class it asks for, its GPU). Everything that refuses a connection happens here, before
//! any resources are set up for it.

use std::sync::Arc;
use std::time::Duration;

use gpushare_protocol::control::{ClientMessage, Hello};
use gpushare_protocol::stats::{ClientStats, GpuLoad};
use gpushare_protocol::{ErrorCode, PROTOCOL_VERSION, PriorityClass};
use tokio::sync::watch;
use tokio_seqpacket::UnixSeqpacket;
use tracing::{Instrument, info_span, warn};

use super::framing::{RecvError, recv, reject};
use super::{Broker, Stop, placement};
use crate::access::{Grant, Identity, TrustDomain};
use crate::accounts::{Joining, Refusal, Seat, Visit};
use crate::jobs::Job;
use gpushare_protocol::control::Role;
use gpushare_protocol::ring::ShmLayout;

/// How long a new connection has to say hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a refused connection's hello is waited for, so the refusal can be read.
const REFUSED_HELLO_WAIT: Duration = Duration::from_millis(200);

/// What an admitted connection's session gets.
pub(super) struct Admission {
    pub(super) grant: Grant,
    /// Index of the GPU it runs on.
    pub(super) gpu: usize,
    /// Its place in its user's account (none for a monitor, which holds nothing).
    pub(super) seat: Option<Seat>,
    /// Its shared region's shape.
    pub(super) layout: ShmLayout,
    /// Whose GPU context it shares.
    pub(super) domain: TrustDomain,
    /// The batch scheduler job whose grant it runs on.
    pub(super) job: Option<Arc<Job>>,
}

impl Broker {
    /// Serves one accepted connection from its hello to its end. `pod`: it came through
    /// that Kubernetes container's socket, and runs on its grant.
    pub(super) async fn connection(
        self: Arc<Self>,
        sock: UnixSeqpacket,
        stop: watch::Receiver<Option<Stop>>,
        pod: Option<Arc<Job>>,
    ) {
        let cred = match sock.peer_cred() {
            Ok(c) => c,
            Err(e) => {
                warn!(error = %e, "cannot read peer credentials; dropping connection");
                return;
            }
        };
        let pid = cred.pid().unwrap_or(0);
        let span = info_span!("conn", pid, uid = cred.uid());
        async move {
            let identity = Identity {
                in_pod: pod.is_some(),
                ..Identity::lookup(cred.uid(), cred.gid())
            };
            // Counted from the start: connections still saying hello hold a descriptor too.
            let _visit = match self.visit(&identity) {
                Ok(v) => v,
                Err(why) => {
                    tracing::debug!(%why, "connection refused");
                    // Its hello read first (briefly): a socket closed with a message unread
                    // resets the connection, and the client would never read why.
                    let _ = tokio::time::timeout(REFUSED_HELLO_WAIT, recv(&sock)).await;
                    reject(&sock, why.code(), &why.to_string()).await;
                    return;
                }
            };
            let Some(hello) = read_hello(&sock, HELLO_TIMEOUT).await else {
                return;
            };
            // A container's socket: the plugin (an administrator) granted its shares, and
            // who the program is inside the container does not matter here.
            let refused = match &pod {
                Some(job) if self.jobs.get(job.id).is_none() => Some(format!(
                    "this container's GPU shares (job {}) have ended",
                    job.id
                )),
                Some(_) => None,
                None => self
                    .policy
                    .read()
                    .unwrap_or_else(|p| p.into_inner())
                    .refusal(&identity),
            };
            if let Some(why) = refused {
                reject(&sock, ErrorCode::PermissionDenied, &why).await;
                return;
            }
            let job = match pod {
                Some(job) => Ok(Some(job)),
                None => self.job_for(&hello, &identity, pid).await,
            };
            let job = match job {
                Ok(job) => job,
                Err(why) => {
                    reject(&sock, ErrorCode::PermissionDenied, &why).await;
                    return;
                }
            };
            let admission = match self.admit(&hello, &identity, pid, job) {
                Ok(a) => a,
                Err((code, why)) => {
                    reject(&sock, code, &why).await;
                    return;
                }
            };
            self.session(sock, hello, identity, pid, admission, stop)
                .await;
        }
        .instrument(span)
        .await
    }

    /// Counts a new connection in its user's account, within the policy's `max_connections`.
    fn visit(&self, identity: &Identity) -> Result<Visit, Refusal> {
        let bounds = self
            .policy
            .read()
            .map(|p| p.bounds_for(identity))
            .unwrap_or_default();
        let user = identity
            .user
            .clone()
            .unwrap_or_else(|| identity.uid.to_string());
        self.accounts.visit(identity.uid, &user, bounds)
    }

    /// The grant and GPU for a connection the policy allows, or why it may not start a
    /// session.
    fn admit(
        &self,
        hello: &Hello,
        identity: &Identity,
        pid: i32,
        job: Option<Arc<Job>>,
    ) -> Result<Admission, (ErrorCode, String)> {
        if let (Some(left), _) = self.carried_for(pid) {
            let msg = format!(
                "evicted: work of this process (pid {pid}) faulted the GPU before gpushared restarted; refused for {} more seconds",
                left.as_secs() + 1
            );
            return Err((ErrorCode::PermissionDenied, msg));
        }
        let (granted, bounds, domain, fault_limit) = self
            .policy
            .read()
            .map(|p| {
                (
                    p.grant_for(identity),
                    p.bounds_for(identity),
                    p.trust_domain(identity),
                    p.fault_limit(),
                )
            })
            .unwrap_or_default();
        let (grant, gpu) = match &job {
            Some(job) => (job.grant(), job.gpu_for(hello.gpu) as usize),
            None => {
                let gpu = choose_gpu(hello.gpu, self.gpus.len(), || self.least_loaded())
                    .map_err(|e| (ErrorCode::InvalidArgument, e.to_string()))?;
                (granted, gpu)
            }
        };
        let grant = with_requested_class(grant, hello.requested_class);
        let layout = self.config.layout_for(hello.sq_entries, hello.arena_size);
        let seat = if hello.role == Role::Monitor {
            None
        } else {
            let user = identity
                .user
                .clone()
                .unwrap_or_else(|| identity.uid.to_string());
            let joining = Joining {
                uid: identity.uid,
                user: &user,
                // The user's own quota: a job's sessions hold memory against the job's.
                quota: granted.memory_quota,
                bounds,
                region_bytes: layout.total_size() as u64,
                faults: fault_limit,
            };
            let seat = self
                .accounts
                .join(joining)
                .map_err(|why| (why.code(), why.to_string()))?;
            Some(seat)
        };
        Ok(Admission {
            grant,
            gpu,
            seat,
            layout,
            domain,
            job,
        })
    }

    /// The batch scheduler job whose grant a new session runs on, when the policy makes this
    /// machine a Slurm node: the job its process is in, as Slurm says. Outside a job (or in
    /// one without shares here) a session runs on its user's grant, unless `jobs_only` refuses
    /// it (root never).
    async fn job_for(
        &self,
        hello: &Hello,
        identity: &Identity,
        pid: i32,
    ) -> Result<Option<Arc<Job>>, String> {
        let slurm = self.policy.read().ok().and_then(|p| p.slurm());
        let Some(slurm) = slurm else {
            return Ok(None);
        };
        if hello.role == Role::Monitor {
            return Ok(None);
        }
        let in_job = crate::jobs::slurm::job_of(pid).await;
        let job = in_job.and_then(|id| self.jobs.get(id));
        match (&job, in_job) {
            (Some(job), _) if job.uid == identity.uid || identity.uid == 0 => {
                return Ok(Some(job.clone()));
            }
            (Some(job), _) => {
                return Err(format!(
                    "process {pid} is in Slurm job {}, which is not yours (uid {})",
                    job.id, job.uid
                ));
            }
            _ => {}
        }
        if !slurm.jobs_only || identity.uid == 0 {
            return Ok(None);
        }
        Err(match in_job {
            Some(id) => format!(
                "Slurm job {id} holds no GPU shards on this machine, and here the GPU is shared only through Slurm: ask for some (srun --gres=shard:N …)"
            ),
            None => "this machine's GPUs are shared through Slurm: run the program in a job that asks for GPU shards (srun --gres=shard:N …)".into(),
        })
    }

    /// The GPU with the least measured load (`placement`).
    fn least_loaded(&self) -> usize {
        placement::least_loaded(&self.gpu_loads(&self.registry.snapshot()))
    }

    /// Each GPU's load now, from a snapshot of the clients.
    pub(super) fn gpu_loads(&self, clients: &[ClientStats]) -> Vec<GpuLoad> {
        self.loads
            .loads(clients, self.gpus.len(), std::time::Instant::now())
    }
}

/// The connection's hello, or `None` once it has been told why not (or has left without one).
async fn read_hello(sock: &UnixSeqpacket, timeout: Duration) -> Option<Hello> {
    let (code, why) = match tokio::time::timeout(timeout, recv(sock)).await {
        Ok(Ok(Some((ClientMessage::Hello(h), _)))) => return Some(h),
        Ok(Err(RecvError::Version(theirs))) => (
            ErrorCode::VersionMismatch,
            format!(
                "client speaks protocol {theirs} but this broker speaks {PROTOCOL_VERSION}; use a matching gpushare client library"
            ),
        ),
        Ok(Ok(Some(_))) => (
            ErrorCode::ProtocolViolation,
            "the first message must be Hello".into(),
        ),
        Ok(Ok(None)) => return None,
        Ok(Err(e)) => (ErrorCode::ProtocolViolation, e.to_string()),
        Err(_) => (
            ErrorCode::ProtocolViolation,
            format!("no Hello within {} s", timeout.as_secs()),
        ),
    };
    reject(sock, code, &why).await;
    None
}

/// `granted`, in the class the client asked for if that is less important: a client may
/// step down, never up.
fn with_requested_class(mut granted: Grant, asked: Option<PriorityClass>) -> Grant {
    if let Some(asked) = asked
        && asked > granted.class
    {
        granted.class = asked;
    }
    granted
}

/// A GPU index past the broker's GPUs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("GPU {asked} does not exist; this broker serves GPU{} 0..={}", if *.count > 1 { "s" } else { "" }, .count.saturating_sub(1))]
struct NoSuchGpu {
    asked: u32,
    count: usize,
}

/// The GPU a client asked for, or the least loaded one when it did not say.
fn choose_gpu(
    asked: Option<u32>,
    count: usize,
    least_loaded: impl FnOnce() -> usize,
) -> Result<usize, NoSuchGpu> {
    match asked {
        None => Ok(least_loaded()),
        Some(g) if (g as usize) < count => Ok(g as usize),
        Some(g) => Err(NoSuchGpu { asked: g, count }),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use gpushare_protocol::control::{BrokerMessage, Role};
    use gpushare_protocol::error::WireError;

    use super::*;
    use crate::gpu::restart::Carry;
    use crate::server::testing::{closed, hear, hello, pair, register, say, sim_broker, within};

    /// Runs `connection` for the broker's end of a pair while a client says `first`; returns
    /// what the client heard first. A welcomed client then says goodbye; either way the broker
    /// closes the connection.
    async fn first_reply(broker: &Arc<Broker>, first: &ClientMessage) -> BrokerMessage {
        let (server, client) = pair();
        let (_stop_tx, stop) = watch::channel(None::<Stop>);
        let client_side = async {
            say(&client, first).await;
            let heard = hear(&client).await;
            if matches!(heard, BrokerMessage::Welcome(_)) {
                say(&client, &ClientMessage::Goodbye).await;
            }
            assert!(closed(&client).await, "the broker closes the connection");
            heard
        };
        let ((), heard) = tokio::join!(
            within(broker.clone().connection(server, stop, None)),
            client_side
        );
        heard
    }

    fn rejected(code: ErrorCode, message: &str) -> BrokerMessage {
        BrokerMessage::Rejected(WireError::new(code, message))
    }

    #[tokio::test]
    async fn a_client_of_another_version_is_told_to_match() {
        let broker = sim_broker(1);
        let theirs = PROTOCOL_VERSION + 1;
        let hello = ClientMessage::Hello(Hello {
            protocol_version: theirs,
            ..hello(Role::Client)
        });
        let msg = format!(
            "client speaks protocol {theirs} but this broker speaks {PROTOCOL_VERSION}; use a matching gpushare client library"
        );
        assert_eq!(
            first_reply(&broker, &hello).await,
            rejected(ErrorCode::VersionMismatch, &msg)
        );
        assert!(broker.registry.is_empty());
    }

    #[tokio::test]
    async fn the_first_message_must_be_a_hello() {
        let broker = sim_broker(1);
        assert_eq!(
            first_reply(&broker, &ClientMessage::Status { request: 1 }).await,
            rejected(
                ErrorCode::ProtocolViolation,
                "the first message must be Hello"
            )
        );
    }

    #[tokio::test]
    async fn a_silent_connection_is_told_and_dropped() {
        let (server, client) = pair();
        let read = within(read_hello(&server, Duration::from_secs(1))).await;
        assert!(read.is_none());
        assert_eq!(
            hear(&client).await,
            rejected(ErrorCode::ProtocolViolation, "no Hello within 1 s")
        );
    }

    #[tokio::test]
    async fn a_connection_that_leaves_before_hello_is_not_answered() {
        let (server, client) = pair();
        client.shutdown(std::net::Shutdown::Both).expect("shutdown");
        assert!(within(read_hello(&server, HELLO_TIMEOUT)).await.is_none());
    }

    #[tokio::test]
    async fn a_monitor_is_welcomed_without_a_region_and_never_above_its_grant() {
        let broker = sim_broker(1);
        let monitor = Hello {
            requested_class: Some(PriorityClass::High),
            ..hello(Role::Monitor)
        };
        match first_reply(&broker, &ClientMessage::Hello(monitor)).await {
            BrokerMessage::Welcome(w) => {
                assert_eq!(w.protocol_version, PROTOCOL_VERSION);
                assert_eq!(w.layout, None, "a monitor gets no shared region");
                assert_eq!(w.backend, "sim");
                assert_eq!(
                    w.class,
                    PriorityClass::Normal,
                    "asking for more than the policy grants gets the grant"
                );
            }
            other => panic!("expected a Welcome, got {other:?}"),
        }
        assert!(broker.registry.is_empty(), "monitors are not clients");
    }

    #[tokio::test]
    async fn a_gpu_that_does_not_exist_is_refused() {
        let broker = sim_broker(2);
        let hello = Hello {
            gpu: Some(2),
            ..hello(Role::Client)
        };
        assert_eq!(
            first_reply(&broker, &ClientMessage::Hello(hello)).await,
            rejected(
                ErrorCode::InvalidArgument,
                "GPU 2 does not exist; this broker serves GPUs 0..=1"
            )
        );
        assert!(broker.registry.is_empty());
    }

    #[tokio::test]
    async fn a_faults_culprit_is_refused_after_the_restart() {
        let broker = sim_broker(1);
        // Over a socketpair the peer is this process.
        let me = std::process::id() as i32;
        broker.carry_over(Carry {
            evicted: vec![me],
            probation: Vec::new(),
            seconds: 60,
        });
        let heard = first_reply(&broker, &ClientMessage::Hello(hello(Role::Client))).await;
        match heard {
            BrokerMessage::Rejected(e) => {
                assert_eq!(e.code, ErrorCode::PermissionDenied);
                let start = format!(
                    "evicted: work of this process (pid {me}) faulted the GPU before gpushared restarted"
                );
                assert!(e.message.starts_with(&start), "{}", e.message);
            }
            other => panic!("expected a rejection, got {other:?}"),
        }
        assert!(broker.registry.is_empty());
    }

    #[test]
    fn a_client_may_ask_for_a_lower_class_never_a_higher_one() {
        let normal = Grant::default();
        let class = |asked| with_requested_class(normal, asked).class;
        assert_eq!(class(None), PriorityClass::Normal);
        assert_eq!(
            class(Some(PriorityClass::BestEffort)),
            PriorityClass::BestEffort
        );
        assert_eq!(class(Some(PriorityClass::High)), PriorityClass::Normal);
        let asked = with_requested_class(normal, Some(PriorityClass::BestEffort));
        assert_eq!(
            (asked.weight, asked.memory_quota),
            (normal.weight, normal.memory_quota),
            "only the class changes"
        );
    }

    #[test]
    fn the_gpu_asked_for_or_the_least_loaded_one() {
        assert_eq!(choose_gpu(None, 4, || 2), Ok(2));
        assert_eq!(choose_gpu(Some(3), 4, || 0), Ok(3));
        assert_eq!(
            choose_gpu(Some(4), 4, || 0).map_err(|e| e.to_string()),
            Err("GPU 4 does not exist; this broker serves GPUs 0..=3".into())
        );
        assert_eq!(
            choose_gpu(Some(1), 1, || 0).map_err(|e| e.to_string()),
            Err("GPU 1 does not exist; this broker serves GPU 0..=0".into())
        );
    }

    #[test]
    fn the_least_loaded_gpu_holds_the_least_memory_then_the_fewest_clients() {
        let broker = sim_broker(2);
        assert_eq!(broker.least_loaded(), 0, "all idle: the first");
        let on0 = register(&broker, 100, 0, false);
        assert_eq!(broker.least_loaded(), 1, "same memory: fewer clients");
        let on1 = register(&broker, 101, 1, false);
        on1.counters.memory_used.store(1 << 30, Ordering::Relaxed);
        let _also_on0 = register(&broker, 102, 0, false);
        on0.counters.memory_used.store(1 << 20, Ordering::Relaxed);
        assert_eq!(
            broker.least_loaded(),
            0,
            "less memory wins over fewer clients"
        );
    }
}

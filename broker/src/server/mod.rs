//! The control plane: the listening socket, one task per connection, and clean shutdown.
//!
//! Here: the broker's shared state, and its accept loop until shutdown. Beside it, one file per
//! step of a connection's life:
//! - `listen`: binding the socket ([`bind`]), never over a live broker's;
//! - `handshake`: a new connection's credentials, hello and admission;
//! - `session`: an admitted connection's session, from its Welcome to its end;
//! - `control`: its control requests, and `admin` for the administrators' ones;
//! - `framing`: one control message and its descriptors on the socket;
//! - `status`: the telemetry sample and the status report.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant};

use gpushare_protocol::control::ShutdownKind;
use gpushare_protocol::stats::TelemetryStatus;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_seqpacket::UnixSeqpacketListener;
use tracing::{info, warn};

use crate::access::Policy;
use crate::accounts::Accounts;
use crate::config::BrokerConfig;
use crate::device::Device;
use crate::gpu::restart::{Carry, Stuck};
use crate::gpu::scheduler::GpuScheduler;
use crate::gpu::{ContextError, DomainMaker, Gpu};
use crate::registry::Registry;
use crate::telemetry::Telemetry;

mod admin;
mod connection;
mod control;
mod driver;
mod exports;
mod framing;
mod graphs;
mod handshake;
mod jobs;
mod listen;
mod placement;
mod pods;
mod pods_kept;
mod status;
#[cfg(test)]
mod testing;
mod usage;

pub use listen::{BindError, bind};

/// Why the broker stops serving, as every client is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stop {
    pub kind: ShutdownKind,
    pub reason: String,
}

impl Stop {
    pub fn stopping(reason: impl Into<String>) -> Stop {
        Stop {
            kind: ShutdownKind::Stopping,
            reason: reason.into(),
        }
    }

    pub fn restarting(reason: impl Into<String>) -> Stop {
        Stop {
            kind: ShutdownKind::Restarting,
            reason: reason.into(),
        }
    }
}

/// How long shutdown waits for connections to wind down.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// The broker: one device, many sessions.
pub struct Broker {
    /// Itself, for the tasks it starts while serving a request (a container's socket).
    me: std::sync::Weak<Broker>,
    /// The GPUs served, by index (never empty).
    gpus: Vec<Gpu>,
    /// Set when a GPU cannot be recovered in place and the broker must restart.
    stuck: Arc<Stuck>,
    /// Set when the broker stops: every guardian ends with it.
    guardians_stop: Arc<AtomicBool>,
    /// Makes the contexts of trust domains other than the default (device workers); without
    /// it, such clients are refused.
    domain_maker: OnceLock<DomainMaker>,
    /// What the previous image knew about a fault (culprit, suspects), and since when.
    carried: Mutex<Option<(Carry, Instant)>>,
    config: BrokerConfig,
    policy: RwLock<Policy>,
    registry: Registry,
    /// Each user's sessions together: the memory quota they share.
    accounts: Arc<Accounts>,
    started: Instant,
    /// Set once telemetry has started (it starts beside serving).
    telemetry: OnceLock<Arc<Telemetry>>,
    telemetry_status: Mutex<TelemetryStatus>,
    /// The latest eBPF view of GPU processes and the outside-load rates derived from it.
    observed: Mutex<status::Observed>,
    /// Module images by content, shared between sessions.
    images: Arc<crate::images::ImageCache>,
    /// Device memory exported for other processes to take.
    exports: exports::Exports,
    /// Batch scheduler jobs holding shares of the GPUs.
    jobs: crate::jobs::Jobs,
    /// Kubernetes containers' own sockets, by job.
    pods: pods::PodSockets,
    /// Recent samples of the clients' GPU time, for the default placement.
    loads: placement::LoadHistory,
    /// Which GPU reaches which one's memory (asked once, on first use).
    peers: OnceLock<Vec<(u32, u32)>>,
    /// Why the broker stops, once it does: every session watches it.
    stop: watch::Sender<Option<Stop>>,
}

impl Broker {
    /// A broker for `devices` (one per GPU, by index; at least one), with eBPF telemetry
    /// when it could be started (`telemetry_status` says why not otherwise).
    pub fn new(
        devices: Vec<Arc<Device>>,
        config: BrokerConfig,
        policy: Policy,
        telemetry: Option<Arc<Telemetry>>,
        telemetry_status: TelemetryStatus,
    ) -> Arc<Broker> {
        assert!(!devices.is_empty(), "a broker needs at least one device");
        let stuck = Arc::new(Stuck::default());
        let guardians_stop = Arc::new(AtomicBool::new(false));
        let gpus: Vec<Gpu> = devices
            .into_iter()
            .enumerate()
            .map(|(index, device)| {
                let scheduler = GpuScheduler::new(
                    policy.scheduler(),
                    policy.tunables(),
                    crate::sched::DeviceShape {
                        sms: device.info().sm_count.max(1),
                        sm_partitions: device.sm_partitions(),
                    },
                );
                if let Some(gate) = device.gate() {
                    scheduler.set_gate(Arc::new(gate));
                }
                Gpu::new(
                    index as u32,
                    device,
                    scheduler,
                    config.faults,
                    stuck.clone(),
                    guardians_stop.clone(),
                )
            })
            .collect();
        for gpu in &gpus {
            gpu.scheduler.keep_gate();
        }
        Arc::new_cyclic(|me| Broker {
            me: me.clone(),
            gpus,
            stuck,
            guardians_stop,
            domain_maker: OnceLock::new(),
            carried: Mutex::new(None),
            config,
            policy: RwLock::new(policy),
            registry: Registry::default(),
            accounts: Arc::default(),
            started: Instant::now(),
            telemetry: telemetry.map(OnceLock::from).unwrap_or_default(),
            telemetry_status: Mutex::new(telemetry_status),
            observed: Mutex::new(status::Observed::default()),
            images: Arc::default(),
            exports: exports::Exports::default(),
            jobs: crate::jobs::Jobs::default(),
            pods: pods::PodSockets::default(),
            loads: placement::LoadHistory::default(),
            peers: OnceLock::new(),
            stop: watch::Sender::new(None),
        })
    }

    /// Telemetry has started (`Some`), or says why it is off.
    pub fn set_telemetry(&self, telemetry: Option<Arc<Telemetry>>, status: TelemetryStatus) {
        if let Some(t) = telemetry {
            let _ = self.telemetry.set(t);
        }
        *self
            .telemetry_status
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = status;
    }

    /// Replaces the policy for sessions that start from now on; connected clients keep what
    /// they were granted.
    pub fn set_policy(&self, policy: Policy) {
        for gpu in &self.gpus {
            gpu.scheduler
                .set_policy(policy.scheduler(), policy.tunables());
        }
        match self.policy.write() {
            Ok(mut p) => *p = policy,
            Err(poisoned) => *poisoned.into_inner() = policy,
        }
    }

    /// Takes over what the image before a restart knew about the fault: its culprit is
    /// refused and its suspects run on probation, each for `carry.seconds`.
    pub fn carry_over(&self, carry: Carry) {
        if carry.is_empty() {
            return;
        }
        info!(evicted = ?carry.evicted, probation = ?carry.probation, seconds = carry.seconds, "carried over from before the restart");
        *self.carried.lock().unwrap_or_else(|e| e.into_inner()) = Some((carry, Instant::now()));
    }

    /// Whether the process `pid` is refused (it faulted the GPU before a restart), and until
    /// when its suspects' probation lasts, if it is one.
    fn carried_for(&self, pid: i32) -> (Option<Duration>, Option<Instant>) {
        let carried = self.carried.lock().unwrap_or_else(|e| e.into_inner());
        let Some((carry, since)) = carried.as_ref() else {
            return (None, None);
        };
        let until = *since + Duration::from_secs(carry.seconds);
        let left = until.checked_duration_since(Instant::now());
        let Some(left) = left else {
            return (None, None);
        };
        (
            carry.evicted.contains(&pid).then_some(left),
            carry.probation.contains(&pid).then_some(until),
        )
    }

    /// Lets clients of trust domains other than the default have contexts of their own (made
    /// by `maker`). Without it, such clients are refused.
    pub fn set_domain_maker(&self, maker: DomainMaker) {
        let _ = self.domain_maker.set(maker);
    }

    /// The context serving `domain` on `gpu`, made on first use. Blocking.
    fn context(
        &self,
        gpu: usize,
        domain: &crate::access::TrustDomain,
    ) -> Result<crate::gpu::Context, ContextError> {
        self.gpus
            .get(gpu)
            .ok_or(ContextError::NoGpu(gpu))?
            .context(domain, self.domain_maker.get())
    }

    /// Where each GPU's clients' memory lives, for a restarting gpushared's next image.
    pub fn memory_handover(&self) -> Vec<Option<crate::gpu::restart::Handover>> {
        self.gpus
            .iter()
            .map(|g| {
                Some(crate::gpu::restart::Handover {
                    space: g.device().space(),
                    floor: g.device().high_water(),
                })
            })
            .collect()
    }

    /// Resolves when a GPU cannot be recovered in place: serve's caller should then stop
    /// and restart the broker ([`Stuck::reason`] says why).
    pub fn stuck(&self) -> Arc<Stuck> {
        self.stuck.clone()
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Serves until `shutdown` resolves (with a reason), then tells every client, waits for
    /// sessions to release their resources, and removes the socket file.
    pub async fn serve(
        self: Arc<Self>,
        mut listener: UnixSeqpacketListener,
        shutdown: impl std::future::Future<Output = Stop>,
    ) {
        self.restore_jobs(crate::jobs::slurm::still_running).await;
        self.restore_pods();
        let stop_rx = self.stop.subscribe();
        let mut tasks = JoinSet::new();
        // One guardian per GPU context (a trust domain's starts as it is made) watches for
        // faults and hangs (see `gpu::guardian`).
        for gpu in &self.gpus {
            gpu.start_guardian();
        }
        tokio::pin!(shutdown);
        let stopping = loop {
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(sock) => {
                        let broker = self.clone();
                        tasks.spawn(broker.connection(sock, stop_rx.clone(), None));
                    }
                    Err(e) => {
                        // Out of descriptors and the like: back off instead of spinning.
                        warn!(error = %e, "cannot accept a connection");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
                stopping = &mut shutdown => break stopping,
                Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            }
        };
        info!(reason = %stopping.reason, kind = ?stopping.kind, clients = self.registry.len(), "shutting down");
        self.stop.send_replace(Some(stopping));
        drop(listener);
        self.pods.close_all();
        // A stuck GPU: the restart is what frees it, and parked sessions never finish; give
        // the clients just long enough to be told.
        let grace = if self.stuck.reason().is_some() {
            Duration::from_millis(20)
        } else {
            SHUTDOWN_GRACE
        };
        let drained =
            tokio::time::timeout(grace, async { while tasks.join_next().await.is_some() {} }).await;
        if drained.is_err() {
            warn!("some sessions did not finish within {grace:?}; exiting anyway");
        }
        self.guardians_stop.store(true, Ordering::Release);
        if let Err(e) = std::fs::remove_file(&self.config.socket) {
            warn!(socket = %self.config.socket.display(), error = %e, "cannot remove socket file");
        }
        info!("stopped");
    }
}

#[cfg(test)]
mod tests {
    use gpushare_protocol::control::{BrokerMessage, ClientMessage, Role};
    use tokio::sync::oneshot;
    use tokio_seqpacket::UnixSeqpacket;

    use super::*;
    use crate::server::testing::{
        hear, hear_with_fds, hello, say, sim_broker, sim_broker_with, within,
    };

    #[test]
    fn a_carried_culprit_is_refused_and_a_suspect_on_probation_for_the_time_given() {
        let broker = sim_broker(1);
        assert_eq!(broker.carried_for(1), (None, None), "nothing carried");
        broker.carry_over(Carry {
            evicted: vec![1],
            probation: vec![2],
            seconds: 60,
        });
        let (refused, probation) = broker.carried_for(1);
        let left = refused.expect("the culprit is refused");
        assert!(left > Duration::from_secs(59) && left <= Duration::from_secs(60));
        assert_eq!(probation, None);

        let (refused, probation) = broker.carried_for(2);
        assert_eq!(refused, None);
        let until = probation.expect("the suspect is on probation");
        assert!(until > Instant::now() + Duration::from_secs(59));

        assert_eq!(
            broker.carried_for(3),
            (None, None),
            "anyone else is welcome"
        );
    }

    #[test]
    fn what_is_carried_over_expires() {
        let broker = sim_broker(1);
        broker.carry_over(Carry {
            evicted: vec![1],
            probation: vec![2],
            seconds: 0,
        });
        assert_eq!(broker.carried_for(1), (None, None));
        assert_eq!(broker.carried_for(2), (None, None));
    }

    #[tokio::test]
    async fn serve_tells_clients_why_it_stops_and_removes_its_socket() {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = BrokerConfig {
            socket: dir.path().join("gpushare.sock"),
            ..BrokerConfig::default()
        };
        let listener = bind(&config).expect("bind");
        let broker = sim_broker_with(1, config.clone());
        let (stop_tx, stop_rx) = oneshot::channel::<Stop>();
        let shutdown = async move {
            stop_rx
                .await
                .unwrap_or_else(|_| Stop::stopping("the test ended"))
        };
        let client_side = async {
            let client = UnixSeqpacket::connect(&config.socket)
                .await
                .expect("connect");
            say(&client, &ClientMessage::Hello(hello(Role::Monitor))).await;
            let (welcome, _) = hear_with_fds(&client).await;
            assert!(matches!(welcome, BrokerMessage::Welcome(_)), "{welcome:?}");
            stop_tx
                .send(Stop::restarting("GPU 0 is stuck"))
                .expect("serve listens");
            hear(&client).await
        };
        let ((), told) = tokio::join!(
            within(broker.clone().serve(listener, shutdown)),
            client_side
        );
        assert_eq!(
            told,
            BrokerMessage::ShuttingDown {
                kind: ShutdownKind::Restarting,
                reason: "GPU 0 is stuck".into()
            }
        );
        assert!(!config.socket.exists(), "the socket file is removed");
    }
}

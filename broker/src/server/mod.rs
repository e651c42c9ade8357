//! The control plane: the listening socket, one task per connection, and clean shutdown.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use gpushare_protocol::control::{
    BrokerMessage, ClientMessage, Hello, Role, ShutdownKind, Welcome,
};
use gpushare_protocol::stats::TelemetryStatus;
use gpushare_protocol::{ErrorCode, PROTOCOL_VERSION};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinSet;
use tokio_seqpacket::{UnixSeqpacket, UnixSeqpacketListener};
use tracing::{Instrument, info, info_span, warn};

use crate::config::BrokerConfig;
use crate::device::Device;
use crate::dispatch::GpuDispatch;
use crate::fault::{Carry, DeviceHealth, Stuck};
use crate::policy::{Identity, Policy};
use crate::registry::Registry;
use crate::session::{GpuServices, ModuleTable, Peer, SessionEnd, SessionInfo, SessionState};
use crate::shm::SharedRegion;
use crate::telemetry::Telemetry;
use crate::wake::Wakeup;
use framing::{RecvError, recv, reject, send};

mod admin;
mod control;
mod framing;
mod listen;
mod status;
#[cfg(test)]
mod testing;

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

/// How long a new connection has to say hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// How long shutdown waits for connections to wind down.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// The broker: one device, many sessions.
pub struct Broker<D: Device> {
    /// One per GPU served, by index (never empty).
    devices: Vec<Arc<D>>,
    /// Fault containment per GPU (same index as `devices`).
    health: Vec<Arc<DeviceHealth>>,
    /// Set when a GPU cannot be recovered in place and the broker must restart.
    stuck: Arc<Stuck>,
    /// The scheduler per GPU (same index as `devices`).
    dispatch: Vec<Arc<GpuDispatch>>,
    /// What the previous image knew about a fault (culprit, suspects), and since when.
    carried: Mutex<Option<(Carry, Instant)>>,
    config: BrokerConfig,
    policy: RwLock<Policy>,
    registry: Registry,
    started: Instant,
    telemetry: Option<Arc<Telemetry>>,
    telemetry_status: TelemetryStatus,
    /// The latest eBPF view of GPU processes and the outside-load rates derived from it.
    observed: Mutex<status::Observed>,
}

impl<D: Device> Broker<D> {
    /// A broker for `devices` (one per GPU, by index; at least one), with eBPF telemetry
    /// when it could be started (`telemetry_status` says why not otherwise).
    pub fn new(
        devices: Vec<Arc<D>>,
        config: BrokerConfig,
        policy: Policy,
        telemetry: Option<Arc<Telemetry>>,
        telemetry_status: TelemetryStatus,
    ) -> Arc<Broker<D>> {
        assert!(!devices.is_empty(), "a broker needs at least one device");
        let dispatch = devices
            .iter()
            .map(|d| {
                Arc::new(GpuDispatch::new(
                    policy.scheduler(),
                    policy.priority_config(),
                    crate::sched::DeviceShape {
                        sms: d.info().sm_count.max(1),
                        sm_partitions: d.sm_partitions(),
                    },
                    crate::device::sim::cost::CostModel::H100_LIKE,
                ))
            })
            .collect();
        let stuck = Arc::new(Stuck::default());
        let health = devices
            .iter()
            .map(|_| DeviceHealth::new(config.faults, stuck.clone()))
            .collect();
        Arc::new(Broker {
            devices,
            health,
            stuck,
            dispatch,
            carried: Mutex::new(None),
            config,
            policy: RwLock::new(policy),
            registry: Registry::default(),
            started: Instant::now(),
            telemetry,
            telemetry_status,
            observed: Mutex::new(status::Observed::default()),
        })
    }

    /// The device with the least memory held by clients, then the fewest clients.
    fn least_loaded(&self) -> usize {
        let clients = self.registry.snapshot();
        let load = |gpu: usize| {
            let on = clients.iter().filter(|c| c.gpu as usize == gpu);
            (on.clone().map(|c| c.memory_used).sum::<u64>(), on.count())
        };
        (0..self.devices.len())
            .min_by_key(|&g| load(g))
            .unwrap_or(0)
    }

    /// Replaces the policy for sessions that start from now on; connected clients keep what
    /// they were granted.
    pub fn set_policy(&self, policy: Policy) {
        for d in &self.dispatch {
            d.set_policy(policy.scheduler(), policy.priority_config());
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
        let (stop_tx, stop_rx) = watch::channel(None::<Stop>);
        let mut tasks = JoinSet::new();
        // One guardian per GPU watches for faults and hangs (see `fault`).
        let guardians_stop = Arc::new(AtomicBool::new(false));
        for (gpu, (health, device)) in self.health.iter().zip(&self.devices).enumerate() {
            let (health, device, stop) = (health.clone(), device.clone(), guardians_stop.clone());
            if let Err(e) = std::thread::Builder::new()
                .name(format!("gpushare-guard-{gpu}"))
                .spawn(move || health.guard(device, gpu as u32, stop))
            {
                warn!(gpu, error = %e, "cannot start the fault guardian; GPU faults will not be contained");
            }
        }
        tokio::pin!(shutdown);
        let stopping = loop {
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(sock) => {
                        let broker = self.clone();
                        tasks.spawn(broker.connection(sock, stop_rx.clone()));
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
        let _ = stop_tx.send(Some(stopping));
        drop(listener);
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
        guardians_stop.store(true, Ordering::Release);
        if let Err(e) = std::fs::remove_file(&self.config.socket) {
            warn!(socket = %self.config.socket.display(), error = %e, "cannot remove socket file");
        }
        info!("stopped");
    }

    async fn connection(self: Arc<Self>, sock: UnixSeqpacket, stop: watch::Receiver<Option<Stop>>) {
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
            let hello = match tokio::time::timeout(HELLO_TIMEOUT, recv(&sock)).await {
                Ok(Ok(Some((ClientMessage::Hello(h), _)))) => h,
                Ok(Err(RecvError::Version(theirs))) => {
                    let msg = format!(
                        "client speaks protocol {theirs} but this broker speaks {PROTOCOL_VERSION}; use a matching gpushare client library"
                    );
                    reject(&sock, ErrorCode::VersionMismatch, &msg).await;
                    return;
                }
                Ok(Ok(Some(_))) => {
                    reject(&sock, ErrorCode::ProtocolViolation, "the first message must be Hello").await;
                    return;
                }
                Ok(Ok(None)) => return,
                Ok(Err(e)) => {
                    reject(&sock, ErrorCode::ProtocolViolation, &e.to_string()).await;
                    return;
                }
                Err(_) => {
                    reject(&sock, ErrorCode::ProtocolViolation, "no Hello within 5 s").await;
                    return;
                }
            };
            let identity = Identity::lookup(cred.uid(), cred.gid());
            let refused = self
                .policy
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .refusal(&identity);
            if let Some(why) = refused {
                reject(&sock, ErrorCode::PermissionDenied, &why).await;
                return;
            }
            self.session(sock, hello, identity, pid, stop).await;
        }
        .instrument(span)
        .await
    }

    async fn session(
        self: Arc<Self>,
        sock: UnixSeqpacket,
        hello: Hello,
        identity: Identity,
        pid: i32,
        mut stop: watch::Receiver<Option<Stop>>,
    ) {
        if let (Some(left), _) = self.carried_for(pid) {
            let msg = format!(
                "evicted: work of this process (pid {pid}) faulted the GPU before gpushared restarted; refused for {} more seconds",
                left.as_secs() + 1
            );
            reject(&sock, ErrorCode::PermissionDenied, &msg).await;
            return;
        }
        let mut grant = self
            .policy
            .read()
            .map(|p| p.grant_for(&identity))
            .unwrap_or_default();
        if let Some(asked) = hello.requested_class
            && asked > grant.class
        {
            grant.class = asked; // less important than granted: always allowed
        }
        let gpu = match hello.gpu {
            None => self.least_loaded(),
            Some(g) if (g as usize) < self.devices.len() => g as usize,
            Some(g) => {
                let msg = format!(
                    "GPU {g} does not exist; this broker serves GPU{} 0..={}",
                    if self.devices.len() > 1 { "s" } else { "" },
                    self.devices.len() - 1
                );
                reject(&sock, ErrorCode::InvalidArgument, &msg).await;
                return;
            }
        };
        let device = self.devices[gpu].clone();
        let id = self.registry.next_id();
        let user = identity
            .user
            .clone()
            .unwrap_or_else(|| identity.uid.to_string());
        let name: String = hello.client_name.chars().take(64).collect();
        let welcome = |layout| Welcome {
            protocol_version: PROTOCOL_VERSION,
            broker_version: env!("CARGO_PKG_VERSION").into(),
            client_id: id,
            layout,
            backend: device.backend().into(),
            device: device.info().clone(),
            class: grant.class,
            weight: grant.weight,
            memory_quota: grant.memory_quota,
        };

        if hello.role == Role::Monitor {
            if send(&sock, &BrokerMessage::Welcome(Box::new(welcome(None))), &[])
                .await
                .is_err()
            {
                return;
            }
            let _ = self
                .control_loop(&sock, None, None, &identity, &mut stop, None)
                .await;
            return;
        }

        let started = match self.start_session(
            id, pid, &identity, user, name, grant, &hello, &device, gpu as u32,
        ) {
            Ok(s) => s,
            Err(e) => {
                warn!(error = %e, "cannot set up client session");
                reject(
                    &sock,
                    ErrorCode::Internal,
                    &format!("cannot set up session: {e}"),
                )
                .await;
                return;
            }
        };
        let StartedSession {
            info,
            modules,
            fds,
            ready,
            mut ended,
            layout,
        } = started;
        match ready.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                reject(&sock, e.code(), &format!("cannot set up session: {e}")).await;
                return;
            }
            Err(_) => {
                reject(&sock, ErrorCode::Internal, "session thread failed to start").await;
                return;
            }
        }
        // Registered before the client learns its id, so that a status or admin request it
        // (or anyone) sends right after the Welcome finds it. Whatever happens to this task
        // from here on (even a panic), the session stops and leaves the registry; its data
        // thread then releases everything.
        self.registry.insert(info.clone());
        let _guard = SessionGuard {
            info: info.clone(),
            registry: &self.registry,
        };
        let borrowed: Vec<BorrowedFd<'_>> = fds.iter().map(|f| f.as_fd()).collect();
        let sent = send(
            &sock,
            &BrokerMessage::Welcome(Box::new(welcome(Some(layout)))),
            &borrowed,
        )
        .await;
        drop(borrowed);
        drop(fds);
        let mut observed_end = None;
        if sent.is_ok() {
            info!(client = id, name = %info.name, user = %info.user, class = %info.grant().class, governed = info.governed, "client connected");
            observed_end = self
                .control_loop(
                    &sock,
                    Some((&modules, &device)),
                    Some(&info),
                    &identity,
                    &mut stop,
                    Some(&mut ended),
                )
                .await;
        }
        info.request_stop();
        let end = match observed_end {
            Some(end) => end,
            None => ended.await.unwrap_or(SessionEnd::Stopped),
        };
        match end {
            SessionEnd::Stopped => info!(client = id, "client disconnected"),
            SessionEnd::ProtocolViolation(why) => {
                warn!(client = id, %why, "client dropped for breaking the ring protocol")
            }
            SessionEnd::Evicted(why) => info!(client = id, %why, "client evicted"),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn start_session(
        &self,
        id: u64,
        pid: i32,
        identity: &Identity,
        user: String,
        name: String,
        grant: crate::policy::Grant,
        hello: &Hello,
        device: &Arc<D>,
        gpu: u32,
    ) -> std::io::Result<StartedSession<D>> {
        let layout = self.config.layout_for(hello.sq_entries, hello.arena_size);
        let region = Arc::new(
            SharedRegion::create(&format!("gpushare-client-{id}"), layout)
                .map_err(std::io::Error::other)?,
        );
        let submit_wake = Wakeup::new()?;
        let complete_wake = Wakeup::new()?;
        let fds = vec![
            region.memfd().as_fd().try_clone_to_owned()?,
            submit_wake.dup()?,
            complete_wake.dup()?,
        ];
        let peer = Peer {
            id,
            pid,
            uid: identity.uid,
            user,
            name,
            gpu,
            governed: hello.role == Role::Governed,
        };
        let info = Arc::new(SessionInfo::new(peer, grant, submit_wake));
        if let (_, Some(until)) = self.carried_for(pid) {
            info!(
                client = id,
                pid, "suspect of the fault before the restart: on probation"
            );
            self.health[gpu as usize].set_probation(id, until);
        }
        let modules: Arc<Mutex<ModuleTable<D>>> = Arc::default();
        let (ready_tx, ready) = oneshot::channel();
        let (ended_tx, ended) = oneshot::channel();
        let (device, thread_info, thread_modules, spin) = (
            device.clone(),
            info.clone(),
            modules.clone(),
            self.config.spin,
        );
        let health = self.health[gpu as usize].clone();
        let dispatch = self.dispatch[gpu as usize].clone();
        std::thread::Builder::new()
            .name(format!("gpushare-client-{id}"))
            .spawn(move || {
                let span = info_span!("client", id, pid);
                let _entered = span.enter();
                match SessionState::new(
                    device,
                    thread_info,
                    region,
                    complete_wake,
                    thread_modules,
                    spin,
                    GpuServices { health, dispatch },
                ) {
                    Ok(state) => {
                        let _ = ready_tx.send(Ok(()));
                        let _ = ended_tx.send(state.run());
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        let _ = ended_tx.send(SessionEnd::Stopped);
                    }
                }
            })?;
        Ok(StartedSession {
            info,
            modules,
            fds,
            ready,
            ended,
            layout,
        })
    }
}

/// Stops a session and removes it from the registry when dropped.
struct SessionGuard<'a> {
    info: Arc<SessionInfo>,
    registry: &'a Registry,
}

impl Drop for SessionGuard<'_> {
    fn drop(&mut self) {
        self.info.request_stop();
        self.registry.remove(self.info.id);
    }
}

struct StartedSession<D: Device> {
    info: Arc<SessionInfo>,
    modules: Arc<Mutex<ModuleTable<D>>>,
    fds: Vec<OwnedFd>,
    ready: oneshot::Receiver<Result<(), crate::device::DeviceError>>,
    ended: oneshot::Receiver<SessionEnd>,
    layout: gpushare_protocol::ring::ShmLayout,
}

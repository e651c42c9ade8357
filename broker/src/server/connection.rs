//! An admitted connection's session, from the server's side: a client's shared region,
//! eventfds and data thread are set up, it is registered and welcomed, and its control loop
//! runs; whatever ends it, the session stops and leaves the registry.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex};

use gpushare_protocol::control::{BrokerMessage, Hello, Role, Welcome};
use gpushare_protocol::text::printable;
use gpushare_protocol::{ErrorCode, PROTOCOL_VERSION};
use tokio::sync::{oneshot, watch};
use tokio_seqpacket::UnixSeqpacket;
use tracing::{info, info_span, warn};

use super::framing::{reject, send};
use super::handshake::Admission;
use super::{Broker, Stop};
use crate::access::Identity;
use crate::device::Device;
use crate::gpu::ContextError;
use crate::registry::Registry;
use crate::session::{
    GpuServices, ModuleTable, Pacing, Peer, SessionEnd, SessionInfo, SessionState,
};
use crate::shm::SharedRegion;
use gpushare_protocol::wake::Wakeup;

impl Broker {
    /// Runs an admitted connection: a client's shared region and data thread, the Welcome,
    /// then its control loop until it ends.
    pub(super) async fn session(
        self: Arc<Self>,
        sock: UnixSeqpacket,
        hello: Hello,
        identity: Identity,
        pid: i32,
        admission: Admission,
        mut stop: watch::Receiver<Option<Stop>>,
    ) {
        let Admission {
            grant,
            gpu,
            seat,
            layout,
            domain,
            job,
        } = admission;
        // A monitor holds nothing on a device: the default domain's answers its questions.
        let served = if hello.role == Role::Monitor {
            self.context(gpu, &crate::access::TrustDomain::default())
        } else {
            let (broker, wanted) = (self.clone(), domain.clone());
            tokio::task::spawn_blocking(move || broker.context(gpu, &wanted))
                .await
                .unwrap_or_else(|e| {
                    Err(ContextError::Open {
                        gpu: gpu as u32,
                        domain: domain.clone(),
                        why: e.to_string(),
                    })
                })
        };
        let (device, health) = match served {
            Ok(d) => (d.device, d.health),
            Err(why) => {
                warn!(%domain, %why, "cannot serve a client's trust domain");
                reject(&sock, why.code(), &why.to_string()).await;
                return;
            }
        };
        // A monitor (`gpushare status`, `top`) holds no session: it takes no client id, so the
        // ids users see count clients only.
        let id = if hello.role == Role::Monitor {
            0
        } else {
            self.registry.next_id()
        };
        let user = identity
            .user
            .clone()
            .unwrap_or_else(|| identity.uid.to_string());
        // Shown in terminals, logs and labels: escaped once here.
        let name: String = hello.client_name.chars().take(64).collect();
        let name = printable(&name).into_owned();
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
            memory_granularity: device.space().granularity,
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

        let Some(seat) = seat else {
            reject(&sock, ErrorCode::Internal, "a session without an account").await;
            return;
        };
        let account = seat.account().clone();
        let started = match self.start_session(
            id,
            pid,
            &identity,
            (user, name),
            (grant, account),
            (&hello, layout),
            (&device, &health, domain),
            (gpu as u32, job),
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
        // The data thread has given everything back: the account may go with the seat.
        drop(seat);
    }

    #[allow(clippy::too_many_arguments)]
    fn start_session(
        &self,
        id: u64,
        pid: i32,
        identity: &Identity,
        (user, name): (String, String),
        (grant, account): (crate::access::Grant, Arc<crate::accounts::UserAccount>),
        (hello, layout): (&Hello, gpushare_protocol::ring::ShmLayout),
        (device, health, domain): (
            &Arc<Device>,
            &Arc<crate::gpu::health::DeviceHealth>,
            crate::access::TrustDomain,
        ),
        (gpu, job): (u32, Option<Arc<crate::jobs::Job>>),
    ) -> std::io::Result<StartedSession> {
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
            consolidated: hello.role == Role::Consolidated,
            trust_domain: domain.to_string(),
            job,
        };
        let info = Arc::new(SessionInfo::new(peer, grant, account, submit_wake));
        if let Some(job) = &info.job {
            job.session_started();
        }
        if let (_, Some(until)) = self.carried_for(pid) {
            info!(
                client = id,
                pid, "suspect of the fault before the restart: on probation"
            );
            health.set_probation(id, until);
        }
        let modules: Arc<Mutex<ModuleTable>> = Arc::default();
        let (ready_tx, ready) = oneshot::channel();
        let (ended_tx, ended) = oneshot::channel();
        let (device, thread_info, thread_modules) = (device.clone(), info.clone(), modules.clone());
        let pacing = Pacing {
            spin: self.config.spin,
            spin_ceiling: self.config.spin_ceiling,
            high_spin: self.config.high_spin,
            high_nice: self.config.high_nice,
            stall_limit: self.config.stall_limit,
        };
        let health = health.clone();
        let Some(dispatch) = self.gpus.get(gpu as usize).map(|g| g.scheduler.clone()) else {
            return Err(std::io::Error::other(format!("no GPU {gpu}")));
        };
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
                    pacing,
                    GpuServices { health, dispatch },
                ) {
                    Ok(state) => {
                        state.register();
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
        // After it left the registry, so that a job's figures never count it twice.
        if let Some(job) = &self.info.job {
            job.session_ended(
                self.info
                    .counters
                    .gpu_time_ns
                    .load(std::sync::atomic::Ordering::Relaxed),
            );
        }
    }
}

struct StartedSession {
    info: Arc<SessionInfo>,
    modules: Arc<Mutex<ModuleTable>>,
    fds: Vec<OwnedFd>,
    ready: oneshot::Receiver<Result<(), crate::device::DeviceError>>,
    ended: oneshot::Receiver<SessionEnd>,
    layout: gpushare_protocol::ring::ShmLayout,
}

#[cfg(test)]
mod tests {
    use gpushare_protocol::PriorityClass;
    use gpushare_protocol::control::{ClientMessage, ShutdownKind};

    use super::*;
    use crate::access::Grant;
    use crate::server::testing::{
        hear, hear_with_fds, hello, identity, pair, register, say, sim_broker, within,
    };

    /// Starts `hello`'s session on GPU `gpu` with `grant`, for a client speaking on the
    /// returned socket; the returned stop sender ends it as a broker shutdown would.
    fn start(
        broker: &Arc<Broker>,
        hello: Hello,
        grant: Grant,
        gpu: usize,
    ) -> (
        impl std::future::Future<Output = ()> + use<>,
        UnixSeqpacket,
        watch::Sender<Option<Stop>>,
    ) {
        let (server, client) = pair();
        let (stop_tx, stop) = watch::channel(None::<Stop>);
        let me = std::process::id() as i32;
        let session = broker.clone().session(
            server,
            hello,
            identity(1000, &[]),
            me,
            Admission {
                grant,
                gpu,
                seat: Some(broker.accounts.seat_for_tests(1000, "alice")),
                layout: broker.config.layout_for(0, 0),
                domain: crate::access::TrustDomain::default(),
                job: None,
            },
            stop,
        );
        (session, client, stop_tx)
    }

    #[tokio::test]
    async fn a_client_gets_its_region_and_is_listed_until_it_leaves() {
        let broker = sim_broker(2);
        let grant = Grant {
            class: PriorityClass::BestEffort,
            weight: 3,
            memory_quota: Some(64 << 20),
        };
        for role in [Role::Client, Role::Governed] {
            let long_name = "n".repeat(100);
            let hello = Hello {
                client_name: long_name,
                ..hello(role)
            };
            let (session, client, _stop) = start(&broker, hello, grant, 1);
            let client_side = async {
                let (welcome, fds) = hear_with_fds(&client).await;
                let BrokerMessage::Welcome(w) = welcome else {
                    panic!("expected a Welcome, got {welcome:?}");
                };
                // Registered before the Welcome, so that a request right after it finds it.
                let listed = broker.status().clients;
                let layout = w.layout.expect("a client gets a shared region");
                assert_eq!(fds.len(), 3, "the region's memfd and two eventfds");
                let region = std::fs::File::from(fds.into_iter().next().expect("memfd"));
                let size = region.metadata().expect("memfd metadata").len();
                assert_eq!(size, layout.total_size() as u64);
                assert_eq!(
                    (w.class, w.weight, w.memory_quota),
                    (grant.class, grant.weight, grant.memory_quota)
                );
                assert_eq!(w.device.index, 1, "the admitted GPU");
                say(&client, &ClientMessage::Goodbye).await;
                (w.client_id, listed)
            };
            let ((), (id, listed)) = tokio::join!(within(session), client_side);
            let me = listed
                .iter()
                .find(|c| c.client_id == id)
                .expect("listed once welcomed");
            assert_eq!(me.gpu, 1);
            assert_eq!(me.governed, role == Role::Governed);
            assert_eq!(
                me.name.chars().count(),
                64,
                "names are cut to 64 characters"
            );
            assert!(broker.registry.is_empty(), "{role:?} gone once it leaves");
        }
    }

    #[tokio::test]
    async fn an_evicted_client_is_told_why_and_unregistered() {
        let broker = sim_broker(1);
        let (session, client, _stop) = start(&broker, hello(Role::Client), Grant::default(), 0);
        let client_side = async {
            let (welcome, _fds) = hear_with_fds(&client).await;
            let BrokerMessage::Welcome(w) = welcome else {
                panic!("expected a Welcome, got {welcome:?}");
            };
            broker
                .admin_evict(&identity(0, &[]), w.client_id, "make room".into())
                .expect("root may evict");
            hear(&client).await
        };
        let ((), told) = tokio::join!(within(session), client_side);
        assert_eq!(
            told,
            BrokerMessage::Evicted {
                reason: "make room".into()
            }
        );
        assert!(broker.registry.is_empty());
    }

    #[tokio::test]
    async fn a_stopping_broker_ends_sessions_and_tells_their_clients() {
        let broker = sim_broker(1);
        for role in [Role::Client, Role::Monitor] {
            let (session, client, stop) = start(&broker, hello(role), Grant::default(), 0);
            let client_side = async {
                let _welcome = hear_with_fds(&client).await;
                stop.send(Some(Stop::stopping("upgrade")))
                    .expect("the session listens");
                hear(&client).await
            };
            let ((), told) = tokio::join!(within(session), client_side);
            assert_eq!(
                told,
                BrokerMessage::ShuttingDown {
                    kind: ShutdownKind::Stopping,
                    reason: "upgrade".into()
                },
                "{role:?}"
            );
            assert!(broker.registry.is_empty());
        }
    }

    #[test]
    fn the_guard_stops_the_session_and_unregisters_it() {
        let broker = sim_broker(1);
        let info = register(&broker, 100, 0, false);
        let guard = SessionGuard {
            info: info.clone(),
            registry: &broker.registry,
        };
        assert!(!info.stopping());
        drop(guard);
        assert!(info.stopping(), "the data thread is told to stop");
        assert!(broker.registry.get(info.id).is_none());
    }
}

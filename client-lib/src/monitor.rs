//! A monitor connection: asks the broker for status without holding a GPU session.

use std::path::Path;

use gpushare_protocol::PriorityClass;
use gpushare_protocol::control::{BrokerMessage, ClientMessage, Welcome};
use gpushare_protocol::job::{JobGpu, JobStart, JobStats, PodGrant, PodIdentity};
use gpushare_protocol::stats::StatusReport;

use crate::{Error, Result};
use gpushare_conn::ControlSocket;

pub struct Monitor {
    socket: ControlSocket,
    welcome: Welcome,
    next_request: u64,
}

impl Monitor {
    pub fn connect(path: &Path) -> Result<Monitor> {
        let (socket, welcome) = ControlSocket::monitor(path)?;
        Ok(Monitor {
            socket,
            welcome,
            next_request: 1,
        })
    }

    pub fn welcome(&self) -> &Welcome {
        &self.welcome
    }

    pub fn status(&mut self) -> Result<StatusReport> {
        let request = self.next_request;
        self.next_request += 1;
        self.socket.status(request)
    }

    /// Changes a live client's class, weight or memory quota; `None` leaves a field as it is
    /// and `memory_quota: Some(None)` removes the quota. Only root and the broker's admin group
    /// may; anyone else gets the broker's refusal as [`Error::Request`].
    pub fn admin_set(
        &mut self,
        client: u64,
        class: Option<PriorityClass>,
        weight: Option<u32>,
        memory_quota: Option<Option<u64>>,
    ) -> Result<()> {
        self.admin(|request| ClientMessage::AdminSet {
            request,
            client,
            class,
            weight,
            memory_quota,
        })
    }

    /// Drops a client, which is told `reason`. Same permissions as [`Monitor::admin_set`].
    pub fn admin_evict(&mut self, client: u64, reason: &str) -> Result<()> {
        self.admin(|request| ClientMessage::AdminEvict {
            request,
            client,
            reason: reason.into(),
        })
    }

    /// Tells the broker a batch scheduler's job has started here with shares of its GPUs;
    /// answers with what the broker granted it. Same permissions as [`Monitor::admin_set`].
    pub fn job_start(&mut self, start: JobStart) -> Result<JobStats> {
        self.ask_job(|request| ClientMessage::AdminJobStart { request, start })
    }

    /// Tells the broker a job has ended: its grant goes and its sessions still open are
    /// evicted. Answers with the job's last figures; a job the broker does not hold is
    /// [`Error::Request`] with `NotFound`. Same permissions as [`Monitor::admin_set`].
    pub fn job_end(&mut self, job: u64) -> Result<JobStats> {
        self.ask_job(|request| ClientMessage::AdminJobEnd { request, job })
    }

    /// Tells the broker a Kubernetes container was allocated shares of its GPUs (gpushare's
    /// kubelet plugin does): answers with the job gpushared numbered for it and the socket
    /// directory to mount into the container. Same permissions as [`Monitor::admin_set`].
    pub fn pod_start(&mut self, gpus: Vec<JobGpu>) -> Result<PodGrant> {
        self.ask(
            |request| ClientMessage::AdminPodStart { request, gpus },
            |m, request| match m {
                BrokerMessage::Pod { request: r, result } if r == request => {
                    Some(result.map_err(Error::Request))
                }
                _ => None,
            },
        )
    }

    /// Tells the broker which pod holds Kubernetes job `job`; answers with its figures, on
    /// the grant the policy gives that pod.
    pub fn pod_identify(&mut self, job: u64, pod: PodIdentity) -> Result<JobStats> {
        self.ask_job(|request| ClientMessage::AdminPodIdentify { request, job, pod })
    }

    fn ask_job(&mut self, build: impl FnOnce(u64) -> ClientMessage) -> Result<JobStats> {
        self.ask(build, |m, request| match m {
            BrokerMessage::Job { request: r, result } if r == request => {
                Some(result.map_err(Error::Request))
            }
            _ => None,
        })
    }

    fn admin(&mut self, build: impl FnOnce(u64) -> ClientMessage) -> Result<()> {
        self.ask(build, |m, request| match m {
            BrokerMessage::AdminDone { request: r, result } if r == request => {
                Some(result.map_err(Error::Request))
            }
            _ => None,
        })
    }

    /// Sends one request and waits for the answer `answer` recognises.
    fn ask<T>(
        &mut self,
        build: impl FnOnce(u64) -> ClientMessage,
        answer: impl Fn(BrokerMessage, u64) -> Option<Result<T>>,
    ) -> Result<T> {
        let request = self.next_request;
        self.next_request += 1;
        self.socket.send(&build(request), &[])?;
        loop {
            let message = self.socket.recv()?.0;
            match message {
                BrokerMessage::ShuttingDown { kind, reason } => {
                    return Err(Error::shutdown(kind, reason));
                }
                // Request 0: a broker that could not even decode the message (an older one).
                BrokerMessage::RequestFailed { request: r, error } if r == request || r == 0 => {
                    return Err(Error::Request(error));
                }
                BrokerMessage::Evicted { reason } => return Err(Error::Evicted(reason)),
                other => {
                    if let Some(done) = answer(other, request) {
                        return done;
                    }
                }
            }
        }
    }
}

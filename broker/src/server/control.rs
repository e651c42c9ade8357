//! A connection's control requests, answered in order until it ends: status for anyone,
//! modules and functions for a client session, admin requests (`admin`), and notices and
//! shutdown for the client.

use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};

use gpushare_protocol::ErrorCode;
use gpushare_protocol::control::{BrokerMessage, ClientMessage, MAX_MODULE_IMAGE, ModuleFormat};
use gpushare_protocol::error::WireError;
use tokio::sync::{oneshot, watch};
use tokio_seqpacket::UnixSeqpacket;
use tracing::debug;

use super::framing::{recv, send};
use super::{Broker, Stop};
use crate::access::Identity;
use crate::device::Device;
use crate::images::{HeldImage, Holder, ImageCache};
use crate::session::{ModuleTable, SessionEnd, SessionInfo};

/// A client session's module table and the device it runs on.
pub(super) type SessionScope<'a> = (&'a Arc<Mutex<ModuleTable>>, &'a Arc<Device>);

impl Broker {
    /// Serves control requests until the client leaves, the broker stops, or the session's
    /// data thread ends on its own.
    pub(super) async fn control_loop(
        &self,
        sock: &UnixSeqpacket,
        // A client session's module table and the device it runs on; `None` for monitors.
        modules: Option<SessionScope<'_>>,
        // The client session, for notices its data thread posts; `None` for monitors.
        session: Option<&SessionInfo>,
        who: &Identity,
        stop: &mut watch::Receiver<Option<Stop>>,
        mut ended: Option<&mut oneshot::Receiver<SessionEnd>>,
    ) -> Option<SessionEnd> {
        loop {
            let thread_ended = async {
                match ended.as_deref_mut() {
                    Some(rx) => rx.await.unwrap_or(SessionEnd::Stopped),
                    None => std::future::pending().await,
                }
            };
            let notice = async {
                match session {
                    Some(info) => info.notice_posted.notified().await,
                    None => std::future::pending().await,
                }
            };
            // A monitor holds a descriptor and nothing else: one that asks nothing goes.
            let idle = async {
                match session {
                    Some(_) => std::future::pending().await,
                    None => tokio::time::sleep(self.config.monitor_idle).await,
                }
            };
            let msg = tokio::select! {
                m = recv(sock) => m,
                () = idle => {
                    debug!("closing an idle monitor connection");
                    let reason = format!(
                        "monitor connection closed after {} s without a request",
                        self.config.monitor_idle.as_secs_f64()
                    );
                    let _ = send(sock, &BrokerMessage::Evicted { reason }, &[]).await;
                    return None;
                }
                () = notice => {
                    if let Some(msg) = session.and_then(|i| i.take_notice())
                        && send(sock, &msg, &[]).await.is_err()
                    {
                        return None;
                    }
                    continue;
                }
                _ = stop.changed() => {
                    let Stop { kind, reason } = stop.borrow().clone().unwrap_or_else(|| Stop::stopping("broker shutting down"));
                    let _ = send(sock, &BrokerMessage::ShuttingDown { kind, reason }, &[]).await;
                    return None;
                }
                end = thread_ended => {
                    let reason = match &end {
                        SessionEnd::ProtocolViolation(why) => Some(format!("protocol violation: {why}")),
                        SessionEnd::Evicted(why) => Some(why.clone()),
                        SessionEnd::Stopped => None,
                    };
                    if let Some(reason) = reason {
                        let _ = send(sock, &BrokerMessage::Evicted { reason }, &[]).await;
                    }
                    // The receiver is spent: hand the outcome to the caller.
                    return Some(end);
                }
            };
            let (msg, fds) = match msg {
                Ok(Some(m)) => m,
                Ok(None) => return None,
                Err(e) => {
                    debug!(error = %e, "malformed control message");
                    let error = WireError::new(ErrorCode::ProtocolViolation, e.to_string());
                    if send(
                        sock,
                        &BrokerMessage::RequestFailed { request: 0, error },
                        &[],
                    )
                    .await
                    .is_err()
                    {
                        return None;
                    }
                    continue;
                }
            };
            if matches!(
                msg,
                ClientMessage::ExportMemory { .. }
                    | ClientMessage::ImportMemory { .. }
                    | ClientMessage::EnablePeerAccess { .. }
            ) {
                let (reply, out) = self.memory_request(&msg, fds, session).unwrap_or_else(|| {
                    let error = WireError::new(ErrorCode::Internal, "unrouted request");
                    (
                        BrokerMessage::RequestFailed { request: 0, error },
                        Vec::new(),
                    )
                });
                let out: Vec<_> = out.iter().map(|f| std::os::fd::AsFd::as_fd(f)).collect();
                if send(sock, &reply, &out).await.is_err() {
                    return None;
                }
                continue;
            }
            let consolidated = matches!(
                msg,
                ClientMessage::LoadCachedModule { .. }
                    | ClientMessage::GetFunctionInfo { .. }
                    | ClientMessage::GetGlobal { .. }
                    | ClientMessage::ShareHostMemory { .. }
                    | ClientMessage::UnshareHostMemory { .. }
                    | ClientMessage::EncodeTensorMap { .. }
                    | ClientMessage::GetFunctionNames { .. }
                    | ClientMessage::MakeGraph { .. }
            );
            if consolidated && let Some(scope) = modules {
                let reply = self
                    .consolidated_request(&msg, fds, scope, session)
                    .await
                    .unwrap_or_else(|| BrokerMessage::RequestFailed {
                        request: 0,
                        error: WireError::new(ErrorCode::Internal, "unrouted request"),
                    });
                if send(sock, &reply, &[]).await.is_err() {
                    return None;
                }
                continue;
            }
            let reply = match (msg, modules) {
                (ClientMessage::Goodbye, _) => return None,
                (ClientMessage::Ping { request }, _) => BrokerMessage::Pong { request },
                (ClientMessage::Status { request }, _) => BrokerMessage::Status {
                    request,
                    report: Box::new(self.status()),
                },
                (ClientMessage::Hello(_), _) => BrokerMessage::RequestFailed {
                    request: 0,
                    error: WireError::new(ErrorCode::ProtocolViolation, "already said hello"),
                },
                (
                    ClientMessage::LoadModule {
                        request,
                        format,
                        image_len,
                    },
                    Some(m),
                ) => {
                    let result = match session.map(|s| self.holder(s)) {
                        Some(holder) => {
                            Self::load_module(m, &self.images, &holder, format, image_len, fds)
                                .await
                        }
                        None => Err(WireError::new(
                            ErrorCode::Internal,
                            "a module without a session",
                        )),
                    };
                    BrokerMessage::ModuleLoaded { request, result }
                }
                (
                    ClientMessage::GetFunction {
                        request,
                        module,
                        name,
                    },
                    Some(m),
                ) => {
                    let result = Self::get_function(m.0, m.1, module, name).await;
                    BrokerMessage::Function { request, result }
                }
                (ClientMessage::UnloadModule { request, module }, Some(m)) => {
                    let removed =
                        m.0.lock()
                            .map(|mut t| t.remove_module(module))
                            .unwrap_or(false);
                    let result = if removed {
                        Ok(())
                    } else {
                        Err(WireError::new(
                            ErrorCode::InvalidHandle,
                            format!("no module {module}"),
                        ))
                    };
                    BrokerMessage::ModuleUnloaded { request, result }
                }
                (
                    ClientMessage::LoadModule { request, .. }
                    | ClientMessage::GetFunction { request, .. }
                    | ClientMessage::UnloadModule { request, .. }
                    | ClientMessage::LoadCachedModule { request, .. }
                    | ClientMessage::GetFunctionInfo { request, .. }
                    | ClientMessage::GetGlobal { request, .. }
                    | ClientMessage::ShareHostMemory { request, .. }
                    | ClientMessage::UnshareHostMemory { request, .. }
                    | ClientMessage::ExportMemory { request, .. }
                    | ClientMessage::ImportMemory { request, .. }
                    | ClientMessage::EnablePeerAccess { request, .. }
                    | ClientMessage::EncodeTensorMap { request, .. }
                    | ClientMessage::GetFunctionNames { request, .. }
                    | ClientMessage::MakeGraph { request, .. },
                    _,
                ) => BrokerMessage::RequestFailed {
                    request,
                    error: WireError::new(
                        ErrorCode::PermissionDenied,
                        "monitor connections cannot load modules",
                    ),
                },
                (
                    ClientMessage::AdminSet {
                        request,
                        client,
                        class,
                        weight,
                        memory_quota,
                    },
                    _,
                ) => BrokerMessage::AdminDone {
                    request,
                    result: self.admin_set(who, client, class, weight, memory_quota),
                },
                (
                    ClientMessage::AdminEvict {
                        request,
                        client,
                        reason,
                    },
                    _,
                ) => BrokerMessage::AdminDone {
                    request,
                    result: self.admin_evict(who, client, reason),
                },
                (ClientMessage::AdminJobStart { request, start }, _) => BrokerMessage::Job {
                    request,
                    result: self.admin_job_start(who, start),
                },
                (ClientMessage::AdminJobEnd { request, job }, _) => BrokerMessage::Job {
                    request,
                    result: self.admin_job_end(who, job).await,
                },
                (ClientMessage::AdminPodStart { request, gpus }, _) => BrokerMessage::Pod {
                    request,
                    result: self.admin_pod_start(who, gpus),
                },
                (ClientMessage::AdminPodIdentify { request, job, pod }, _) => BrokerMessage::Job {
                    request,
                    result: self.admin_pod_identify(who, job, pod),
                },
            };
            if send(sock, &reply, &[]).await.is_err() {
                return None;
            }
        }
    }

    /// What a session's modules are counted against: its user's account.
    pub(super) fn holder(&self, session: &SessionInfo) -> Holder {
        Holder {
            accounts: self.accounts.clone(),
            account: session.account().clone(),
        }
    }

    pub(super) async fn load_module(
        (modules, device): SessionScope<'_>,
        images: &Arc<ImageCache>,
        holder: &Holder,
        format: ModuleFormat,
        image_len: u64,
        fds: Vec<OwnedFd>,
    ) -> Result<u64, WireError> {
        let fd = fds.into_iter().next().ok_or_else(|| {
            WireError::new(
                ErrorCode::InvalidArgument,
                "LoadModule must carry the image as a file descriptor",
            )
        })?;
        if image_len > MAX_MODULE_IMAGE {
            return Err(WireError::new(
                ErrorCode::InvalidArgument,
                format!(
                    "module image of {image_len} bytes exceeds the {MAX_MODULE_IMAGE}-byte limit"
                ),
            ));
        }
        let (cache, who) = (images.clone(), holder.clone());
        let image = tokio::task::spawn_blocking(move || cache.receive(fd, image_len, &who))
            .await
            .map_err(|e| WireError::new(ErrorCode::Internal, e.to_string()))??;
        Self::load_held(modules, device, format, image).await
    }

    /// Loads a module from an image held for the session; the table keeps both.
    pub(super) async fn load_held(
        modules: &Arc<Mutex<ModuleTable>>,
        device: &Arc<Device>,
        format: ModuleFormat,
        image: HeldImage,
    ) -> Result<u64, WireError> {
        let (device, bytes) = (device.clone(), image.bytes().clone());
        let module = tokio::task::spawn_blocking(move || {
            device
                .load_module(format, bytes)
                .map_err(|e| WireError::new(e.code(), e.to_string()))
        })
        .await
        .map_err(|e| WireError::new(ErrorCode::Internal, e.to_string()))??;
        let mut table = modules
            .lock()
            .map_err(|_| WireError::new(ErrorCode::Internal, "module table poisoned"))?;
        table
            .insert_module_from(module, image)
            .map_err(|c| WireError::new(c, "too many modules"))
    }

    pub(super) async fn get_function(
        modules: &Arc<Mutex<ModuleTable>>,
        device: &Arc<Device>,
        module: u64,
        name: String,
    ) -> Result<u64, WireError> {
        let m = super::driver::module_of(modules, module)?;
        let device = device.clone();
        let f = super::driver::quick(move || device.get_function(&m, &name))
            .await?
            .map_err(super::driver::told)?;
        let mut table = modules
            .lock()
            .map_err(|_| WireError::new(ErrorCode::Internal, "module table poisoned"))?;
        table
            .insert_function(module, f)
            .map_err(|c| WireError::new(c, "too many functions"))
    }
}

#[cfg(test)]
mod tests;

//! Physical memory one process shares with another (`cuMemExportToShareableHandle`, then
//! `cuMemImportFromShareableHandle` in the other): the exporter gets a descriptor of a sealed,
//! empty memfd the broker keeps open too, so its inode names the memory for as long as any
//! session holds a handle of it; the importer sends that descriptor back and gets a handle.
//! Having the descriptor is the right to the memory, as with CUDA's own; between Unix users
//! only when the policy says `share_memory_between_users = true`, and only on the same GPU.

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex, Weak};

use gpushare_protocol::ErrorCode;
use gpushare_protocol::control::{BrokerMessage, ClientMessage};
use gpushare_protocol::error::WireError;
use nix::sys::memfd::{MFdFlags, memfd_create};

use super::Broker;
use crate::session::SessionInfo;
use crate::session::vmm::Physical;

/// Exported memory by its token's (device, inode).
#[derive(Default)]
pub struct Exports {
    by_token: Mutex<HashMap<(u64, u64), Export>>,
}

struct Export {
    /// Kept open so that no other file takes its inode while the memory lives.
    _token: OwnedFd,
    physical: Weak<Physical>,
    uid: u32,
}

fn wire(code: ErrorCode, message: impl Into<String>) -> WireError {
    WireError::new(code, message)
}

fn identity(fd: &OwnedFd) -> Result<(u64, u64), WireError> {
    let st = nix::sys::stat::fstat(fd.as_fd())
        .map_err(|e| wire(ErrorCode::InvalidArgument, format!("not a descriptor: {e}")))?;
    Ok((st.st_dev, st.st_ino))
}

impl Exports {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(u64, u64), Export>> {
        self.by_token.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A fresh token for `physical`, `uid`'s; the caller sends it.
    fn export(&self, physical: &std::sync::Arc<Physical>, uid: u32) -> Result<OwnedFd, WireError> {
        let failed = |e: nix::Error| wire(ErrorCode::Internal, format!("cannot make a token: {e}"));
        let token = memfd_create(
            "gpushare-device-memory",
            MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING,
        )
        .map_err(failed)?;
        let seals =
            libc::F_SEAL_SEAL | libc::F_SEAL_GROW | libc::F_SEAL_SHRINK | libc::F_SEAL_WRITE;
        nix::fcntl::fcntl(
            &token,
            nix::fcntl::FcntlArg::F_ADD_SEALS(nix::fcntl::SealFlag::from_bits_truncate(seals)),
        )
        .map_err(failed)?;
        let sent = token
            .try_clone()
            .map_err(|e| wire(ErrorCode::Internal, format!("cannot make a token: {e}")))?;
        let key = identity(&token)?;
        let mut exports = self.lock();
        exports.retain(|_, e| e.physical.strong_count() > 0);
        exports.insert(
            key,
            Export {
                _token: token,
                physical: std::sync::Arc::downgrade(physical),
                uid,
            },
        );
        Ok(sent)
    }

    /// The memory `token` names, if it lives and `uid` may take it.
    fn import(
        &self,
        token: &OwnedFd,
        uid: u32,
        between_users: bool,
    ) -> Result<std::sync::Arc<Physical>, WireError> {
        let key = identity(token)?;
        let exports = self.lock();
        let export = exports.get(&key).ok_or_else(|| {
            wire(
                ErrorCode::InvalidArgument,
                "the descriptor is not device memory exported through gpushare",
            )
        })?;
        if export.uid != uid && !between_users {
            return Err(wire(
                ErrorCode::PermissionDenied,
                "the memory is another user's, and the policy does not let users share memory",
            ));
        }
        export.physical.upgrade().ok_or_else(|| {
            wire(
                ErrorCode::InvalidArgument,
                "the exported memory is gone: no process holds it any more",
            )
        })
    }
}

impl Broker {
    /// The pairs of GPUs where the first reaches the second's memory (asked of the driver
    /// once).
    pub(super) fn peers(&self) -> &[(u32, u32)] {
        self.peers.get_or_init(|| {
            let n = self.gpus.len() as u32;
            (0..n)
                .flat_map(|a| (0..n).map(move |b| (a, b)))
                .filter(|&(a, b)| a != b && self.reaches(a, b))
                .collect()
        })
    }

    /// Whether programs on GPU `from` can map memory made on another GPU `to` (the GPUs' peer
    /// access: what NCCL's transport between the processes of a job on two GPUs maps); asked
    /// once a pair, by [`Broker::peers`].
    fn reaches(&self, from: u32, to: u32) -> bool {
        let device = |gpu: u32| self.gpus.get(gpu as usize).map(|g| g.device());
        match (device(from), device(to)) {
            (Some(a), Some(b)) => match (a.backend(), b.backend()) {
                // The sim's memory is host memory: every sim GPU reaches every other's.
                ("sim", "sim") => true,
                ("cuda", "cuda") => crate::device::cuda::peer::reaches(a.info().pci, b.info().pci),
                _ => false,
            },
            _ => false,
        }
    }

    /// Peer access for a session's GPU to GPU `peer` (a process working on both): `peer`'s
    /// memory of the session's trust domain mapped into the session's GPU context.
    fn enable_peer_access(&self, info: &SessionInfo, peer: u32) -> Result<(), WireError> {
        let invalid = |why: String| wire(ErrorCode::InvalidArgument, why);
        if peer == info.gpu {
            return Err(invalid(format!("GPU {peer} is this session's own")));
        }
        if !self.peers().contains(&(info.gpu, peer)) {
            return Err(invalid(format!(
                "GPU {} cannot reach GPU {peer}'s memory (no peer access between them)",
                info.gpu
            )));
        }
        let domain = crate::access::TrustDomain::new(&info.trust_domain)
            .map_err(|e| wire(ErrorCode::Internal, e.to_string()))?;
        let context = |gpu: u32| {
            let g = self
                .gpus
                .get(gpu as usize)
                .ok_or_else(|| invalid(format!("no GPU {gpu}")))?;
            // Made already where the process works: it has a session there.
            g.context(&domain, None).map_err(|e| {
                invalid(format!(
                    "GPU {gpu} serves no context of trust domain {domain} yet: {e}"
                ))
            })
        };
        let (mine, theirs) = (context(info.gpu)?, context(peer)?);
        let mut held = info
            .peers
            .lock()
            .map_err(|_| wire(ErrorCode::Internal, "peer table poisoned"))?;
        if held.iter().any(|d| Arc::ptr_eq(d, &theirs.device)) {
            return Ok(());
        }
        theirs
            .device
            .mirror_into(&mine.device, info.id)
            .map_err(|e| wire(e.code(), format!("peer access to GPU {peer}: {e}")))?;
        held.push(theirs.device.clone());
        tracing::info!(
            from = info.gpu,
            to = peer,
            %domain,
            pid = info.pid,
            "peer access: GPU {peer}'s memory of trust domain {domain} mapped into GPU {}'s context",
            info.gpu
        );
        Ok(())
    }

    /// Answers `ExportMemory`, `ImportMemory` and `EnablePeerAccess` (`None` for any other
    /// message); the reply's descriptors go with it.
    pub(super) fn memory_request(
        &self,
        msg: &ClientMessage,
        fds: Vec<OwnedFd>,
        session: Option<&SessionInfo>,
    ) -> Option<(BrokerMessage, Vec<OwnedFd>)> {
        let no_session = || wire(ErrorCode::PermissionDenied, "monitors hold no memory");
        Some(match *msg {
            ClientMessage::ExportMemory { request, handle } => {
                let token = session.ok_or_else(no_session).and_then(|info| {
                    let physical = info
                        .vmm
                        .lock()
                        .map_err(|_| wire(ErrorCode::Internal, "handle table poisoned"))?
                        .physical(handle)
                        .ok_or_else(|| {
                            wire(
                                ErrorCode::InvalidHandle,
                                format!("no memory handle {handle}"),
                            )
                        })?;
                    self.exports.export(&physical, info.uid)
                });
                match token {
                    Ok(fd) => (
                        BrokerMessage::MemoryExported {
                            request,
                            result: Ok(()),
                        },
                        vec![fd],
                    ),
                    Err(e) => (
                        BrokerMessage::MemoryExported {
                            request,
                            result: Err(e),
                        },
                        Vec::new(),
                    ),
                }
            }
            ClientMessage::EnablePeerAccess { request, gpu } => {
                let result = session
                    .ok_or_else(no_session)
                    .and_then(|info| self.enable_peer_access(info, gpu));
                (
                    BrokerMessage::PeerAccessEnabled { request, result },
                    Vec::new(),
                )
            }
            ClientMessage::ImportMemory { request } => {
                let result = session.ok_or_else(no_session).and_then(|info| {
                    let token = fds.first().ok_or_else(|| {
                        wire(
                            ErrorCode::InvalidArgument,
                            "ImportMemory must carry a descriptor",
                        )
                    })?;
                    let physical =
                        self.exports
                            .import(token, info.uid, self.shares_memory_between_users())?;
                    if info.gpu != physical.gpu
                        && !self.peers().contains(&(info.gpu, physical.gpu))
                    {
                        return Err(wire(
                            ErrorCode::InvalidArgument,
                            format!(
                                "the memory is on GPU {}, which this program's GPU {} cannot reach (no peer access between them)",
                                physical.gpu, info.gpu
                            ),
                        ));
                    }
                    let size = physical.size;
                    let handle = info
                        .vmm
                        .lock()
                        .map_err(|_| wire(ErrorCode::Internal, "handle table poisoned"))?
                        .add(physical, 0)
                        .map_err(|c| wire(c, "too many memory handles"))?;
                    Ok((handle, size))
                });
                (
                    BrokerMessage::MemoryImported { request, result },
                    Vec::new(),
                )
            }
            _ => return None,
        })
    }
}

impl Broker {
    fn shares_memory_between_users(&self) -> bool {
        self.policy
            .read()
            .map(|p| p.shares_memory_between_users())
            .unwrap_or(false)
    }
}

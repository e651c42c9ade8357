//! CUDA IPC for a consolidated client (`cuIpcGetMemHandle`, `cuIpcOpenMemHandle`,
//! `cuIpcCloseMemHandle`, `cuIpcGetEventHandle`, `cuIpcOpenEventHandle`): what it shares and
//! opens through its device's registry (`device/ipc.rs`). Only the same Unix user's
//! sessions on the same device (one context: the same GPU and trust domain) can open what
//! one shares; memory opened stays at its own address and counts against its exporter.

use gpushare_protocol::{DevicePtr, ErrorCode, EventId, MAX_EVENTS};

use super::{MAX_ALLOCATIONS, SessionState};
use crate::device::ipc::{SharedMemory, token_of, words_of};

impl SessionState {
    pub(super) fn ipc_export_memory(&mut self, ptr: DevicePtr) -> Result<(u64, u64), ErrorCode> {
        let (base, size) = self
            .allocations
            .containing(ptr)
            .ok_or(ErrorCode::InvalidPointer)?;
        let token = self.device.ipc().export_memory(SharedMemory {
            base,
            size,
            uid: self.info.uid,
            session: self.info.id,
        });
        Ok(words_of(token))
    }

    pub(super) fn ipc_open_memory(&mut self, lo: u64, hi: u64) -> Result<(u64, u64), ErrorCode> {
        let token = token_of(lo, hi);
        let m = self
            .device
            .ipc()
            .memory(token)
            .ok_or(ErrorCode::InvalidArgument)?;
        if m.uid != self.info.uid {
            return Err(ErrorCode::PermissionDenied);
        }
        if m.session == self.info.id {
            // CUDA refuses a handle in the process that made it.
            return Err(ErrorCode::InvalidArgument);
        }
        if self.ipc_opened.len() >= MAX_ALLOCATIONS {
            return Err(ErrorCode::TooManyHandles);
        }
        self.ipc_opened.insert(m.base, (m.size, token));
        Ok((m.base, m.size))
    }

    pub(super) fn ipc_close_memory(&mut self, ptr: DevicePtr) -> Result<(u64, u64), ErrorCode> {
        self.ipc_opened
            .remove(&ptr)
            .map(|_| (0, 0))
            .ok_or(ErrorCode::InvalidPointer)
    }

    pub(super) fn ipc_export_event(&mut self, event: EventId) -> Result<(u64, u64), ErrorCode> {
        let e = self.events.get(&event).ok_or(ErrorCode::InvalidHandle)?;
        let token = self
            .device
            .ipc()
            .export_event(e, self.info.uid, self.info.id);
        Ok(words_of(token))
    }

    pub(super) fn ipc_open_event(
        &mut self,
        lo: u64,
        hi: u64,
        id: EventId,
    ) -> Result<(u64, u64), ErrorCode> {
        if id == 0 || self.events.contains_key(&id) {
            return Err(ErrorCode::InvalidHandle);
        }
        if self.events.len() >= MAX_EVENTS {
            return Err(ErrorCode::TooManyHandles);
        }
        let (event, uid, session) = self
            .device
            .ipc()
            .event(token_of(lo, hi))
            .ok_or(ErrorCode::InvalidArgument)?;
        if uid != self.info.uid {
            return Err(ErrorCode::PermissionDenied);
        }
        if session == self.info.id {
            return Err(ErrorCode::InvalidArgument);
        }
        self.events.insert(id, event);
        Ok((0, 0))
    }

    /// Whether `[ptr, ptr + len)` lies in memory this session opened and its exporter
    /// still shares.
    pub(super) fn in_opened_memory(&self, ptr: DevicePtr, len: u64) -> bool {
        let Some((&base, &(size, token))) = self.ipc_opened.range(..=ptr).next_back() else {
            return false;
        };
        let inside = ptr
            .checked_add(len)
            .is_some_and(|end| end <= base.saturating_add(size));
        inside && self.device.ipc().memory(token).is_some()
    }

    /// Shares nothing and has nothing open any more (the session ends, or lost its memory).
    pub(super) fn forget_ipc(&mut self) {
        self.device.ipc().forget_session(self.info.id);
        self.ipc_opened.clear();
    }
}

//! CUDA IPC within one context (`cuIpcGetMemHandle`, `cuIpcGetEventHandle` and their
//! `Open`s): what one session shares with the same user's other sessions on this device, by
//! a random token. Memory is shared at its own address (every session of the device runs in
//! the same context), for as long as its exporter holds it; an event is the same device
//! event, for as long as any session holds it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use gpushare_protocol::DevicePtr;

use super::handles::Event;

/// Memory a session shared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SharedMemory {
    pub base: DevicePtr,
    pub size: u64,
    pub uid: u32,
    pub session: u64,
}

struct SharedEvent {
    event: Weak<Event>,
    uid: u32,
    session: u64,
}

#[derive(Default)]
struct State {
    memory: HashMap<u128, SharedMemory>,
    events: HashMap<u128, SharedEvent>,
}

/// A device's shared memory and events, by token.
#[derive(Default)]
pub struct Ipc {
    state: Mutex<State>,
}

/// 128 random bits: a token cannot be guessed.
fn token() -> u128 {
    let mut bytes = [0u8; 16];
    let mut filled = 0;
    while filled < bytes.len() {
        // SAFETY: writes at most the rest of `bytes`, which we own.
        let n = unsafe {
            libc::getrandom(bytes[filled..].as_mut_ptr().cast(), bytes.len() - filled, 0)
        };
        if n > 0 {
            filled += n as usize;
        }
    }
    u128::from_le_bytes(bytes)
}

impl Ipc {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Shares `memory`; the token it already has if it was shared before.
    pub fn export_memory(&self, memory: SharedMemory) -> u128 {
        let mut st = self.lock();
        if let Some((&t, _)) = st.memory.iter().find(|(_, m)| **m == memory) {
            return t;
        }
        let t = token();
        st.memory.insert(t, memory);
        t
    }

    /// The memory a token names, while its exporter holds it.
    pub fn memory(&self, token: u128) -> Option<SharedMemory> {
        self.lock().memory.get(&token).copied()
    }

    /// Session `session` let go of the memory at `base` (freed it): it is shared no more.
    pub fn forget_memory(&self, session: u64, base: DevicePtr) {
        self.lock()
            .memory
            .retain(|_, m| !(m.session == session && m.base == base));
    }

    /// Session `session` ended, or lost its memory: nothing it shared is shared any more.
    pub fn forget_session(&self, session: u64) {
        let mut st = self.lock();
        st.memory.retain(|_, m| m.session != session);
        st.events
            .retain(|_, e| e.session != session && e.event.strong_count() > 0);
    }

    /// Shares an event.
    pub fn export_event(&self, event: &Arc<Event>, uid: u32, session: u64) -> u128 {
        let mut st = self.lock();
        st.events.retain(|_, e| e.event.strong_count() > 0);
        if let Some((&t, _)) = st.events.iter().find(|(_, e)| {
            e.session == session && std::ptr::eq(e.event.as_ptr(), Arc::as_ptr(event))
        }) {
            return t;
        }
        let t = token();
        st.events.insert(
            t,
            SharedEvent {
                event: Arc::downgrade(event),
                uid,
                session,
            },
        );
        t
    }

    /// The event a token names, its owner's uid and session, while anyone holds it.
    pub fn event(&self, token: u128) -> Option<(Arc<Event>, u32, u64)> {
        let st = self.lock();
        let e = st.events.get(&token)?;
        Some((e.event.upgrade()?, e.uid, e.session))
    }
}

/// A token from its two words, as commands carry it.
pub fn token_of(lo: u64, hi: u64) -> u128 {
    u128::from(lo) | (u128::from(hi) << 64)
}

/// A token as two words (low, high).
pub fn words_of(token: u128) -> (u64, u64) {
    (token as u64, (token >> 64) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_is_shared_by_token_until_its_exporter_lets_go() {
        let ipc = Ipc::default();
        let m = SharedMemory {
            base: 0x1000,
            size: 64,
            uid: 7,
            session: 3,
        };
        let t = ipc.export_memory(m);
        assert_eq!(ipc.export_memory(m), t, "the same memory, the same token");
        assert_ne!(token(), token());
        let (lo, hi) = words_of(t);
        assert_eq!(token_of(lo, hi), t);
        assert_eq!(ipc.memory(t), Some(m));
        assert_eq!(ipc.memory(t ^ 1), None, "a guessed token names nothing");
        ipc.forget_memory(4, 0x1000);
        assert_eq!(
            ipc.memory(t),
            Some(m),
            "another session's free changes nothing"
        );
        ipc.forget_memory(3, 0x1000);
        assert_eq!(ipc.memory(t), None);
        let t2 = ipc.export_memory(m);
        ipc.forget_session(3);
        assert_eq!(ipc.memory(t2), None);
    }
}

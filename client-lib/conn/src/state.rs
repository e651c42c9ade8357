//! What every part of a session shares, below them all: why a session ended, the rings'
//! bookkeeping, and the lock they are all taken with. Imports nothing of this crate's but
//! its errors, so that the parts above it (`session`, `ring`, `news`) point one way.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, MutexGuard};

use gpushare_protocol::StreamId;
use gpushare_protocol::control::ShutdownKind;
use gpushare_protocol::ring::{ClientRings, CompletionEntry};

use crate::error::Error;

/// Takes a lock; one that a panicking holder poisoned is taken all the same (every state
/// under these locks stays consistent between statements).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Why the session is over.
#[derive(Debug, Clone)]
pub(crate) enum Dead {
    Shutdown(ShutdownKind, String),
    Evicted(String),
    Gone,
    /// No sign of life for this many milliseconds.
    Unresponsive(u64),
    Protocol(String),
}

impl Dead {
    pub(crate) fn error(&self) -> Error {
        match self {
            Dead::Shutdown(kind, r) => Error::shutdown(*kind, r.clone()),
            Dead::Evicted(r) => Error::Evicted(r.clone()),
            Dead::Gone => Error::BrokerGone,
            Dead::Unresponsive(ms) => Error::BrokerUnresponsive { waited_ms: *ms },
            Dead::Protocol(r) => Error::Protocol(r.clone()),
        }
    }

    /// Why a session is over after a fatal error met on its socket.
    pub(crate) fn from_error(e: &Error) -> Dead {
        match e {
            Error::BrokerUnresponsive { waited_ms } => Dead::Unresponsive(*waited_ms),
            Error::Protocol(why) => Dead::Protocol(why.clone()),
            _ => Dead::Gone,
        }
    }
}

/// A submission's tag: its sequence number (submission order, from 1) and the low byte of
/// its opcode, so that an error nobody waited for can say what failed.
pub(crate) fn tag_of(seq: u64, op: u16) -> u64 {
    seq << 8 | (op as u64 & 0xff)
}

/// The sequence number in a tag.
pub(crate) fn seq_of(tag: u64) -> u64 {
    tag >> 8
}

/// The client's side of its rings: what it submitted, what it waits for, what it read.
pub(crate) struct RingState {
    pub rings: ClientRings,
    pub next_seq: u64,
    /// Submitted and not yet reaped; never more than the completion ring holds.
    pub in_flight: u32,
    /// Tags somebody waits for, and their completions once reaped.
    pub wanted: HashSet<u64>,
    pub done: HashMap<u64, CompletionEntry>,
    /// Synchronizations answered by the sync word whose completions have not come yet (each
    /// was counted as received when it was answered).
    pub told: HashSet<u64>,
    /// First error of a command nobody waited for, reported at the next synchronization.
    pub async_error: Option<(u16, u32)>,
    pub sleepers: u32,
    /// The sequence number of the last completion reaped. The broker completes commands in
    /// the order they were submitted, so every earlier one has been reaped too.
    pub reaped_seq: u64,
    /// The last wait that left work finished: the stream it waited for (`None`: every
    /// stream) and its sequence number. See [`crate::Session::quiet`].
    pub quiet: Option<(Option<StreamId>, u64)>,
    /// Whether the last command submitted was one its caller waits for (not posted work).
    pub last_waited: bool,
}

impl RingState {
    pub fn new(rings: ClientRings) -> RingState {
        RingState {
            rings,
            next_seq: 1,
            in_flight: 0,
            wanted: HashSet::new(),
            done: HashMap::new(),
            told: HashSet::new(),
            async_error: None,
            sleepers: 0,
            reaped_seq: 0,
            quiet: None,
            last_waited: false,
        }
    }
}

//! The live sessions, for status reports and shutdown.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use gpushare_protocol::stats::ClientStats;

use crate::session::SessionInfo;

#[derive(Default)]
pub struct Registry {
    sessions: Mutex<BTreeMap<u64, Arc<SessionInfo>>>,
    next_id: AtomicU64,
}

impl Registry {
    pub fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed) + 1
    }

    pub fn insert(&self, info: Arc<SessionInfo>) {
        self.lock().insert(info.id, info);
    }

    pub fn remove(&self, id: u64) {
        self.lock().remove(&id);
    }

    pub fn get(&self, id: u64) -> Option<Arc<SessionInfo>> {
        self.lock().get(&id).cloned()
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn snapshot(&self) -> Vec<ClientStats> {
        self.lock()
            .values()
            .map(|s| s.stats(s.counters.streams.load(Ordering::Relaxed) as u32))
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Arc<SessionInfo>>> {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }
}

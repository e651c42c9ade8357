//! What each live governed allocation reserved, by its address (or VMM handle), so that a free
//! gives back exactly that. Sharded by address so that threads allocating at once rarely meet
//! on one lock; the launch path never touches it.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

const SHARDS: usize = 64;

pub struct Sizes {
    shards: [Mutex<HashMap<u64, u64>>; SHARDS],
}

impl Sizes {
    pub fn new() -> Sizes {
        Sizes {
            shards: std::array::from_fn(|_| Mutex::new(HashMap::new())),
        }
    }

    fn shard(&self, key: u64) -> std::sync::MutexGuard<'_, HashMap<u64, u64>> {
        // Allocations are at least 256-byte aligned: mix the higher bits in.
        let h = (key >> 8) ^ (key >> 21) ^ (key >> 34);
        self.shards[(h as usize) % SHARDS]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    pub fn insert(&self, key: u64, bytes: u64) {
        self.shard(key).insert(key, bytes);
    }

    pub fn remove(&self, key: u64) -> Option<u64> {
        self.shard(key).remove(&key)
    }

    /// Bytes recorded over all entries.
    pub fn total(&self) -> u64 {
        (0..SHARDS)
            .map(|i| {
                self.shards[i]
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .values()
                    .sum::<u64>()
            })
            .sum()
    }
}

/// What live allocations reserved, by device address.
pub fn pointers() -> &'static Sizes {
    static S: OnceLock<Sizes> = OnceLock::new();
    S.get_or_init(Sizes::new)
}

/// What live VMM allocations reserved, by handle.
pub fn handles() -> &'static Sizes {
    static S: OnceLock<Sizes> = OnceLock::new();
    S.get_or_init(Sizes::new)
}

/// Device memory the program holds now, as its allocations reserved it.
pub fn held() -> u64 {
    pointers().total().saturating_add(handles().total())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_free_returns_what_its_allocation_recorded_once() {
        let s = Sizes::new();
        for i in 0..1000u64 {
            s.insert(0x7f00_0000_0000 + i * 512, i + 1);
        }
        assert_eq!(s.total(), 1000 * 1001 / 2);
        assert_eq!(s.remove(0x7f00_0000_0000 + 9 * 512), Some(10));
        assert_eq!(s.remove(0x7f00_0000_0000 + 9 * 512), None);
        assert_eq!(s.remove(0x1234), None);
    }
}

//! Device memory held against a quota by sessions on their own threads: the check and the
//! charge are one atomic step. A user's account and a batch scheduler job each keep one.

use std::sync::atomic::{AtomicU64, Ordering};

use gpushare_protocol::ErrorCode;

#[derive(Debug)]
pub struct MemoryTally {
    used: AtomicU64,
    /// `u64::MAX` means unlimited.
    quota: AtomicU64,
}

impl MemoryTally {
    /// Nothing held; `quota` `None` is unlimited.
    pub fn new(quota: Option<u64>) -> MemoryTally {
        MemoryTally {
            used: AtomicU64::new(0),
            quota: AtomicU64::new(quota.unwrap_or(u64::MAX)),
        }
    }

    /// `None` means unlimited.
    pub fn quota(&self) -> Option<u64> {
        Some(self.quota.load(Ordering::Relaxed)).filter(|&q| q != u64::MAX)
    }

    pub fn set_quota(&self, quota: Option<u64>) {
        self.quota
            .store(quota.unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// Counts `bytes` more if the total stays within the quota (else `OutOfQuota`, and
    /// nothing changes).
    pub fn charge(&self, bytes: u64) -> Result<(), ErrorCode> {
        let quota = self.quota.load(Ordering::Relaxed);
        if quota == u64::MAX {
            self.charge_held(bytes);
            return Ok(());
        }
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|&now| now <= quota)
            })
            .map(drop)
            .map_err(|_| ErrorCode::OutOfQuota)
    }

    /// Counts `bytes` more whatever the quota: memory already held.
    pub fn charge_held(&self, bytes: u64) {
        let _ = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                Some(used.saturating_add(bytes))
            });
    }

    /// Gives `bytes` back (never below zero).
    pub fn release(&self, bytes: u64) {
        let _ = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                Some(used.saturating_sub(bytes))
            });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_charge_past_the_quota_changes_nothing_and_held_memory_counts_whatever_it() {
        let t = MemoryTally::new(Some(100));
        assert_eq!(t.charge(60), Ok(()));
        assert_eq!(t.charge(41), Err(ErrorCode::OutOfQuota));
        assert_eq!(t.used(), 60);
        t.charge_held(50);
        assert_eq!(t.used(), 110);
        t.release(200);
        assert_eq!(t.used(), 0, "never below zero");
        t.set_quota(None);
        assert_eq!(t.quota(), None);
        assert_eq!(t.charge(u64::MAX), Ok(()));
        assert_eq!(t.charge(1), Ok(()), "unlimited");
        assert_eq!(t.used(), u64::MAX, "saturated, never wrapped");
    }
}

//! A user's device memory on each GPU, against the policy's `gpu_memory_quota` (the same
//! quota on every GPU, beside the total the user's memory quota bounds). A session charges
//! the tally of its GPU, which it holds from its start; tallies are made on first use.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use gpushare_protocol::stats::GpuMemory;

use super::tally::MemoryTally;

#[derive(Debug)]
pub struct GpuTallies {
    /// `u64::MAX` means unlimited.
    quota: AtomicU64,
    by_gpu: Mutex<BTreeMap<u32, Arc<MemoryTally>>>,
}

impl Default for GpuTallies {
    fn default() -> Self {
        GpuTallies {
            quota: AtomicU64::new(u64::MAX),
            by_gpu: Mutex::default(),
        }
    }
}

impl GpuTallies {
    /// The tally of GPU `gpu`.
    pub fn tally(&self, gpu: u32) -> Arc<MemoryTally> {
        let quota = self.quota();
        self.lock()
            .entry(gpu)
            .or_insert_with(|| Arc::new(MemoryTally::new(quota)))
            .clone()
    }

    /// `None` means unlimited.
    pub fn quota(&self) -> Option<u64> {
        Some(self.quota.load(Ordering::Relaxed)).filter(|&q| q != u64::MAX)
    }

    /// A new quota, on every GPU from now on.
    pub fn set_quota(&self, quota: Option<u64>) {
        self.quota
            .store(quota.unwrap_or(u64::MAX), Ordering::Relaxed);
        for t in self.lock().values() {
            t.set_quota(quota);
        }
    }

    /// What the user holds on each GPU they have used.
    pub fn stats(&self) -> Vec<GpuMemory> {
        self.lock()
            .iter()
            .map(|(&gpu, t)| GpuMemory {
                gpu,
                memory_used: t.used(),
            })
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u32, Arc<MemoryTally>>> {
        self.by_gpu.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_gpu_has_its_own_tally_under_one_quota() {
        let t = GpuTallies::default();
        t.set_quota(Some(100));
        let (g0, g1) = (t.tally(0), t.tally(1));
        assert_eq!(g0.charge(100), Ok(()));
        assert_eq!(
            g1.charge(100),
            Ok(()),
            "another GPU's memory is not counted"
        );
        assert!(g0.charge(1).is_err());
        assert!(Arc::ptr_eq(&g0, &t.tally(0)), "one tally per GPU");
        t.set_quota(Some(150));
        assert_eq!(
            g0.charge(50),
            Ok(()),
            "a new quota holds for tallies made before"
        );
        assert_eq!(t.tally(2).quota(), Some(150));
        let used: Vec<(u32, u64)> = t.stats().iter().map(|m| (m.gpu, m.memory_used)).collect();
        assert_eq!(used, vec![(0, 150), (1, 100), (2, 0)]);
    }
}

//! A client's granted kernels not yet completed, with the sums the policies read of them kept
//! as kernels come and go: a policy looks at every client on every launch, and summing every
//! client's kernels in flight each time (up to 64 each) made the scheduler's lock, which all
//! data threads take per launch, the bottleneck of FAIR with 16 programs on an H200.

use std::collections::VecDeque;

use super::client::Inflight;
use super::profile::Bound;

/// Granted kernels not yet completed, in grant order (they mostly complete in it: the oldest
/// goes without moving the others), and their sums.
#[derive(Debug, Clone, Default)]
pub struct InflightSet {
    list: VecDeque<Inflight>,
    est_ns: u64,
    sms: u64,
    widest: u32,
    /// How many of them are `widest` wide: a program's kernels are often all as wide, and
    /// the widest is looked for again only when the last of those goes.
    at_widest: u32,
    bounds: [u32; 3],
}

impl InflightSet {
    pub(super) fn push(&mut self, f: Inflight) {
        self.est_ns = self.est_ns.saturating_add(f.profile.est_ns);
        self.sms = self.sms.saturating_add(held_sms(&f));
        let need = f.profile.sm_need;
        if need > self.widest || self.list.is_empty() {
            (self.widest, self.at_widest) = (need, 1);
        } else if need == self.widest {
            self.at_widest += 1;
        }
        self.bounds[f.profile.bound.index()] += 1;
        self.list.push_back(f);
    }

    /// Takes the kernel `request` off, if it is in flight.
    pub(super) fn take(&mut self, request: u64) -> Option<Inflight> {
        let pos = self.list.iter().position(|f| f.id == request)?;
        let f = self.list.remove(pos)?;
        self.est_ns = self.est_ns.saturating_sub(f.profile.est_ns);
        self.sms = self.sms.saturating_sub(held_sms(&f));
        let b = &mut self.bounds[f.profile.bound.index()];
        *b = b.saturating_sub(1);
        if f.profile.sm_need == self.widest {
            self.at_widest = self.at_widest.saturating_sub(1);
            if self.at_widest == 0 {
                let needs = || self.list.iter().map(|f| f.profile.sm_need);
                let widest = needs().max().unwrap_or(0);
                self.at_widest = needs().filter(|&n| n == widest).count() as u32;
                self.widest = widest;
            }
        }
        Some(f)
    }

    pub fn len(&self) -> usize {
        self.list.len()
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Oldest first.
    pub fn iter(&self) -> impl Iterator<Item = &Inflight> {
        self.list.iter()
    }

    /// The latest granted.
    pub fn last(&self) -> Option<&Inflight> {
        self.list.back()
    }

    /// Estimated time of all of them.
    pub(super) fn est_ns(&self) -> u64 {
        self.est_ns
    }

    /// SMs they hold together (each its grid, or its partition if smaller).
    pub(super) fn sms(&self) -> u64 {
        self.sms
    }

    /// The grid of the widest of them, in SMs (0: none).
    pub(super) fn widest(&self) -> u32 {
        self.widest
    }

    /// Whether one of them is bound by `bound`.
    pub(super) fn has(&self, bound: Bound) -> bool {
        self.bounds[bound.index()] > 0
    }
}

/// SMs a kernel in flight holds: its grid's, or its partition's if smaller.
fn held_sms(f: &Inflight) -> u64 {
    u64::from(
        f.sm_limit
            .map_or(f.profile.sm_need, |l| l.min(f.profile.sm_need)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sched::{KernelKey, KernelProfile};

    fn kernel(id: u64, est_ns: u64, sms: u32, bound: Bound, sm_limit: Option<u32>) -> Inflight {
        Inflight {
            id,
            profile: KernelProfile::new(KernelKey::client_function(1, id, sms), est_ns, bound, 132),
            submitted_at: 0,
            granted_at: 0,
            due_at: est_ns,
            grant_seq: id,
            sm_limit,
            overlapped: false,
            deadline_sms: 0,
        }
    }

    #[test]
    fn the_sums_follow_kernels_granted_and_completed_in_any_order() {
        let mut set = InflightSet::default();
        set.push(kernel(1, 100, 8, Bound::Compute, None));
        set.push(kernel(2, 50, 64, Bound::Memory, Some(16)));
        set.push(kernel(3, 10, 32, Bound::Compute, None));
        assert_eq!(
            (set.est_ns(), set.sms(), set.widest()),
            (160, 8 + 16 + 32, 64)
        );
        assert!(set.has(Bound::Memory) && !set.has(Bound::Unknown));
        // The widest goes: the next widest is found.
        assert_eq!(set.take(2).map(|f| f.id), Some(2));
        assert_eq!((set.est_ns(), set.sms(), set.widest()), (110, 40, 32));
        assert!(!set.has(Bound::Memory));
        assert_eq!(set.take(2), None);
        assert_eq!(set.iter().map(|f| f.id).collect::<Vec<_>>(), [1, 3]);
        set.take(1);
        set.take(3);
        assert_eq!(
            (set.est_ns(), set.sms(), set.widest(), set.len()),
            (0, 0, 0, 0)
        );
    }

    #[test]
    fn the_widest_stays_until_the_last_kernel_that_wide_goes() {
        let mut set = InflightSet::default();
        for (id, sms) in [(1, 132), (2, 8), (3, 132), (4, 64)] {
            set.push(kernel(id, 10, sms, Bound::Compute, None));
        }
        set.take(1);
        assert_eq!(set.widest(), 132);
        set.take(3);
        assert_eq!(set.widest(), 64);
        set.push(kernel(5, 10, 64, Bound::Compute, None));
        set.take(4);
        assert_eq!(set.widest(), 64);
        set.take(5);
        assert_eq!(set.widest(), 8);
        set.take(2);
        assert_eq!(set.widest(), 0);
        set.push(kernel(6, 10, 16, Bound::Compute, None));
        assert_eq!(set.widest(), 16);
    }
}

//! Memory admission (Salus, MLSys'20): co-located jobs must never run each other out of memory.
//!
//! Salus splits a job's GPU memory into persistent (weights, optimizer state: held for the
//! job's life) and ephemeral (activations: needed during an iteration). A job is admitted only
//! if its footprint — persistent + ephemeral, declared up front or learned from what it
//! allocated — fits beside the jobs already admitted; otherwise it waits. Waiters are admitted
//! strictly in arrival order: a small job never overtakes a big one that waits, so none
//! starves. A job bigger than the whole capacity is refused at once (it could never run, and
//! at the head of the queue it would block everyone behind it).
//!
//! Salus's lanes (jobs taking turns on one ephemeral region at iteration boundaries) would
//! admit more; this reserves both parts for a job's whole life, which is simpler and never
//! over-commits.

use std::collections::{HashMap, VecDeque};

use super::ClientId;

/// The answer to a request for admission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Admitted: the memory is reserved.
    Now,
    /// Queued: admitted (in arrival order) when enough memory is released.
    Wait,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a job of {need} bytes can never fit in {capacity} bytes of device memory")]
pub struct TooLarge {
    pub need: u64,
    pub capacity: u64,
}

/// Admitted footprints and the queue of jobs waiting for memory.
#[derive(Debug, Clone)]
pub struct MemoryAdmission {
    capacity: u64,
    used: u64,
    admitted: HashMap<ClientId, u64>,
    waiting: VecDeque<(ClientId, u64)>,
}

impl MemoryAdmission {
    pub fn new(capacity: u64) -> MemoryAdmission {
        MemoryAdmission {
            capacity,
            used: 0,
            admitted: HashMap::new(),
            waiting: VecDeque::new(),
        }
    }

    /// Asks to admit `client` with a footprint of `bytes`. Asking again for a client already
    /// admitted or waiting changes nothing but returns its state.
    pub fn admit(&mut self, client: ClientId, bytes: u64) -> Result<Admit, TooLarge> {
        if self.admitted.contains_key(&client) {
            return Ok(Admit::Now);
        }
        if self.waiting.iter().any(|&(c, _)| c == client) {
            return Ok(Admit::Wait);
        }
        if bytes > self.capacity {
            return Err(TooLarge {
                need: bytes,
                capacity: self.capacity,
            });
        }
        // Nobody overtakes a waiter: that is what keeps big jobs from starving.
        if self.waiting.is_empty() && self.fits(bytes) {
            self.admitted.insert(client, bytes);
            self.used += bytes;
            Ok(Admit::Now)
        } else {
            self.waiting.push_back((client, bytes));
            Ok(Admit::Wait)
        }
    }

    fn fits(&self, bytes: u64) -> bool {
        self.used.saturating_add(bytes) <= self.capacity
    }

    /// Records a footprint learned from what an admitted (or unmanaged) client really holds.
    /// Memory already in use cannot be refused, so this may push `used` past the capacity;
    /// later jobs then wait until it is released. A shrink may admit waiters (pushed to
    /// `admitted`).
    pub fn account(&mut self, client: ClientId, bytes: u64, admitted: &mut Vec<ClientId>) {
        if let Some(pos) = self.waiting.iter().position(|&(c, _)| c == client) {
            // A waiter that allocates anyway: its queued footprint becomes the real one.
            self.waiting[pos].1 = bytes.min(self.capacity);
        } else {
            let old = self.admitted.insert(client, bytes).unwrap_or(0);
            self.used = self.used - old + bytes;
        }
        self.admit_waiters(admitted);
    }

    /// Forgets `client` (admitted or waiting) and admits waiters that now fit, in order.
    /// Returns the newly admitted clients.
    pub fn release(&mut self, client: ClientId, admitted: &mut Vec<ClientId>) {
        if let Some(bytes) = self.admitted.remove(&client) {
            self.used -= bytes;
        }
        self.waiting.retain(|&(c, _)| c != client);
        self.admit_waiters(admitted);
    }

    fn admit_waiters(&mut self, admitted: &mut Vec<ClientId>) {
        while let Some(&(c, bytes)) = self.waiting.front() {
            if !self.fits(bytes) {
                break;
            }
            self.waiting.pop_front();
            self.admitted.insert(c, bytes);
            self.used += bytes;
            admitted.push(c);
        }
    }

    pub fn is_admitted(&self, client: ClientId) -> bool {
        self.admitted.contains_key(&client)
    }

    #[cfg(test)]
    pub fn used(&self) -> u64 {
        self.used
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_that_does_not_fit_waits_until_another_leaves() {
        let mut a = MemoryAdmission::new(10);
        assert_eq!(a.admit(1, 6), Ok(Admit::Now));
        assert_eq!(a.admit(2, 6), Ok(Admit::Wait));
        assert!(!a.is_admitted(2));
        let mut newly = Vec::new();
        a.release(1, &mut newly);
        assert_eq!(newly, vec![2]);
        assert!(a.is_admitted(2));
        assert_eq!(a.used(), 6);
    }

    #[test]
    fn waiters_are_admitted_in_arrival_order_without_overtaking() {
        let mut a = MemoryAdmission::new(10);
        assert_eq!(a.admit(1, 8), Ok(Admit::Now));
        assert_eq!(a.admit(2, 9), Ok(Admit::Wait));
        // 3 would fit now (8 + 1 ≤ 10) but must not overtake 2.
        assert_eq!(a.admit(3, 1), Ok(Admit::Wait));
        let mut newly = Vec::new();
        a.release(1, &mut newly);
        assert_eq!(newly, vec![2, 3]);
        assert_eq!(a.used(), 10);
    }

    #[test]
    fn a_job_bigger_than_the_device_is_refused() {
        let mut a = MemoryAdmission::new(10);
        assert_eq!(
            a.admit(1, 11),
            Err(TooLarge {
                need: 11,
                capacity: 10
            })
        );
        assert_eq!(a.admit(2, 10), Ok(Admit::Now));
    }

    #[test]
    fn a_waiter_that_leaves_unblocks_those_behind_it() {
        let mut a = MemoryAdmission::new(10);
        assert_eq!(a.admit(1, 5), Ok(Admit::Now));
        assert_eq!(a.admit(2, 9), Ok(Admit::Wait));
        assert_eq!(a.admit(3, 5), Ok(Admit::Wait));
        let mut newly = Vec::new();
        a.release(2, &mut newly);
        assert_eq!(newly, vec![3]);
    }

    #[test]
    fn learned_footprints_count() {
        let mut a = MemoryAdmission::new(10);
        let mut newly = Vec::new();
        assert_eq!(a.admit(1, 2), Ok(Admit::Now));
        a.account(1, 9, &mut newly);
        assert_eq!(a.admit(2, 2), Ok(Admit::Wait));
        a.account(1, 3, &mut newly);
        assert_eq!(newly, vec![2]);
    }
}

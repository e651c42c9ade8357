//! Admission for governed clients: unmodified programs under `gpushare run`, whose libcuda
//! interposer asks the broker before it allocates and launches on the program's own CUDA
//! context. Nothing runs on the broker's device for them.
//!
//! Memory: `GovernedReserve` counts bytes against the user's quota exactly like a brokered
//! allocation (past the quota it fails with `OutOfQuota` and changes nothing), and
//! `GovernedRelease` gives them back, never more than the client holds. A program that
//! connected again (after a restart of gpushared) counts what it already holds with
//! `GovernedHeld`, whatever the quota.
//!
//! Launches: the interposer launches from a local budget of tokens and asks for more
//! (`GovernedTokens`) when it runs out or they expire, so a launch costs no round trip. Under
//! FIFO, or alone on its GPU, the budget is large and long-lived. Under any other policy each
//! request is one request to the GPU's dispatcher, which this session's data thread waits for
//! like a brokered kernel's turn: the priority policy holds a best-effort program while
//! high-priority work is in flight, and the TGS rate limiter paces its thread blocks.
//!
//! A grant under a policy is a *lease*: it stays in flight in the dispatcher, so that others
//! are ordered against it, until the program synchronizes (`GovernedIdle`), asks again, or
//! [`LEASE`] passes. A lease that ends by the program's word is reported with its length as
//! the measured time of the batch: the dispatcher learns it as the batch's profile and, for a
//! high-priority program, feeds the rate controller's slowdown signal (TGS's "production job's
//! observed rate").

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use gpushare_protocol::command::GOVERNED_LEASE;
use gpushare_protocol::{ErrorCode, PriorityClass};

use super::SessionState;
use crate::sched::RequestId;

/// Tokens granted when launches are not gated, and how long they stay valid.
const UNGATED_TOKENS: u64 = 4096;
const UNGATED_VALID: Duration = Duration::from_millis(20);
/// Tokens per grant under a policy: a best-effort program gets small batches, so that what it
/// launches in a gap of high-priority work is short.
const GATED_TOKENS: u64 = 64;
const BEST_EFFORT_TOKENS: u64 = 8;
/// Longest a lease (and the tokens of a gated grant) lasts without word from the program.
pub(super) const LEASE: Duration = Duration::from_millis(5);
/// A best-effort batch never counts as shorter than this: longer than the priority policy's
/// budget for lower-priority work beside high-priority work (2.5 % of 10 ms by default), so it
/// is held while high-priority clients have work in flight and waits for a gap.
const BEST_EFFORT_MIN_NS: u64 = 1_000_000;
/// The function handle a governed program's launch batches are profiled under (client handles
/// start at 1).
const BATCH_FUNCTION: u64 = 0;

/// A governed client's admission state.
#[derive(Debug, Default)]
pub(super) struct Governed {
    /// Bytes reserved and not released.
    reserved: u64,
    lease: Option<Lease>,
}

#[derive(Debug, Clone, Copy)]
struct Lease {
    request: RequestId,
    granted: Instant,
}

impl Governed {
    pub(super) fn reserved(&self) -> u64 {
        self.reserved
    }

    /// Drops the lease without telling the dispatcher (it forgot the client's requests).
    pub(super) fn forget_lease(&mut self) {
        self.lease = None;
    }
}

/// `n` rounded up to four significant bits, so that batches of similar size share a profile
/// (and the rate limiter charges at most 1/8 more than was launched).
fn coarse_blocks(n: u64) -> u32 {
    let n = n.max(1);
    let bits = 64 - n.leading_zeros();
    let rounded = if bits <= 4 {
        n
    } else {
        let shift = bits - 4;
        n.div_ceil(1 << shift).saturating_mul(1 << shift)
    };
    u32::try_from(rounded).unwrap_or(u32::MAX)
}

impl SessionState {
    fn require_governed(&self) -> Result<(), ErrorCode> {
        if self.info.governed {
            Ok(())
        } else {
            Err(ErrorCode::InvalidCommand)
        }
    }

    pub(super) fn governed_reserve(&mut self, bytes: u64) -> Result<(u64, u64), ErrorCode> {
        self.require_governed()?;
        let reserved = self
            .governed
            .reserved
            .checked_add(bytes)
            .ok_or(ErrorCode::InvalidArgument)?;
        self.info.charge_memory(bytes)?;
        self.governed.reserved = reserved;
        self.info
            .counters
            .allocations
            .fetch_add(1, Ordering::Relaxed);
        Ok((0, 0))
    }

    /// A program that connected again counts what it already holds, whatever the quota.
    pub(super) fn governed_held(&mut self, bytes: u64) -> Result<(u64, u64), ErrorCode> {
        self.require_governed()?;
        self.governed.reserved = self
            .governed
            .reserved
            .checked_add(bytes)
            .ok_or(ErrorCode::InvalidArgument)?;
        self.info.hold_memory(bytes);
        Ok((0, 0))
    }

    /// Result: the bytes released (at most what the client holds).
    pub(super) fn governed_release(&mut self, bytes: u64) -> Result<(u64, u64), ErrorCode> {
        self.require_governed()?;
        let released = bytes.min(self.governed.reserved);
        self.governed.reserved -= released;
        self.info.release_memory(released);
        Ok((released, 0))
    }

    pub(super) fn governed_tokens(
        &mut self,
        launched: u64,
        blocks: u64,
    ) -> Result<(u64, u64), ErrorCode> {
        self.require_governed()?;
        self.note_launches(launched);
        self.end_lease(true);
        if !self.dispatch.gated() {
            return Ok((UNGATED_TOKENS, UNGATED_VALID.as_micros() as u64));
        }
        let best_effort = self.info.grant().class == PriorityClass::BestEffort;
        let batch = if best_effort {
            BEST_EFFORT_TOKENS
        } else {
            GATED_TOKENS
        };
        // The next batch is taken to look like the last: its blocks per launch, `batch` times.
        let per_launch = blocks.checked_div(launched).unwrap_or(1).max(1);
        let batch_blocks = coarse_blocks(per_launch.saturating_mul(batch));
        let id = self.info.id;
        let asked = Instant::now();
        let request = self.acquire(|d| {
            let mut p = d.module_profile(id, BATCH_FUNCTION, batch_blocks);
            if best_effort {
                p.est_ns = p.est_ns.max(BEST_EFFORT_MIN_NS);
            }
            p
        });
        let waited = asked.elapsed();
        self.info
            .counters
            .throttled_ns
            .fetch_add(waited.as_nanos() as u64, Ordering::Relaxed);
        // A governed program runs in its own CUDA context: no partition applies to it.
        match request.map(|turn| turn.request) {
            Some(request) => {
                self.governed.lease = Some(Lease {
                    request,
                    granted: Instant::now(),
                });
                Ok((batch, LEASE.as_micros() as u64 | GOVERNED_LEASE))
            }
            // The session is ending, or the GPU stopped being gated meanwhile.
            None if self.info.stopping() => Err(ErrorCode::ShuttingDown),
            None => Ok((batch, LEASE.as_micros() as u64)),
        }
    }

    pub(super) fn governed_idle(
        &mut self,
        launched: u64,
        _blocks: u64,
    ) -> Result<(u64, u64), ErrorCode> {
        self.require_governed()?;
        self.note_launches(launched);
        self.end_lease(true);
        Ok((0, 0))
    }

    /// A weight below the granted one (never above, never 0) for the rest of the session.
    /// A weight at or below the granted one; governed and consolidated clients (whose
    /// programs cannot call the library) ask for it this way.
    pub(super) fn governed_weight(&mut self, weight: u32) -> Result<(u64, u64), ErrorCode> {
        if !self.info.governed && !self.info.consolidated {
            return Err(ErrorCode::InvalidCommand);
        }
        let mut grant = self.info.grant();
        if weight == 0 {
            return Err(ErrorCode::InvalidArgument);
        }
        if weight > grant.weight {
            return Err(ErrorCode::PermissionDenied);
        }
        grant.weight = weight;
        self.info.set_grant(grant);
        self.dispatch
            .update_client(self.info.id, grant.class, weight);
        Ok((u64::from(weight), 0))
    }

    fn note_launches(&self, launched: u64) {
        self.info
            .counters
            .kernels
            .fetch_add(launched, Ordering::Relaxed);
    }

    /// Ends the lease, if one is open; `measured` reports its length as the batch's time.
    fn end_lease(&mut self, measured: bool) {
        if let Some(lease) = self.governed.lease.take() {
            let ns = measured.then(|| lease.granted.elapsed().as_nanos() as u64);
            self.dispatch.complete(self.info.id, &[(lease.request, ns)]);
        }
    }

    /// Ends a lease the program has not given back within [`LEASE`].
    pub(super) fn expire_lease(&mut self) {
        if self
            .governed
            .lease
            .is_some_and(|l| l.granted.elapsed() >= LEASE)
        {
            self.end_lease(false);
        }
    }

    /// How long until the open lease expires, if one is open.
    pub(super) fn lease_left(&self) -> Option<Duration> {
        self.governed
            .lease
            .map(|l| LEASE.saturating_sub(l.granted.elapsed()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_sizes_are_coarsened_up_by_at_most_an_eighth() {
        assert_eq!(coarse_blocks(0), 1);
        assert_eq!(coarse_blocks(7), 7);
        assert_eq!(coarse_blocks(8), 8);
        assert_eq!(coarse_blocks(15), 15);
        assert_eq!(coarse_blocks(17), 18);
        assert_eq!(coarse_blocks(1000), 1024);
        assert_eq!(coarse_blocks(u64::MAX), u32::MAX);
        for n in [17u64, 100, 4097, 123_456] {
            let c = coarse_blocks(n) as u64;
            assert!(c >= n && c * 8 <= n * 9 + 8, "{n} -> {c}");
        }
    }
}

//! The priority gate's word (slot 0 of a progress page): lower-priority launches wait at it on
//! the GPU. Two parties write it, each its own bit: the GPU scheduler in gpushared closes and
//! opens it ([`Gate`]), and the device worker holds it open while it makes a driver call that
//! waits for the context's queued work ([`GateHold`]). A launch passes while either bit is set
//! ([`passes`]; on a GPU, `cuStreamWaitValue32` with `CU_STREAM_WAIT_VALUE_AND` and
//! [`PASS_MASK`]).
//!
//! Why the hold: on an H200, `cuMemFree`, `cuModuleLoadData`, `cuMemFreeHost` and
//! `cuMemHostUnregister` wait until work held at a closed gate has run, and meanwhile hold up
//! every other thread's launches, a high-priority client's included; `cuModuleUnload` waits
//! too, and a lazily loaded module's first `cuModuleGetFunction` holds every stream's next
//! kernels on the device behind the held work (`scripts/probes/gate_sync.cu`,
//! docs/benchmarks.md runs C1–C2; the virtual memory calls that make clients' memory, copies,
//! stream and event calls and graphs do not wait). With one context for every client, a
//! best-effort client loading a module while a high-priority request ran stopped that request
//! until the gate's bound opened it.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use super::call::GateWord;
use super::progress::GATE_SLOT;
use crate::shm::HostRegion;

/// Set by the scheduler while the gate is open.
pub const OPEN: u32 = 1;
/// Set by the worker while it holds the gate open.
pub const HELD: u32 = 2;
/// A launch passes the gate while the word has any of these bits.
pub const PASS_MASK: u32 = OPEN | HELD;

/// Whether a launch passes a gate whose word holds `word`. A page's fresh word (0) is closed:
/// a gate is opened once its scheduler takes it (`Gate::set_closed`), before any launch
/// carries it.
pub fn passes(word: u32) -> bool {
    word & PASS_MASK != 0
}

/// The gate as the GPU scheduler steers it: a launch that carries it ([`GateWord`]) waits on
/// its stream until it opens, so that work queued before a high-priority request does not
/// start inside it (a kernel already running is not preempted).
#[derive(Clone)]
pub struct Gate {
    page: Arc<HostRegion>,
}

impl Gate {
    pub(super) fn new(page: Arc<HostRegion>) -> Gate {
        Gate { page }
    }

    /// What a launch carries to wait at this gate.
    pub fn word(&self) -> GateWord {
        gate_word(&self.page)
    }

    /// Closes or opens the gate for launches that reach it from now on (a worker's hold
    /// keeps it open whatever this says).
    pub fn set_closed(&self, closed: bool) {
        let Some(word) = self
            .page
            .slice(u64::from(GATE_SLOT) * 4, 4)
            .and_then(|w| w.atomic_u32())
        else {
            return;
        };
        if closed {
            word.fetch_and(!OPEN, Ordering::AcqRel);
        } else {
            word.fetch_or(OPEN, Ordering::AcqRel);
        }
    }
}

/// The gate's word in `page`, a progress page.
pub(super) fn gate_word(page: &HostRegion) -> GateWord {
    GateWord {
        page: page.whole().span(),
        slot: GATE_SLOT,
    }
}

/// A worker's side of the gate: while any of its driver calls that wait for queued work runs,
/// the gate is held open ([`HELD`]), so that the call does not wait for the scheduler to open
/// it while it holds up every other call into the driver. Nothing until the worker has queued
/// a launch at the gate (no work of its own waits there before).
#[derive(Default)]
pub struct GateHold {
    /// The page the gate's word is in, and the word's offset in it (the first gated launch
    /// says; a trust domain has one page).
    word: OnceLock<(Arc<HostRegion>, u64)>,
    /// Calls holding it now.
    holders: Mutex<u32>,
}

impl GateHold {
    /// Whether the gate's word is known yet.
    pub fn knows(&self) -> bool {
        self.word.get().is_some()
    }

    /// The gate's word is at `offset` of `page` (the first gated launch tells). The hold a
    /// worker before this one left set (it died holding it) is cleared: this worker serves
    /// now, and holds nothing yet.
    pub fn learn(&self, page: Arc<HostRegion>, offset: u64) {
        let holders = self.lock();
        if self.word.set((page, offset)).is_ok() && *holders == 0 {
            self.update(|w| w.fetch_and(!HELD, Ordering::AcqRel));
        }
    }

    /// Holds the gate open until the guard is dropped.
    pub fn hold(&self) -> HeldOpen<'_> {
        let mut holders = self.lock();
        *holders += 1;
        if *holders == 1 {
            self.update(|w| w.fetch_or(HELD, Ordering::AcqRel));
        }
        HeldOpen(self)
    }

    fn release(&self) {
        let mut holders = self.lock();
        *holders = holders.saturating_sub(1);
        if *holders == 0 {
            self.update(|w| w.fetch_and(!HELD, Ordering::AcqRel));
        }
    }

    fn update(&self, f: impl FnOnce(&AtomicU32) -> u32) {
        if let Some((page, offset)) = self.word.get()
            && let Some(word) = page.slice(*offset, 4).and_then(|w| w.atomic_u32())
        {
            f(word);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, u32> {
        self.holders.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The gate held open by a driver call ([`GateHold::hold`]).
pub struct HeldOpen<'a>(&'a GateHold);

impl Drop for HeldOpen<'_> {
    fn drop(&mut self) {
        self.0.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page() -> Arc<HostRegion> {
        let fd = crate::shm::sealed_memfd("gate-test", 4096).expect("memfd");
        Arc::new(HostRegion::map(&fd, 4096, 0).expect("map"))
    }

    fn word(page: &HostRegion) -> u32 {
        page.slice(0, 4).expect("word").load_u32()
    }

    #[test]
    fn a_hold_opens_a_closed_gate_until_its_last_holder_lets_go() {
        let page = page();
        let gate = Gate::new(page.clone());
        gate.set_closed(false);
        assert!(passes(word(&page)), "opened by the scheduler");
        gate.set_closed(true);
        assert!(!passes(word(&page)), "closed by the scheduler");

        let hold = GateHold::default();
        drop(hold.hold());
        assert!(
            !passes(word(&page)),
            "a hold before any gated launch does nothing"
        );
        hold.learn(page.clone(), 0);
        let first = hold.hold();
        assert!(passes(word(&page)), "held open");
        let second = hold.hold();
        drop(first);
        assert!(passes(word(&page)), "still held by the second call");
        gate.set_closed(false);
        gate.set_closed(true);
        assert!(
            passes(word(&page)),
            "the scheduler's closing leaves the hold"
        );
        drop(second);
        assert!(!passes(word(&page)), "closed again once nothing holds it");
        gate.set_closed(false);
        assert!(passes(word(&page)));
    }

    #[test]
    fn a_hold_left_by_a_dead_worker_is_cleared_by_the_next() {
        let page = page();
        let gate = Gate::new(page.clone());
        gate.set_closed(true);
        let dead = GateHold::default();
        dead.learn(page.clone(), 0);
        std::mem::forget(dead.hold());
        assert!(passes(word(&page)));
        let next = GateHold::default();
        next.learn(page.clone(), 0);
        assert!(!passes(word(&page)), "the new worker holds nothing");
    }

    #[test]
    fn a_fresh_word_is_closed_and_opening_sets_only_its_bit() {
        let page = page();
        assert!(!passes(word(&page)));
        let gate = Gate::new(page.clone());
        gate.set_closed(false);
        assert_eq!(word(&page), OPEN);
    }
}

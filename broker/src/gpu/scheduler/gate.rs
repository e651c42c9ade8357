//! The device's priority gate, steered by the GPU scheduler: closed while high-priority
//! kernels are in flight, so that lower-priority work granted before a request waits on the
//! device instead of starting between the request's kernels (`sched::policy::priority`).

use std::sync::{Arc, Weak};
use std::time::Duration;

use super::GpuScheduler;
use crate::device::GateWord;
use crate::sched::Dispatcher;

/// The longest the gate stays closed at a stretch, by the clock ([`GpuScheduler::keep_gate`]);
/// it then stays open until no high-priority kernel is in flight. On the H200 a gate opened
/// only as launches and completions came once held all five clients, the high-priority one
/// too, until the guardian reset the context (run G4). A driver call that waits for the held
/// work while it holds up every other thread's launches (a module load, `cuMemFree`) does
/// that; the worker now holds the gate open around those (`device::gate`, runs C1–C4), and
/// the bound stays for whatever else may. It still opens the gate once or twice as the
/// colocate bench's clients warm up. And a high-priority client that never pauses must not
/// keep the lower classes' queued work waiting either; neither is the short request the gate
/// serves.
///
/// [`GpuScheduler::keep_gate`]: super::GpuScheduler::keep_gate
pub(super) const MAX_CLOSED_NS: u64 = 5_000_000;

/// What opens and closes the gate: a word of the device's progress page.
pub trait GateSwitch: Send + Sync {
    fn set_closed(&self, closed: bool);
    /// The word launches wait at.
    fn word(&self) -> GateWord;
}

impl GateSwitch for crate::device::Gate {
    fn set_closed(&self, closed: bool) {
        crate::device::Gate::set_closed(self, closed);
    }

    fn word(&self) -> GateWord {
        crate::device::Gate::word(self)
    }
}

/// The gate and what the scheduler knows of it.
pub(super) struct GateState {
    switch: Arc<dyn GateSwitch>,
    /// Closed since then.
    closed_since: Option<u64>,
    /// Opened after [`MAX_CLOSED_NS`]: stays open until no high-priority kernel is in flight.
    held_open: bool,
    /// When it last closed.
    last_closed: Option<u64>,
    /// The keeper sleeps until it is woken: the next closing wakes it. Otherwise it looks by
    /// itself soon enough (a wake-up per closing cost the scheduler's caller a system call,
    /// under its lock, on each high-priority request).
    keeper_asleep: bool,
    /// The keeper's last wait was a look of its own after a closing (for tests).
    keeper_watching: bool,
}

impl GateState {
    /// A gate, opened (whatever it held: a scheduler starts with nothing in flight).
    pub(super) fn new(switch: Arc<dyn GateSwitch>) -> GateState {
        switch.set_closed(false);
        GateState {
            switch,
            closed_since: None,
            held_open: false,
            last_closed: None,
            keeper_asleep: false,
            keeper_watching: false,
        }
    }

    /// When it must open at the latest, while it is closed.
    pub(super) fn deadline(&self) -> Option<u64> {
        self.closed_since.map(|at| at.saturating_add(MAX_CLOSED_NS))
    }

    /// Opens or closes the gate for what the dispatcher has in flight at `now`.
    pub(super) fn steer(&mut self, dispatcher: &Dispatcher, now: u64) {
        let wanted = dispatcher.gate_wanted();
        if !wanted {
            self.held_open = false;
        }
        match self.closed_since {
            Some(_) if !wanted => self.open(),
            Some(at) if now.saturating_sub(at) >= MAX_CLOSED_NS => {
                self.open();
                self.held_open = true;
                // How often a request outlasts the bound, or waits at the gate itself, is
                // what the four-client tails on the H200 leave open (docs/benchmarks.md).
                tracing::debug!(
                    closed_ms = now.saturating_sub(at) / 1_000_000,
                    "priority gate opened by its bound while high-priority kernels are in flight"
                );
            }
            None if wanted && !self.held_open => {
                self.switch.set_closed(true);
                self.closed_since = Some(now);
                self.last_closed = Some(now);
            }
            _ => {}
        }
    }

    /// Whether it is closed now.
    pub(super) fn closed(&self) -> bool {
        self.closed_since.is_some()
    }

    /// Whether a closing just made must wake the keeper (once: it is awake after that).
    pub(super) fn wake_keeper(&mut self) -> bool {
        let wake = self.keeper_asleep && self.closed();
        if wake {
            self.keeper_asleep = false;
        }
        wake
    }

    /// How long the keeper may wait at `now` before it looks again: until the bound while
    /// closed; a bound's length while the gate closed lately (a closing meanwhile has its
    /// deadline after that look); `None`: until woken, which the next closing does.
    fn keeper_wait(&mut self, now: u64) -> Option<u64> {
        self.keeper_asleep = false;
        self.keeper_watching = false;
        if let Some(at) = self.deadline() {
            return Some(at.saturating_sub(now));
        }
        if self
            .last_closed
            .is_some_and(|t| now.saturating_sub(t) < KEEPER_WATCH_NS)
        {
            self.keeper_watching = true;
            return Some(MAX_CLOSED_NS);
        }
        self.keeper_asleep = true;
        None
    }

    fn open(&mut self) {
        self.switch.set_closed(false);
        self.closed_since = None;
    }
}

impl GpuScheduler {
    /// The device's priority gate, which this scheduler opens and closes from now on (set
    /// once).
    pub fn set_gate(&self, switch: Arc<dyn GateSwitch>) {
        let mut st = self.lock();
        if self.gate_word.set(switch.word()).is_err() {
            return;
        }
        st.gate = Some(GateState::new(switch));
        self.pump(&mut st);
    }

    /// Whether `word` is the gate this scheduler steers: a session of another trust domain has
    /// a progress page (and a gate word) of its own, which nothing closes and its worker is
    /// the only one to map.
    pub fn steers(&self, word: &GateWord) -> bool {
        self.gate_word.get() == Some(word)
    }

    /// Starts the thread that opens the priority gate once it has been closed for
    /// `gate::MAX_CLOSED_NS`, whatever else happens meanwhile: the scheduler's own looks come
    /// with launches and completions, and what holds those may be waiting at the gate itself.
    /// Nothing without a gate; it ends once the scheduler is gone.
    pub fn keep_gate(self: &Arc<Self>) {
        if self.lock().gate.is_none() {
            return;
        }
        let weak = Arc::downgrade(self);
        if let Err(e) = std::thread::Builder::new()
            .name("gpushare-gate".into())
            .spawn(move || keep_gate(weak))
        {
            tracing::warn!(error = %e, "no keeper for the priority gate: it opens only as launches and completions come");
        }
    }

    /// Whether the priority gate is closed now (`None`: the device has none).
    pub fn gate_closed(&self) -> Option<bool> {
        self.lock().gate.as_ref().map(GateState::closed)
    }

    /// Whether the gate's keeper is looking by itself after a closing, unwoken.
    #[cfg(test)]
    pub(super) fn gate_keeper_watching(&self) -> bool {
        self.lock().gate.as_ref().is_some_and(|g| g.keeper_watching)
    }
}

/// How long the gate's keeper sleeps while the gate has not closed lately (it is woken when
/// it closes), so that it notices the scheduler gone: rarely, since an idle broker should cost
/// no CPU.
const KEEPER_IDLE: Duration = Duration::from_secs(10);

/// After a closing, the keeper looks every [`MAX_CLOSED_NS`] by itself for this long, so that
/// the closings of a busy high-priority client need not wake it.
const KEEPER_WATCH_NS: u64 = 100_000_000;

/// The gate's keeper ([`GpuScheduler::keep_gate`]).
fn keep_gate(weak: Weak<GpuScheduler>) {
    while let Some(s) = weak.upgrade() {
        let mut st = s.lock();
        let now = s.now();
        let wait = match st.gate.as_mut().and_then(|g| g.keeper_wait(now)) {
            Some(0) => {
                // The pump's look opens it (closed too long), and grants what that frees.
                s.pump_at(&mut st, now);
                continue;
            }
            Some(ns) => Duration::from_nanos(ns),
            None => KEEPER_IDLE,
        };
        drop(
            s.gate_closed
                .wait_timeout(st, wait)
                .unwrap_or_else(|e| e.into_inner()),
        );
    }
}

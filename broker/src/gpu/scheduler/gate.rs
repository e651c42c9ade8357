//! The device's priority gate, steered by the GPU scheduler: closed while high-priority
//! kernels are in flight, so that lower-priority work granted before a request waits on the
//! device instead of starting between the request's kernels (`sched::policy::priority`).

use std::sync::Arc;

use crate::sched::Dispatcher;

/// The longest the gate stays closed at a stretch; it then stays open until no high-priority
/// kernel is in flight. A high-priority client that never pauses must not keep the lower
/// classes' queued work waiting on the device (the guardian takes work that makes no
/// progress for seconds for hung), and such a client is not the short request the gate
/// serves.
pub(super) const MAX_CLOSED_NS: u64 = 20_000_000;

/// What opens and closes the gate: a word of the device's progress page.
pub trait GateSwitch: Send + Sync {
    fn set_closed(&self, closed: bool);
}

impl GateSwitch for crate::device::Gate {
    fn set_closed(&self, closed: bool) {
        crate::device::Gate::set_closed(self, closed);
    }
}

/// The gate and what the scheduler knows of it.
pub(super) struct GateState {
    switch: Arc<dyn GateSwitch>,
    /// Closed since then.
    closed_since: Option<u64>,
    /// Opened after [`MAX_CLOSED_NS`]: stays open until no high-priority kernel is in flight.
    held_open: bool,
}

impl GateState {
    /// A gate, opened (whatever it held: a scheduler starts with nothing in flight).
    pub(super) fn new(switch: Arc<dyn GateSwitch>) -> GateState {
        switch.set_closed(false);
        GateState {
            switch,
            closed_since: None,
            held_open: false,
        }
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
            }
            None if wanted && !self.held_open => {
                self.switch.set_closed(true);
                self.closed_since = Some(now);
            }
            _ => {}
        }
    }

    /// Whether it is closed now.
    pub(super) fn closed(&self) -> bool {
        self.closed_since.is_some()
    }

    fn open(&mut self) {
        self.switch.set_closed(false);
        self.closed_since = None;
    }
}

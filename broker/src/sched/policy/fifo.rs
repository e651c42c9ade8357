//! FIFO: requests in global arrival order (Salus's baseline, and the broker's default).
//!
//! With no concurrency cap this is a pass-through: every client's head is granted as soon as
//! its stream has room, oldest first, and the device shares itself among whatever runs. A cap
//! bounds the requests in flight over all clients; then the oldest head goes next.

use super::{Pick, Policy, earliest};
use crate::sched::View;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FifoConfig {
    /// Requests in flight over all clients; `None`: no cap.
    pub max_concurrent: Option<u32>,
}

#[derive(Debug, Clone)]
pub struct Fifo {
    cfg: FifoConfig,
}

impl Fifo {
    pub fn new(cfg: FifoConfig) -> Fifo {
        Fifo { cfg }
    }
}

impl Policy for Fifo {
    fn name(&self) -> &'static str {
        "fifo"
    }

    fn pick(&mut self, view: &View<'_>, _now: u64) -> Pick {
        if let Some(cap) = self.cfg.max_concurrent
            && view.inflight_total() >= cap.max(1) as usize
        {
            return Pick::Hold;
        }
        earliest(view.candidates()).map_or(Pick::Hold, |c| Pick::Grant(c.id()))
    }
}

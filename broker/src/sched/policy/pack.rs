//! PACK (Salus): every job whose memory fits runs at the same time.
//!
//! Which jobs fit is memory admission's answer ([`crate::sched::admission`]: persistent +
//! ephemeral footprints, arrival order, no over-commit), applied by the dispatcher before any
//! policy sees a client. PACK then co-runs all admitted jobs, granting their kernels in
//! arrival order; a job is switched out only by leaving (its memory then admits the next
//! waiter). Unlike SRTF it never holds an admitted job back, so it trades single-job speed
//! for utilisation. Without a memory capacity configured every job fits.

use super::{Pick, Policy, earliest};
use crate::sched::View;

#[derive(Debug, Clone, Default)]
pub struct Pack;

impl Pack {
    pub fn new() -> Pack {
        Pack
    }
}

impl Policy for Pack {
    fn name(&self) -> &'static str {
        "pack"
    }

    fn pick(&mut self, view: &View<'_>, _now: u64) -> Pick {
        earliest(view.candidates()).map_or(Pick::Hold, |c| Pick::Grant(c.id()))
    }
}

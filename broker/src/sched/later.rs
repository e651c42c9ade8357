//! Device times that come after their kernels were reported finished.
//!
//! A timed kernel's time is read from two events by a call to the device worker, which
//! answers after everything the session posted before it: asked while the client keeps
//! sending, it stalls the data thread until the worker's queue drains (docs/benchmarks.md,
//! run H1). So a busy session reports such a kernel finished at once, charged its estimate,
//! and asks for its time when the client goes quiet; [`Dispatcher::timed`] then teaches the
//! kernel's profile what a measurement at completion would have.

use super::id_hash::IdMap;
use super::{ClientId, Dispatcher, KernelKey, RequestId, SchedError};

/// Kernels awaiting their time, over all clients, at most: past it those awaited are forgotten
/// (a session that never asks loses nothing but what its profiles would have learned).
const MAX_AWAITED: usize = 4096;

/// What a finished kernel's measured time teaches.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Lesson {
    pub(super) client: ClientId,
    pub(super) key: KernelKey,
    pub(super) est_ns: u64,
    /// It had the GPU to itself.
    pub(super) solo: bool,
    /// Of a high-priority client (the rate controller samples those).
    pub(super) high: bool,
}

/// The finished kernels whose time is to come, by request.
#[derive(Debug, Default)]
pub struct TimedLater {
    awaited: IdMap<RequestId, Lesson>,
}

impl TimedLater {
    pub(super) fn forget_client(&mut self, client: ClientId) {
        self.awaited.retain(|_, l| l.client != client);
    }
}

impl Dispatcher {
    /// `request` finished; its device time comes later, by [`Dispatcher::timed`]. Meanwhile it
    /// is charged its estimate, as a kernel that is not timed is.
    pub fn complete_timed_later(
        &mut self,
        client: ClientId,
        request: RequestId,
        now: u64,
    ) -> Result<(), SchedError> {
        let lesson = self.finish(client, request, None, now)?;
        let awaited = &mut self.timed_later.awaited;
        if awaited.len() >= MAX_AWAITED {
            awaited.clear();
        }
        awaited.insert(request, lesson);
        Ok(())
    }

    /// A kernel's measured device time: into its profile, and the high-priority rate's.
    pub(super) fn learn(&mut self, lesson: Lesson, measured_ns: u64, now: u64) {
        self.profiles.observe(lesson.key, measured_ns, lesson.solo);
        if lesson.high
            && let Some(r) = self.rate.as_mut()
        {
            r.advance(now);
            r.sample_high(lesson.est_ns, measured_ns);
        }
    }

    /// The device time of `client`'s `request`, reported finished earlier by
    /// [`Dispatcher::complete_timed_later`].
    pub fn timed(
        &mut self,
        client: ClientId,
        request: RequestId,
        measured_ns: u64,
        now: u64,
    ) -> Result<(), SchedError> {
        let now = self.clamp_now(now);
        let awaited = &mut self.timed_later.awaited;
        if awaited.get(&request).is_none_or(|l| l.client != client) {
            return Err(SchedError::UnknownRequest { client, request });
        }
        if let Some(lesson) = awaited.remove(&request) {
            self.learn(lesson, measured_ns, now);
        }
        Ok(())
    }
}

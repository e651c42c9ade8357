//! Kernels and the GPU's scheduler: a launch waits for its turn, and the scheduler hears when
//! each granted kernel has finished (an event recorded after it says so).

use gpushare_protocol::StreamId;

use super::SessionState;
use crate::device::Device;
use crate::dispatch::{GpuDispatch, Turn, Waiting};
use crate::sched::{KernelProfile, RequestId};

impl<D: Device> SessionState<D> {
    /// Waits for the scheduler to grant a kernel of this profile (not at all under FIFO).
    pub(super) fn acquire(
        &mut self,
        profile: impl FnOnce(&GpuDispatch) -> KernelProfile,
    ) -> Option<Turn> {
        if !self.dispatch.schedules(self.info.grant().class) {
            return None;
        }
        let dispatch = self.dispatch.clone();
        let profile = profile(&dispatch);
        let id = self.info.id;
        let info = self.info.clone();
        let health = self.health.clone();
        let epoch = self.epoch;
        dispatch.acquire(
            id,
            profile,
            |waiting| match waiting {
                Waiting::Reap => self.reap_granted(),
                // Close the measured spans: time spent waiting for others is not ours. Every
                // stream's, and as idle: an ordinary batch end leaves a young span open, and
                // the wait would be charged to this client.
                Waiting::Begins => {
                    for slot in self.streams.values_mut() {
                        self.device.end_batch(&mut slot.stream, true);
                    }
                }
            },
            || info.stopping() || health.epoch() != epoch,
        )
    }

    /// After a granted launch: an event marks when the kernel is done.
    pub(super) fn track_granted(&mut self, stream: StreamId, request: RequestId, launched: bool) {
        let event = match self.spare_events.pop() {
            Some(e) => Ok(e),
            None => self.device.create_marker(),
        };
        let recorded = match (launched, event, self.streams.get_mut(&stream)) {
            (true, Ok(mut e), Some(slot)) => {
                match self.device.record_event(&mut e, &mut slot.stream) {
                    Ok(()) => Ok(e),
                    Err(_) => Err(Some(e)),
                }
            }
            (_, Ok(e), _) => Err(Some(e)),
            (_, Err(_), _) => Err(None),
        };
        match recorded {
            Ok(e) => self.granted.push_back((request, e)),
            Err(spare) => {
                self.spare_events.extend(spare);
                self.dispatch.complete(self.info.id, request, None);
            }
        }
    }

    /// Reports granted kernels that have finished to the scheduler.
    pub(super) fn reap_granted(&mut self) {
        while let Some((request, event)) = self.granted.front() {
            // An error (a fault) ends the wait too: the guardian deals with the fault.
            if matches!(self.device.event_done(event), Ok(false)) {
                break;
            }
            let request = *request;
            if let Some((_, e)) = self.granted.pop_front() {
                self.spare_events.push(e);
            }
            self.dispatch.complete(self.info.id, request, None);
        }
    }
}

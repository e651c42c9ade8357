//! The sim's modelled time: the wall clock in `realtime` mode (work then takes as long as
//! the cost model says), else none (work is done when it is accepted).

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::SimDevice;
use crate::device::{DeviceError, DeviceResult};

impl SimDevice {
    /// Modelled time now: the wall clock with `realtime`, otherwise 0 (time then advances
    /// only with work).
    pub(super) fn now_ns(&self) -> u64 {
        if self.options.realtime {
            self.origin.elapsed().as_nanos() as u64
        } else {
            0
        }
    }

    /// Whether modelled time `t` has come: always without `realtime`, where work is done
    /// when it is accepted.
    pub(super) fn reached(&self, t: u64) -> bool {
        !self.options.realtime || self.now_ns() >= t
    }

    /// Waits until `done` says so, looking every 20 µs, as a GPU stream waits on a word of
    /// host memory; a reset cuts the wait short.
    pub(super) fn wait_until(
        &self,
        mut done: impl FnMut() -> DeviceResult<bool>,
    ) -> DeviceResult<()> {
        while !done()? {
            if self.interrupted.load(Ordering::Acquire) {
                return Err(DeviceError::Cancelled);
            }
            std::thread::sleep(Duration::from_micros(20));
        }
        Ok(())
    }

    /// Waits until modelled time `t` has come on the wall clock (`realtime` only); a reset
    /// cuts the wait short.
    pub(super) fn wait_for(&self, t: u64) -> DeviceResult<()> {
        if !self.options.realtime {
            return Ok(());
        }
        loop {
            let now = self.now_ns();
            if now >= t {
                return Ok(());
            }
            if self.interrupted.load(Ordering::Acquire) {
                return Err(DeviceError::Cancelled);
            }
            // Sleep most of it, spin the rest: good to a few µs without burning a core.
            let left = Duration::from_nanos(t - now);
            if left > Duration::from_micros(200) {
                std::thread::sleep(
                    (left - Duration::from_micros(100)).min(Duration::from_millis(5)),
                );
            } else {
                std::hint::spin_loop();
            }
        }
    }
}

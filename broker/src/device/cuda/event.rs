//! Client events: markers a client records on its streams, waits on and times.

use cudarc::driver::result as cu;
use cudarc::driver::sys::{self, CUevent};

use super::error::driver;
use super::timing::ms_to_ns;
use super::{CudaDevice, CudaStream};
use crate::device::{DeviceError, DeviceResult};

/// A client event.
pub struct CudaEvent {
    raw: CUevent,
    recorded: bool,
    /// A program's own timing event (`cuEventCreate` without `CU_EVENT_DISABLE_TIMING`):
    /// recording it on a stream moves that stream's device-time events beside it
    /// (`span_clock.rs`), so they never land inside the program's timed intervals.
    program_timer: bool,
}

// SAFETY: a plain driver handle.
unsafe impl Send for CudaEvent {}

impl Drop for CudaEvent {
    fn drop(&mut self) {
        // SAFETY: created by us, destroyed once; the driver defers destruction of an event
        // still pending on a stream.
        let _ = unsafe { cu::event::destroy(self.raw) };
    }
}

impl CudaEvent {
    /// A client-visible event with `flags`.
    pub(super) fn create(dev: &CudaDevice, flags: sys::CUevent_flags) -> DeviceResult<CudaEvent> {
        dev.bind()?;
        let raw = cu::event::create(flags).map_err(|e| driver("cuEventCreate", e))?;
        Ok(CudaEvent {
            raw,
            recorded: false,
            program_timer: false,
        })
    }

    /// A consolidated program's timing event.
    pub(super) fn program_timer(dev: &CudaDevice) -> DeviceResult<CudaEvent> {
        let mut e = CudaEvent::create(dev, sys::CUevent_flags::CU_EVENT_DEFAULT)?;
        e.program_timer = true;
        Ok(e)
    }

    #[inline]
    pub(super) fn record(&mut self, dev: &CudaDevice, stream: &mut CudaStream) -> DeviceResult<()> {
        dev.bind()?;
        // SAFETY: live event and stream.
        unsafe { cu::event::record(self.raw, stream.raw) }
            .map_err(|e| driver("cuEventRecord", e))?;
        self.recorded = true;
        if self.program_timer {
            stream.timed_by_program();
        }
        Ok(())
    }

    pub(super) fn raw(&self) -> CUevent {
        self.raw
    }

    /// Whether the work before the event's last record has finished.
    pub(super) fn done(&self, dev: &CudaDevice) -> DeviceResult<bool> {
        dev.bind()?;
        // SAFETY: live event.
        match unsafe { cu::event::query(self.raw) } {
            Ok(()) => Ok(true),
            Err(e) if e.0 == sys::cudaError_enum::CUDA_ERROR_NOT_READY => Ok(false),
            Err(e) => Err(driver("cuEventQuery", e)),
        }
    }

    /// Device time from this event to `end`.
    pub(super) fn elapsed_ns(&self, dev: &CudaDevice, end: &CudaEvent) -> DeviceResult<u64> {
        if !self.recorded || !end.recorded {
            return Err(DeviceError::InvalidArgument(
                "event was never recorded".into(),
            ));
        }
        dev.bind()?;
        // SAFETY: live events, both recorded.
        let ms = unsafe { cu::event::elapsed(self.raw, end.raw) }
            .map_err(|e| driver("cuEventElapsedTime", e))?;
        Ok(ms_to_ns(ms))
    }
}

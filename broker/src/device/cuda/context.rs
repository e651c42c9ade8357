//! The device's CUDA context on the calling thread: making it current, waiting on work in it
//! in a way that giving it up can interrupt, and asking it for a sticky fault.

use std::cell::Cell;
use std::ptr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use cudarc::driver::result as cu;
use cudarc::driver::sys::{self, CUcontext};

use super::CudaDevice;
use super::error::driver;
use crate::device::{DeviceError, DeviceResult};

thread_local! {
    /// The context current on this thread, so we set it only when it changes.
    static CURRENT: Cell<usize> = const { Cell::new(0) };
}

/// Makes `ctx` current on the calling thread.
///
/// # Safety
/// `ctx` is a retained context.
pub(super) unsafe fn make_current(ctx: CUcontext) -> DeviceResult<()> {
    // SAFETY: the caller's promise.
    unsafe { cu::ctx::set_current(ctx) }.map_err(|e| driver("cuCtxSetCurrent", e))?;
    CURRENT.with(|c| c.set(ctx as usize));
    Ok(())
}

impl CudaDevice {
    /// Makes our context current on the calling thread (every call into the driver does this
    /// first, so the common case is one thread-local read).
    #[inline]
    pub(super) fn bind(&self) -> DeviceResult<()> {
        if CURRENT.with(|c| c.get()) != self.ctx as usize {
            // SAFETY: the context is retained for the device's lifetime.
            unsafe { make_current(self.ctx) }?;
        }
        Ok(())
    }

    /// Waits until `done` says the work finished, polling so that giving up the context can
    /// interrupt it (a blocking driver wait on a kernel that never ends would never return).
    pub(super) fn wait_until(
        &self,
        mut done: impl FnMut() -> DeviceResult<bool>,
    ) -> DeviceResult<()> {
        let mut clock = gpushare_protocol::wake::SpinClock::new();
        loop {
            if done()? {
                return Ok(());
            }
            if self.interrupted.load(Ordering::Acquire) {
                return Err(DeviceError::Cancelled);
            }
            // Spin first (short kernels answer within microseconds), then back off.
            let waited = clock.spun();
            if waited < Duration::from_micros(100) {
                std::hint::spin_loop();
            } else if waited < Duration::from_millis(20) {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(20));
            }
        }
    }

    /// The sticky error of our context, if a fault poisoned it.
    pub(super) fn sticky_fault(&self) -> Option<String> {
        self.bind().ok()?;
        // SAFETY: the legacy default stream of our current context; a query never blocks and
        // reports a sticky error if the context has one.
        let r = unsafe { sys::cuStreamQuery(ptr::null_mut()) };
        match r.result().map_err(|e| driver("GPU context", e)) {
            Err(DeviceError::Fault(what)) => Some(what),
            _ => None,
        }
    }
}

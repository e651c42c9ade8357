//! Fault injection (`--allow-fault-injection`): kernels that break the GPU on purpose, so the
//! broker's containment of a poisoned context can be exercised on a real device.

use std::ffi::c_void;
use std::ptr;
use std::sync::MutexGuard;

use cudarc::driver::result as cu;
use cudarc::driver::sys;
use gpushare_protocol::DevicePtr;

use super::error::{check, driver};
use super::{CudaDevice, CudaStream, builtins};
use crate::device::{DeviceError, DeviceResult};

/// Hand-written PTX, so it needs no compiler: an illegal-address store and a loop that never
/// ends.
const FAULT_PTX: &str = "
.version 7.0
.target sm_70
.address_size 64
.visible .entry gpushare_fault_illegal()
{
    .reg .b32 %r<2>;
    .reg .b64 %rd<2>;
    mov.u64 %rd1, 16;
    mov.u32 %r1, 1;
    st.global.u32 [%rd1], %r1;
    ret;
}
.visible .entry gpushare_fault_hang(.param .u64 flag)
{
    .reg .pred %p<2>;
    .reg .b32 %r<2>;
    .reg .b64 %rd<2>;
    ld.param.u64 %rd1, [flag];
LOOP:
    ld.volatile.global.u32 %r1, [%rd1];
    setp.eq.u32 %p1, %r1, 0;
    @%p1 bra LOOP;
    ret;
}
";

/// The fault-injection kernels, loaded on first use in the current context.
pub(super) struct FaultKernels {
    illegal: sys::CUfunction,
    hang: sys::CUfunction,
    /// A zeroed device word the hang kernel waits on forever.
    flag: DevicePtr,
}

// SAFETY: plain driver handles, used with the context current.
unsafe impl Send for FaultKernels {}

impl CudaDevice {
    /// Loads the fault-injection kernels now, so injecting a fault later takes no JIT time
    /// (for measuring recovery from the fault itself).
    pub fn prepare_fault_injection(&self) -> DeviceResult<()> {
        self.bind()?;
        self.fault_kernels().map(|_| ())
    }

    fn fault_kernels(&self) -> DeviceResult<MutexGuard<'_, Option<FaultKernels>>> {
        let mut faults = self.faults.lock().unwrap_or_else(|e| e.into_inner());
        if faults.is_none() {
            let mut image = FAULT_PTX.as_bytes().to_vec();
            image.push(0);
            let module = builtins::load_image(&image)?;
            // SAFETY: plain allocation with our context current (bound by the caller).
            let flag = unsafe { cu::malloc_sync(4) }.map_err(|e| driver("cuMemAlloc", e))?;
            // SAFETY: `flag` is the 4-byte allocation just made.
            unsafe { cu::memset_d8_sync(flag, 0, 4) }.map_err(|e| driver("cuMemsetD8", e))?;
            *faults = Some(FaultKernels {
                illegal: builtins::function(module, "gpushare_fault_illegal")?,
                hang: builtins::function(module, "gpushare_fault_hang")?,
                flag,
            });
        }
        Ok(faults)
    }

    /// Launches a fault-injection kernel.
    pub(super) fn inject_fault(&self, stream: &CudaStream, hang: bool) -> DeviceResult<()> {
        let faults = self.fault_kernels()?;
        let Some(k) = faults.as_ref() else {
            return Err(DeviceError::Failed("fault kernels missing".into()));
        };
        let mut flag = k.flag;
        let mut params = [&mut flag as *mut DevicePtr as *mut c_void];
        let (f, params) = if hang {
            (k.hang, params.as_mut_ptr())
        } else {
            (k.illegal, ptr::null_mut())
        };
        // SAFETY: functions of the loaded fault module; the hang kernel's one parameter is a
        // live local the driver copies at launch.
        check("fault kernel launch", unsafe {
            sys::cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, stream.raw, params, ptr::null_mut())
        })
    }
}

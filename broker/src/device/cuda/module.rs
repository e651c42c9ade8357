//! Modules a client loads (PTX, cubin or fatbin) and launches of their functions.

use std::ffi::c_void;
use std::ptr;
use std::sync::Arc;

use cudarc::driver::result as cu;
use cudarc::driver::sys::{self, CUmodule};
use gpushare_protocol::command::ModuleLaunch;
use gpushare_protocol::control::ModuleFormat;

use super::error::check;
use super::{CudaDevice, CudaStream, builtins};
use crate::device::DeviceResult;

/// A module a client loaded.
pub struct CudaModule {
    raw: CUmodule,
}

// SAFETY: a plain driver handle.
unsafe impl Send for CudaModule {}
// SAFETY: never mutated after loading.
unsafe impl Sync for CudaModule {}

impl Drop for CudaModule {
    fn drop(&mut self) {
        // SAFETY: loaded by us; functions keep the module alive through their Arc, so nothing
        // launches from it after this.
        let _ = unsafe { cu::module::unload(self.raw) };
    }
}

/// Shares a module between its functions.
pub struct ModuleRef(CudaModule);

impl ModuleRef {
    pub(super) fn load(
        dev: &CudaDevice,
        format: ModuleFormat,
        image: &[u8],
    ) -> DeviceResult<Arc<ModuleRef>> {
        dev.bind()?;
        let raw = builtins::load_image(&image_for_driver(format, image))?;
        Ok(Arc::new(ModuleRef(CudaModule { raw })))
    }
}

/// The image as the driver takes it: PTX is read as a C string, so it ends in a NUL.
fn image_for_driver(format: ModuleFormat, image: &[u8]) -> Vec<u8> {
    let mut bytes = image.to_vec();
    if format == ModuleFormat::Ptx && bytes.last() != Some(&0) {
        bytes.push(0);
    }
    bytes
}

/// A function in a loaded module; keeps its module loaded.
pub struct CudaFunction {
    raw: sys::CUfunction,
    _module: Arc<ModuleRef>,
}

// SAFETY: a plain driver handle, never mutated.
unsafe impl Send for CudaFunction {}
// SAFETY: as above.
unsafe impl Sync for CudaFunction {}

impl CudaFunction {
    pub(super) fn get(
        dev: &CudaDevice,
        module: &Arc<ModuleRef>,
        name: &str,
    ) -> DeviceResult<CudaFunction> {
        dev.bind()?;
        let raw = builtins::function(module.0.raw, name)?;
        Ok(CudaFunction {
            raw,
            _module: module.clone(),
        })
    }

    /// Queues a launch with the client's packed parameters.
    #[inline]
    pub(super) fn launch(
        &self,
        dev: &CudaDevice,
        stream: &mut CudaStream,
        launch: &ModuleLaunch,
        params: &[u8],
    ) -> DeviceResult<()> {
        stream.begin(dev)?;
        let mut size = params.len();
        let mut buffer = params.to_vec();
        // Packed parameters go through the `extra` array: pointer, size, end.
        let mut extra = [
            sys::CU_LAUNCH_PARAM_BUFFER_POINTER_AS_INT as usize as *mut c_void,
            buffer.as_mut_ptr() as *mut c_void,
            sys::CU_LAUNCH_PARAM_BUFFER_SIZE_AS_INT as usize as *mut c_void,
            &mut size as *mut usize as *mut c_void,
            ptr::null_mut(), // CU_LAUNCH_PARAM_END
        ];
        let extra_ptr = if params.is_empty() {
            ptr::null_mut()
        } else {
            extra.as_mut_ptr()
        };
        let [gx, gy, gz] = launch.grid;
        let [bx, by, bz] = launch.block;
        // SAFETY: `self` is a live function of a loaded module (kept alive by its Arc); the
        // parameter buffer and its size outlive the call, which copies them.
        check("cuLaunchKernel", unsafe {
            sys::cuLaunchKernel(
                self.raw,
                gx,
                gy,
                gz,
                bx,
                by,
                bz,
                launch.shared_mem_bytes,
                stream.raw,
                ptr::null_mut(),
                extra_ptr,
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ptx_is_handed_over_nul_terminated_once() {
        assert_eq!(
            image_for_driver(ModuleFormat::Ptx, b".version 7.0"),
            b".version 7.0\0"
        );
        assert_eq!(
            image_for_driver(ModuleFormat::Ptx, b".version 7.0\0"),
            b".version 7.0\0"
        );
        assert_eq!(image_for_driver(ModuleFormat::Ptx, b""), b"\0");
    }

    #[test]
    fn binary_images_are_handed_over_as_they_are() {
        for format in [ModuleFormat::Cubin, ModuleFormat::Fatbin] {
            assert_eq!(image_for_driver(format, b"\x7fELF"), b"\x7fELF");
        }
    }
}

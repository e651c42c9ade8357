//! Modules a client loads (PTX, cubin or fatbin) and launches of their functions.

use std::ffi::c_void;
use std::ptr;
use std::sync::Arc;

use cudarc::driver::result as cu;
use cudarc::driver::sys::{self, CUmodule};
use gpushare_protocol::command::{
    LAUNCH_COOPERATIVE, LAUNCH_PROGRAMMATIC_SERIALIZATION, LaunchAttributes, ModuleLaunch,
    OccupancyQuery,
};
use gpushare_protocol::control::ModuleFormat;

use super::error::check;
use super::{CudaDevice, CudaStream, builtins};
use crate::device::{DeviceError, DeviceResult, FunctionShape, Occupancy};

/// `CUfunction_attribute` numbers a function is described by (CU_FUNC_ATTRIBUTE_MAX).
const FUNCTION_ATTRIBUTES: u32 = 16;

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

    /// A global variable's device address and size.
    pub(super) fn global(&self, dev: &CudaDevice, name: &str) -> DeviceResult<(u64, u64)> {
        dev.bind()?;
        let name = std::ffi::CString::new(name)
            .map_err(|_| DeviceError::InvalidArgument("a name with a NUL in it".into()))?;
        let (mut ptr, mut size) = (0, 0);
        // SAFETY: live module; a NUL-terminated name; out-parameters on our stack.
        check("cuModuleGetGlobal", unsafe {
            sys::cuModuleGetGlobal_v2(&mut ptr, &mut size, self.0.raw, name.as_ptr())
        })?;
        Ok((ptr, size as u64))
    }

    /// Its functions' names, in the module's order (`cuModuleEnumerateFunctions`).
    pub(super) fn function_names(&self, dev: &CudaDevice) -> DeviceResult<Vec<String>> {
        dev.bind()?;
        let mut count: std::ffi::c_uint = 0;
        // SAFETY: live module; out-parameter on our stack.
        check("cuModuleGetFunctionCount", unsafe {
            sys::cuModuleGetFunctionCount(&mut count, self.0.raw)
        })?;
        let mut functions: Vec<sys::CUfunction> = vec![ptr::null_mut(); count as usize];
        // SAFETY: live module; room for `count` handles.
        check("cuModuleEnumerateFunctions", unsafe {
            sys::cuModuleEnumerateFunctions(functions.as_mut_ptr(), count, self.0.raw)
        })?;
        functions
            .into_iter()
            .map(|f| {
                let mut name = ptr::null();
                // SAFETY: a function of the live module; out-parameter on our stack.
                check("cuFuncGetName", unsafe { sys::cuFuncGetName(&mut name, f) })?;
                if name.is_null() {
                    return Err(DeviceError::Failed("cuFuncGetName gave no name".into()));
                }
                // SAFETY: the driver's NUL-terminated name, which lives as long as the module.
                let name = unsafe { std::ffi::CStr::from_ptr(name) };
                Ok(name.to_string_lossy().into_owned())
            })
            .collect()
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
    pub(super) fn raw(&self) -> sys::CUfunction {
        self.raw
    }

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

    /// Its parameters' (offset, size) and its attributes.
    pub(super) fn shape(&self, dev: &CudaDevice) -> DeviceResult<FunctionShape> {
        dev.bind()?;
        let mut params = Vec::new();
        loop {
            let (mut offset, mut size) = (0usize, 0usize);
            // SAFETY: live function; out-parameters on our stack. Past the last parameter
            // the driver answers an error, which ends the list.
            let r =
                unsafe { sys::cuFuncGetParamInfo(self.raw, params.len(), &mut offset, &mut size) };
            if r != sys::cudaError_enum::CUDA_SUCCESS {
                break;
            }
            params.push((offset as u32, size as u32));
        }
        let attributes = (0..FUNCTION_ATTRIBUTES)
            .map(|a| {
                let mut v = 0;
                // SAFETY: live function; any attribute number the driver does not know is
                // an error, mapped to 0.
                let r = unsafe { sys::cuFuncGetAttribute(&mut v, attribute(a), self.raw) };
                if r == sys::cudaError_enum::CUDA_SUCCESS {
                    v
                } else {
                    0
                }
            })
            .collect();
        Ok(FunctionShape { params, attributes })
    }

    pub(super) fn set_attribute(
        &self,
        dev: &CudaDevice,
        attr: u32,
        value: i32,
    ) -> DeviceResult<()> {
        if attr >= FUNCTION_ATTRIBUTES {
            return Err(DeviceError::InvalidArgument(format!(
                "function attribute {attr}"
            )));
        }
        dev.bind()?;
        // SAFETY: live function, a known attribute number.
        check("cuFuncSetAttribute", unsafe {
            sys::cuFuncSetAttribute(self.raw, attribute(attr), value)
        })
    }

    pub(super) fn occupancy(&self, dev: &CudaDevice, q: &Occupancy) -> DeviceResult<u64> {
        dev.bind()?;
        let block = i32::try_from(q.block_size)
            .map_err(|_| DeviceError::InvalidArgument("block size".into()))?;
        match q.query {
            OccupancyQuery::BlocksPerSm => {
                let mut n = 0;
                let smem = usize::try_from(q.dynamic_smem)
                    .map_err(|_| DeviceError::InvalidArgument("shared memory size".into()))?;
                check(
                    "cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags",
                    // SAFETY: live function; out-parameter on our stack.
                    unsafe {
                        sys::cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
                            &mut n, self.raw, block, smem, q.flags,
                        )
                    },
                )?;
                Ok(n.max(0) as u64)
            }
            OccupancyQuery::DynamicSmemPerBlock => {
                let mut size = 0usize;
                let blocks = i32::try_from(q.dynamic_smem)
                    .map_err(|_| DeviceError::InvalidArgument("block count".into()))?;
                // SAFETY: as above.
                check("cuOccupancyAvailableDynamicSMemPerBlock", unsafe {
                    sys::cuOccupancyAvailableDynamicSMemPerBlock(&mut size, self.raw, blocks, block)
                })?;
                Ok(size as u64)
            }
            OccupancyQuery::MaxActiveClusters => {
                let mut attr: sys::CUlaunchAttribute = unsafe_zeroed();
                attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
                attr.value.clusterDim.x = q.cluster[0].max(1);
                attr.value.clusterDim.y = q.cluster[1].max(1);
                attr.value.clusterDim.z = q.cluster[2].max(1);
                let config = sys::CUlaunchConfig {
                    gridDimX: q.cluster[0].max(1),
                    gridDimY: q.cluster[1].max(1),
                    gridDimZ: q.cluster[2].max(1),
                    blockDimX: q.block_size,
                    blockDimY: 1,
                    blockDimZ: 1,
                    sharedMemBytes: u32::try_from(q.dynamic_smem)
                        .map_err(|_| DeviceError::InvalidArgument("shared memory size".into()))?,
                    hStream: ptr::null_mut(),
                    attrs: &mut attr,
                    numAttrs: u32::from(q.cluster != [0; 3]),
                };
                let mut n = 0;
                // SAFETY: live function; the config and its attribute live on our stack.
                check("cuOccupancyMaxActiveClusters", unsafe {
                    sys::cuOccupancyMaxActiveClusters(&mut n, self.raw, &config)
                })?;
                Ok(n.max(0) as u64)
            }
        }
    }

    /// Queues a launch with the client's packed parameters and launch attributes.
    #[inline]
    pub(super) fn launch(
        &self,
        dev: &CudaDevice,
        stream: &mut CudaStream,
        launch: &ModuleLaunch,
        attributes: &LaunchAttributes,
        params: &[u8],
    ) -> DeviceResult<()> {
        stream.begin(dev)?;
        self.launch_on(stream.raw, launch, attributes, params)
    }

    /// Queues a launch on a raw stream (a graph's capture stream, or a client's).
    pub(super) fn launch_on(
        &self,
        raw: sys::CUstream,
        launch: &ModuleLaunch,
        attributes: &LaunchAttributes,
        params: &[u8],
    ) -> DeviceResult<()> {
        with_packed(params, |extra| {
            self.launch_packed(raw, launch, attributes, extra)
        })
    }

    /// [`CudaFunction::launch_on`] with the parameters' `extra` array made.
    fn launch_packed(
        &self,
        raw: sys::CUstream,
        launch: &ModuleLaunch,
        attributes: &LaunchAttributes,
        extra_ptr: *mut *mut c_void,
    ) -> DeviceResult<()> {
        let [gx, gy, gz] = launch.grid;
        let [bx, by, bz] = launch.block;
        if *attributes != LaunchAttributes::default() {
            let mut attrs: Vec<sys::CUlaunchAttribute> = Vec::with_capacity(3);
            if attributes.cluster != [0; 3] {
                let mut a: sys::CUlaunchAttribute = unsafe_zeroed();
                a.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
                a.value.clusterDim.x = attributes.cluster[0];
                a.value.clusterDim.y = attributes.cluster[1];
                a.value.clusterDim.z = attributes.cluster[2];
                attrs.push(a);
            }
            if attributes.flags & LAUNCH_COOPERATIVE != 0 {
                let mut a: sys::CUlaunchAttribute = unsafe_zeroed();
                a.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
                a.value.cooperative = 1;
                attrs.push(a);
            }
            if attributes.flags & LAUNCH_PROGRAMMATIC_SERIALIZATION != 0 {
                let mut a: sys::CUlaunchAttribute = unsafe_zeroed();
                a.id =
                    sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
                a.value.programmaticStreamSerializationAllowed = 1;
                attrs.push(a);
            }
            let config = sys::CUlaunchConfig {
                gridDimX: gx,
                gridDimY: gy,
                gridDimZ: gz,
                blockDimX: bx,
                blockDimY: by,
                blockDimZ: bz,
                sharedMemBytes: launch.shared_mem_bytes,
                hStream: raw,
                attrs: attrs.as_mut_ptr(),
                numAttrs: attrs.len() as u32,
            };
            // SAFETY: as for cuLaunchKernel below; the config and its attributes outlive the
            // call.
            return check("cuLaunchKernelEx", unsafe {
                sys::cuLaunchKernelEx(&config, self.raw, ptr::null_mut(), extra_ptr)
            });
        }
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
                raw,
                ptr::null_mut(),
                extra_ptr,
            )
        })
    }
}

/// Runs `f` with the `extra` array that passes `params` packed (pointer, size, end), or NULL
/// for none. The driver only reads the buffer (and copies it) during the call, so the
/// caller's slice serves as it is.
pub(super) fn with_packed<T>(params: &[u8], f: impl FnOnce(*mut *mut c_void) -> T) -> T {
    if params.is_empty() {
        return f(ptr::null_mut());
    }
    let mut size = params.len();
    let mut extra = [
        sys::CU_LAUNCH_PARAM_BUFFER_POINTER_AS_INT as usize as *mut c_void,
        params.as_ptr() as *mut c_void,
        sys::CU_LAUNCH_PARAM_BUFFER_SIZE_AS_INT as usize as *mut c_void,
        &mut size as *mut usize as *mut c_void,
        ptr::null_mut(), // CU_LAUNCH_PARAM_END
    ];
    f(extra.as_mut_ptr())
}

/// A function attribute number as the bindings type it.
fn attribute(a: u32) -> sys::CUfunction_attribute {
    use sys::CUfunction_attribute::*;
    match a {
        0 => CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
        1 => CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES,
        2 => CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES,
        3 => CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES,
        4 => CU_FUNC_ATTRIBUTE_NUM_REGS,
        5 => CU_FUNC_ATTRIBUTE_PTX_VERSION,
        6 => CU_FUNC_ATTRIBUTE_BINARY_VERSION,
        7 => CU_FUNC_ATTRIBUTE_CACHE_MODE_CA,
        8 => CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        9 => CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
        10 => CU_FUNC_ATTRIBUTE_CLUSTER_SIZE_MUST_BE_SET,
        11 => CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH,
        12 => CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT,
        13 => CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH,
        14 => CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED,
        _ => CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE,
    }
}

/// A zeroed plain-data driver structure.
pub(super) fn unsafe_zeroed<T: Copy>() -> T {
    // SAFETY: used only for the bindings' plain C structures and unions for which all-zero
    // bytes are a valid value (none holding an enum without a zero variant: Rust aborts on
    // those; the test below zeroes each type it is used for).
    unsafe { std::mem::zeroed() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_structures_made_zeroed_may_be_all_zero() {
        let a: sys::CUlaunchAttribute = unsafe_zeroed();
        assert!(matches!(
            a.id,
            sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_IGNORE
        ));
    }

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

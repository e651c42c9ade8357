//! libcuda's ABI as the interposer speaks it: the types and result codes every part uses (a
//! leaf: it imports nothing of the crate). They follow `cuda.h` on 64-bit Linux: `CUresult`
//! is an `int`, `CUdeviceptr` and VMM handles are `unsigned long long`, every `CU*` object is
//! an opaque pointer.

use std::ffi::{c_int, c_void};

pub type CUresult = c_int;
pub type CUdeviceptr = u64;
pub type CUdevice = c_int;
pub(crate) type Ptr = *mut c_void;

pub const CUDA_SUCCESS: CUresult = 0;
pub const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
pub const CUDA_ERROR_NOT_INITIALIZED: CUresult = 3;
pub const CUDA_ERROR_NO_DEVICE: CUresult = 100;
pub const CUDA_ERROR_NOT_FOUND: CUresult = 500;
/// No broker for a governed program that may not run without one.
pub const CUDA_ERROR_SYSTEM_NOT_READY: CUresult = 802;

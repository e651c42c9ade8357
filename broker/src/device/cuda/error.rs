//! Turning CUDA driver, NVRTC and cuBLAS status codes into [`DeviceError`]s.

use cudarc::driver::result::DriverError;
use cudarc::driver::sys::{CUresult, cudaError_enum};

use crate::device::DeviceError;

/// A driver status as a device error, with the driver's own name and sentence.
pub fn driver(what: &str, e: DriverError) -> DeviceError {
    match e.0 {
        cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY => DeviceError::OutOfMemory,
        cudaError_enum::CUDA_ERROR_NOT_READY => DeviceError::NotReady,
        cudaError_enum::CUDA_ERROR_NOT_FOUND => DeviceError::NotFound(describe(what, e)),
        cudaError_enum::CUDA_ERROR_INVALID_VALUE
        | cudaError_enum::CUDA_ERROR_INVALID_IMAGE
        | cudaError_enum::CUDA_ERROR_INVALID_PTX
        | cudaError_enum::CUDA_ERROR_NO_BINARY_FOR_GPU => {
            DeviceError::InvalidArgument(describe(what, e))
        }
        // Sticky errors: the context is unusable until it is reset.
        cudaError_enum::CUDA_ERROR_ILLEGAL_ADDRESS
        | cudaError_enum::CUDA_ERROR_LAUNCH_FAILED
        | cudaError_enum::CUDA_ERROR_HARDWARE_STACK_ERROR
        | cudaError_enum::CUDA_ERROR_ILLEGAL_INSTRUCTION
        | cudaError_enum::CUDA_ERROR_MISALIGNED_ADDRESS
        | cudaError_enum::CUDA_ERROR_INVALID_ADDRESS_SPACE
        | cudaError_enum::CUDA_ERROR_INVALID_PC
        | cudaError_enum::CUDA_ERROR_ASSERT
        | cudaError_enum::CUDA_ERROR_LAUNCH_TIMEOUT
        | cudaError_enum::CUDA_ERROR_ECC_UNCORRECTABLE
        | cudaError_enum::CUDA_ERROR_CONTEXT_IS_DESTROYED => DeviceError::Fault(describe(what, e)),
        _ => DeviceError::Failed(describe(what, e)),
    }
}

/// "what: CUDA_ERROR_X (sentence)".
pub fn describe(what: &str, e: DriverError) -> String {
    let name = e
        .error_name()
        .map(|c| c.to_string_lossy().into_owned())
        .unwrap_or_else(|_| format!("{:?}", e.0));
    let text = e
        .error_string()
        .map(|c| c.to_string_lossy().into_owned())
        .unwrap_or_default();
    format!("{what}: {name} ({text})")
}

/// Checks a raw driver call.
pub fn check(what: &str, r: CUresult) -> Result<(), DeviceError> {
    r.result().map_err(|e| driver(what, e))
}

//! The `nvmlReturn_t` codes the shim returns itself, and what each code means in words
//! (`nvmlErrorString` when there is no real library to ask).

use std::ffi::CStr;

pub const SUCCESS: u32 = 0;
pub const UNINITIALIZED: u32 = 1;
pub const INVALID_ARGUMENT: u32 = 2;
pub const NOT_FOUND: u32 = 6;
pub const INSUFFICIENT_SIZE: u32 = 7;
pub const LIBRARY_NOT_FOUND: u32 = 12;
pub const FUNCTION_NOT_FOUND: u32 = 13;

/// NVML's words for `code` (nvml.h's `nvmlReturn_t`).
pub fn describe(code: u32) -> &'static CStr {
    match code {
        0 => c"Success",
        1 => c"Uninitialized",
        2 => c"Invalid Argument",
        3 => c"Not Supported",
        4 => c"Insufficient Permissions",
        5 => c"Already Initialized",
        6 => c"Not Found",
        7 => c"Insufficient Size",
        8 => c"Insufficient External Power",
        9 => c"Driver Not Loaded",
        10 => c"Timeout",
        11 => c"Interrupt request issue",
        12 => c"NVML Shared Library Not Found",
        13 => c"Function Not Found",
        14 => c"Corrupted infoROM",
        15 => c"GPU is lost",
        16 => c"GPU requires restart",
        17 => c"The operating system has blocked the request",
        18 => c"RM has detected an NVML/RM version mismatch",
        19 => c"In use by another client",
        20 => c"Insufficient Memory",
        21 => c"No data",
        22 => c"The requested vgpu operation is not available on target device, because ECC is enabled",
        23 => c"Ran out of critical resources, other than memory",
        24 => c"The requested frequency is not supported",
        25 => c"The provided version is invalid/unsupported",
        26 => c"The requested functionality has been deprecated",
        27 => c"The system is not ready for the request",
        28 => c"No GPUs were found",
        29 => c"Resource not in correct state to perform requested operation",
        30 => c"Reset not supported for given device/parameters",
        _ => c"Unknown Error",
    }
}

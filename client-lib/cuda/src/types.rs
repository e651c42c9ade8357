//! The CUDA driver ABI as this driver needs it: handle and scalar types, the constants it
//! reads and answers with, and the few structures programs pass in. Values from `cuda.h`
//! (CUDA 13.0). Enum-typed arguments arrive as plain integers: a value this driver does not
//! know is an error to report, never undefined behaviour.

#![allow(non_camel_case_types, non_snake_case)]

use std::ffi::c_void;

pub type CUresult = i32;
pub type CUdevice = i32;
pub type CUdeviceptr = u64;
pub type CUcontext = *mut c_void;
pub type CUmodule = *mut c_void;
pub type CUlibrary = *mut c_void;
pub type CUfunction = *mut c_void;
pub type CUkernel = *mut c_void;
pub type CUstream = *mut c_void;
pub type CUevent = *mut c_void;
pub type CUgraph = *mut c_void;
pub type CUgraphExec = *mut c_void;
pub type CUgraphNode = *mut c_void;

/// The CUDA version this driver speaks (what `cuDriverGetVersion` says unless the broker's
/// driver says otherwise).
pub const CUDA_VERSION: i32 = 13000;

pub mod result {
    use super::CUresult;
    pub const SUCCESS: CUresult = 0;
    pub const INVALID_VALUE: CUresult = 1;
    pub const OUT_OF_MEMORY: CUresult = 2;
    pub const NOT_INITIALIZED: CUresult = 3;
    pub const DEINITIALIZED: CUresult = 4;
    pub const DEVICE_UNAVAILABLE: CUresult = 46;
    pub const NO_DEVICE: CUresult = 100;
    pub const INVALID_DEVICE: CUresult = 101;
    pub const INVALID_IMAGE: CUresult = 200;
    pub const INVALID_CONTEXT: CUresult = 201;
    pub const NO_BINARY_FOR_GPU: CUresult = 209;
    pub const PEER_ACCESS_UNSUPPORTED: CUresult = 217;
    pub const FILE_NOT_FOUND: CUresult = 301;
    pub const OPERATING_SYSTEM: CUresult = 304;
    pub const INVALID_HANDLE: CUresult = 400;
    pub const ILLEGAL_STATE: CUresult = 401;
    pub const NOT_FOUND: CUresult = 500;
    pub const NOT_READY: CUresult = 600;
    pub const ILLEGAL_ADDRESS: CUresult = 700;
    pub const LAUNCH_OUT_OF_RESOURCES: CUresult = 701;
    pub const PEER_ACCESS_ALREADY_ENABLED: CUresult = 704;
    pub const PEER_ACCESS_NOT_ENABLED: CUresult = 705;
    pub const PRIMARY_CONTEXT_ACTIVE: CUresult = 708;
    pub const HOST_MEMORY_ALREADY_REGISTERED: CUresult = 712;
    pub const HOST_MEMORY_NOT_REGISTERED: CUresult = 713;
    pub const LAUNCH_FAILED: CUresult = 719;
    pub const NOT_PERMITTED: CUresult = 800;
    pub const NOT_SUPPORTED: CUresult = 801;
    pub const SYSTEM_NOT_READY: CUresult = 802;
    pub const SYSTEM_DRIVER_MISMATCH: CUresult = 803;
    pub const STREAM_CAPTURE_UNSUPPORTED: CUresult = 900;
    pub const STREAM_CAPTURE_INVALIDATED: CUresult = 901;
    pub const STREAM_CAPTURE_UNMATCHED: CUresult = 903;
    pub const STREAM_CAPTURE_IMPLICIT: CUresult = 906;
    pub const STREAM_CAPTURE_WRONG_THREAD: CUresult = 908;
    pub const UNKNOWN: CUresult = 999;
}

/// `CUdevice_attribute` numbers this driver reads itself (it answers every attribute from
/// the broker's table).
pub mod device_attr {
    pub const MAX_THREADS_PER_BLOCK: usize = 1;
    pub const MAX_BLOCK_DIM_X: usize = 2;
    pub const MAX_GRID_DIM_X: usize = 5;
    pub const MAX_SHARED_MEMORY_PER_BLOCK: usize = 8;
    pub const TOTAL_CONSTANT_MEMORY: usize = 9;
    pub const WARP_SIZE: usize = 10;
    pub const MAX_PITCH: usize = 11;
    pub const MAX_REGISTERS_PER_BLOCK: usize = 12;
    pub const CLOCK_RATE: usize = 13;
    pub const TEXTURE_ALIGNMENT: usize = 14;
    pub const MULTIPROCESSOR_COUNT: usize = 16;
    pub const PCI_BUS_ID: usize = 33;
    pub const PCI_DEVICE_ID: usize = 34;
    pub const PCI_DOMAIN_ID: usize = 50;
    pub const COMPUTE_CAPABILITY_MAJOR: usize = 75;
    pub const COMPUTE_CAPABILITY_MINOR: usize = 76;
    pub const MANAGED_MEMORY: usize = 83;
    pub const CONCURRENT_MANAGED_ACCESS: usize = 89;
    pub const VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: usize = 102;
    pub const HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED: usize = 103;
    pub const GENERIC_COMPRESSION_SUPPORTED: usize = 107;
    pub const GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED: usize = 110;
    pub const MEMPOOL_SUPPORTED_HANDLE_TYPES: usize = 119;
    pub const HOST_NUMA_MEMORY_POOLS_SUPPORTED: usize = 142;
    pub const HOST_MEMORY_POOLS_SUPPORTED: usize = 144;
    pub const HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: usize = 141;
    pub const HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: usize = 145;
    pub const MAX: usize = 150;
}

/// `CUfunction_attribute` numbers.
pub mod func_attr {
    pub const MAX_THREADS_PER_BLOCK: i32 = 0;
    pub const SHARED_SIZE_BYTES: i32 = 1;
    pub const MAX_DYNAMIC_SHARED_SIZE_BYTES: i32 = 8;
    pub const MAX: i32 = 16;
}

/// `CUpointer_attribute` numbers.
pub mod ptr_attr {
    pub const CONTEXT: i32 = 1;
    pub const MEMORY_TYPE: i32 = 2;
    pub const DEVICE_POINTER: i32 = 3;
    pub const HOST_POINTER: i32 = 4;
    pub const P2P_TOKENS: i32 = 5;
    pub const SYNC_MEMOPS: i32 = 6;
    pub const BUFFER_ID: i32 = 7;
    pub const IS_MANAGED: i32 = 8;
    pub const DEVICE_ORDINAL: i32 = 9;
    pub const IS_LEGACY_CUDA_IPC_CAPABLE: i32 = 10;
    pub const RANGE_START_ADDR: i32 = 11;
    pub const RANGE_SIZE: i32 = 12;
    pub const MAPPED: i32 = 13;
    pub const ALLOWED_HANDLE_TYPES: i32 = 14;
    pub const IS_GPU_DIRECT_RDMA_CAPABLE: i32 = 15;
    pub const ACCESS_FLAGS: i32 = 16;
    pub const MEMPOOL_HANDLE: i32 = 17;
    pub const MAPPING_SIZE: i32 = 18;
    pub const MAPPING_BASE_ADDR: i32 = 19;
    pub const MEMORY_BLOCK_ID: i32 = 20;
}

/// `CUmemorytype`.
pub mod memory_type {
    pub const HOST: u32 = 1;
    pub const DEVICE: u32 = 2;
}

/// `CUlimit` numbers.
pub mod limit {
    pub const STACK_SIZE: usize = 0;
    pub const PRINTF_FIFO_SIZE: usize = 1;
    pub const MALLOC_HEAP_SIZE: usize = 2;
    pub const DEV_RUNTIME_SYNC_DEPTH: usize = 3;
    pub const DEV_RUNTIME_PENDING_LAUNCH_COUNT: usize = 4;
    pub const MAX_L2_FETCH_GRANULARITY: usize = 5;
    pub const PERSISTING_L2_CACHE_SIZE: usize = 6;
    pub const COUNT: usize = 10;
}

/// Stream handles with a meaning of their own, and stream flags.
pub mod stream {
    pub const LEGACY: usize = 0x1;
    pub const PER_THREAD: usize = 0x2;
    pub const NON_BLOCKING: u32 = 0x1;
}

/// `CUevent_flags`.
pub mod event {
    pub const BLOCKING_SYNC: u32 = 0x1;
    pub const DISABLE_TIMING: u32 = 0x2;
    pub const INTERPROCESS: u32 = 0x4;
}

/// `cuGetProcAddress` flags and symbol status.
pub mod proc_address {
    pub const PER_THREAD_DEFAULT_STREAM: u64 = 2;
    pub const SYMBOL_SUCCESS: i32 = 0;
    pub const SYMBOL_NOT_FOUND: i32 = 1;
    pub const VERSION_NOT_SUFFICIENT: i32 = 2;
}

/// `cuMemHostAlloc` and `cuMemHostRegister` flags.
pub mod host_mem {
    pub const PORTABLE: u32 = 0x1;
    pub const DEVICEMAP: u32 = 0x2;
    pub const WRITECOMBINED: u32 = 0x4;
    pub const REGISTER_IOMEMORY: u32 = 0x4;
    pub const REGISTER_READ_ONLY: u32 = 0x8;
}

/// `cuLaunchKernel`'s `extra` markers.
pub mod launch_param {
    pub const END: usize = 0x0;
    pub const BUFFER_POINTER: usize = 0x1;
    pub const BUFFER_SIZE: usize = 0x2;
}

/// `CUlaunchAttributeID` numbers.
pub mod launch_attr {
    pub const IGNORE: u32 = 0;
    pub const ACCESS_POLICY_WINDOW: u32 = 1;
    pub const COOPERATIVE: u32 = 2;
    pub const SYNCHRONIZATION_POLICY: u32 = 3;
    pub const CLUSTER_DIMENSION: u32 = 4;
    pub const CLUSTER_SCHEDULING_POLICY_PREFERENCE: u32 = 5;
    pub const PROGRAMMATIC_STREAM_SERIALIZATION: u32 = 6;
    pub const PROGRAMMATIC_EVENT: u32 = 7;
    pub const PRIORITY: u32 = 8;
    pub const MEM_SYNC_DOMAIN_MAP: u32 = 9;
    pub const MEM_SYNC_DOMAIN: u32 = 10;
    pub const PREFERRED_CLUSTER_DIMENSION: u32 = 11;
    pub const LAUNCH_COMPLETION_EVENT: u32 = 12;
    pub const DEVICE_UPDATABLE_KERNEL_NODE: u32 = 13;
    pub const PREFERRED_SHARED_MEMORY_CARVEOUT: u32 = 14;
}

/// Stream capture modes and states.
pub mod capture {
    pub const MODE_GLOBAL: i32 = 0;
    pub const MODE_THREAD_LOCAL: i32 = 1;
    pub const MODE_RELAXED: i32 = 2;
    pub const STATUS_NONE: i32 = 0;
    pub const STATUS_ACTIVE: i32 = 1;
    pub const STATUS_INVALIDATED: i32 = 2;
}

/// `CUmoduleLoadingMode`.
pub const MODULE_LAZY_LOADING: i32 = 2;

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CUuuid {
    pub bytes: [u8; 16],
}

/// `CUlaunchAttribute`: an id, padding, and a 64-byte value union.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUlaunchAttribute {
    pub id: u32,
    pub pad: [u8; 4],
    pub value: [u32; 16],
}

const _: () = assert!(std::mem::size_of::<CUlaunchAttribute>() == 72);

/// `CUlaunchConfig`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUlaunchConfig {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem_bytes: u32,
    pub stream: CUstream,
    pub attrs: *const CUlaunchAttribute,
    pub num_attrs: u32,
}

const _: () = assert!(std::mem::size_of::<CUlaunchConfig>() == 56);

/// `CUdevprop` (`cuDeviceGetProperties`, deprecated but still asked for).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct CUdevprop {
    pub max_threads_per_block: i32,
    pub max_threads_dim: [i32; 3],
    pub max_grid_size: [i32; 3],
    pub shared_mem_per_block: i32,
    pub total_constant_memory: i32,
    pub simd_width: i32,
    pub mem_pitch: i32,
    pub regs_per_block: i32,
    pub clock_rate: i32,
    pub texture_align: i32,
}

/// The header of a fat binary (what `.nv_fatbin` sections and `cuLibraryLoadData` hold).
pub const FATBIN_MAGIC: u32 = 0xba55_ed50;
/// The wrapper the CUDA runtime registers fat binaries with (`__fatbinwrap`).
pub const FATBIN_WRAPPER_MAGIC: u32 = 0x4662_43b1;

//! The device attributes the sim device reports: an H100's (80 GB HBM3, driver 580), as
//! `cuDeviceGetAttribute` gave them on the GPU machine, so that a client-side CUDA driver
//! sees a plausible GPU.

/// By `CUdevice_attribute` number (index 0 unused).
pub const H100_ATTRIBUTES: [i32; 148] = [
    0, 1024, 1024, 1024, 64, 2147483647, 65535, 65535, 49152, 65536, 32, 2147483647, 65536,
    1980000, 512, 1, 132, 0, 0, 1, 0, 131072, 131072, 65536, 16384, 16384, 16384, 32768, 32768,
    2048, 512, 1, 1, 0, 6, 0, 2619000, 5120, 52428800, 2048, 3, 1, 32768, 2048, 1, 32768, 32768,
    8192, 8192, 32768, 0, 32, 32768, 32768, 2046, 32768, 131072, 65536, 16384, 16384, 16384, 32768,
    2048, 32768, 32768, 2048, 32768, 32768, 2046, 268435456, 131072, 65000, 2097120, 32768, 32768,
    9, 0, 32768, 1, 1, 1, 233472, 65536, 1, 0, 0, 0, 2, 0, 1, 1, 1, 0, 0, 0, 1, 1, 232448, 0, 1, 0,
    0, 1, 1, 0, 0, 32, 1, 32768000, 134217728, 1, 1024, 1, 1, 1, 1, 1, 1, 100, 9, 1, 1, 1, 1, 1, 1,
    4, 1, 1, 1, 0, -1, 0, 0, 0, 0, 0, 0, 0, 590352606, 381751518, 1, 1, 0, 1, 1, 0, 0,
];

/// `CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT`, `_PCI_BUS_ID`.
const MULTIPROCESSOR_COUNT: usize = 16;
const PCI_BUS_ID: usize = 33;

/// The table for a sim device with `sm_count` SMs at index `index`.
pub fn for_sim(sm_count: u32, index: u32) -> Vec<i32> {
    let mut a = H100_ATTRIBUTES.to_vec();
    a[MULTIPROCESSOR_COUNT] = sm_count as i32;
    a[PCI_BUS_ID] = index as i32 + 1;
    a
}

//! What the device is, as its driver says and as the scheduler models it: every attribute,
//! its UUID, the driver's version, and peak rates from clocks and widths.

use cudarc::driver::sys::{self, CUdevice};

/// FP32 lanes per SM on recent NVIDIA GPUs (Ampere and later), for the peak-rate estimate.
const FP32_LANES_PER_SM: f64 = 128.0;

/// Every device attribute by number (0 where the driver does not know it): what a
/// consolidated client's driver answers `cuDeviceGetAttribute` with.
pub(super) fn all_attributes(device: CUdevice) -> Vec<i32> {
    const COUNT: i32 = 160;
    (0..COUNT)
        .map(|a| {
            if a == 0 {
                return 0;
            }
            let mut v = 0;
            // SAFETY: `device` is valid; the attribute number is passed as the C enum's
            // integer, and one the driver does not know is an error (mapped to 0).
            let r = unsafe {
                sys::cuDeviceGetAttribute(
                    &mut v,
                    std::mem::transmute::<i32, sys::CUdevice_attribute>(a),
                    device,
                )
            };
            if r == sys::cudaError_enum::CUDA_SUCCESS {
                v
            } else {
                0
            }
        })
        .collect()
}

pub(super) fn uuid(device: CUdevice) -> [u8; 16] {
    let mut u = sys::CUuuid { bytes: [0; 16] };
    // SAFETY: valid device; out-parameter on our stack.
    let _ = unsafe { sys::cuDeviceGetUuid_v2(&mut u, device) };
    u.bytes.map(|b| b as u8)
}

pub(super) fn driver_version() -> i32 {
    let mut v = 0;
    // SAFETY: out-parameter on our stack.
    let _ = unsafe { sys::cuDriverGetVersion(&mut v) };
    v
}

/// Peak FP32 rate (flop/s) from the SM count and the SM clock in kHz: one FMA (two flops) per
/// lane per clock.
pub(super) fn fp32_flops(sm_count: u32, clock_khz: f64) -> f64 {
    sm_count as f64 * FP32_LANES_PER_SM * 2.0 * clock_khz * 1e3
}

/// Peak memory bandwidth (bytes/s) from the memory clock in kHz and the bus width in bits:
/// two transfers per clock.
pub(super) fn memory_bandwidth(mem_clock_khz: f64, bus_bits: f64) -> f64 {
    2.0 * mem_clock_khz * 1e3 * bus_bits / 8.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peak_rates_come_from_attributes_in_khz_and_bits() {
        // 100 SMs at 1 GHz: 100 × 128 lanes × 2 flops × 1e9.
        assert_eq!(fp32_flops(100, 1_000_000.0), 25.6e12);
        // A 1 GHz memory clock on a 1024-bit bus: 2 × 1e9 × 128 bytes.
        assert_eq!(memory_bandwidth(1_000_000.0, 1024.0), 256e9);
    }
}

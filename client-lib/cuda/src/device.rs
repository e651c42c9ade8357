//! The devices: the GPU the broker runs this client on (ordinal 0), or under
//! `gpushare run --gpus N` the N GPUs it gave the program (`crate::gpus`), each of which the
//! process may work on (`crate::route`). Everything about them comes from the broker at
//! `cuInit`; no query waits for the broker.

use std::ffi::{c_char, c_int, c_uint};

use crate::driver::{self, Driver};
use crate::status::{Cu, entry, out};
use gpushare_protocol::control::DeviceInfo;

use crate::types::{CUdevice, CUdevprop, CUresult, CUuuid, device_attr, result};

/// The device a context, an allocation or a pool may be on: one the program sees.
pub fn check(dev: CUdevice) -> Cu<()> {
    visible(dev).map(drop)
}

/// `dev` itself if the program sees that device, else `CUDA_ERROR_INVALID_DEVICE` (said once).
pub fn visible(dev: CUdevice) -> Cu<CUdevice> {
    let d = driver::get()?;
    seen(d, dev).map(|_| dev)
}

/// Says (once) that a device ordinal names none of the `seen` devices.
fn say_unseen(seen: CUdevice) {
    if seen == 1 {
        crate::log::say_once(
            "this program sees one GPU through gpushare (device 0, the one gpushared assigned it; `gpushare run --gpu N` picks another, `--gpus N` gives it several)",
        );
    } else {
        crate::log::say_once(&format!(
            "this program sees {seen} GPUs through gpushare (devices 0 to {}, the ones `gpushare run --gpus` gave it)",
            seen - 1
        ));
    }
}

/// The ordinal of the calling thread's current device, where its work goes (0 before
/// `cuInit`).
pub fn bound() -> CUdevice {
    driver::get().map_or(0, |d| d.device)
}

/// A device the program sees, for a query.
fn seen(d: &Driver, dev: CUdevice) -> Cu<&DeviceInfo> {
    d.gpus.get(dev).ok_or_else(|| {
        say_unseen(d.gpus.visible.len() as CUdevice);
        result::INVALID_DEVICE
    })
}

/// The attributes of features this driver does not offer, whatever the GPU can do: programs
/// ask them before using the feature, and a driver without it says 0.
const NOT_OFFERED: [usize; 9] = [
    device_attr::MANAGED_MEMORY,
    device_attr::CONCURRENT_MANAGED_ACCESS,
    device_attr::MEMPOOL_SUPPORTED_HANDLE_TYPES,
    device_attr::HOST_NUMA_MEMORY_POOLS_SUPPORTED,
    device_attr::HOST_MEMORY_POOLS_SUPPORTED,
    device_attr::GENERIC_COMPRESSION_SUPPORTED,
    device_attr::GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED,
    device_attr::HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
    device_attr::HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
];

/// Offered exactly when the broker has memory for the virtual memory API (whatever the GPU
/// says: the sim says nothing).
const VIRTUAL_MEMORY: [usize; 2] = [
    device_attr::VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
    device_attr::HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
];

/// An attribute's value as programs of this driver see it: the GPU's `value`, or 0 for a
/// feature not offered here.
fn offered(attr: usize, value: i32) -> i32 {
    if NOT_OFFERED.contains(&attr) {
        0
    } else {
        value
    }
}

impl Driver {
    /// An attribute of the device this process runs on.
    pub fn attribute(&self, attr: usize) -> Cu<i32> {
        self.attribute_of(self.device_info(), attr)
    }

    /// A device attribute, as the broker's GPU has it, less what this driver cannot offer.
    pub fn attribute_of(&self, device: &DeviceInfo, attr: usize) -> Cu<i32> {
        match device.attributes.get(attr) {
            Some(_) if VIRTUAL_MEMORY.contains(&attr) => Ok(i32::from(self.memory_granularity > 0)),
            Some(&v) if attr > 0 => Ok(offered(attr, v)),
            _ => Err(result::INVALID_VALUE),
        }
    }
}

/// # Safety
/// Callable from C.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuInit(flags: c_uint) -> CUresult {
    entry("cuInit", || {
        if flags != 0 {
            return Err(result::INVALID_VALUE);
        }
        driver::init()
    })
}

/// # Safety
/// `version` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDriverGetVersion(version: *mut c_int) -> CUresult {
    entry("cuDriverGetVersion", || {
        // Before cuInit too, as CUDA allows; then it is the version this driver speaks.
        let v = driver::get().map_or(crate::types::CUDA_VERSION, |d| {
            if d.gpus.bound_device().driver_version > 0 {
                d.gpus.bound_device().driver_version
            } else {
                crate::types::CUDA_VERSION
            }
        });
        // SAFETY: the caller's contract.
        unsafe { out(version, v) }
    })
}

/// # Safety
/// `device` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGet(device: *mut CUdevice, ordinal: c_int) -> CUresult {
    entry("cuDeviceGet", || {
        seen(driver::get()?, ordinal)?;
        // SAFETY: the caller's contract.
        unsafe { out(device, ordinal) }
    })
}

/// # Safety
/// `count` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CUresult {
    entry("cuDeviceGetCount", || {
        let n = driver::get()?.gpus.visible.len() as c_int;
        // SAFETY: the caller's contract.
        unsafe { out(count, n) }
    })
}

/// # Safety
/// `name` is NULL or valid for writing `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) -> CUresult {
    entry("cuDeviceGetName", || {
        let info = seen(driver::get()?, dev)?;
        if name.is_null() || len <= 0 {
            return Err(result::INVALID_VALUE);
        }
        let bytes = info.name.as_bytes();
        let n = bytes.len().min(len as usize - 1);
        // SAFETY: `n + 1 <= len` bytes, which the caller says are writable.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), name.cast::<u8>(), n);
            *name.add(n) = 0;
        }
        Ok(())
    })
}

/// # Safety
/// `bytes` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
    entry("cuDeviceTotalMem_v2", || {
        let info = seen(driver::get()?, dev)?;
        // SAFETY: the caller's contract.
        unsafe { out(bytes, info.total_memory as usize) }
    })
}

/// The CUDA 2.0 form, with a 32-bit size.
///
/// # Safety
/// `bytes` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem(bytes: *mut c_uint, dev: CUdevice) -> CUresult {
    entry("cuDeviceTotalMem", || {
        let info = seen(driver::get()?, dev)?;
        let total = info.total_memory.min(c_uint::MAX as u64) as c_uint;
        // SAFETY: the caller's contract.
        unsafe { out(bytes, total) }
    })
}

/// # Safety
/// `value` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetAttribute(
    value: *mut c_int,
    attr: c_int,
    dev: CUdevice,
) -> CUresult {
    entry("cuDeviceGetAttribute", || {
        let d = driver::get()?;
        let info = seen(d, dev)?;
        let v = usize::try_from(attr)
            .map_err(|_| result::INVALID_VALUE)
            .and_then(|a| d.attribute_of(info, a))?;
        // SAFETY: the caller's contract.
        unsafe { out(value, v) }
    })
}

/// # Safety
/// `uuid` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetUuid(uuid: *mut CUuuid, dev: CUdevice) -> CUresult {
    entry("cuDeviceGetUuid", || {
        let info = seen(driver::get()?, dev)?;
        // SAFETY: the caller's contract.
        unsafe { out(uuid, CUuuid { bytes: info.uuid }) }
    })
}

/// # Safety
/// `uuid` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetUuid_v2(uuid: *mut CUuuid, dev: CUdevice) -> CUresult {
    // SAFETY: the same contract.
    unsafe { cuDeviceGetUuid(uuid, dev) }
}

/// # Safety
/// `major` and `minor` are NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceComputeCapability(
    major: *mut c_int,
    minor: *mut c_int,
    dev: CUdevice,
) -> CUresult {
    entry("cuDeviceComputeCapability", || {
        let (ma, mi) = seen(driver::get()?, dev)?.compute_capability;
        // SAFETY: the caller's contract.
        unsafe {
            out(major, ma as c_int)?;
            out(minor, mi as c_int)
        }
    })
}

/// # Safety
/// `prop` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetProperties(prop: *mut CUdevprop, dev: CUdevice) -> CUresult {
    entry("cuDeviceGetProperties", || {
        let d = driver::get()?;
        let info = seen(d, dev)?;
        let a = |i| d.attribute_of(info, i).unwrap_or(0);
        let p = CUdevprop {
            max_threads_per_block: a(device_attr::MAX_THREADS_PER_BLOCK),
            max_threads_dim: [
                a(device_attr::MAX_BLOCK_DIM_X),
                a(device_attr::MAX_BLOCK_DIM_X + 1),
                a(device_attr::MAX_BLOCK_DIM_X + 2),
            ],
            max_grid_size: [
                a(device_attr::MAX_GRID_DIM_X),
                a(device_attr::MAX_GRID_DIM_X + 1),
                a(device_attr::MAX_GRID_DIM_X + 2),
            ],
            shared_mem_per_block: a(device_attr::MAX_SHARED_MEMORY_PER_BLOCK),
            total_constant_memory: a(device_attr::TOTAL_CONSTANT_MEMORY),
            simd_width: a(device_attr::WARP_SIZE),
            mem_pitch: a(device_attr::MAX_PITCH),
            regs_per_block: a(device_attr::MAX_REGISTERS_PER_BLOCK),
            clock_rate: a(device_attr::CLOCK_RATE),
            texture_align: a(device_attr::TEXTURE_ALIGNMENT),
        };
        // SAFETY: the caller's contract.
        unsafe { out(prop, p) }
    })
}

/// A device's PCI bus id, as `cuDeviceGetPCIBusId` writes it.
fn pci_bus_id(info: &DeviceInfo) -> String {
    let (domain, bus, device) = info.pci;
    format!("{domain:08x}:{bus:02x}:{device:02x}.0")
}

/// # Safety
/// `id` is NULL or valid for writing `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetPCIBusId(
    id: *mut c_char,
    len: c_int,
    dev: CUdevice,
) -> CUresult {
    entry("cuDeviceGetPCIBusId", || {
        let info = seen(driver::get()?, dev)?;
        if id.is_null() || len <= 0 {
            return Err(result::INVALID_VALUE);
        }
        let s = pci_bus_id(info);
        let n = s.len().min(len as usize - 1);
        // SAFETY: `n + 1 <= len` writable bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(s.as_ptr(), id.cast::<u8>(), n);
            *id.add(n) = 0;
        }
        Ok(())
    })
}

/// # Safety
/// `dev` is NULL or valid for writing; `id` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetByPCIBusId(dev: *mut CUdevice, id: *const c_char) -> CUresult {
    entry("cuDeviceGetByPCIBusId", || {
        let d = driver::get()?;
        if id.is_null() {
            return Err(result::INVALID_VALUE);
        }
        // SAFETY: the caller's contract.
        let asked = unsafe { std::ffi::CStr::from_ptr(id) }
            .to_string_lossy()
            .to_lowercase();
        // Domain may be written short ("0000:00:06.0") or left out ("00:06.0").
        let matches = |ours: &str| {
            ours.ends_with(asked.trim_start_matches('0'))
                || ours
                    .trim_start_matches('0')
                    .ends_with(asked.trim_start_matches("0000:"))
        };
        let found = d
            .gpus
            .visible
            .iter()
            .position(|info| matches(&pci_bus_id(info)))
            .ok_or(result::INVALID_DEVICE)?;
        // SAFETY: the caller's contract.
        unsafe { out(dev, found as CUdevice) }
    })
}

/// # Safety
/// `can` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceCanAccessPeer(
    can: *mut c_int,
    dev: CUdevice,
    peer: CUdevice,
) -> CUresult {
    entry("cuDeviceCanAccessPeer", || {
        let d = driver::get()?;
        seen(d, dev)?;
        seen(d, peer)?;
        // SAFETY: the caller's contract.
        unsafe { out(can, c_int::from(d.gpus.reaches(dev, peer))) }
    })
}

/// `CU_DEVICE_P2P_ATTRIBUTE_*`: performance rank, access supported, native atomics, CUDA
/// array access.
const P2P_ATTRIBUTES: std::ops::RangeInclusive<c_int> = 1..=4;
const P2P_ACCESS_SUPPORTED: c_int = 2;

/// # Safety
/// `value` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetP2PAttribute(
    value: *mut c_int,
    attrib: c_int,
    src: CUdevice,
    dst: CUdevice,
) -> CUresult {
    entry("cuDeviceGetP2PAttribute", || {
        let d = driver::get()?;
        seen(d, src)?;
        seen(d, dst)?;
        if src == dst {
            return Err(result::INVALID_DEVICE);
        }
        if !P2P_ATTRIBUTES.contains(&attrib) {
            return Err(result::INVALID_VALUE);
        }
        // Access as `cuDeviceCanAccessPeer` says it; no claim of native atomics (unknown
        // here), no CUDA arrays (not served), and one performance rank for every link.
        let v = c_int::from(attrib == P2P_ACCESS_SUPPORTED && d.gpus.reaches(src, dst));
        // SAFETY: the caller's contract.
        unsafe { out(value, v) }
    })
}

/// # Safety
/// `supported` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetExecAffinitySupport(
    supported: *mut c_int,
    _kind: c_int,
    dev: CUdevice,
) -> CUresult {
    entry("cuDeviceGetExecAffinitySupport", || {
        seen(driver::get()?, dev)?;
        // SAFETY: the caller's contract.
        unsafe { out(supported, 0) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn features_this_driver_lacks_read_as_absent() {
        // The GPU has managed memory (an H100 says 1); programs here cannot.
        assert_eq!(offered(device_attr::MANAGED_MEMORY, 1), 0);
        assert_eq!(offered(device_attr::CONCURRENT_MANAGED_ACCESS, 1), 0);
        assert_eq!(offered(device_attr::MULTIPROCESSOR_COUNT, 132), 132);
        assert_eq!(offered(device_attr::WARP_SIZE, 32), 32);
    }
}

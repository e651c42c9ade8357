//! Whether one GPU reaches another's memory (peer access over NVLink or PCIe), asked of the
//! driver in gpushared's own process, which initialised it and holds no context.

use std::ffi::CString;

use cudarc::driver::sys::{self, CUdevice};

/// The driver's device for PCI location (domain, bus, device), if it has one.
fn device_at(pci: (u32, u32, u32)) -> Option<CUdevice> {
    let (domain, bus, device) = pci;
    let id = CString::new(format!("{domain:04x}:{bus:02x}:{device:02x}.0")).ok()?;
    let mut dev: CUdevice = 0;
    // SAFETY: an out-parameter and a NUL-terminated string that outlives the call.
    let r = unsafe { sys::cuDeviceGetByPCIBusId(&mut dev, id.as_ptr()) };
    (r == sys::CUresult::CUDA_SUCCESS).then_some(dev)
}

/// Whether the GPU at PCI location `from` can map and use memory of the GPU at `to`; false
/// where the driver cannot say.
pub fn reaches(from: (u32, u32, u32), to: (u32, u32, u32)) -> bool {
    if from == to {
        return true;
    }
    let (Some(a), Some(b)) = (device_at(from), device_at(to)) else {
        return false;
    };
    let mut can = 0;
    // SAFETY: an out-parameter; two devices the driver just named.
    let r = unsafe { sys::cuDeviceCanAccessPeer(&mut can, a, b) };
    r == sys::CUresult::CUDA_SUCCESS && can != 0
}

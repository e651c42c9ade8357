//! Pointer attributes: what `cuPointerGetAttribute(s)` answer for device allocations,
//! module globals and shared host memory.

use std::ffi::{c_int, c_uint, c_void};

use super::{DeviceRange, HostRegion, Memory};
use crate::status::Cu;
use crate::types::{CUcontext, memory_type, ptr_attr, result};

/// Where a pointer points, for pointer queries.
pub(super) enum Pointee {
    Device { base: u64, range: DeviceRange },
    Host { base: usize, region: HostRegion },
    Unknown,
}

pub(super) fn pointee(memory: &Memory, ptr: u64) -> Pointee {
    if let Some((base, range)) = memory.device_range(ptr, 0) {
        return Pointee::Device { base, range };
    }
    match memory.host_region_at(ptr as usize) {
        Some((base, region)) => Pointee::Host { base, region },
        None => Pointee::Unknown,
    }
}

/// Writes one pointer attribute's value to `data`; `Ok(false)` when the pointer has no such
/// attribute. `owner` is the context every pointer of its device belongs to (the device's
/// primary one) and the device's ordinal.
///
/// # Safety
/// `data` is valid for writing the attribute's type.
pub(super) unsafe fn write_attribute(
    owner: (CUcontext, c_int),
    attr: c_int,
    p: &Pointee,
    ptr: u64,
    data: *mut c_void,
) -> Cu<bool> {
    let (ctx, device) = owner;
    // SAFETY: every write below is to `data`, valid for the attribute's type per the contract.
    unsafe {
        match (attr, p) {
            (ptr_attr::MEMORY_TYPE, Pointee::Device { .. }) => {
                data.cast::<c_uint>().write(memory_type::DEVICE)
            }
            (ptr_attr::MEMORY_TYPE, Pointee::Host { .. }) => {
                data.cast::<c_uint>().write(memory_type::HOST)
            }
            (ptr_attr::CONTEXT, Pointee::Device { .. } | Pointee::Host { .. }) => {
                data.cast::<CUcontext>().write(ctx)
            }
            (ptr_attr::DEVICE_POINTER, Pointee::Device { .. }) => data.cast::<u64>().write(ptr),
            (ptr_attr::DEVICE_POINTER, Pointee::Host { base, region }) => data
                .cast::<u64>()
                .write(region.device_ptr + (ptr as usize - base) as u64),
            (ptr_attr::HOST_POINTER, Pointee::Host { .. }) => {
                data.cast::<*mut c_void>().write(ptr as *mut c_void)
            }
            (ptr_attr::HOST_POINTER, Pointee::Device { .. }) => return Err(result::INVALID_VALUE),
            (ptr_attr::SYNC_MEMOPS, Pointee::Device { .. }) => data.cast::<c_int>().write(1),
            (ptr_attr::BUFFER_ID, Pointee::Device { range, .. }) => {
                data.cast::<u64>().write(range.buffer_id)
            }
            (ptr_attr::IS_MANAGED, Pointee::Device { .. } | Pointee::Host { .. }) => {
                data.cast::<c_int>().write(0)
            }
            (ptr_attr::DEVICE_ORDINAL, Pointee::Device { .. } | Pointee::Host { .. }) => {
                data.cast::<c_int>().write(device)
            }
            (
                ptr_attr::IS_LEGACY_CUDA_IPC_CAPABLE | ptr_attr::IS_GPU_DIRECT_RDMA_CAPABLE,
                Pointee::Device { .. },
            ) => data.cast::<c_int>().write(0),
            (ptr_attr::RANGE_START_ADDR, Pointee::Device { base, .. }) => {
                data.cast::<u64>().write(*base)
            }
            (ptr_attr::RANGE_START_ADDR, Pointee::Host { base, .. }) => {
                data.cast::<u64>().write(*base as u64)
            }
            (ptr_attr::RANGE_SIZE, Pointee::Device { range, .. }) => {
                data.cast::<usize>().write(range.bytes as usize)
            }
            (ptr_attr::RANGE_SIZE, Pointee::Host { region, .. }) => {
                data.cast::<usize>().write(region.len)
            }
            (ptr_attr::MAPPED, Pointee::Device { .. } | Pointee::Host { .. }) => {
                data.cast::<c_int>().write(1)
            }
            (ptr_attr::MEMPOOL_HANDLE, Pointee::Device { .. }) => {
                data.cast::<*mut c_void>().write(std::ptr::null_mut())
            }
            (ptr_attr::ALLOWED_HANDLE_TYPES | ptr_attr::ACCESS_FLAGS, Pointee::Device { .. }) => {
                data.cast::<u64>().write(0)
            }
            (ptr_attr::MEMORY_BLOCK_ID, Pointee::Device { range, .. }) => {
                data.cast::<u64>().write(range.buffer_id)
            }
            (ptr_attr::MAPPING_BASE_ADDR, Pointee::Device { base, .. }) => {
                data.cast::<u64>().write(*base)
            }
            (ptr_attr::MAPPING_SIZE, Pointee::Device { range, .. }) => {
                data.cast::<usize>().write(range.bytes as usize)
            }
            (ptr_attr::P2P_TOKENS, _) => return Err(result::NOT_SUPPORTED),
            _ => return Ok(false),
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::DeviceKind;

    const CTX: CUcontext = 0x10 as CUcontext;
    const ALLOCATION: u64 = 0x1000_0000;
    const HOST: usize = 0x7f00_0000_0000;
    const HOST_DEVICE_PTR: u64 = 0x2_0000_0000;

    fn memory() -> Memory {
        let m = Memory::default();
        m.add_device(ALLOCATION, 8192, DeviceKind::Allocation, false);
        m.host.write().expect("lock").insert(
            HOST,
            HostRegion {
                len: 4096,
                region: 1,
                device_ptr: HOST_DEVICE_PTR,
                flags: 0,
                pages: crate::memory::Pages::Allocated,
            },
        );
        m
    }

    /// The attribute's value as 8 bytes (every attribute type fits), or the call's outcome.
    fn read(p: &Pointee, ptr: u64, attr: c_int) -> Cu<Option<u64>> {
        let mut v = 0u64;
        // SAFETY: `v` is 8 bytes, room for any attribute's type.
        let written = unsafe { write_attribute((CTX, 0), attr, p, ptr, (&raw mut v).cast()) }?;
        Ok(written.then_some(v))
    }

    #[test]
    fn device_pointers_are_device_memory_of_their_allocation() {
        let m = memory();
        let ptr = ALLOCATION + 0x100;
        let p = pointee(&m, ptr);
        assert!(matches!(
            p,
            Pointee::Device {
                base: ALLOCATION,
                ..
            }
        ));
        assert_eq!(
            read(&p, ptr, ptr_attr::MEMORY_TYPE).map(|v| v.map(|v| v as c_uint)),
            Ok(Some(memory_type::DEVICE))
        );
        assert_eq!(read(&p, ptr, ptr_attr::CONTEXT), Ok(Some(CTX as u64)));
        assert_eq!(read(&p, ptr, ptr_attr::DEVICE_POINTER), Ok(Some(ptr)));
        assert_eq!(
            read(&p, ptr, ptr_attr::RANGE_START_ADDR),
            Ok(Some(ALLOCATION))
        );
        assert_eq!(read(&p, ptr, ptr_attr::RANGE_SIZE), Ok(Some(8192)));
        assert_eq!(
            read(&p, ptr, ptr_attr::HOST_POINTER),
            Err(result::INVALID_VALUE),
            "device memory has no host address"
        );
    }

    #[test]
    fn shared_host_pointers_map_to_the_device_address_at_the_same_offset() {
        let m = memory();
        let ptr = (HOST + 0x10) as u64;
        let p = pointee(&m, ptr);
        assert!(matches!(p, Pointee::Host { base: HOST, .. }));
        assert_eq!(
            read(&p, ptr, ptr_attr::MEMORY_TYPE).map(|v| v.map(|v| v as c_uint)),
            Ok(Some(memory_type::HOST))
        );
        assert_eq!(
            read(&p, ptr, ptr_attr::DEVICE_POINTER),
            Ok(Some(HOST_DEVICE_PTR + 0x10))
        );
        assert_eq!(read(&p, ptr, ptr_attr::HOST_POINTER), Ok(Some(ptr)));
        assert_eq!(read(&p, ptr, ptr_attr::RANGE_SIZE), Ok(Some(4096)));
        assert_eq!(
            read(&p, ptr, ptr_attr::BUFFER_ID),
            Ok(None),
            "only device allocations have one"
        );
    }

    #[test]
    fn unknown_pointers_have_no_attributes() {
        let m = memory();
        let ptr = (HOST + 4096) as u64;
        let p = pointee(&m, ptr);
        assert!(matches!(p, Pointee::Unknown), "just past the host region");
        assert_eq!(read(&p, ptr, ptr_attr::MEMORY_TYPE), Ok(None));
        assert_eq!(
            read(&p, ptr, ptr_attr::P2P_TOKENS),
            Err(result::NOT_SUPPORTED)
        );
    }
}

//! Memory: device allocations the broker makes (against the user's quota) and page-locked
//! host memory shared with the broker, with what pointer queries need to know of both.
//!
//! Device addresses are the broker's; the process reserves each allocation's address range
//! (no access) in its own address space, so that no host mapping can ever land on a device
//! address and a pointer query can tell host from device memory, as with CUDA's unified
//! addressing. Page-locked host memory is a sealed memfd mapped here and in the broker, which
//! registers it with the device: copies to and from it are DMA.

mod attributes;
mod device;
pub(crate) mod host;
pub mod ipc;
pub(crate) mod pinned;
pub mod pools;
pub mod pools_api;
mod shared_file;
pub mod vmm;
pub mod vmm_api;

pub mod api;

use std::collections::BTreeMap;
use std::sync::RwLock;

/// What kind of device range an address is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceKind {
    /// An allocation the program made (`cuMemAlloc`).
    Allocation,
    /// A module's global variable.
    Global,
    /// Physical memory the program mapped (`cuMemMap`); one follows another in a
    /// reservation, and copies may run across them.
    Mapped,
    /// Another process's allocation, opened through CUDA IPC.
    Ipc,
}

#[derive(Debug, Clone, Copy)]
pub struct DeviceRange {
    pub bytes: u64,
    pub kind: DeviceKind,
    /// Whether this process reserved the range in its own address space.
    reserved: bool,
    /// A number unique to the allocation (`CU_POINTER_ATTRIBUTE_BUFFER_ID`).
    pub buffer_id: u64,
}

/// A page-locked host range shared with the broker.
#[derive(Debug, Clone, Copy)]
pub struct HostRegion {
    pub len: usize,
    pub region: u32,
    pub device_ptr: u64,
    pub flags: u32,
    pub pages: Pages,
}

/// Whose pages a shared host region holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pages {
    /// Ours: `cuMemHostAlloc`'s memfd.
    Allocated,
    /// The program's anonymous pages, moved into a memfd of ours by `cuMemHostRegister`.
    Moved,
    /// The program's shared mapping of a tmpfs file, shared as it is by `cuMemHostRegister`.
    Mapped,
}

/// Where a host pointer lies: in a shared region (`region`, offset), or in pageable memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostPlace {
    Shared { region: u32, offset: u64 },
    Pageable,
}

#[derive(Default)]
pub struct Memory {
    device: RwLock<BTreeMap<u64, DeviceRange>>,
    host: RwLock<BTreeMap<usize, HostRegion>>,
    next_buffer_id: std::sync::atomic::AtomicU64,
    /// The virtual memory API's handles, reservations and mappings.
    vmm: std::sync::Mutex<vmm::Vmm>,
}

const PAGE: usize = 4096;

impl Memory {
    /// The page-locked host ranges by address, read-locked (a fork holds this across).
    pub(crate) fn host_table(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<usize, HostRegion>> {
        self.host.read().unwrap_or_else(|p| p.into_inner())
    }

    /// The device range `[ptr, ptr + len)` lies in, and its base.
    pub fn device_range(&self, ptr: u64, len: u64) -> Option<(u64, DeviceRange)> {
        let map = self.device.read().unwrap_or_else(|p| p.into_inner());
        let (&base, &range) = map.range(..=ptr).next_back()?;
        let end = ptr.checked_add(len)?;
        (end <= base.saturating_add(range.bytes) && ptr < base.saturating_add(range.bytes.max(1)))
            .then_some((base, range))
    }

    fn add_device(&self, ptr: u64, bytes: u64, kind: DeviceKind, reserved: bool) {
        let buffer_id = self
            .next_buffer_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1;
        self.device
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                ptr,
                DeviceRange {
                    bytes,
                    kind,
                    reserved,
                    buffer_id,
                },
            );
    }

    fn remove_device(&self, ptr: u64) -> Option<DeviceRange> {
        self.device
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&ptr)
    }

    /// Where host memory at `ptr` (for `len` bytes) lies.
    pub fn host_place(&self, ptr: usize, len: usize) -> HostPlace {
        let map = self.host.read().unwrap_or_else(|p| p.into_inner());
        match map.range(..=ptr).next_back() {
            Some((&base, r)) if ptr.checked_add(len).is_some_and(|end| end <= base + r.len) => {
                HostPlace::Shared {
                    region: r.region,
                    offset: (ptr - base) as u64,
                }
            }
            _ => HostPlace::Pageable,
        }
    }

    pub(crate) fn host_region_at(&self, ptr: usize) -> Option<(usize, HostRegion)> {
        let map = self.host.read().unwrap_or_else(|p| p.into_inner());
        let (&base, &r) = map.range(..=ptr).next_back()?;
        (ptr < base + r.len).then_some((base, r))
    }

    /// Where device code reaches `[ptr, ptr + len)` of page-locked host memory, named by its
    /// host address or by the device address it has (`cuMemHostGetDevicePointer`).
    pub fn host_device_range(&self, ptr: u64, len: u64) -> Option<u64> {
        let end = ptr.checked_add(len)?;
        if let Some((base, r)) = self.host_region_at(ptr as usize)
            && end <= base as u64 + r.len as u64
        {
            return Some(r.device_ptr + (ptr - base as u64));
        }
        let map = self.host.read().unwrap_or_else(|p| p.into_inner());
        map.values()
            .any(|r| ptr >= r.device_ptr && end <= r.device_ptr + r.len as u64)
            .then_some(ptr)
    }

    /// What lies at or below `ptr`, in words (for tracing a refused pointer).
    pub fn describe(&self, ptr: u64) -> String {
        let below = {
            let map = self.device.read().unwrap_or_else(|p| p.into_inner());
            map.range(..=ptr).next_back().map(|(&b, r)| {
                format!(
                    "the device range below is {:?} of {} bytes at {b:#x}",
                    r.kind, r.bytes
                )
            })
        };
        let host = self
            .host_region_at(ptr as usize)
            .map(|(b, r)| format!("; page-locked host memory of {} bytes at {b:#x}", r.len));
        below.unwrap_or_else(|| "no device range below it".into()) + &host.unwrap_or_default()
    }

    /// Bytes of device memory the program holds.
    pub fn allocated(&self) -> u64 {
        self.device
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .filter(|r| r.kind == DeviceKind::Allocation)
            .map(|r| r.bytes)
            .sum()
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_ranges_are_found_by_any_address_inside() {
        let m = Memory::default();
        m.add_device(0x1000_0000, 4096, DeviceKind::Allocation, false);
        m.add_device(0x2000_0000, 64, DeviceKind::Global, false);
        assert_eq!(
            m.device_range(0x1000_0000, 4096).map(|r| r.0),
            Some(0x1000_0000)
        );
        assert_eq!(
            m.device_range(0x1000_0fff, 1).map(|r| r.0),
            Some(0x1000_0000)
        );
        assert!(
            m.device_range(0x1000_0fff, 2).is_none(),
            "runs past the end"
        );
        assert!(m.device_range(0x1000_1000, 0).is_none());
        assert!(m.device_range(0x0fff_ffff, 1).is_none());
        assert_eq!(
            m.allocated(),
            4096,
            "globals are not the program's allocations"
        );
        assert!(m.remove_device(0x1000_0000).is_some());
        assert!(m.device_range(0x1000_0000, 1).is_none());
    }

    #[test]
    fn host_places_are_shared_only_inside_a_region() {
        let m = Memory::default();
        m.host.write().expect("lock").insert(
            0x7f00_0000_0000,
            HostRegion {
                len: 8192,
                region: 3,
                device_ptr: 0x7f00_0000_0000,
                flags: 0,
                pages: Pages::Allocated,
            },
        );
        assert_eq!(
            m.host_place(0x7f00_0000_1000, 4096),
            HostPlace::Shared {
                region: 3,
                offset: 4096
            }
        );
        assert_eq!(m.host_place(0x7f00_0000_1000, 4097), HostPlace::Pageable);
        assert_eq!(m.host_place(0x1234, 1), HostPlace::Pageable);
    }
}

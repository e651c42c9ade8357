//! The virtual memory API's bookkeeping in the process: physical-memory handles (their size,
//! the properties they were made with, the program's references), the address space it
//! reserved (kept inaccessible here, as allocations are) and what it mapped where, with the
//! access it set. The broker holds the memory and checks everything again.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use std::os::fd::IntoRawFd;

use gpushare_protocol::Command;
use gpushare_protocol::control::{BrokerMessage, ClientMessage};

use super::device::{PLACEMENT_TRIES, reserve_range, unreserve_range};
use super::{DeviceKind, Memory};
use crate::driver::Driver;
use crate::log::say_once;
use crate::status::{Cu, from_code, from_error};
use crate::types::result;

/// `CUmemAllocationProp`, as the header lays it out (32 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct AllocationProp {
    pub kind: u32,
    pub handle_types: u32,
    pub location: Location,
    pub win32_metadata: usize,
    pub compression: u8,
    pub rdma: u8,
    pub usage: u16,
    pub reserved: [u8; 4],
}

impl AllocationProp {
    /// Pinned memory of this process's device, shareable as a POSIX descriptor.
    pub fn shareable_on_device() -> AllocationProp {
        AllocationProp {
            kind: ALLOCATION_PINNED,
            handle_types: HANDLE_POSIX_FD,
            location: Location {
                kind: LOCATION_DEVICE,
                id: crate::device::bound(),
            },
            ..AllocationProp::default()
        }
    }
}

/// `CUmemLocation`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Location {
    pub kind: u32,
    pub id: i32,
}

/// `CUmemAccessDesc`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct AccessDesc {
    pub location: Location,
    pub flags: u32,
}

/// `CU_MEM_ALLOCATION_TYPE_PINNED`.
pub const ALLOCATION_PINNED: u32 = 1;
/// `CU_MEM_LOCATION_TYPE_DEVICE`.
pub const LOCATION_DEVICE: u32 = 1;
/// `CU_MEM_LOCATION_TYPE_HOST`, `_HOST_NUMA`, `_HOST_NUMA_CURRENT`.
pub const LOCATION_HOST: u32 = 2;
pub const LOCATION_HOST_NUMA: u32 = 3;
pub const LOCATION_HOST_NUMA_CURRENT: u32 = 4;
/// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`.
pub const HANDLE_POSIX_FD: u32 = 1;
/// `CU_MEM_ACCESS_FLAGS_PROT_READWRITE`; `_READ` is 1, `_NONE` 0.
pub const ACCESS_READWRITE: u32 = 3;

#[derive(Debug)]
struct Handle {
    size: u64,
    prop: AllocationProp,
    /// The program's references: one from `cuMemCreate`, one per retain.
    refs: u32,
    mappings: u32,
}

#[derive(Debug, Clone, Copy)]
struct Mapping {
    size: u64,
    handle: u64,
    /// `CUmemAccess_flags` the program set for the device.
    access: u32,
}

#[derive(Debug, Default)]
pub struct Vmm {
    handles: HashMap<u64, Handle>,
    reserved: BTreeMap<u64, u64>,
    mapped: BTreeMap<u64, Mapping>,
}

impl Vmm {
    /// The mapping holding `ptr`, and its address.
    fn mapping_at(&self, ptr: u64) -> Option<(u64, Mapping)> {
        let (&at, &m) = self.mapped.range(..=ptr).next_back()?;
        (ptr < at + m.size).then_some((at, m))
    }

    /// The mappings that make up exactly `[ptr, ptr + size)`, or `None`.
    fn whole_mappings(&self, ptr: u64, size: u64) -> Option<Vec<u64>> {
        let end = ptr.checked_add(size).filter(|_| size > 0)?;
        let mut next = ptr;
        let mut found = Vec::new();
        for (&at, m) in self.mapped.range(ptr..end) {
            if at != next {
                return None;
            }
            found.push(at);
            next = at + m.size;
        }
        (next == end).then_some(found)
    }

    /// Whether `[ptr, ptr + size)` lies in one reservation.
    fn in_reservation(&self, ptr: u64, size: u64) -> bool {
        self.reserved
            .range(..=ptr)
            .next_back()
            .is_some_and(|(&at, &len)| ptr.checked_add(size).is_some_and(|e| e <= at + len))
    }
}

/// Checks what `cuMemCreate` may be asked for here: pinned device memory on device `dev` (the
/// driver's).
fn check_prop(prop: &AllocationProp, dev: i32) -> Cu<()> {
    if prop.kind != ALLOCATION_PINNED || prop.location.kind != LOCATION_DEVICE {
        say_once(
            "the virtual memory API serves pinned device memory only (no managed or host memory)",
        );
        return Err(result::NOT_SUPPORTED);
    }
    if prop.location.id != dev {
        return Err(result::INVALID_DEVICE);
    }
    posix_handles_only(prop.handle_types & !HANDLE_POSIX_FD == 0)
}

/// Memory is shared as POSIX descriptors only: refuses any other kind (`posix` false),
/// saying so once.
pub fn posix_handles_only(posix: bool) -> Cu<()> {
    if !posix {
        say_once("memory handles can be shared as POSIX file descriptors only");
        return Err(result::NOT_SUPPORTED);
    }
    Ok(())
}

fn lock(m: &Mutex<Vmm>) -> std::sync::MutexGuard<'_, Vmm> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Memory {
    /// Whether `[ptr, ptr + len)` is device memory: inside one range, or across mappings
    /// that follow one another.
    pub fn device_span(&self, ptr: u64, len: u64) -> bool {
        if self.device_range(ptr, len).is_some() {
            return true;
        }
        let Some(end) = ptr.checked_add(len) else {
            return false;
        };
        let map = self.device.read().unwrap_or_else(|p| p.into_inner());
        let mut at = ptr;
        loop {
            let Some((&base, r)) = map.range(..=at).next_back() else {
                return false;
            };
            let reach = base.saturating_add(r.bytes);
            if r.kind != DeviceKind::Mapped || at >= reach {
                return false;
            }
            if reach >= end {
                return true;
            }
            at = reach;
        }
    }
}

impl Driver {
    /// The granule of physical memory and reserved address space. Asked for pinned host
    /// memory, the same (NCCL asks first, then tries `cuMemCreate`, and uses `/dev/shm` files
    /// when that is refused; a refused question would stop it instead).
    pub fn vmm_granularity(&self, prop: &AllocationProp) -> Cu<u64> {
        let host = matches!(
            prop.location.kind,
            LOCATION_HOST | LOCATION_HOST_NUMA | LOCATION_HOST_NUMA_CURRENT
        );
        if !(host && prop.kind == ALLOCATION_PINNED) {
            check_prop(prop, self.device)?;
        }
        match self.memory_granularity {
            0 => {
                say_once("this device offers no memory for the virtual memory API");
                Err(result::NOT_SUPPORTED)
            }
            g => Ok(g),
        }
    }

    pub fn vmm_reserve(&self, size: u64, align: u64, hint: u64) -> Cu<u64> {
        if size == 0 || (align != 0 && !align.is_power_of_two()) {
            return Err(result::INVALID_VALUE);
        }
        let mut colliding = Vec::new();
        let outcome = (|| {
            for _ in 0..PLACEMENT_TRIES {
                let (at, _) = self
                    .transport
                    .call(Command::MemReserve { size, align, hint })?;
                if reserve_range(at, size) {
                    lock(&self.memory.vmm).reserved.insert(at, size);
                    return Ok(at);
                }
                colliding.push(at);
            }
            say_once(
                "device addresses collide with this process's own memory; reservation refused",
            );
            Err(result::OUT_OF_MEMORY)
        })();
        for at in colliding {
            let _ = self.transport.post(Command::MemUnreserve { ptr: at, size });
        }
        outcome
    }

    pub fn vmm_unreserve(&self, ptr: u64, size: u64) -> Cu<()> {
        {
            let v = lock(&self.memory.vmm);
            if v.reserved.get(&ptr) != Some(&size) {
                return Err(result::INVALID_VALUE);
            }
        }
        self.transport.call(Command::MemUnreserve { ptr, size })?;
        lock(&self.memory.vmm).reserved.remove(&ptr);
        unreserve_range(ptr, size);
        Ok(())
    }

    pub fn vmm_create(&self, size: u64, prop: &AllocationProp) -> Cu<u64> {
        check_prop(prop, self.device)?;
        let g = self.vmm_granularity(prop)?;
        if size == 0 || !size.is_multiple_of(g) {
            return Err(result::INVALID_VALUE);
        }
        let (handle, _) = self.transport.call(Command::MemCreate { size })?;
        lock(&self.memory.vmm).handles.insert(
            handle,
            Handle {
                size,
                prop: *prop,
                refs: 1,
                mappings: 0,
            },
        );
        Ok(handle)
    }

    pub fn vmm_release(&self, handle: u64) -> Cu<()> {
        let mut v = lock(&self.memory.vmm);
        let h = v.handles.get_mut(&handle).ok_or(result::INVALID_VALUE)?;
        if h.refs == 0 {
            return Err(result::INVALID_VALUE);
        }
        h.refs -= 1;
        self.settle(&mut v, handle)
    }

    /// Lets the broker go of `handle` once the program holds no reference and no mapping.
    fn settle(&self, v: &mut Vmm, handle: u64) -> Cu<()> {
        if v.handles
            .get(&handle)
            .is_some_and(|h| h.refs == 0 && h.mappings == 0)
        {
            v.handles.remove(&handle);
            self.transport.post(Command::MemRelease { handle })?;
        }
        Ok(())
    }

    pub fn vmm_map(&self, ptr: u64, size: u64, offset: u64, handle: u64) -> Cu<()> {
        // CUDA itself requires 0.
        if offset != 0 {
            return Err(result::INVALID_VALUE);
        }
        {
            let v = lock(&self.memory.vmm);
            let h = v.handles.get(&handle).ok_or(result::INVALID_VALUE)?;
            if h.refs == 0 || size == 0 || size > h.size || !v.in_reservation(ptr, size) {
                return Err(result::INVALID_VALUE);
            }
        }
        self.transport.call(Command::MemMap { ptr, size, handle })?;
        let mut v = lock(&self.memory.vmm);
        v.mapped.insert(
            ptr,
            Mapping {
                size,
                handle,
                access: 0,
            },
        );
        if let Some(h) = v.handles.get_mut(&handle) {
            h.mappings += 1;
        }
        self.memory.add_device(ptr, size, DeviceKind::Mapped, false);
        Ok(())
    }

    pub fn vmm_unmap(&self, ptr: u64, size: u64) -> Cu<()> {
        let mut v = lock(&self.memory.vmm);
        let whole = v.whole_mappings(ptr, size).ok_or(result::INVALID_VALUE)?;
        self.transport.call(Command::MemUnmap { ptr, size })?;
        for at in whole {
            if let Some(m) = v.mapped.remove(&at) {
                self.memory.remove_device(at);
                if let Some(h) = v.handles.get_mut(&m.handle) {
                    h.mappings = h.mappings.saturating_sub(1);
                }
                self.settle(&mut v, m.handle)?;
            }
        }
        Ok(())
    }

    /// Sets the device's access to whole mappings; the broker maps memory readable and
    /// writable, so this only records what the program asked (for `cuMemGetAccess`).
    pub fn vmm_set_access(&self, ptr: u64, size: u64, descs: &[AccessDesc]) -> Cu<()> {
        let mut flags = None;
        for d in descs {
            if d.location.kind != LOCATION_DEVICE {
                say_once("cuMemSetAccess: only the device's access can be set");
                return Err(result::NOT_SUPPORTED);
            }
            if !matches!(d.flags, 0 | 1 | ACCESS_READWRITE) {
                return Err(result::INVALID_VALUE);
            }
            if d.location.id != self.device {
                // Another GPU of the job's (NCCL gives every peer access as it allocates):
                // its process maps the memory with its own access when it imports it.
                self.reached_by(d.location.id)?;
                continue;
            }
            flags = Some(d.flags);
        }
        let mut v = lock(&self.memory.vmm);
        let whole = v.whole_mappings(ptr, size).ok_or(result::INVALID_VALUE)?;
        if let Some(f) = flags {
            for at in whole {
                if let Some(m) = v.mapped.get_mut(&at) {
                    m.access = f;
                }
            }
        }
        Ok(())
    }

    pub fn vmm_access(&self, location: &Location, ptr: u64) -> Cu<u32> {
        if location.kind != LOCATION_DEVICE {
            return Err(result::INVALID_DEVICE);
        }
        if location.id != self.device {
            self.reached_by(location.id)?;
        }
        let v = lock(&self.memory.vmm);
        v.mapping_at(ptr)
            .map(|(_, m)| m.access)
            .ok_or(result::INVALID_VALUE)
    }

    /// Whether device `dev`, another the program sees, reaches this process's device's memory.
    fn reached_by(&self, dev: i32) -> Cu<()> {
        if self.gpus.reaches(dev, self.device) {
            Ok(())
        } else {
            Err(result::INVALID_DEVICE)
        }
    }

    /// Whether `[ptr, ptr + size)` lies in one of this session's reservations.
    pub fn holds_reservation(&self, ptr: u64, size: u64) -> bool {
        lock(&self.memory.vmm).in_reservation(ptr, size)
    }

    /// The handle mapped at `ptr`, with one more reference the program must release.
    pub fn vmm_retain(&self, ptr: u64) -> Cu<u64> {
        let mut v = lock(&self.memory.vmm);
        let (_, m) = v.mapping_at(ptr).ok_or(result::INVALID_VALUE)?;
        let h = v.handles.get_mut(&m.handle).ok_or(result::INVALID_VALUE)?;
        h.refs += 1;
        Ok(m.handle)
    }

    /// A descriptor another process can take this memory by (the program owns it).
    pub fn vmm_export(&self, handle: u64) -> Cu<i32> {
        {
            let v = lock(&self.memory.vmm);
            let h = v.handles.get(&handle).ok_or(result::INVALID_VALUE)?;
            // CUDA exports only the kinds of handle asked for at creation.
            if h.prop.handle_types & HANDLE_POSIX_FD == 0 {
                return Err(result::INVALID_VALUE);
            }
        }
        self.vmm_descriptor(handle)
    }

    /// A descriptor of the memory of `handle` (one the program holds), whatever kinds of
    /// handle it was made for: how another device's session of this process takes it.
    pub fn vmm_descriptor(&self, handle: u64) -> Cu<i32> {
        if lock(&self.memory.vmm)
            .handles
            .get(&handle)
            .is_none_or(|h| h.refs == 0)
        {
            return Err(result::INVALID_VALUE);
        }
        let (reply, fds) = self
            .transport
            .session
            .request_fds(
                |request| ClientMessage::ExportMemory { request, handle },
                &[],
            )
            .map_err(|e| from_error(&e))?;
        match reply {
            BrokerMessage::MemoryExported { result: Ok(()), .. } => fds
                .into_iter()
                .next()
                .map(IntoRawFd::into_raw_fd)
                .ok_or(result::UNKNOWN),
            BrokerMessage::MemoryExported { result: Err(w), .. } => Err(from_code(w.code)),
            _ => Err(result::UNKNOWN),
        }
    }

    /// The handle of memory another process exported (`fd`, which stays the program's).
    pub fn vmm_import(&self, fd: i32) -> Cu<u64> {
        if fd < 0 {
            return Err(result::INVALID_VALUE);
        }
        let reply = self
            .transport
            .session
            .request(|request| ClientMessage::ImportMemory { request }, &[fd])
            .map_err(|e| from_error(&e))?;
        let (handle, size) = match reply {
            BrokerMessage::MemoryImported {
                result: Ok(got), ..
            } => got,
            BrokerMessage::MemoryImported { result: Err(w), .. } => {
                return Err(match w.code {
                    // Not a descriptor of exported memory, or memory another user may not take.
                    gpushare_protocol::ErrorCode::PermissionDenied => result::NOT_PERMITTED,
                    code => from_code(code),
                });
            }
            _ => return Err(result::UNKNOWN),
        };
        let prop = AllocationProp::shareable_on_device();
        lock(&self.memory.vmm).handles.insert(
            handle,
            Handle {
                size,
                prop,
                refs: 1,
                mappings: 0,
            },
        );
        Ok(handle)
    }

    pub fn vmm_properties(&self, handle: u64) -> Cu<AllocationProp> {
        let v = lock(&self.memory.vmm);
        match v.handles.get(&handle) {
            Some(h) if h.refs > 0 || h.mappings > 0 => Ok(h.prop),
            _ => Err(result::INVALID_VALUE),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapping(size: u64) -> Mapping {
        Mapping {
            size,
            handle: 1,
            access: 0,
        }
    }

    #[test]
    fn only_whole_adjacent_mappings_make_up_a_range() {
        let mut v = Vmm::default();
        v.mapped.insert(0x10_0000, mapping(0x1000));
        v.mapped.insert(0x10_1000, mapping(0x1000));
        v.mapped.insert(0x10_3000, mapping(0x1000));
        assert_eq!(
            v.whole_mappings(0x10_0000, 0x2000),
            Some(vec![0x10_0000, 0x10_1000])
        );
        assert_eq!(v.whole_mappings(0x10_0000, 0x1000), Some(vec![0x10_0000]));
        assert_eq!(v.whole_mappings(0x10_0000, 0x1800), None, "half a mapping");
        assert_eq!(v.whole_mappings(0x10_0800, 0x800), None, "from inside one");
        assert_eq!(v.whole_mappings(0x10_1000, 0x3000), None, "across a gap");
        assert_eq!(v.whole_mappings(0x10_0000, 0), None);
        assert_eq!(v.mapping_at(0x10_1fff).map(|(a, _)| a), Some(0x10_1000));
        assert_eq!(v.mapping_at(0x10_2000).map(|(a, _)| a), None);
    }

    #[test]
    fn a_range_spanning_adjacent_mappings_is_device_memory() {
        let m = Memory::default();
        m.add_device(0x20_0000, 0x1000, DeviceKind::Mapped, false);
        m.add_device(0x20_1000, 0x1000, DeviceKind::Mapped, false);
        m.add_device(0x20_3000, 0x1000, DeviceKind::Mapped, false);
        assert!(m.device_span(0x20_0800, 0x1000), "across two");
        assert!(!m.device_span(0x20_1800, 0x2000), "into the gap");
        assert!(!m.device_span(0x1f_ffff, 2), "from below");
        m.add_device(0x30_0000, 0x1000, DeviceKind::Allocation, false);
        m.add_device(0x30_1000, 0x1000, DeviceKind::Allocation, false);
        assert!(
            !m.device_span(0x30_0800, 0x1000),
            "allocations never join: a copy across two is refused"
        );
    }

    #[test]
    fn properties_outside_pinned_device_memory_are_refused() {
        let ok = AllocationProp::shareable_on_device();
        assert_eq!(check_prop(&ok, 0), Ok(()));
        assert_eq!(
            check_prop(&AllocationProp { kind: 2, ..ok }, 0),
            Err(result::NOT_SUPPORTED)
        );
        let other = Location {
            kind: LOCATION_DEVICE,
            id: 1,
        };
        assert_eq!(
            check_prop(
                &AllocationProp {
                    location: other,
                    ..ok
                },
                0
            ),
            Err(result::INVALID_DEVICE)
        );
        assert_eq!(
            check_prop(
                &AllocationProp {
                    handle_types: 8,
                    ..ok
                },
                0
            ),
            Err(result::NOT_SUPPORTED),
            "fabric handles"
        );
        assert_eq!(std::mem::size_of::<AllocationProp>(), 32);
        assert_eq!(std::mem::size_of::<AccessDesc>(), 12);
    }
}

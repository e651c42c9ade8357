//! Memory placed at a device address asked for, through the driver's virtual memory
//! management (`cuMemAddressReserve` with the address as hint, `cuMemCreate`, `cuMemMap`,
//! `cuMemSetAccess`): what a client rebuilding its state after a restart asks for, so that
//! the raw device addresses its kernels' parameters hold stay valid.
//!
//! Physical memory comes in granules (2 MiB on an H100) and address space in reservations of
//! [`VA_BLOCK`]s; a granule or a reservation that several placed allocations touch (small
//! buffers that `cuMemAlloc` had packed into one 2 MiB page) is shared and counted, and goes
//! back to the driver when the last allocation touching it is freed.

use std::collections::BTreeMap;

use cudarc::driver::sys;
use gpushare_protocol::DevicePtr;

use super::error::check;
use crate::device::{DeviceError, DeviceResult};

/// Address space is reserved in blocks of this size and alignment: `cuMemAddressReserve`
/// honours its address hint only for a reservation of at least 32 MiB that starts on a 32 MiB
/// boundary; a smaller one lands wherever the driver likes.
const VA_BLOCK: u64 = 32 << 20;

/// One `cuMemAddressReserve`d range.
struct Reservation {
    size: u64,
    /// Placed allocations that lie (partly) in it.
    users: u32,
}

/// One `cuMemCreate`d and mapped run of granules.
struct Chunk {
    size: u64,
    handle: sys::CUmemGenericAllocationHandle,
    users: u32,
}

/// The placed allocations of one GPU, and the reservations and physical chunks under them.
/// Every method expects the GPU's context to be current on the calling thread.
#[derive(Default)]
pub struct PlacedMemory {
    /// Physical allocation granularity, bytes; 0 until first asked.
    granularity: u64,
    reservations: BTreeMap<u64, Reservation>,
    chunks: BTreeMap<u64, Chunk>,
    /// Base → bytes of every placed allocation.
    allocations: BTreeMap<DevicePtr, u64>,
}

/// `[base, end)` of every entry of `map` that overlaps `[lo, hi)` (entries are disjoint).
fn overlapping<V>(
    map: &BTreeMap<u64, V>,
    size: impl Fn(&V) -> u64,
    lo: u64,
    hi: u64,
) -> Vec<(u64, u64)> {
    let before = map
        .range(..lo)
        .next_back()
        .map(|(&b, v)| (b, b + size(v)))
        .filter(|&(_, end)| end > lo);
    before
        .into_iter()
        .chain(map.range(lo..hi).map(|(&b, v)| (b, b + size(v))))
        .collect()
}

/// The parts of `[lo, hi)` that no entry of `map` covers.
fn gaps<V>(map: &BTreeMap<u64, V>, size: impl Fn(&V) -> u64, lo: u64, hi: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut at = lo;
    for (base, end) in overlapping(map, size, lo, hi) {
        if base > at {
            out.push((at, base));
        }
        at = at.max(end);
    }
    if at < hi {
        out.push((at, hi));
    }
    out
}

fn unavailable(ptr: DevicePtr, bytes: u64, why: impl std::fmt::Display) -> DeviceError {
    DeviceError::AddressUnavailable(format!("{bytes} bytes at {ptr:#x}: {why}"))
}

/// `[down(lo), up(hi))` on a multiple of `align` (a power of two), or None on overflow.
fn widen(lo: u64, hi: u64, align: u64) -> Option<(u64, u64)> {
    let up = hi.checked_add(align - 1)? & !(align - 1);
    Some((lo & !(align - 1), up))
}

fn location(ordinal: i32) -> sys::CUmemLocation {
    sys::CUmemLocation {
        type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
        id: ordinal,
    }
}

fn properties(ordinal: i32) -> sys::CUmemAllocationProp {
    sys::CUmemAllocationProp {
        type_: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
        location: location(ordinal),
        win32HandleMetaData: std::ptr::null_mut(),
        allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 {
            compressionType: 0,
            gpuDirectRDMACapable: 0,
            usage: 0,
            reserved: [0; 4],
        },
    }
}

impl PlacedMemory {
    fn granularity(&mut self, ordinal: i32) -> DeviceResult<u64> {
        if self.granularity == 0 {
            let prop = properties(ordinal);
            let mut g = 0usize;
            // SAFETY: `g` and `prop` are live locals; the call only writes `g`.
            check("cuMemGetAllocationGranularity", unsafe {
                sys::cuMemGetAllocationGranularity(
                    &mut g,
                    &prop,
                    sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
                )
            })?;
            if g == 0 || !g.is_power_of_two() {
                return Err(DeviceError::Failed(format!(
                    "the driver reports an allocation granularity of {g} bytes"
                )));
            }
            self.granularity = g as u64;
        }
        Ok(self.granularity)
    }

    /// Places `bytes` at exactly `ptr` on GPU `ordinal`, or fails with
    /// [`DeviceError::AddressUnavailable`] (the range overlaps memory in use, or the driver
    /// would put it elsewhere). Returns the physical memory it took: the granules it had to
    /// create (none where it shares granules with placed memory already there), at least
    /// `bytes`.
    pub fn alloc_at(&mut self, ordinal: i32, ptr: DevicePtr, bytes: u64) -> DeviceResult<u64> {
        let size = bytes.max(1);
        let end = ptr
            .checked_add(size)
            .filter(|_| ptr != 0)
            .ok_or_else(|| unavailable(ptr, size, "not a valid device range"))?;
        if let Some((&base, &len)) = self.allocations.range(..end).next_back()
            && base + len > ptr
        {
            return Err(unavailable(
                ptr,
                size,
                format!("overlaps the allocation at {base:#x}"),
            ));
        }
        let granule = self.granularity(ordinal)?;
        let too_high = || unavailable(ptr, size, "too close to the top of the address space");
        let (vlo, vhi) = widen(ptr, end, VA_BLOCK.max(granule)).ok_or_else(too_high)?;
        let (plo, phi) = widen(ptr, end, granule).ok_or_else(too_high)?;

        let mut reserved = Vec::new();
        let mut mapped = Vec::new();
        let made =
            self.reserve_and_map(ordinal, (vlo, vhi), (plo, phi), &mut reserved, &mut mapped);
        if let Err(e) = made {
            for base in mapped {
                self.release_chunk(base);
            }
            for base in reserved {
                self.release_reservation(base);
            }
            return Err(match e {
                DeviceError::AddressUnavailable(why) => unavailable(ptr, size, why),
                other => other,
            });
        }
        for (base, _) in overlapping(&self.reservations, |r| r.size, vlo, vhi) {
            if let Some(r) = self.reservations.get_mut(&base) {
                r.users += 1;
            }
        }
        for (base, _) in overlapping(&self.chunks, |c| c.size, plo, phi) {
            if let Some(c) = self.chunks.get_mut(&base) {
                c.users += 1;
            }
        }
        self.allocations.insert(ptr, size);
        let created: u64 = mapped
            .iter()
            .filter_map(|base| self.chunks.get(base))
            .map(|c| c.size)
            .sum();
        Ok(created.max(size))
    }

    /// Reserves the address blocks and maps the granules of `[lo, hi)` that are not yet,
    /// noting what it made (for undoing it on failure).
    fn reserve_and_map(
        &mut self,
        ordinal: i32,
        (vlo, vhi): (u64, u64),
        (plo, phi): (u64, u64),
        reserved: &mut Vec<u64>,
        mapped: &mut Vec<u64>,
    ) -> DeviceResult<()> {
        for (lo, hi) in gaps(&self.reservations, |r| r.size, vlo, vhi) {
            let len = (hi - lo) as usize;
            let mut got: sys::CUdeviceptr = 0;
            // SAFETY: `got` is a live local the call writes; reserving address space touches
            // no memory.
            check("cuMemAddressReserve", unsafe {
                sys::cuMemAddressReserve(&mut got, len, 0, lo, 0)
            })?;
            if got != lo {
                // SAFETY: the range was just reserved by the call above.
                let _ = unsafe { sys::cuMemAddressFree(got, len) };
                return Err(DeviceError::AddressUnavailable(format!(
                    "the address range {lo:#x}..{hi:#x} is in use in this process (the driver offered {got:#x})"
                )));
            }
            self.reservations.insert(
                lo,
                Reservation {
                    size: hi - lo,
                    users: 0,
                },
            );
            reserved.push(lo);
        }
        let prop = properties(ordinal);
        let access = sys::CUmemAccessDesc {
            location: location(ordinal),
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // A chunk never spans two reservations (a mapping lies in one), so a reservation
        // whose users are gone has no chunk left in it.
        let mut pieces = Vec::new();
        for (lo, hi) in gaps(&self.chunks, |c| c.size, plo, phi) {
            for (rlo, rhi) in overlapping(&self.reservations, |r| r.size, lo, hi) {
                pieces.push((lo.max(rlo), hi.min(rhi)));
            }
        }
        for (lo, hi) in pieces {
            let len = (hi - lo) as usize;
            let mut handle: sys::CUmemGenericAllocationHandle = 0;
            // SAFETY: `handle` and `prop` are live locals; `len` is a multiple of the
            // granularity.
            check("cuMemCreate", unsafe {
                sys::cuMemCreate(&mut handle, len, &prop, 0)
            })?;
            // SAFETY: `[lo, hi)` lies in one reservation made above (or earlier) and no chunk
            // maps it yet; `handle` is the `len`-byte allocation just made.
            let mapped_now = check("cuMemMap", unsafe { sys::cuMemMap(lo, len, 0, handle, 0) })
                .and_then(|()| {
                    // SAFETY: `[lo, hi)` was just mapped; `access` is a live local.
                    check("cuMemSetAccess", unsafe {
                        sys::cuMemSetAccess(lo, len, &access, 1)
                    })
                });
            self.chunks.insert(
                lo,
                Chunk {
                    size: hi - lo,
                    handle,
                    users: 0,
                },
            );
            mapped.push(lo);
            mapped_now?;
        }
        Ok(())
    }

    /// Unmaps and releases a chunk (an unmap of a range never mapped fails harmlessly).
    fn release_chunk(&mut self, base: u64) {
        if let Some(c) = self.chunks.remove(&base) {
            // SAFETY: the chunk's range and handle are ours; nothing uses them any more (the
            // caller synchronized the context, or never handed the range out).
            unsafe {
                let _ = sys::cuMemUnmap(base, c.size as usize);
                let _ = sys::cuMemRelease(c.handle);
            }
        }
    }

    fn release_reservation(&mut self, base: u64) {
        if let Some(r) = self.reservations.remove(&base) {
            // SAFETY: reserved by us with this size; every chunk in it is unmapped already.
            let _ = unsafe { sys::cuMemAddressFree(base, r.size as usize) };
        }
    }

    /// Frees a placed allocation; `None` when `ptr` is not one (a `cuMemAlloc` pointer).
    pub fn free(&mut self, ptr: DevicePtr) -> Option<DeviceResult<()>> {
        let size = self.allocations.remove(&ptr)?;
        let end = ptr + size;
        let granule = self.granularity.max(1);
        let (Some((vlo, vhi)), Some((plo, phi))) = (
            widen(ptr, end, VA_BLOCK.max(granule)),
            widen(ptr, end, granule),
        ) else {
            return Some(Ok(()));
        };
        let mut done_chunks = Vec::new();
        for (base, _) in overlapping(&self.chunks, |c| c.size, plo, phi) {
            if let Some(c) = self.chunks.get_mut(&base) {
                c.users = c.users.saturating_sub(1);
                if c.users == 0 {
                    done_chunks.push(base);
                }
            }
        }
        if !done_chunks.is_empty() {
            // Like cuMemFree, wait for work that may still use the memory before it goes.
            // SAFETY: synchronizes the current context; touches no memory.
            let _ = unsafe { sys::cuCtxSynchronize() };
        }
        for base in done_chunks {
            self.release_chunk(base);
        }
        for (base, _) in overlapping(&self.reservations, |r| r.size, vlo, vhi) {
            let unused = self.reservations.get_mut(&base).is_some_and(|r| {
                r.users = r.users.saturating_sub(1);
                r.users == 0
            });
            if unused {
                self.release_reservation(base);
            }
        }
        Some(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_are_what_no_entry_covers() {
        let mut map = BTreeMap::new();
        map.insert(10u64, 5u64); // [10, 15)
        map.insert(20, 10); // [20, 30)
        let size = |v: &u64| *v;
        assert_eq!(gaps(&map, size, 0, 40), vec![(0, 10), (15, 20), (30, 40)]);
        assert_eq!(gaps(&map, size, 12, 22), vec![(15, 20)]);
        assert_eq!(gaps(&map, size, 20, 30), vec![]);
        assert_eq!(overlapping(&map, size, 12, 21), vec![(10, 15), (20, 30)]);
        assert_eq!(overlapping(&map, size, 15, 20), vec![]);
        assert_eq!(widen(5, 9, 4), Some((4, 12)));
        assert_eq!(widen(0, u64::MAX, 4), None);
    }
}

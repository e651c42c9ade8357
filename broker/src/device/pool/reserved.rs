//! Address space a program reserves itself (`cuMemAddressReserve`) and the physical memory it
//! maps there (`cuMemMap`): the virtual memory API. A reservation is taken out of the same
//! space as the pool's chunks, with an unmapped granule after it; each mapping is a chunk of
//! the link's, so it is in every context that serves the device, like any other memory. One
//! user may reserve a quarter of the space at most, so that others always find room.

use std::collections::BTreeMap;
use std::os::fd::BorrowedFd;

use super::{Pool, State};
use crate::device::link::Link;
use crate::device::{DeviceError, DeviceResult};

/// One reservation: whose, how big, and what is mapped in it (address → size).
#[derive(Debug)]
pub(super) struct Reservation {
    owner: u32,
    size: u64,
    mapped: BTreeMap<u64, u64>,
}

impl Reservation {
    pub(super) fn end(&self, at: u64) -> u64 {
        at + self.size
    }
}

fn invalid(why: String) -> DeviceError {
    DeviceError::InvalidArgument(why)
}

impl Pool {
    /// Reserves `size` bytes (whole granules) aligned to `align` (0: the granule), at `hint`
    /// when that is free, else anywhere.
    pub fn reserve(&self, size: u64, align: u64, hint: u64, owner: u32) -> DeviceResult<u64> {
        let g = self.granule();
        if size == 0 || !size.is_multiple_of(g) {
            return Err(invalid(format!(
                "{size} bytes is not a whole number of {g}-byte granules"
            )));
        }
        if align != 0 && !align.is_power_of_two() {
            return Err(invalid(format!("an alignment of {align} bytes")));
        }
        let align = align.max(g);
        let span = size.checked_add(g).ok_or(DeviceError::OutOfMemory)?;
        let mut st = self.lock();
        let held: u64 = st
            .reserved
            .values()
            .filter(|r| r.owner == owner)
            .map(|r| r.size)
            .sum();
        if held.saturating_add(size) > self.space.size / 4 {
            return Err(DeviceError::OutOfMemory);
        }
        let at_hint = hint != 0 && hint.is_multiple_of(align) && st.free.take_at(hint, span);
        let at = if at_hint {
            hint
        } else {
            let floor = st.floor;
            st.free
                .take(span, align, floor)
                .or_else(|| st.free.take(span, align, 0))
                .ok_or(DeviceError::OutOfMemory)?
        };
        st.reserved.insert(
            at,
            Reservation {
                owner,
                size,
                mapped: BTreeMap::new(),
            },
        );
        Ok(at)
    }

    /// Gives back the reservation at `at` of `size` bytes; nothing may be mapped in it.
    pub fn unreserve(&self, at: u64, size: u64, owner: u32) -> DeviceResult<()> {
        let mut st = self.lock();
        match st.reserved.get(&at) {
            Some(r) if r.owner == owner && r.size == size && r.mapped.is_empty() => {}
            Some(r) if r.owner == owner && r.size == size => {
                return Err(invalid(format!(
                    "{} mappings are still in the range at {at:#x}",
                    r.mapped.len()
                )));
            }
            _ => {
                return Err(invalid(format!(
                    "no reservation of {size} bytes at {at:#x}"
                )));
            }
        }
        st.reserved.remove(&at);
        let span = size + self.granule();
        st.free.give(at, span);
        Ok(())
    }

    /// Maps `size` bytes of the physical memory `fd` describes at `at`, inside one of
    /// `owner`'s reservations and over nothing mapped.
    pub fn map(
        &self,
        link: &dyn Link,
        at: u64,
        size: u64,
        fd: BorrowedFd<'_>,
        owner: u32,
    ) -> DeviceResult<()> {
        let g = self.granule();
        if size == 0 || !size.is_multiple_of(g) || !at.is_multiple_of(g) {
            return Err(invalid(format!(
                "{size} bytes at {at:#x} are not whole {g}-byte granules"
            )));
        }
        let mut st = self.lock();
        let r = reservation_holding(&mut st, at, size, owner)?;
        let end = at + size;
        let overlaps = r
            .mapped
            .range(..end)
            .next_back()
            .is_some_and(|(&a, &s)| a + s > at);
        if overlaps {
            return Err(invalid(format!(
                "{size} bytes at {at:#x} overlap memory mapped there already"
            )));
        }
        // Under the lock: the range is this reservation's until the link has it.
        link.map_chunk(at, size, fd)?;
        r.mapped.insert(at, size);
        Ok(())
    }

    /// Unmaps `[at, at + size)`, which whole mappings of one of `owner`'s reservations must
    /// make up; returns the mappings taken out (address, size).
    pub fn unmap(
        &self,
        link: &dyn Link,
        at: u64,
        size: u64,
        owner: u32,
    ) -> DeviceResult<Vec<(u64, u64)>> {
        let mut st = self.lock();
        let r = reservation_holding(&mut st, at, size.max(1), owner)?;
        let end = at.saturating_add(size);
        let mut gone = Vec::new();
        let mut next = at;
        for (&a, &s) in r.mapped.range(at..end) {
            if a != next || a + s > end {
                break;
            }
            gone.push((a, s));
            next = a + s;
        }
        if next != end || size == 0 {
            return Err(invalid(format!(
                "{size} bytes at {at:#x} are not whole mappings"
            )));
        }
        for &(a, s) in &gone {
            r.mapped.remove(&a);
            link.release_chunk(a, s);
        }
        Ok(gone)
    }
}

/// The reservation of `owner`'s that holds all of `[at, at + size)`.
fn reservation_holding(
    st: &mut State,
    at: u64,
    size: u64,
    owner: u32,
) -> DeviceResult<&mut Reservation> {
    let end = at
        .checked_add(size)
        .ok_or_else(|| invalid(format!("{size} bytes at {at:#x}")))?;
    st.reserved
        .range_mut(..=at)
        .next_back()
        .map(|(&base, r)| (base, r))
        .filter(|(base, r)| r.owner == owner && end <= r.end(*base))
        .map(|(_, r)| r)
        .ok_or_else(|| {
            invalid(format!(
                "{size} bytes at {at:#x} are not inside a reservation of this program's"
            ))
        })
}

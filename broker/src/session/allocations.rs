//! A client's live device memory, and the range check every pointer it names meets before
//! the device sees it.

use std::collections::BTreeMap;

use gpushare_protocol::{DevicePtr, ErrorCode};

/// Base pointer → size of every live allocation. Allocations never overlap, so the one that
/// could hold a pointer is the last that starts at or below it.
#[derive(Default)]
pub(super) struct Allocations {
    by_base: BTreeMap<DevicePtr, u64>,
}

impl Allocations {
    pub(super) fn len(&self) -> usize {
        self.by_base.len()
    }

    /// The size of the allocation at exactly `base`.
    pub(super) fn size_of(&self, base: DevicePtr) -> Option<u64> {
        self.by_base.get(&base).copied()
    }

    pub(super) fn insert(&mut self, base: DevicePtr, size: u64) {
        self.by_base.insert(base, size);
    }

    pub(super) fn remove(&mut self, base: DevicePtr) -> Option<u64> {
        self.by_base.remove(&base)
    }

    /// Checks that `[ptr, ptr + len)` lies inside one allocation. A zero-length range may
    /// start at an allocation's end.
    #[inline]
    pub(super) fn check_range(&self, ptr: DevicePtr, len: u64) -> Result<(), ErrorCode> {
        let (&base, &size) = self
            .by_base
            .range(..=ptr)
            .next_back()
            .ok_or(ErrorCode::InvalidPointer)?;
        let end = ptr.checked_add(len).ok_or(ErrorCode::InvalidPointer)?;
        if end > base.saturating_add(size) {
            return Err(ErrorCode::InvalidPointer);
        }
        Ok(())
    }

    /// The allocation holding `ptr` (base, size).
    pub(super) fn containing(&self, ptr: DevicePtr) -> Option<(DevicePtr, u64)> {
        let (&base, &size) = self.by_base.range(..=ptr).next_back()?;
        (ptr < base.saturating_add(size.max(1))).then_some((base, size))
    }

    /// Whether any allocation overlaps `[start, end)`.
    pub(super) fn overlaps(&self, start: DevicePtr, end: DevicePtr) -> bool {
        self.by_base
            .range(..end)
            .next_back()
            .is_some_and(|(&base, &size)| base.saturating_add(size) > start)
    }

    pub(super) fn total_bytes(&self) -> u64 {
        self.by_base.values().sum()
    }

    /// (base, size) of every allocation, lowest address first.
    pub(super) fn iter(&self) -> impl Iterator<Item = (DevicePtr, u64)> {
        self.by_base.iter().map(|(&base, &size)| (base, size))
    }

    /// Empties the table, handing over what it held.
    pub(super) fn take(&mut self) -> impl Iterator<Item = (DevicePtr, u64)> + use<> {
        std::mem::take(&mut self.by_base).into_iter()
    }

    pub(super) fn clear(&mut self) {
        self.by_base.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two allocations with a gap between them: [0x1000, 0x1100) and [0x2000, 0x2040), and
    /// one right after the second: [0x2040, 0x2080).
    fn table() -> Allocations {
        let mut a = Allocations::default();
        a.insert(0x1000, 0x100);
        a.insert(0x2000, 0x40);
        a.insert(0x2040, 0x40);
        a
    }

    #[test]
    fn ranges_inside_one_allocation_pass() {
        let a = table();
        assert_eq!(a.check_range(0x1000, 0x100), Ok(()));
        assert_eq!(a.check_range(0x1000, 1), Ok(()));
        assert_eq!(a.check_range(0x10ff, 1), Ok(()));
        assert_eq!(a.check_range(0x1080, 0x80), Ok(()));
        assert_eq!(a.check_range(0x2040, 0x40), Ok(()));
    }

    #[test]
    fn ranges_past_an_edge_fail() {
        let a = table();
        let bad = Err(ErrorCode::InvalidPointer);
        assert_eq!(a.check_range(0x1000, 0x101), bad, "one byte past the end");
        assert_eq!(a.check_range(0x10ff, 2), bad);
        assert_eq!(a.check_range(0x0fff, 1), bad, "below every allocation");
        assert_eq!(a.check_range(0x1100, 1), bad, "in the gap after one");
        assert_eq!(a.check_range(0x1f00, 0x200), bad, "from a gap into one");
        assert_eq!(a.check_range(0x2000, 0x80), bad, "across two adjacent ones");
        assert_eq!(a.check_range(0x2080, 1), bad, "past the last");
        assert_eq!(Allocations::default().check_range(0x1000, 1), bad);
    }

    #[test]
    fn a_range_that_wraps_the_address_space_fails() {
        let mut a = table();
        assert_eq!(
            a.check_range(0x1080, u64::MAX),
            Err(ErrorCode::InvalidPointer)
        );
        // The highest allocation there can be (`AllocAt` refuses one whose end overflows).
        let top = u64::MAX - 0x100;
        a.insert(top, 0x100);
        assert_eq!(a.check_range(top, 0x100), Ok(()));
        assert_eq!(a.check_range(u64::MAX - 1, 1), Ok(()));
        assert_eq!(a.check_range(top, 0x101), Err(ErrorCode::InvalidPointer));
        assert_eq!(a.check_range(u64::MAX, 2), Err(ErrorCode::InvalidPointer));
    }

    #[test]
    fn zero_length_ranges_pass_inside_and_at_the_end_only() {
        let a = table();
        assert_eq!(a.check_range(0x1000, 0), Ok(()));
        assert_eq!(a.check_range(0x1080, 0), Ok(()));
        assert_eq!(a.check_range(0x1100, 0), Ok(()), "at the end");
        assert_eq!(a.check_range(0x1101, 0), Err(ErrorCode::InvalidPointer));
        assert_eq!(a.check_range(0x0fff, 0), Err(ErrorCode::InvalidPointer));
    }

    #[test]
    fn a_freed_allocation_is_no_longer_usable() {
        let mut a = table();
        assert_eq!(a.remove(0x1000), Some(0x100));
        assert_eq!(a.remove(0x1000), None);
        assert_eq!(a.size_of(0x1000), None);
        assert_eq!(a.check_range(0x1000, 1), Err(ErrorCode::InvalidPointer));
        assert_eq!(a.check_range(0x2000, 0x40), Ok(()));
    }

    #[test]
    fn only_a_base_pointer_names_an_allocation() {
        let mut a = table();
        assert_eq!(a.size_of(0x1000), Some(0x100));
        assert_eq!(a.size_of(0x1001), None);
        assert_eq!(a.remove(0x1001), None);
        assert_eq!(a.len(), 3);
    }

    #[test]
    fn overlap_is_any_shared_byte() {
        let a = table();
        assert!(!a.overlaps(0x0f00, 0x1000), "ends where one starts");
        assert!(!a.overlaps(0x1100, 0x2000), "fills the gap exactly");
        assert!(!a.overlaps(0x2080, 0x3000), "starts where the last ends");
        assert!(a.overlaps(0x0f00, 0x1001));
        assert!(a.overlaps(0x10ff, 0x1200));
        assert!(a.overlaps(0x1010, 0x1020), "inside one");
        assert!(a.overlaps(0x0000, 0x9000), "around all");
        assert!(!Allocations::default().overlaps(0, u64::MAX));
    }

    #[test]
    fn take_hands_over_everything_and_empties_the_table() {
        let mut a = table();
        assert_eq!(a.total_bytes(), 0x180);
        let held: Vec<_> = a.take().collect();
        assert_eq!(held, vec![(0x1000, 0x100), (0x2000, 0x40), (0x2040, 0x40)]);
        assert_eq!(a.len(), 0);
        assert_eq!(a.total_bytes(), 0);
        assert_eq!(a.check_range(0x1000, 1), Err(ErrorCode::InvalidPointer));
    }
}

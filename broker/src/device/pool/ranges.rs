//! Free address ranges: first fit with alignment, merged when given back.

use std::collections::BTreeMap;

/// Free ranges, start → length, kept merged.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct Ranges(BTreeMap<u64, u64>);

impl Ranges {
    pub(super) fn with(start: u64, len: u64) -> Ranges {
        let mut r = Ranges::default();
        if len > 0 {
            r.0.insert(start, len);
        }
        r
    }

    /// Takes `len` bytes aligned to `align` at or above `floor` (first fit).
    pub(super) fn take(&mut self, len: u64, align: u64, floor: u64) -> Option<u64> {
        let (start, at) = self.0.iter().find_map(|(&s, &l)| {
            let at = s.max(floor).checked_next_multiple_of(align)?;
            (at.checked_add(len)? <= s + l).then_some((s, at))
        })?;
        self.take_exactly(start, at, len);
        Some(at)
    }

    /// Takes `[at, at + len)`, which must lie inside the free range starting at `start`.
    pub(super) fn take_exactly(&mut self, start: u64, at: u64, len: u64) {
        let Some(l) = self.0.remove(&start) else {
            return;
        };
        if at > start {
            self.0.insert(start, at - start);
        }
        let end = start + l;
        if at + len < end {
            self.0.insert(at + len, end - at - len);
        }
    }

    /// Takes `[at, at + len)` if all of it is free.
    pub(super) fn take_at(&mut self, at: u64, len: u64) -> bool {
        let Some((&start, &l)) = self.0.range(..=at).next_back() else {
            return false;
        };
        let fits = at.checked_add(len).is_some_and(|end| end <= start + l);
        if fits {
            self.take_exactly(start, at, len);
        }
        fits
    }

    pub(super) fn give(&mut self, mut at: u64, mut len: u64) {
        if let Some((&s, &l)) = self.0.range(..at).next_back()
            && s + l == at
        {
            self.0.remove(&s);
            at = s;
            len += l;
        }
        if let Some(&l) = self.0.get(&(at + len)) {
            self.0.remove(&(at + len));
            len += l;
        }
        self.0.insert(at, len);
    }

    pub(super) fn bytes(&self) -> u64 {
        self.0.values().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ranges_merge_and_fit_aligned() {
        let mut r = Ranges::with(0, 100);
        assert_eq!(r.take(10, 8, 0), Some(0));
        assert_eq!(r.take(10, 8, 0), Some(16), "aligned past the first");
        assert_eq!(r.take(10, 1, 50), Some(50), "at or above the floor");
        assert!(r.take_at(70, 10));
        assert!(!r.take_at(75, 10), "taken already");
        r.give(0, 10);
        r.give(16, 10);
        r.give(50, 10);
        r.give(70, 10);
        assert_eq!(r, Ranges::with(0, 100), "all merged back");
        assert_eq!(r.take(101, 1, 0), None);
    }
}

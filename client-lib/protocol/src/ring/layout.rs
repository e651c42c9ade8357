//! The region's geometry: where the header, the index words, the two rings' entries and the
//! arena lie (the picture in [`super`]), the entry formats, and which geometries are valid.

use serde::{Deserialize, Serialize};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// Marks a gpushare shared region ("GPUSHARE" in ASCII, little-endian).
pub const SHM_MAGIC: u64 = u64::from_le_bytes(*b"GPUSHARE");
/// Page size the layout aligns to.
pub const PAGE: usize = 4096;
const CACHE_LINE: usize = 64;

pub(super) const SQ_HEAD: usize = CACHE_LINE;
pub(super) const SQ_TAIL: usize = 2 * CACHE_LINE;
pub(super) const SQ_FLAGS: usize = 3 * CACHE_LINE;
pub(super) const CQ_HEAD: usize = 4 * CACHE_LINE;
pub(super) const CQ_TAIL: usize = 5 * CACHE_LINE;
pub(super) const CQ_FLAGS: usize = 6 * CACHE_LINE;
/// The client's sync word (u32, on a cache line of its own): once a stream synchronization
/// is known to succeed, the broker's side writes [`sync_value`] of its tag there, before its
/// completion, so that a client waiting for it may go on at once (the completion follows, and
/// is dropped). Only the broker's side writes it and never reads it; a broker that does not
/// write it leaves clients waiting for completions as before. Clients use it for
/// `StreamSync` only.
pub const SYNC_WORD: usize = 7 * CACHE_LINE;

/// What the sync word holds once the synchronization tagged `tag` is known to succeed.
pub fn sync_value(tag: u64) -> u32 {
    tag as u32
}

/// Most entries a ring may have.
pub const MAX_RING_ENTRIES: u32 = 1 << 16;
/// Largest data arena a client may have.
pub const MAX_ARENA_SIZE: u64 = 1 << 32;

/// One submission, client → broker. 64 bytes, one cache line.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
pub struct SubmissionEntry {
    /// Echoed unchanged on the completion.
    pub user_tag: u64,
    pub opcode: u16,
    pub flags: u16,
    pub stream: u32,
    pub args: [u64; 6],
}

/// One completion, broker → client. 32 bytes.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
pub struct CompletionEntry {
    /// The `user_tag` of the submission this completes.
    pub user_tag: u64,
    /// 0 for success, else an [`ErrorCode`](crate::ErrorCode) value.
    pub status: u32,
    pub flags: u32,
    /// Command-specific result (a device pointer, a handle, nanoseconds …).
    pub result: u64,
    pub result2: u64,
}

const _: () = assert!(std::mem::size_of::<SubmissionEntry>() == 64);
const _: () = assert!(std::mem::size_of::<CompletionEntry>() == 32);

/// The header at offset 0 of the region (informational for the client; the broker keeps its
/// own copy of the geometry and never reads this back).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct RegionHeader {
    pub magic: u64,
    pub version: u32,
    pub sq_entries: u32,
    pub cq_entries: u32,
    pub _reserved: u32,
    pub arena_size: u64,
}

/// The geometry of a client's shared region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShmLayout {
    pub sq_entries: u32,
    pub cq_entries: u32,
    pub arena_size: u64,
}

/// Why a layout cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    #[error("ring size {0} is not a power of two between 2 and {MAX_RING_ENTRIES}")]
    BadRingSize(u32),
    #[error("completion ring ({cq}) must be at least as large as the submission ring ({sq})")]
    CompletionRingTooSmall { sq: u32, cq: u32 },
    #[error("arena size {0} is not a multiple of {PAGE} between {PAGE} and {MAX_ARENA_SIZE}")]
    BadArenaSize(u64),
}

impl ShmLayout {
    pub fn validate(&self) -> Result<(), LayoutError> {
        for n in [self.sq_entries, self.cq_entries] {
            if !(2..=MAX_RING_ENTRIES).contains(&n) || !n.is_power_of_two() {
                return Err(LayoutError::BadRingSize(n));
            }
        }
        if self.cq_entries < self.sq_entries {
            return Err(LayoutError::CompletionRingTooSmall {
                sq: self.sq_entries,
                cq: self.cq_entries,
            });
        }
        if self.arena_size < PAGE as u64
            || self.arena_size > MAX_ARENA_SIZE
            || !self.arena_size.is_multiple_of(PAGE as u64)
        {
            return Err(LayoutError::BadArenaSize(self.arena_size));
        }
        Ok(())
    }

    pub fn sq_offset(&self) -> usize {
        PAGE
    }

    pub fn cq_offset(&self) -> usize {
        align_up(
            self.sq_offset() + self.sq_entries as usize * std::mem::size_of::<SubmissionEntry>(),
        )
    }

    pub fn arena_offset(&self) -> usize {
        align_up(
            self.cq_offset() + self.cq_entries as usize * std::mem::size_of::<CompletionEntry>(),
        )
    }

    /// Size of the whole region in bytes.
    pub fn total_size(&self) -> usize {
        self.arena_offset() + self.arena_size as usize
    }

    pub fn header(&self) -> RegionHeader {
        RegionHeader {
            magic: SHM_MAGIC,
            version: crate::PROTOCOL_VERSION,
            sq_entries: self.sq_entries,
            cq_entries: self.cq_entries,
            _reserved: 0,
            arena_size: self.arena_size,
        }
    }

    /// Checks that `[offset, offset + len)` lies inside the arena; returns the range.
    pub fn arena_range(&self, offset: u64, len: u64) -> Option<std::ops::Range<usize>> {
        let end = offset.checked_add(len)?;
        if end > self.arena_size {
            return None;
        }
        Some(offset as usize..end as usize)
    }
}

fn align_up(n: usize) -> usize {
    n.div_ceil(PAGE) * PAGE
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_page_aligned_and_validated() {
        let l = ShmLayout {
            sq_entries: 256,
            cq_entries: 512,
            arena_size: 1 << 20,
        };
        l.validate().expect("valid");
        assert_eq!(l.cq_offset() % PAGE, 0);
        assert_eq!(l.arena_offset() % PAGE, 0);
        assert!(l.cq_offset() >= l.sq_offset() + 256 * 64);
        assert_eq!(l.total_size(), l.arena_offset() + (1 << 20));
        assert!(ShmLayout { sq_entries: 3, ..l }.validate().is_err());
        assert!(
            ShmLayout {
                cq_entries: 128,
                ..l
            }
            .validate()
            .is_err()
        );
        assert!(
            ShmLayout {
                arena_size: 100,
                ..l
            }
            .validate()
            .is_err()
        );
        assert_eq!(l.arena_range(0, 1 << 20), Some(0..1 << 20));
        assert_eq!(l.arena_range(1, 1 << 20), None);
        assert_eq!(l.arena_range(u64::MAX, 2), None);
    }
}

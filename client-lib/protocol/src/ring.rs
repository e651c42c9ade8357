//! The shared-memory region of one client: two single-producer/single-consumer rings and a
//! data arena.
//!
//! The broker creates the region (a sealed memfd) and both sides map it. Layout, as byte
//! offsets from the start of the region:
//!
//! ```text
//! 0x0000  header      magic, version, geometry  (broker writes once, never reads back)
//! 0x0040  sq.head     u32  broker  → client: submissions consumed
//! 0x0080  sq.tail     u32  client  → broker: submissions published
//! 0x00c0  sq.flags    u32  broker: NEED_WAKEUP while it sleeps on the submit eventfd
//! 0x0100  cq.head     u32  client  → broker: completions consumed
//! 0x0140  cq.tail     u32  broker  → client: completions published
//! 0x0180  cq.flags    u32  client: NEED_WAKEUP while it sleeps on the complete eventfd
//! 0x1000  sq entries  sq_entries × 64 bytes            (SubmissionEntry)
//!  page   cq entries  cq_entries × 32 bytes            (CompletionEntry)
//!  page   data arena  arena_size bytes                 (copy payloads, launch parameters)
//! ```
//!
//! Each index sits on its own cache line so the two sides never false-share. Indices are
//! free-running `u32` counters; `tail - head` (wrapping) is the fill level. The owner of an
//! index stores it with `Release` after touching entries; the other side loads it with
//! `Acquire` before touching entries.
//!
//! The broker never trusts this memory: it keeps its own copy of the indices it owns, checks
//! that the other side's index is plausible (`tail - head <= capacity`) and masks every slot
//! index, so a hostile client can corrupt only its own session.

use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering, fence};

use serde::{Deserialize, Serialize};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// Marks a gpushare shared region ("GPUSHARE" in ASCII, little-endian).
pub const SHM_MAGIC: u64 = u64::from_le_bytes(*b"GPUSHARE");
/// Page size the layout aligns to.
pub const PAGE: usize = 4096;
const CACHE_LINE: usize = 64;

const SQ_HEAD: usize = CACHE_LINE;
const SQ_TAIL: usize = 2 * CACHE_LINE;
const SQ_FLAGS: usize = 3 * CACHE_LINE;
const CQ_HEAD: usize = 4 * CACHE_LINE;
const CQ_TAIL: usize = 5 * CACHE_LINE;
const CQ_FLAGS: usize = 6 * CACHE_LINE;

/// Set in a ring's flags word by its consumer just before it sleeps on its eventfd: the
/// producer must then signal the eventfd after publishing.
pub const NEED_WAKEUP: u32 = 1;

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

/// The other side's index says the ring holds more entries than it can: the region is corrupt
/// (or hostile). The session that owns it cannot continue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("ring indices are corrupt: head {head}, tail {tail}, capacity {capacity}")]
pub struct RingCorrupt {
    pub head: u32,
    pub tail: u32,
    pub capacity: u32,
}

/// Raw pointers into one ring of a mapped region.
struct RingPtrs<E> {
    head: NonNull<AtomicU32>,
    tail: NonNull<AtomicU32>,
    flags: NonNull<AtomicU32>,
    entries: NonNull<E>,
    capacity: u32,
    _entries: PhantomData<E>,
}

impl<E> RingPtrs<E> {
    /// # Safety
    /// `base` must point to a mapping of at least `layout.total_size()` bytes, aligned to a
    /// page, that stays mapped as long as the returned value (and anything built on it) lives.
    unsafe fn new(base: NonNull<u8>, idx: [usize; 3], entries: usize, capacity: u32) -> Self {
        // SAFETY: the caller guarantees the mapping covers these offsets; all offsets are
        // multiples of 64 from a page-aligned base, so the casts are suitably aligned.
        unsafe {
            RingPtrs {
                head: base.add(idx[0]).cast(),
                tail: base.add(idx[1]).cast(),
                flags: base.add(idx[2]).cast(),
                entries: base.add(entries).cast(),
                capacity,
                _entries: PhantomData,
            }
        }
    }

    fn head(&self) -> &AtomicU32 {
        // SAFETY: in bounds and aligned (see `new`); atomics are valid for any bit pattern
        // and are the only way either side touches this word.
        unsafe { self.head.as_ref() }
    }
    fn tail(&self) -> &AtomicU32 {
        // SAFETY: as for `head`.
        unsafe { self.tail.as_ref() }
    }
    fn flags(&self) -> &AtomicU32 {
        // SAFETY: as for `head`.
        unsafe { self.flags.as_ref() }
    }

    fn slot(&self, index: u32) -> *mut E {
        // SAFETY: capacity is a power of two and the masked index is below it, so the slot
        // lies inside the entries array of the mapping.
        unsafe {
            self.entries
                .as_ptr()
                .add((index & (self.capacity - 1)) as usize)
        }
    }

    fn check(&self, head: u32, tail: u32) -> Result<u32, RingCorrupt> {
        let used = tail.wrapping_sub(head);
        if used > self.capacity {
            return Err(RingCorrupt {
                head,
                tail,
                capacity: self.capacity,
            });
        }
        Ok(used)
    }
}

/// The side that writes entries into a ring.
pub struct Producer<E> {
    ring: RingPtrs<E>,
    /// Our own tail: authoritative, never read back from shared memory.
    tail: u32,
}

// SAFETY: the producer is the only writer of its tail and of free slots; the pointers stay
// valid for the lifetime promised at construction, so moving it to another thread is sound.
unsafe impl<E: Send> Send for Producer<E> {}

impl<E: Copy + FromBytes + IntoBytes> Producer<E> {
    /// Free slots, as far as the consumer's published head says.
    pub fn free_slots(&self) -> Result<u32, RingCorrupt> {
        let head = self.ring.head().load(Ordering::Acquire);
        let used = self.ring.check(head, self.tail)?;
        Ok(self.ring.capacity - used)
    }

    /// Writes `entry` into the next slot if there is room; it becomes visible to the consumer
    /// at the next [`publish`](Self::publish). Returns `false` when the ring is full.
    pub fn try_push(&mut self, entry: E) -> Result<bool, RingCorrupt> {
        if self.free_slots()? == 0 {
            return Ok(false);
        }
        // SAFETY: the slot is inside the mapping (masked index) and the consumer has released
        // it (head moved past it, checked above with Acquire).
        unsafe { self.ring.slot(self.tail).write_volatile(entry) };
        self.tail = self.tail.wrapping_add(1);
        Ok(true)
    }

    /// Makes every pushed entry visible to the consumer.
    pub fn publish(&mut self) {
        self.ring.tail().store(self.tail, Ordering::Release);
    }

    /// Whether the consumer asked to be woken; call after [`publish`](Self::publish).
    pub fn consumer_needs_wakeup(&self) -> bool {
        // Pairs with the fence in `Consumer::prepare_sleep`: either we see its flag, or it
        // sees our tail.
        fence(Ordering::SeqCst);
        self.ring.flags().load(Ordering::Relaxed) & NEED_WAKEUP != 0
    }
}

/// The side that reads entries from a ring.
pub struct Consumer<E> {
    ring: RingPtrs<E>,
    /// Our own head: authoritative, never read back from shared memory.
    head: u32,
}

// SAFETY: as for `Producer`.
unsafe impl<E: Send> Send for Consumer<E> {}

impl<E: Copy + FromBytes + IntoBytes> Consumer<E> {
    /// Entries published and not yet consumed.
    pub fn available(&self) -> Result<u32, RingCorrupt> {
        let tail = self.ring.tail().load(Ordering::Acquire);
        self.ring.check(self.head, tail)
    }

    /// Reads the next entry. Only meaningful when [`available`](Self::available) said so; it
    /// never reads outside the ring either way. The slot is handed back at
    /// [`release`](Self::release).
    pub fn pop(&mut self) -> E {
        // SAFETY: masked index, inside the mapping; `E: FromBytes` so any bytes the other side
        // wrote form a valid value, and we copy it out before validating anything.
        let entry = unsafe { self.ring.slot(self.head).read_volatile() };
        self.head = self.head.wrapping_add(1);
        entry
    }

    /// Hands consumed slots back to the producer.
    pub fn release(&mut self) {
        self.ring.head().store(self.head, Ordering::Release);
    }

    /// Announces that we are about to sleep. Re-check [`available`](Self::available)
    /// afterwards and sleep only if it is still zero.
    pub fn prepare_sleep(&self) {
        self.ring.flags().fetch_or(NEED_WAKEUP, Ordering::Relaxed);
        fence(Ordering::SeqCst);
    }

    /// We are awake again: producers need not signal.
    pub fn finish_sleep(&self) {
        self.ring.flags().fetch_and(!NEED_WAKEUP, Ordering::Relaxed);
    }

    /// Whether the producer of this ring is waiting for room, e.g. the broker blocked on a full
    /// completion ring; see [`Producer::wait_for_room`].
    pub fn producer_waiting(&self) -> bool {
        fence(Ordering::SeqCst);
        self.ring.flags().load(Ordering::Relaxed) & PRODUCER_WAITING != 0
    }
}

/// Set in a ring's flags word by its producer while it waits for the consumer to free slots:
/// the consumer signals the producer's eventfd after releasing.
pub const PRODUCER_WAITING: u32 = 2;

impl<E: Copy + FromBytes + IntoBytes> Producer<E> {
    /// Announces that we wait for room. Re-check [`free_slots`](Self::free_slots) afterwards.
    pub fn wait_for_room(&self) {
        self.ring
            .flags()
            .fetch_or(PRODUCER_WAITING, Ordering::Relaxed);
        fence(Ordering::SeqCst);
    }

    pub fn finish_wait_for_room(&self) {
        self.ring
            .flags()
            .fetch_and(!PRODUCER_WAITING, Ordering::Relaxed);
    }
}

/// The broker's view of a client region: it consumes submissions and produces completions.
pub struct BrokerRings {
    pub submissions: Consumer<SubmissionEntry>,
    pub completions: Producer<CompletionEntry>,
}

/// The client's view of its region: it produces submissions and consumes completions.
pub struct ClientRings {
    pub submissions: Producer<SubmissionEntry>,
    pub completions: Consumer<CompletionEntry>,
}

fn rings(
    base: NonNull<u8>,
    layout: &ShmLayout,
) -> (RingPtrs<SubmissionEntry>, RingPtrs<CompletionEntry>) {
    // SAFETY: forwarded from the callers' contracts.
    unsafe {
        (
            RingPtrs::new(
                base,
                [SQ_HEAD, SQ_TAIL, SQ_FLAGS],
                layout.sq_offset(),
                layout.sq_entries,
            ),
            RingPtrs::new(
                base,
                [CQ_HEAD, CQ_TAIL, CQ_FLAGS],
                layout.cq_offset(),
                layout.cq_entries,
            ),
        )
    }
}

impl BrokerRings {
    /// Initialises a freshly created (zeroed) region and returns the broker's side of it.
    ///
    /// # Safety
    /// `base` must be page-aligned, point to a writable shared mapping of at least
    /// `layout.total_size()` bytes, and outlive the returned value. `layout` must have passed
    /// [`ShmLayout::validate`].
    pub unsafe fn init(base: NonNull<u8>, layout: &ShmLayout) -> BrokerRings {
        let header = layout.header();
        // SAFETY: the header fits in the first cache line of the mapping.
        unsafe { base.cast::<RegionHeader>().write_volatile(header) };
        // SAFETY: forwarded from our caller.
        let (sq, cq) = rings(base, layout);
        BrokerRings {
            submissions: Consumer { ring: sq, head: 0 },
            completions: Producer { ring: cq, tail: 0 },
        }
    }
}

impl ClientRings {
    /// Attaches to a region the broker created.
    ///
    /// # Safety
    /// As for [`BrokerRings::init`], and the region must have been initialised by the broker.
    pub unsafe fn attach(base: NonNull<u8>, layout: &ShmLayout) -> ClientRings {
        // SAFETY: forwarded from our caller.
        let (sq, cq) = rings(base, layout);
        let sq_tail = sq.tail().load(Ordering::Acquire);
        let cq_head = cq.head().load(Ordering::Acquire);
        ClientRings {
            submissions: Producer {
                ring: sq,
                tail: sq_tail,
            },
            completions: Consumer {
                ring: cq,
                head: cq_head,
            },
        }
    }

    /// Reads the header the broker wrote.
    ///
    /// # Safety
    /// As for [`ClientRings::attach`].
    pub unsafe fn read_header(base: NonNull<u8>) -> RegionHeader {
        // SAFETY: forwarded from our caller.
        unsafe { base.cast::<RegionHeader>().read_volatile() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A page-aligned heap buffer standing in for the shared mapping.
    struct Region {
        ptr: NonNull<u8>,
        layout: std::alloc::Layout,
    }
    impl Region {
        fn new(size: usize) -> Region {
            let layout = std::alloc::Layout::from_size_align(size, PAGE).expect("layout");
            // SAFETY: non-zero size.
            let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
            Region {
                ptr: NonNull::new(ptr).expect("alloc"),
                layout,
            }
        }
    }
    impl Drop for Region {
        fn drop(&mut self) {
            // SAFETY: allocated in `new` with this layout.
            unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
        }
    }

    fn small() -> ShmLayout {
        ShmLayout {
            sq_entries: 8,
            cq_entries: 8,
            arena_size: PAGE as u64,
        }
    }

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

    #[test]
    fn submissions_flow_in_order_and_wrap() {
        let layout = small();
        let region = Region::new(layout.total_size());
        // SAFETY: the region is page-aligned, big enough and outlives both views.
        let mut broker = unsafe { BrokerRings::init(region.ptr, &layout) };
        // SAFETY: as above; initialised by `init`.
        let mut client = unsafe { ClientRings::attach(region.ptr, &layout) };
        let mut next = 0u64;
        for round in 0..5 {
            let mut pushed = 0;
            while client
                .submissions
                .try_push(SubmissionEntry {
                    user_tag: next + pushed,
                    ..Default::default()
                })
                .expect("sane")
            {
                pushed += 1;
            }
            assert_eq!(
                pushed, 8,
                "round {round}: the ring holds exactly its capacity"
            );
            client.submissions.publish();
            assert_eq!(broker.submissions.available(), Ok(8));
            for i in 0..8 {
                assert_eq!(broker.submissions.pop().user_tag, next + i);
            }
            broker.submissions.release();
            assert_eq!(client.submissions.free_slots(), Ok(8));
            next += 8;
        }
    }

    #[test]
    fn corrupt_indices_are_detected_not_trusted() {
        let layout = small();
        let region = Region::new(layout.total_size());
        // SAFETY: see above.
        let broker = unsafe { BrokerRings::init(region.ptr, &layout) };
        // A hostile client sets its tail far ahead of the broker's head.
        // SAFETY: in bounds of the region; plain atomic store as the client would do.
        unsafe {
            (*region.ptr.as_ptr().add(SQ_TAIL).cast::<AtomicU32>()).store(1000, Ordering::Release)
        };
        assert!(broker.submissions.available().is_err());
        // A hostile client sets its completion head ahead of the broker's tail.
        // SAFETY: as above.
        unsafe {
            (*region.ptr.as_ptr().add(CQ_HEAD).cast::<AtomicU32>()).store(77, Ordering::Release)
        };
        assert!(broker.completions.free_slots().is_err());
    }

    #[test]
    fn wakeup_flag_handshake() {
        let layout = small();
        let region = Region::new(layout.total_size());
        // SAFETY: see above.
        let broker = unsafe { BrokerRings::init(region.ptr, &layout) };
        // SAFETY: see above.
        let mut client = unsafe { ClientRings::attach(region.ptr, &layout) };
        assert!(!client.submissions.consumer_needs_wakeup());
        broker.submissions.prepare_sleep();
        assert!(
            client
                .submissions
                .try_push(SubmissionEntry::default())
                .expect("sane")
        );
        client.submissions.publish();
        assert!(client.submissions.consumer_needs_wakeup());
        assert_eq!(broker.submissions.available(), Ok(1));
        broker.submissions.finish_sleep();
        assert!(!client.submissions.consumer_needs_wakeup());
    }
}

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
//! 0x01c0  sync word   u32  broker  → client: a stream synchronization known to succeed
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
//!
//! Where each part lives: `layout.rs` (the geometry and the entry formats), `spsc.rs` (one
//! ring: [`Producer`], [`Consumer`] and their wake-up flags), this file (each side's view of
//! a whole region).

mod layout;
mod spsc;

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};

use self::layout::{CQ_FLAGS, CQ_HEAD, CQ_TAIL, SQ_FLAGS, SQ_HEAD, SQ_TAIL};
pub use self::layout::{
    CompletionEntry, LayoutError, MAX_ARENA_SIZE, MAX_RING_ENTRIES, PAGE, RegionHeader, SHM_MAGIC,
    SYNC_WORD, ShmLayout, SubmissionEntry, sync_value,
};
use self::spsc::RingPtrs;
pub use self::spsc::{Consumer, NEED_WAKEUP, PRODUCER_WAITING, Producer, RingCorrupt};

/// The broker's view of a client region: it consumes submissions and produces completions.
pub struct BrokerRings {
    pub submissions: Consumer<SubmissionEntry>,
    pub completions: Producer<CompletionEntry>,
}

/// The client's view of its region: it produces submissions and consumes completions, and
/// reads its sync word.
pub struct ClientRings {
    pub submissions: Producer<SubmissionEntry>,
    pub completions: Consumer<CompletionEntry>,
    pub synced: SyncWord,
}

/// The client's view of its sync word ([`SYNC_WORD`]).
pub struct SyncWord(NonNull<AtomicU32>);

// SAFETY: it points into the shared mapping, which outlives the rings (`ClientRings::attach`'s
// contract), and is only ever reached atomically.
unsafe impl Send for SyncWord {}
// SAFETY: as above.
unsafe impl Sync for SyncWord {}

impl SyncWord {
    fn word(&self) -> &AtomicU32 {
        // SAFETY: aligned (a cache line's start) and inside the live mapping (see above).
        unsafe { self.0.as_ref() }
    }

    /// Whether the broker's side said that the synchronization tagged `tag` succeeded
    /// (acquire: the completions published before it are seen too).
    pub fn told(&self, tag: u64) -> bool {
        self.word().load(Ordering::Acquire) == sync_value(tag)
    }

    /// Clears what it says of `tag`, if it still says that (so that it never speaks for a
    /// later synchronization whose tag has the same low bits).
    pub fn forget(&self, tag: u64) {
        let v = sync_value(tag);
        let _ = self
            .word()
            .compare_exchange(v, 0, Ordering::Relaxed, Ordering::Relaxed);
    }
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
        // SAFETY: SYNC_WORD lies in the region's first page, inside the mapping.
        let synced = SyncWord(unsafe { base.add(SYNC_WORD) }.cast::<AtomicU32>());
        ClientRings {
            submissions: Producer {
                ring: sq,
                tail: sq_tail,
            },
            completions: Consumer {
                ring: cq,
                head: cq_head,
            },
            synced,
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
    use std::sync::atomic::AtomicU32;

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

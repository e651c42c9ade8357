//! One single-producer/single-consumer ring over shared memory: free-running `u32` indices,
//! each side's own index kept privately and published with `Release`, the other side's read
//! with `Acquire` and checked before it is believed, and the flags words by which a side that
//! sleeps asks to be woken.

use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering, fence};

use zerocopy::{FromBytes, IntoBytes};

/// Set in a ring's flags word by its consumer just before it sleeps on its eventfd: the
/// producer must then signal the eventfd after publishing.
pub const NEED_WAKEUP: u32 = 1;

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
pub(super) struct RingPtrs<E> {
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
    pub(super) unsafe fn new(
        base: NonNull<u8>,
        idx: [usize; 3],
        entries: usize,
        capacity: u32,
    ) -> Self {
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

    pub(super) fn head(&self) -> &AtomicU32 {
        // SAFETY: in bounds and aligned (see `new`); atomics are valid for any bit pattern
        // and are the only way either side touches this word.
        unsafe { self.head.as_ref() }
    }
    pub(super) fn tail(&self) -> &AtomicU32 {
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
    pub(super) ring: RingPtrs<E>,
    /// Our own tail: authoritative, never read back from shared memory.
    pub(super) tail: u32,
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
    pub(super) ring: RingPtrs<E>,
    /// Our own head: authoritative, never read back from shared memory.
    pub(super) head: u32,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// One ring of eight `u64`s: index words at 0, 64 and 128, entries from 192.
    #[repr(C, align(64))]
    struct Memory([u8; 256]);

    fn ring(memory: &mut Memory) -> (Producer<u64>, Consumer<u64>) {
        let base = NonNull::from(&mut memory.0).cast::<u8>();
        // SAFETY: the offsets and eight entries lie inside `memory`, 64-byte aligned, which
        // outlives both sides in each test.
        let (p, c) = unsafe {
            (
                RingPtrs::new(base, [0, 64, 128], 192, 8),
                RingPtrs::new(base, [0, 64, 128], 192, 8),
            )
        };
        (Producer { ring: p, tail: 0 }, Consumer { ring: c, head: 0 })
    }

    #[test]
    fn a_ring_holds_its_capacity_and_hands_slots_back_on_release() {
        let mut memory = Memory([0; 256]);
        let (mut p, mut c) = ring(&mut memory);
        for i in 0..8 {
            assert_eq!(p.try_push(i), Ok(true));
        }
        assert_eq!(p.try_push(8), Ok(false), "full");
        assert_eq!(c.available(), Ok(0), "nothing published yet");
        p.publish();
        assert_eq!(c.available(), Ok(8));
        assert_eq!((c.pop(), c.pop()), (0, 1));
        assert_eq!(p.free_slots(), Ok(0), "popped but not released");
        c.release();
        assert_eq!(p.free_slots(), Ok(2));
    }

    #[test]
    fn an_index_that_claims_more_than_the_capacity_is_corrupt() {
        let mut memory = Memory([0; 256]);
        let (p, c) = ring(&mut memory);
        p.ring.tail().store(9, Ordering::Release);
        assert_eq!(
            c.available(),
            Err(RingCorrupt {
                head: 0,
                tail: 9,
                capacity: 8
            })
        );
        // Free-running counters wrap: a tail just past u32::MAX is four after this head.
        assert_eq!(p.ring.check(u32::MAX - 1, 2), Ok(4));
    }

    #[test]
    fn a_producer_waiting_for_room_is_seen_until_it_stops() {
        let mut memory = Memory([0; 256]);
        let (p, c) = ring(&mut memory);
        assert!(!c.producer_waiting());
        p.wait_for_room();
        assert!(c.producer_waiting());
        // The consumer's own sleep flag is another bit of the same word.
        c.prepare_sleep();
        assert!(p.consumer_needs_wakeup() && c.producer_waiting());
        p.finish_wait_for_room();
        assert!(!c.producer_waiting() && p.consumer_needs_wakeup());
        c.finish_sleep();
        assert!(!p.consumer_needs_wakeup());
    }
}

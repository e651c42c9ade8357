//! The pool against a sim device, and against a link that releases slowly.

use std::os::fd::AsFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::*;
use crate::device::sim::{SimDevice, SimOptions};
use crate::device::{Call, Device, Memory, Reply};

/// A sim device of 64 MiB in this process (the mirrors' tests use it too).
pub(in crate::device) fn device() -> Device {
    let sim = SimDevice::new(SimOptions {
        memory: 64 << 20,
        ..SimOptions::default()
    });
    Device::local(sim, None).expect("a sim device")
}

/// Device memory in use, as the device itself counts it.
pub(in crate::device) fn used(d: &Device) -> u64 {
    let (free, total) = d
        .call(Call::MemoryInfo, &[])
        .and_then(Reply::pair)
        .expect("memory info");
    total - free
}

#[test]
fn small_allocations_share_a_granule_and_large_ones_get_their_own() {
    let d = device();
    let g = d.space().granularity;
    let a = d.alloc(512, 1).expect("small");
    let b = d.alloc(512, 1).expect("small");
    assert_eq!(used(&d), g, "two small allocations cost one granule");
    assert!(b >= a + 512 + GAP, "apart: {a:#x} {b:#x}");
    let big = d.alloc(3 << 20, 1).expect("large");
    assert_eq!(used(&d), g + (4 << 20), "rounded up to whole granules");
    d.free(big).expect("free");
    assert_eq!(
        used(&d),
        g + (4 << 20),
        "a large allocation's chunk is kept a while for the user's next one of its size"
    );
    let kept = d.alloc(3 << 20, 1).expect("large");
    assert_eq!(kept, big, "and taken by it");
    assert_eq!(used(&d), g + (4 << 20));
    d.free(a).expect("free");
    d.free(b).expect("free");
    assert_eq!(
        used(&d),
        g + (4 << 20),
        "an empty shared chunk is kept while its user has other memory"
    );
    d.free(kept).expect("free");
    assert_eq!(used(&d), 0, "and goes with the user's last memory");
    assert!(d.free(a).is_err(), "double free");
    // Out of memory is the typed error, and nothing is left behind.
    assert_eq!(d.alloc(1 << 30, 1), Err(DeviceError::OutOfMemory));
    assert_eq!(used(&d), 0);
}

#[test]
fn users_never_share_a_chunk_nor_get_each_others_bytes() {
    let d = device();
    let g = d.space().granularity;
    let a = d.alloc(512, 1).expect("user 1");
    let b = d.alloc(512, 2).expect("user 2");
    assert_ne!(
        a / g,
        b / g,
        "different users' small allocations share no granule"
    );
    assert_eq!(used(&d), 2 * g);
    // User 1 frees; user 2's next small allocation does not land in user 1's granule.
    d.free(a).expect("free");
    let c = d.alloc(512, 2).expect("user 2 again");
    assert_ne!(c / g, a / g);
    // Placing memory in another user's granule is refused.
    assert!(matches!(
        d.alloc_at(b + 4096, 8, 1),
        Err(DeviceError::AddressUnavailable(_))
    ));
}

#[test]
fn placed_memory_goes_where_asked_or_says_why_not() {
    let d = device();
    let a = d.alloc(1000, 1).expect("small");
    d.free(a).expect("free");
    // Back where it was, in its shared granule; a neighbour beside it.
    assert_eq!(d.alloc_at(a, 1000, 1), Ok(1000));
    assert_eq!(d.alloc_at(a + 1024, 64, 1), Ok(64));
    assert!(matches!(
        d.alloc_at(a + 512, 8, 1),
        Err(DeviceError::AddressUnavailable(_))
    ));
    assert!(matches!(
        d.alloc_at(0x10, 8, 1),
        Err(DeviceError::AddressUnavailable(_))
    ));
}

#[test]
fn memory_outlives_a_reset_of_its_context() {
    let d = device();
    let p = d.alloc(4096, 1).expect("alloc");
    let mut s = d
        .create_stream(gpushare_protocol::PriorityClass::Normal)
        .expect("stream");
    let fill = gpushare_protocol::Kernel::FillF32 {
        dst: p,
        n: 1024,
        value: 6.5,
    };
    d.queue(
        &mut s,
        |stream| Call::Launch {
            stream,
            kernel: fill,
            start: None,
            place: Default::default(),
        },
        &[],
    )
    .expect("fill");
    d.sync_stream(&mut s).expect("sync");
    assert_eq!(d.reset(), Ok(Memory::Kept));
    // The same stream handle, the same memory, the same bytes.
    let sum = gpushare_protocol::Kernel::ReduceSumF32 { x: p, out: p, n: 4 };
    d.queue(
        &mut s,
        |stream| Call::Launch {
            stream,
            kernel: sum,
            start: None,
            place: Default::default(),
        },
        &[],
    )
    .expect("the stream lives on");
    d.sync_stream(&mut s).expect("sync");
    d.destroy_stream(s);
    d.free(p).expect("free");
}

/// A link whose chunk release stalls (until a chunk is made meanwhile, or a while has
/// passed), and which refuses a chunk over one still mapped, as a worker does.
struct SlowRelease {
    inner: Arc<dyn Link>,
    mapped: Mutex<BTreeMap<u64, u64>>,
    releasing: AtomicBool,
    made: AtomicBool,
}

impl Link for SlowRelease {
    crate::device::link::pass_on_to_inner!();
    fn create_chunk(&self, at: u64, size: u64) -> DeviceResult<()> {
        self.made.store(true, Ordering::Release);
        let mut mapped = self.mapped.lock().expect("mapped");
        if let Some((&base, &len)) = mapped.range(..at + size).next_back()
            && base + len > at
        {
            return Err(DeviceError::Failed(format!("{at:#x} is mapped still")));
        }
        mapped.insert(at, size);
        Ok(())
    }
    fn release_chunk(&self, at: u64, _size: u64) {
        self.releasing.store(true, Ordering::Release);
        let until = Instant::now() + Duration::from_millis(200);
        while !self.made.load(Ordering::Acquire) && Instant::now() < until {
            std::thread::yield_now();
        }
        self.mapped.lock().expect("mapped").remove(&at);
    }
    fn interrupt(&self) {}
    fn fault(&self) -> Option<String> {
        None
    }
    fn reset(&self) -> DeviceResult<Memory> {
        Ok(Memory::Lost)
    }
    fn resets_in_place(&self) -> bool {
        false
    }
    fn reset_deadline(&self) -> Duration {
        Duration::from_secs(1)
    }
}

#[test]
fn memory_freed_while_another_user_allocates_never_meets_its_old_chunk() {
    let link = Arc::new(SlowRelease {
        inner: device().link().clone(),
        mapped: Mutex::default(),
        releasing: AtomicBool::new(false),
        made: AtomicBool::new(false),
    });
    let pool = Arc::new(Pool::new(link.space(), 0));
    let a = pool.alloc(&*link, 512, 1).expect("user 1");
    link.made.store(false, Ordering::Release);
    // User 1's last memory goes (and its chunk with it) while user 2 allocates: user 2's
    // chunk may take the same addresses, but only once the old chunk is gone.
    let freeing = {
        let (pool, link) = (pool.clone(), link.clone());
        std::thread::spawn(move || pool.free(&*link, a))
    };
    while !link.releasing.load(Ordering::Acquire) {
        std::thread::yield_now();
    }
    let b = pool.alloc(&*link, 512, 2);
    assert_eq!(freeing.join().expect("free"), Ok(()));
    assert!(b.is_ok(), "{b:?}");
}

#[test]
fn a_freed_large_chunk_serves_only_its_user_gives_way_when_memory_runs_short_and_expires() {
    let d = device();
    let g = d.space().granularity;
    let small = d.alloc(512, 1).expect("user 1 keeps some memory");
    let big = d.alloc(32 << 20, 1).expect("large");
    d.free(big).expect("free");
    assert_eq!(used(&d), g + (32 << 20), "kept idle");
    // Another user never gets it: a chunk of its own.
    let other = d.alloc(8 << 20, 2).expect("user 2");
    assert_ne!(other, big);
    assert_eq!(used(&d), g + (40 << 20));
    d.free(other).expect("free");
    // The device (64 MiB) cannot hold 48 MiB more beside the idle chunk: it gives way.
    let large = d.alloc(48 << 20, 2).expect("the idle chunk went back");
    d.free(large).expect("free");
    // Kept chunks go back after a while (at the pool's next allocation or free).
    let again = d.alloc(16 << 20, 1).expect("large");
    d.free(again).expect("free");
    assert!(used(&d) > g, "kept idle");
    let deadline = Instant::now() + IDLE_FOR * 5;
    while used(&d) > g && Instant::now() < deadline {
        let p = d.alloc(512, 1).expect("small");
        d.free(p).expect("free");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(used(&d), g, "the idle chunk expired");
    d.free(small).expect("free");
    assert_eq!(used(&d), 0);
}

#[test]
fn memory_placed_where_an_idle_chunk_lies_gets_the_place() {
    let d = device();
    let _small = d.alloc(512, 1).expect("user 1 keeps some memory");
    let big = d.alloc(4 << 20, 1).expect("large");
    d.free(big).expect("free");
    assert_eq!(
        d.alloc_at(big, 4 << 20, 2),
        Ok(4 << 20),
        "the idle chunk gave way"
    );
}

#[test]
fn reservations_take_address_space_only_and_hold_only_their_owners_mappings() {
    let d = device();
    let g = d.space().granularity;
    let at = d.reserve(4 * g, 0, 0, 1).expect("reserve");
    assert_eq!(at % g, 0, "granule-aligned");
    assert_eq!(used(&d), 0, "address space costs no memory");
    let a = d.alloc(3 << 20, 1).expect("an allocation");
    assert!(
        a + (3 << 20) <= at || a >= at + 4 * g,
        "allocations stay out of reservations: {a:#x} {at:#x}"
    );
    assert!(d.reserve(g + 1, 0, 0, 1).is_err(), "whole granules only");
    assert!(
        d.reserve(g, 3 * g, 0, 1).is_err(),
        "a power-of-two alignment"
    );
    let mem = d.make_memory(2 * g).expect("physical memory");
    d.map_memory(at, 2 * g, mem.as_fd(), 1).expect("mapped");
    assert_eq!(
        used(&d),
        (4 << 20) + 2 * g,
        "mapped memory is on the device"
    );
    let refused = [
        (at + g, 2 * g, 1, "over a mapping"),
        (at + 3 * g, 2 * g, 1, "past the reservation"),
        (at + 2 * g, 2 * g, 2, "another user's reservation"),
        (at + 2 * g + 4096, g, 1, "not on a granule"),
    ];
    for (ptr, size, owner, why) in refused {
        assert!(
            d.map_memory(ptr, size, mem.as_fd(), owner).is_err(),
            "{why}"
        );
    }
    // The same memory twice, side by side: one mapping each.
    d.map_memory(at + 2 * g, 2 * g, mem.as_fd(), 1)
        .expect("mapped again");
    assert!(d.unreserve(at, 4 * g, 1).is_err(), "still mapped");
    assert!(d.unmap_memory(at, g, 1).is_err(), "half a mapping");
    assert!(d.unmap_memory(at, 4 * g, 2).is_err(), "another user's");
    assert_eq!(
        d.unmap_memory(at, 4 * g, 1).expect("both at once"),
        vec![(at, 2 * g), (at + 2 * g, 2 * g)]
    );
    d.unreserve(at, 4 * g, 1).expect("unreserved");
    assert!(d.unreserve(at, 4 * g, 1).is_err(), "once");
    // Its place can be asked for again.
    assert_eq!(d.reserve(4 * g, 0, at, 1).expect("at the hint"), at);
}

#[test]
fn one_user_reserves_a_quarter_of_the_space_at_most() {
    let d = device();
    let (g, quarter) = (d.space().granularity, d.space().size / 4);
    let big = d.reserve(quarter - g, 0, 0, 1).expect("most of a quarter");
    assert!(matches!(
        d.reserve(2 * g, 0, 0, 1),
        Err(DeviceError::OutOfMemory)
    ));
    d.reserve(2 * g, 0, 0, 2).expect("another user finds room");
    d.unreserve(big, quarter - g, 1).expect("given back");
    d.reserve(2 * g, 0, 0, 1).expect("room again");
}

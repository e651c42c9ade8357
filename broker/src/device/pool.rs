//! [`Pool`]: clients' device memory, carved out of chunks the link holds (memory that outlives
//! a context). Addresses come from the device's reserved [`Space`]; an allocation past
//! [`SMALL_MAX`] gets a chunk of its own (rounded up to the granule), smaller ones share
//! chunks of one granule, so a 512-byte allocation does not cost 2 MiB. At most one empty
//! shared chunk is kept for the next small allocation; the rest go back at once.

use std::collections::BTreeMap;
use std::sync::Mutex;

use gpushare_protocol::DevicePtr;

use super::link::{Link, Space};
use super::{DeviceError, DeviceResult};

/// Allocations up to this size share chunks.
pub const SMALL_MAX: u64 = 1 << 20;
/// Alignment of shared-chunk allocations (cudaMalloc's own).
const ALIGN: u64 = 256;
/// Bytes left free after each shared-chunk allocation: a copy that runs past an allocation's
/// end meets no other allocation, and is refused.
const GAP: u64 = ALIGN;

/// Free ranges, start → length, kept merged.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Ranges(BTreeMap<u64, u64>);

impl Ranges {
    fn with(start: u64, len: u64) -> Ranges {
        let mut r = Ranges::default();
        if len > 0 {
            r.0.insert(start, len);
        }
        r
    }

    /// Takes `len` bytes aligned to `align` at or above `floor` (first fit).
    fn take(&mut self, len: u64, align: u64, floor: u64) -> Option<u64> {
        let (start, at) = self.0.iter().find_map(|(&s, &l)| {
            let at = s.max(floor).checked_next_multiple_of(align)?;
            (at.checked_add(len)? <= s + l).then_some((s, at))
        })?;
        self.take_exactly(start, at, len);
        Some(at)
    }

    /// Takes `[at, at + len)`, which must lie inside the free range starting at `start`.
    fn take_exactly(&mut self, start: u64, at: u64, len: u64) {
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
    fn take_at(&mut self, at: u64, len: u64) -> bool {
        let Some((&start, &l)) = self.0.range(..=at).next_back() else {
            return false;
        };
        let fits = at.checked_add(len).is_some_and(|end| end <= start + l);
        if fits {
            self.take_exactly(start, at, len);
        }
        fits
    }

    fn give(&mut self, mut at: u64, mut len: u64) {
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

    fn bytes(&self) -> u64 {
        self.0.values().sum()
    }
}

/// One chunk: all one allocation's, or shared by small ones (its free blocks).
#[derive(Debug)]
struct Chunk {
    size: u64,
    /// The address space it holds: its size, and a granule after a fresh chunk that nothing
    /// maps (a copy running past its end meets no other allocation).
    span: u64,
    shared: Option<Ranges>,
}

#[derive(Debug)]
struct State {
    /// Address space not under a chunk.
    free: Ranges,
    chunks: BTreeMap<u64, Chunk>,
    /// Allocation → (its chunk, its size as placed).
    allocations: BTreeMap<DevicePtr, (u64, u64)>,
    /// Fresh chunks go at or above this (what an earlier image handed out, for clients that
    /// place their memory again where it was).
    floor: u64,
}

/// A device's clients' memory.
#[derive(Debug)]
pub struct Pool {
    space: Space,
    state: Mutex<State>,
}

impl Pool {
    pub fn new(space: Space, floor: u64) -> Pool {
        Pool {
            space,
            state: Mutex::new(State {
                free: Ranges::with(space.base, space.size),
                chunks: BTreeMap::new(),
                allocations: BTreeMap::new(),
                floor,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn granule(&self) -> u64 {
        self.space.granularity.max(1)
    }

    fn round(&self, bytes: u64) -> Option<u64> {
        bytes.max(1).checked_next_multiple_of(self.granule())
    }

    /// Where fresh chunks go from now on: the end of the highest one ever made.
    pub fn high_water(&self) -> u64 {
        let st = self.lock();
        self.high_water_of(&st)
    }

    /// `bytes` of device memory at an address of the pool's choosing.
    pub fn alloc(&self, link: &dyn Link, bytes: u64) -> DeviceResult<DevicePtr> {
        let mut st = self.lock();
        let ptr = if bytes > SMALL_MAX {
            let size = self.round(bytes).ok_or(DeviceError::OutOfMemory)?;
            let at = self.new_chunk(&mut st, link, size, false)?;
            st.allocations.insert(at, (at, bytes));
            at
        } else {
            let len = bytes.max(1).next_multiple_of(ALIGN) + GAP;
            let found = st.chunks.iter_mut().find_map(|(&at, c)| {
                let free = c.shared.as_mut()?;
                free.take(len, ALIGN, 0).map(|p| (at, p))
            });
            let (chunk, ptr) = match found {
                Some(f) => f,
                None => {
                    let size = self.round(SMALL_MAX).ok_or(DeviceError::OutOfMemory)?;
                    let at = self.new_chunk(&mut st, link, size, true)?;
                    let free = st
                        .chunks
                        .get_mut(&at)
                        .and_then(|c| c.shared.as_mut())
                        .ok_or_else(|| DeviceError::Failed("a chunk went missing".into()))?;
                    let ptr = free.take(len, ALIGN, 0).ok_or(DeviceError::OutOfMemory)?;
                    (at, ptr)
                }
            };
            st.allocations.insert(ptr, (chunk, len));
            ptr
        };
        Ok(ptr)
    }

    /// `bytes` at exactly `ptr` (a client placing its memory again where it was), or
    /// `AddressUnavailable`. A small allocation goes into the shared chunk of its granule (made
    /// if need be), as it was made; a large one takes whole granules. Returns the memory it
    /// took.
    pub fn alloc_at(&self, link: &dyn Link, ptr: DevicePtr, bytes: u64) -> DeviceResult<u64> {
        let g = self.granule();
        let unavailable = |why: &str| {
            DeviceError::AddressUnavailable(format!("{bytes} bytes at {ptr:#x}: {why}"))
        };
        let end = ptr
            .checked_add(bytes.max(1))
            .filter(|_| ptr != 0)
            .ok_or_else(|| unavailable("not a valid device range"))?;
        let lo = ptr - ptr % g;
        let hi = end
            .checked_next_multiple_of(g)
            .ok_or_else(|| unavailable("not a valid device range"))?;
        let mut st = self.lock();
        if bytes <= SMALL_MAX && hi - lo == g {
            return self.place_small(&mut st, link, ptr, bytes, lo);
        }
        if !st.free.take_at(lo, hi - lo) {
            return Err(unavailable(
                "outside this device's address range, or in use",
            ));
        }
        if let Err(e) = link.create_chunk(lo, hi - lo) {
            st.free.give(lo, hi - lo);
            return Err(e);
        }
        st.chunks.insert(
            lo,
            Chunk {
                size: hi - lo,
                span: hi - lo,
                shared: None,
            },
        );
        st.allocations.insert(ptr, (lo, bytes));
        Ok(hi - lo)
    }

    /// Places a small allocation at `ptr` in the shared chunk at `lo`.
    fn place_small(
        &self,
        st: &mut State,
        link: &dyn Link,
        ptr: DevicePtr,
        bytes: u64,
        lo: u64,
    ) -> DeviceResult<u64> {
        let g = self.granule();
        if !st.chunks.contains_key(&lo) {
            if !st.free.take_at(lo, g) {
                return Err(DeviceError::AddressUnavailable(format!(
                    "{bytes} bytes at {ptr:#x}: outside this device's address range, or in use"
                )));
            }
            if let Err(e) = link.create_chunk(lo, g) {
                st.free.give(lo, g);
                return Err(e);
            }
            st.chunks.insert(
                lo,
                Chunk {
                    size: g,
                    span: g,
                    shared: Some(Ranges::with(lo, g)),
                },
            );
        }
        let len = bytes.max(1).next_multiple_of(ALIGN);
        let placed = st
            .chunks
            .get_mut(&lo)
            .and_then(|c| c.shared.as_mut())
            .is_some_and(|free| free.take_at(ptr, len));
        if !placed {
            return Err(DeviceError::AddressUnavailable(format!(
                "{bytes} bytes at {ptr:#x}: another allocation holds part of it"
            )));
        }
        st.allocations.insert(ptr, (lo, len));
        Ok(bytes)
    }

    fn new_chunk(
        &self,
        st: &mut State,
        link: &dyn Link,
        size: u64,
        shared: bool,
    ) -> DeviceResult<u64> {
        let (floor, g) = (st.floor, self.granule());
        let span = size.checked_add(g).ok_or(DeviceError::OutOfMemory)?;
        let at = st
            .free
            .take(span, g, floor)
            .or_else(|| st.free.take(span, g, 0))
            .ok_or(DeviceError::OutOfMemory)?;
        if let Err(e) = link.create_chunk(at, size) {
            st.free.give(at, span);
            return Err(e);
        }
        st.chunks.insert(
            at,
            Chunk {
                size,
                span,
                shared: shared.then(|| Ranges::with(at, size)),
            },
        );
        Ok(at)
    }

    /// Frees an allocation; its chunk goes back when nothing else is in it.
    pub fn free(&self, link: &dyn Link, ptr: DevicePtr) -> DeviceResult<()> {
        let mut st = self.lock();
        let (chunk, len) = st.allocations.remove(&ptr).ok_or_else(|| {
            DeviceError::InvalidArgument(format!("{ptr:#x} is not an allocation"))
        })?;
        let Some(c) = st.chunks.get_mut(&chunk) else {
            return Ok(());
        };
        let (size, span) = (c.size, c.span);
        let release = match c.shared.as_mut() {
            None => true,
            Some(free) => {
                free.give(ptr, len);
                let empty = free.bytes() == size;
                // One empty shared chunk stays for the next small allocation.
                empty
                    && st.chunks.iter().any(|(&a, o)| {
                        a != chunk && o.shared.as_ref().is_some_and(|f| f.bytes() == o.size)
                    })
            }
        };
        if release {
            st.chunks.remove(&chunk);
            st.free.give(chunk, span);
            drop(st);
            link.release_chunk(chunk, size);
        }
        Ok(())
    }

    /// Forgets every chunk and allocation (their memory went with a context).
    pub fn forget(&self) {
        let mut st = self.lock();
        let floor = self.high_water_of(&st);
        st.chunks.clear();
        st.allocations.clear();
        st.free = Ranges::with(self.space.base, self.space.size);
        st.floor = floor;
    }

    fn high_water_of(&self, st: &State) -> u64 {
        let top = st.chunks.iter().next_back().map_or(0, |(&a, c)| a + c.size);
        top.max(st.floor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::sim::{SimDevice, SimOptions};
    use crate::device::{Call, Device, Memory, Reply};

    fn device() -> Device {
        let sim = SimDevice::new(SimOptions {
            memory: 64 << 20,
            ..SimOptions::default()
        });
        Device::local(sim, None).expect("a sim device")
    }

    /// Device memory in use, as the device itself counts it.
    fn used(d: &Device) -> u64 {
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
        let a = d.alloc(512).expect("small");
        let b = d.alloc(512).expect("small");
        assert_eq!(used(&d), g, "two small allocations cost one granule");
        assert!(b >= a + 512 + GAP, "apart: {a:#x} {b:#x}");
        let big = d.alloc(3 << 20).expect("large");
        assert_eq!(used(&d), g + (4 << 20), "rounded up to whole granules");
        d.free(big).expect("free");
        assert_eq!(used(&d), g, "a large allocation's chunk goes at once");
        d.free(a).expect("free");
        d.free(b).expect("free");
        assert_eq!(used(&d), g, "one empty shared chunk is kept");
        assert!(d.free(a).is_err(), "double free");
        // Out of memory is the typed error, and nothing is left behind.
        assert_eq!(d.alloc(1 << 30), Err(DeviceError::OutOfMemory));
        assert_eq!(used(&d), g);
    }

    #[test]
    fn placed_memory_goes_where_asked_or_says_why_not() {
        let d = device();
        let a = d.alloc(1000).expect("small");
        d.free(a).expect("free");
        // Back where it was, in its shared granule; a neighbour beside it.
        assert_eq!(d.alloc_at(a, 1000), Ok(1000));
        assert_eq!(d.alloc_at(a + 1024, 64), Ok(64));
        assert!(matches!(
            d.alloc_at(a + 512, 8),
            Err(DeviceError::AddressUnavailable(_))
        ));
        assert!(matches!(
            d.alloc_at(0x10, 8),
            Err(DeviceError::AddressUnavailable(_))
        ));
    }

    #[test]
    fn memory_outlives_a_reset_of_its_context() {
        let d = device();
        let p = d.alloc(4096).expect("alloc");
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
            },
            &[],
        )
        .expect("the stream lives on");
        d.sync_stream(&mut s).expect("sync");
        d.destroy_stream(s);
        d.free(p).expect("free");
    }

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

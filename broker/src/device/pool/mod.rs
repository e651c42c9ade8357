//! [`Pool`]: clients' device memory, carved out of chunks the link holds (memory that outlives
//! a context). Addresses come from the device's reserved [`Space`]; an allocation past
//! [`SMALL_MAX`] gets a chunk of its own (rounded up to the granule), smaller ones share
//! chunks of one granule with the same user's, so a 512-byte allocation does not cost 2 MiB
//! and bytes one user freed are never handed to another (a fresh chunk comes zeroed from the
//! driver). A user's empty shared chunk is kept while the user has other memory here, for
//! their next small allocation; otherwise it goes back at once. So is a freed large chunk,
//! for the same user's next allocation of its size, for [`IDLE_FOR`] and up to a share of the
//! device ([`Pool::idle_max`]): making one costs create, export, map and access in two
//! contexts (0.4-0.7 ms on an H200), and programs that free a large buffer often allocate
//! one of the same size next. Idle chunks go back at once when memory runs
//! short or when a client places memory where one lies.

mod ranges;
mod reserved;

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use gpushare_protocol::DevicePtr;

use self::ranges::Ranges;
use super::link::{Link, Space};
use super::{DeviceError, DeviceResult};

/// Allocations up to this size share chunks.
pub const SMALL_MAX: u64 = 1 << 20;
/// Alignment of shared-chunk allocations (cudaMalloc's own).
const ALIGN: u64 = 256;
/// Bytes left free after each shared-chunk allocation: a copy that runs past an allocation's
/// end meets no other allocation, and is refused.
const GAP: u64 = ALIGN;
/// How long a freed large chunk is kept for its user's next allocation of its size.
pub const IDLE_FOR: Duration = Duration::from_secs(2);

/// One chunk: all one allocation's, or shared by one user's small ones (its free blocks).
#[derive(Debug)]
struct Chunk {
    /// The user whose memory it holds.
    owner: u32,
    size: u64,
    /// The address space it holds: its size, and a granule after a fresh chunk that nothing
    /// maps (a copy running past its end meets no other allocation).
    span: u64,
    shared: Option<Ranges>,
    /// A large chunk freed and kept for its user's next allocation of its size.
    idle: bool,
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
    /// Idle large chunks, the oldest first, and since when.
    idle: VecDeque<(u64, Instant)>,
    idle_bytes: u64,
    /// Address space programs reserved themselves, by address.
    reserved: BTreeMap<u64, reserved::Reservation>,
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
                idle: VecDeque::new(),
                idle_bytes: 0,
                reserved: BTreeMap::new(),
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

    /// Bytes of idle chunks kept at most: a sixteenth of the device's memory, 1 GiB at most.
    fn idle_max(&self) -> u64 {
        (self.space.memory() / 16).min(1 << 30)
    }

    /// `bytes` of device memory at an address of the pool's choosing.
    pub fn alloc(&self, link: &dyn Link, bytes: u64, owner: u32) -> DeviceResult<DevicePtr> {
        let mut st = self.lock();
        self.expire_idle(&mut st, link, Instant::now());
        let ptr = if bytes > SMALL_MAX {
            let size = self.round(bytes).ok_or(DeviceError::OutOfMemory)?;
            let at = match take_idle(&mut st, owner, size) {
                Some(at) => at,
                None => self.new_chunk(&mut st, link, size, false, owner)?,
            };
            st.allocations.insert(at, (at, bytes));
            at
        } else {
            let len = bytes.max(1).next_multiple_of(ALIGN) + GAP;
            let found = st.chunks.iter_mut().find_map(|(&at, c)| {
                let mine = c.owner == owner;
                let free = c.shared.as_mut().filter(|_| mine)?;
                free.take(len, ALIGN, 0).map(|p| (at, p))
            });
            let (chunk, ptr) = match found {
                Some(f) => f,
                None => {
                    let size = self.round(SMALL_MAX).ok_or(DeviceError::OutOfMemory)?;
                    let at = self.new_chunk(&mut st, link, size, true, owner)?;
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
    pub fn alloc_at(
        &self,
        link: &dyn Link,
        ptr: DevicePtr,
        bytes: u64,
        owner: u32,
    ) -> DeviceResult<u64> {
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
        // Idle chunks give way to memory placed where they lie.
        let in_the_way: Vec<u64> = st
            .chunks
            .range(..hi)
            .filter(|(a, c)| c.idle && **a + c.span > lo)
            .map(|(a, _)| *a)
            .collect();
        for a in in_the_way {
            release_idle(&mut st, link, a);
        }
        if bytes <= SMALL_MAX && hi - lo == g {
            return self.place_small(&mut st, link, (ptr, bytes), lo, owner);
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
                owner,
                size: hi - lo,
                span: hi - lo,
                shared: None,
                idle: false,
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
        (ptr, bytes): (DevicePtr, u64),
        lo: u64,
        owner: u32,
    ) -> DeviceResult<u64> {
        let g = self.granule();
        if st.chunks.get(&lo).is_some_and(|c| c.owner != owner) {
            return Err(DeviceError::AddressUnavailable(format!(
                "{bytes} bytes at {ptr:#x}: another user's memory is there"
            )));
        }
        if !st.chunks.contains_key(&lo) {
            if !st.free.take_at(lo, g) {
                return Err(DeviceError::AddressUnavailable(format!(
                    "{bytes} bytes at {ptr:#x}: outside this device's address range, or in use"
                )));
            }
            Self::make_chunk(st, link, lo, g, g, true, owner)?;
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

    /// A fresh chunk of `size`; memory held idle goes back before it is refused for want of
    /// memory.
    fn new_chunk(
        &self,
        st: &mut State,
        link: &dyn Link,
        size: u64,
        shared: bool,
        owner: u32,
    ) -> DeviceResult<u64> {
        match self.place_chunk(st, link, size, shared, owner) {
            Err(DeviceError::OutOfMemory) if !st.idle.is_empty() => {
                self.expire_idle(st, link, Instant::now() + IDLE_FOR);
                self.place_chunk(st, link, size, shared, owner)
            }
            other => other,
        }
    }

    fn place_chunk(
        &self,
        st: &mut State,
        link: &dyn Link,
        size: u64,
        shared: bool,
        owner: u32,
    ) -> DeviceResult<u64> {
        let (floor, g) = (st.floor, self.granule());
        let span = size.checked_add(g).ok_or(DeviceError::OutOfMemory)?;
        let at = st
            .free
            .take(span, g, floor)
            .or_else(|| st.free.take(span, g, 0))
            .ok_or(DeviceError::OutOfMemory)?;
        Self::make_chunk(st, link, at, size, span, shared, owner)?;
        Ok(at)
    }

    /// Makes a chunk of `size` at `at`, in the `span` of address space taken for it, which
    /// goes back if the device cannot make it.
    fn make_chunk(
        st: &mut State,
        link: &dyn Link,
        at: u64,
        size: u64,
        span: u64,
        shared: bool,
        owner: u32,
    ) -> DeviceResult<()> {
        if let Err(e) = link.create_chunk(at, size) {
            st.free.give(at, span);
            return Err(e);
        }
        st.chunks.insert(
            at,
            Chunk {
                owner,
                size,
                span,
                shared: shared.then(|| Ranges::with(at, size)),
                idle: false,
            },
        );
        Ok(())
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
        let (size, span, owner) = (c.size, c.span, c.owner);
        let release = match c.shared.as_mut() {
            None => true,
            Some(free) => {
                free.give(ptr, len);
                free.bytes() == size && !keep_empty(&st, chunk, owner)
            }
        };
        let now = Instant::now();
        let mut gone = Vec::new();
        let keep_idle = release
            && st.chunks.get(&chunk).is_some_and(|c| c.shared.is_none())
            && st.idle_bytes + size <= self.idle_max();
        if keep_idle {
            if let Some(c) = st.chunks.get_mut(&chunk) {
                c.idle = true;
            }
            st.idle.push_back((chunk, now));
            st.idle_bytes += size;
        } else if release {
            st.chunks.remove(&chunk);
            st.free.give(chunk, span);
            gone.push((chunk, size));
        }
        // The user's last memory went: so does an empty chunk kept for them.
        let owners = |c: &u64, st: &State| st.chunks.get(c).is_some_and(|o| o.owner == owner);
        if !st.allocations.values().any(|(c, _)| owners(c, &st)) {
            let empty: Vec<(u64, u64, u64)> = st
                .chunks
                .iter()
                .filter(|(_, o)| o.owner == owner)
                .map(|(&a, o)| (a, o.size, o.span))
                .collect();
            for (a, size, span) in empty {
                forget_idle(&mut st, a, size);
                st.chunks.remove(&a);
                st.free.give(a, span);
                gone.push((a, size));
            }
        }
        gone.extend(self.expired_idle(&mut st, now));
        // Under the lock: a chunk made meanwhile at the address just given back must not
        // meet the old one still mapped there.
        for (a, size) in gone {
            link.release_chunk(a, size);
        }
        drop(st);
        Ok(())
    }

    /// Gives back the idle chunks kept since before `now - IDLE_FOR`.
    fn expire_idle(&self, st: &mut State, link: &dyn Link, now: Instant) {
        for (a, size) in self.expired_idle(st, now) {
            link.release_chunk(a, size);
        }
    }

    /// Takes out the idle chunks kept since before `now - IDLE_FOR`; the caller gives them
    /// back to the link, under the lock.
    fn expired_idle(&self, st: &mut State, now: Instant) -> Vec<(u64, u64)> {
        let mut gone = Vec::new();
        while let Some(&(a, since)) = st.idle.front() {
            if now.saturating_duration_since(since) < IDLE_FOR {
                break;
            }
            st.idle.pop_front();
            if let Some(c) = st.chunks.remove(&a) {
                st.idle_bytes -= c.size;
                st.free.give(a, c.span);
                gone.push((a, c.size));
            }
        }
        gone
    }

    /// Forgets every chunk and allocation (their memory went with a context).
    pub fn forget(&self) {
        let mut st = self.lock();
        let floor = self.high_water_of(&st);
        st.idle.clear();
        st.idle_bytes = 0;
        st.chunks.clear();
        st.allocations.clear();
        st.reserved.clear();
        st.free = Ranges::with(self.space.base, self.space.size);
        st.floor = floor;
    }

    fn high_water_of(&self, st: &State) -> u64 {
        let top = st.chunks.iter().next_back().map_or(0, |(&a, c)| a + c.size);
        let reserved = st.reserved.iter().next_back().map_or(0, |(&a, r)| r.end(a));
        top.max(reserved).max(st.floor)
    }
}

/// An idle chunk of `owner`'s of `size` bytes, taken for a new allocation.
fn take_idle(st: &mut State, owner: u32, size: u64) -> Option<u64> {
    let i = st.idle.iter().rposition(|(a, _)| {
        st.chunks
            .get(a)
            .is_some_and(|c| c.owner == owner && c.size == size)
    })?;
    let (at, _) = st.idle.remove(i)?;
    if let Some(c) = st.chunks.get_mut(&at) {
        c.idle = false;
    }
    st.idle_bytes -= size;
    Some(at)
}

/// No longer counts the chunk at `at` (of `size` bytes) as idle, if it was.
fn forget_idle(st: &mut State, at: u64, size: u64) {
    if let Some(i) = st.idle.iter().position(|(a, _)| *a == at) {
        st.idle.remove(i);
        st.idle_bytes -= size;
    }
}

/// Gives back the idle chunk at `at` now.
fn release_idle(st: &mut State, link: &dyn Link, at: u64) {
    if let Some(c) = st.chunks.remove(&at) {
        forget_idle(st, at, c.size);
        st.free.give(at, c.span);
        link.release_chunk(at, c.size);
    }
}

/// Whether `owner`'s shared chunk at `chunk`, empty now, stays for their next small
/// allocation: while they have other memory here, and no other empty chunk.
fn keep_empty(st: &State, chunk: u64, owner: u32) -> bool {
    let owners = |c: &u64| st.chunks.get(c).is_some_and(|o| o.owner == owner);
    let other_memory = st
        .allocations
        .values()
        .any(|(c, _)| *c != chunk && owners(c));
    let other_empty = st.chunks.iter().any(|(&a, o)| {
        a != chunk && o.owner == owner && o.shared.as_ref().is_some_and(|f| f.bytes() == o.size)
    });
    other_memory && !other_empty
}

#[cfg(test)]
pub(super) mod tests;

//! [`Pool`]: clients' device memory, carved out of chunks the link holds (memory that outlives
//! a context). Addresses come from the device's reserved [`Space`]; an allocation past
//! [`SMALL_MAX`] gets a chunk of its own (rounded up to the granule), smaller ones share
//! chunks of one granule with the same user's, so a 512-byte allocation does not cost 2 MiB
//! and bytes one user freed are never handed to another (a fresh chunk comes zeroed from the
//! driver). A user's empty shared chunk is kept while the user has other memory here, for
//! their next small allocation; otherwise it goes back at once.

mod ranges;

use std::collections::BTreeMap;
use std::sync::Mutex;

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
    pub fn alloc(&self, link: &dyn Link, bytes: u64, owner: u32) -> DeviceResult<DevicePtr> {
        let mut st = self.lock();
        let ptr = if bytes > SMALL_MAX {
            let size = self.round(bytes).ok_or(DeviceError::OutOfMemory)?;
            let at = self.new_chunk(&mut st, link, size, false, owner)?;
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

    fn new_chunk(
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
        let mut gone = Vec::new();
        if release {
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
                st.chunks.remove(&a);
                st.free.give(a, span);
                gone.push((a, size));
            }
        }
        // Under the lock: a chunk made meanwhile at the address just given back must not
        // meet the old one still mapped there.
        for (a, size) in gone {
            link.release_chunk(a, size);
        }
        drop(st);
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
mod tests;

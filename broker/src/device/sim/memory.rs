//! The sim device's memory: zero-initialised host buffers at made-up device addresses. A
//! chunk (memory that outlives the device: see [`crate::device::Backend::create_chunk`]) is a
//! memfd mapped shared, so that a successor device mapping the same memfd sees every byte.

use std::collections::BTreeMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

use nix::sys::memfd::{MFdFlags, memfd_create};
use nix::sys::mman::{MapFlags, ProtFlags};

use gpushare_protocol::DevicePtr;

use crate::device::{DeviceError, DeviceResult};

/// Where sim device addresses start: well away from 0 so a null pointer is never valid, and
/// below where programs map their libraries and mmaps (top-down from the stack), as a CUDA
/// device worker's addresses are (it maps bottom-up).
const BASE_ADDRESS: u64 = 0x4000_0000_0000;
/// Allocation granularity (like cudaMalloc's 256-byte alignment).
const ALIGN: u64 = 256;
/// Where a restarting gpushared tells its next image to start handing out addresses (see
/// [`next_address`]).
pub const ADDRESS_HANDOVER_ENV: &str = "GPUSHARE_SIM_NEXT_ADDRESS";

/// The next address any sim device of this process hands out. Shared by every sim GPU and
/// never rewound, not even by a reset, and carried across a restart: a fresh allocation
/// never lands where memory lost in a reset used to be, so a client rebuilding its state
/// finds its old addresses free (as a new CUDA context's allocations land elsewhere). 0 until
/// the first allocation.
static NEXT_ADDRESS: AtomicU64 = AtomicU64::new(0);

/// Where the next fresh allocation of this process goes: for handing to the next image of a
/// restarting gpushared in [`ADDRESS_HANDOVER_ENV`].
pub fn next_address() -> u64 {
    let handed = std::env::var(ADDRESS_HANDOVER_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(0);
    let first = BASE_ADDRESS.max(handed.div_ceil(ALIGN) * ALIGN);
    let _ = NEXT_ADDRESS.compare_exchange(0, first, Ordering::AcqRel, Ordering::Acquire);
    NEXT_ADDRESS.load(Ordering::Acquire)
}

/// Takes `span` bytes of fresh address space.
pub fn take_addresses(span: u64) -> Option<u64> {
    next_address();
    NEXT_ADDRESS
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_add(span))
        .ok()
}

/// Makes sure fresh allocations start at or above `end` (memory placed there on request, or
/// handed out by a device worker this one replaces).
pub fn skip_addresses_below(end: u64) {
    next_address();
    let end = end
        .div_ceil(ALIGN)
        .saturating_mul(ALIGN)
        .saturating_add(ALIGN);
    NEXT_ADDRESS.fetch_max(end, Ordering::AcqRel);
}

/// A zeroed buffer whose allocation failure is reported, not aborted on: heap memory, or a
/// chunk's memfd mapped shared.
struct Buffer {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
    mapped: bool,
    /// Memory of someone else's (a client's registered host memory): never freed here.
    borrowed: bool,
}

// SAFETY: the buffer is plain owned memory; access goes through `&`/`&mut` methods.
unsafe impl Send for Buffer {}

impl Buffer {
    fn zeroed(len: usize) -> Option<Buffer> {
        if len == 0 {
            return Some(Buffer {
                ptr: std::ptr::NonNull::dangling(),
                len: 0,
                mapped: false,
                borrowed: false,
            });
        }
        let layout = std::alloc::Layout::from_size_align(len, 64).ok()?;
        // SAFETY: non-zero size; a null return is handled.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        Some(Buffer {
            ptr: std::ptr::NonNull::new(ptr)?,
            len,
            mapped: false,
            borrowed: false,
        })
    }

    /// `len` bytes of `fd` (a memfd at least that long), mapped shared.
    fn mapped(fd: BorrowedFd<'_>, len: usize) -> DeviceResult<Buffer> {
        let size = std::num::NonZeroUsize::new(len)
            .ok_or_else(|| DeviceError::InvalidArgument("an empty chunk".into()))?;
        // SAFETY: a fresh shared mapping of a descriptor we were given; nothing else in this
        // process points into it until it is returned.
        let ptr = unsafe {
            nix::sys::mman::mmap(
                None,
                size,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED,
                fd,
                0,
            )
        }
        .map_err(|e| DeviceError::Failed(format!("cannot map a chunk: {e}")))?;
        Ok(Buffer {
            ptr: ptr.cast(),
            len,
            mapped: true,
            borrowed: false,
        })
    }
    fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` owns `len` initialised (zeroed) bytes.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, uniquely borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        if self.borrowed {
            return;
        }
        if self.mapped {
            // SAFETY: our own mapping, unmapped once; no slice into it outlives `self`.
            let _ = unsafe { nix::sys::mman::munmap(self.ptr.cast(), self.len) };
            return;
        }
        if self.len > 0
            && let Ok(layout) = std::alloc::Layout::from_size_align(self.len, 64)
        {
            // SAFETY: allocated in `zeroed` with this layout.
            unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) }
        }
    }
}

/// All allocations of the sim device. Fresh addresses are never reused (see
/// [`NEXT_ADDRESS`]), so a stale pointer never aliases a newer fresh allocation; only
/// [`SimMemory::alloc_at`] places memory at an address asked for.
pub struct SimMemory {
    buffers: BTreeMap<u64, Buffer>,
    used: u64,
    capacity: u64,
    /// Chunks of another device's mapped here (peer access): not this device's memory.
    peer: std::collections::BTreeSet<u64>,
}

impl SimMemory {
    pub fn new(capacity: u64) -> SimMemory {
        SimMemory {
            buffers: BTreeMap::new(),
            used: 0,
            capacity,
            peer: std::collections::BTreeSet::new(),
        }
    }

    /// A zeroed buffer of `size` bytes within the capacity.
    fn buffer(&self, size: u64) -> DeviceResult<Buffer> {
        if self.used.saturating_add(size) > self.capacity {
            return Err(DeviceError::OutOfMemory);
        }
        let len = usize::try_from(size).map_err(|_| DeviceError::OutOfMemory)?;
        Buffer::zeroed(len).ok_or(DeviceError::OutOfMemory)
    }

    pub fn alloc(&mut self, bytes: u64) -> DeviceResult<DevicePtr> {
        let size = bytes.max(1);
        let buffer = self.buffer(size)?;
        let span = size
            .div_ceil(ALIGN)
            .checked_mul(ALIGN)
            .and_then(|s| s.checked_add(ALIGN))
            .ok_or(DeviceError::OutOfMemory)?;
        let ptr = take_addresses(span).ok_or(DeviceError::OutOfMemory)?;
        self.buffers.insert(ptr, buffer);
        self.used += size;
        Ok(ptr)
    }

    /// Places `bytes` at exactly `ptr`: refused when any of the range overlaps a live
    /// allocation (or is null, or wraps).
    pub fn alloc_at(&mut self, ptr: DevicePtr, bytes: u64) -> DeviceResult<()> {
        let size = bytes.max(1);
        let end = ptr.checked_add(size).filter(|_| ptr != 0).ok_or_else(|| {
            DeviceError::AddressUnavailable(format!(
                "{size} bytes at {ptr:#x} are not a valid device range"
            ))
        })?;
        let below = self.buffers.range(..end).next_back();
        if let Some((&base, buf)) = below
            && base + (buf.len as u64).max(1) > ptr
        {
            return Err(DeviceError::AddressUnavailable(format!(
                "{size} bytes at {ptr:#x} overlap the allocation at {base:#x}"
            )));
        }
        let buffer = self.buffer(size)?;
        self.buffers.insert(ptr, buffer);
        self.used += size;
        skip_addresses_below(end);
        Ok(())
    }

    /// Makes a chunk of `size` bytes at `at` (a memfd, mapped here); returns the memfd.
    pub fn create_chunk(&mut self, at: u64, size: u64) -> DeviceResult<OwnedFd> {
        if self.used.saturating_add(size) > self.capacity {
            return Err(DeviceError::OutOfMemory);
        }
        let fd = make_memory(size)?;
        self.import_chunk(at, size, fd.as_fd())?;
        Ok(fd)
    }

    /// Maps a chunk another device made (its memfd) at `at`.
    pub fn import_chunk(&mut self, at: u64, size: u64, fd: BorrowedFd<'_>) -> DeviceResult<()> {
        let end = at
            .checked_add(size)
            .filter(|_| at != 0)
            .ok_or_else(|| DeviceError::AddressUnavailable(format!("{size} bytes at {at:#x}")))?;
        if let Some((&base, buf)) = self.buffers.range(..end).next_back()
            && base + (buf.len as u64).max(1) > at
        {
            return Err(DeviceError::AddressUnavailable(format!(
                "{size} bytes at {at:#x} overlap the memory at {base:#x}"
            )));
        }
        let len = usize::try_from(size).map_err(|_| DeviceError::OutOfMemory)?;
        let buffer = Buffer::mapped(fd, len)?;
        self.buffers.insert(at, buffer);
        self.used += size;
        Ok(())
    }

    /// Maps a chunk of another device's (its memfd) at its own address `at`, as a GPU maps a
    /// peer's memory: reachable here, not counted as this device's.
    pub fn import_peer_chunk(
        &mut self,
        at: u64,
        size: u64,
        fd: BorrowedFd<'_>,
    ) -> DeviceResult<()> {
        self.import_chunk(at, size, fd)?;
        self.used -= size;
        self.peer.insert(at);
        Ok(())
    }

    /// Unmaps the chunk at `at`.
    pub fn release_chunk(&mut self, at: u64) -> DeviceResult<()> {
        match self.buffers.get(&at) {
            Some(b) if b.mapped => self.free(at),
            _ => Err(DeviceError::InvalidArgument(format!("no chunk at {at:#x}"))),
        }
    }

    /// Makes `len` bytes of host memory at `ptr` reachable at that address, as a GPU
    /// reaches registered host memory.
    ///
    /// # Safety
    /// `ptr` stays mapped, readable and writable, until [`SimMemory::unregister_host`].
    pub unsafe fn register_host(&mut self, ptr: *mut u8, len: usize) -> DeviceResult<u64> {
        let at = ptr as u64;
        let nonnull = std::ptr::NonNull::new(ptr)
            .filter(|_| len > 0)
            .ok_or_else(|| DeviceError::InvalidArgument("an empty host region".into()))?;
        let end = at + len as u64;
        if let Some((&base, buf)) = self.buffers.range(..end).next_back()
            && base + (buf.len as u64).max(1) > at
        {
            return Err(DeviceError::AddressUnavailable(format!(
                "host memory at {at:#x} overlaps device memory at {base:#x}"
            )));
        }
        let buffer = Buffer {
            ptr: nonnull,
            len,
            mapped: false,
            borrowed: true,
        };
        self.buffers.insert(at, buffer);
        Ok(at)
    }

    /// Forgets host memory [`SimMemory::register_host`] made reachable.
    pub fn unregister_host(&mut self, at: u64) {
        if self.buffers.get(&at).is_some_and(|b| b.borrowed) {
            self.buffers.remove(&at);
        }
    }

    pub fn free(&mut self, ptr: DevicePtr) -> DeviceResult<()> {
        let buffer = self.buffers.remove(&ptr).ok_or_else(|| {
            DeviceError::InvalidArgument(format!("{ptr:#x} is not an allocation"))
        })?;
        if !self.peer.remove(&ptr) {
            self.used -= (buffer.len as u64).max(1);
        }
        Ok(())
    }

    pub fn used(&self) -> u64 {
        self.used
    }

    /// The pieces `[ptr, ptr + len)` lies in: (buffer base, offset, length). One buffer, or
    /// mapped memory across mappings that follow one another (as a GPU's virtual addresses
    /// run across them).
    fn locate(&self, ptr: DevicePtr, len: u64) -> DeviceResult<Vec<(u64, usize, usize)>> {
        let past = || {
            DeviceError::InvalidArgument(format!(
                "{len} bytes at {ptr:#x} run past the end of their allocation"
            ))
        };
        let (&base, buf) = self.buffers.range(..=ptr).next_back().ok_or_else(|| {
            DeviceError::InvalidArgument(format!("{ptr:#x} is not device memory"))
        })?;
        let end = ptr.checked_add(len).ok_or_else(past)?;
        let mut pieces = Vec::new();
        let (mut base, mut buf, mut at) = (base, buf, ptr);
        loop {
            let buf_end = base + buf.len as u64;
            if at > buf_end {
                return Err(past());
            }
            let upto = end.min(buf_end);
            pieces.push((base, (at - base) as usize, (upto - at) as usize));
            if upto == end {
                return Ok(pieces);
            }
            match self.buffers.get(&buf_end) {
                Some(next) if buf.mapped && next.mapped => {
                    (base, buf, at) = (buf_end, next, buf_end)
                }
                _ => return Err(past()),
            }
        }
    }

    pub fn read(&self, ptr: DevicePtr, out: &mut [u8]) -> DeviceResult<()> {
        let mut done = 0;
        for (base, off, n) in self.locate(ptr, out.len() as u64)? {
            let buf = &self.buffers[&base];
            out[done..done + n].copy_from_slice(&buf.bytes()[off..off + n]);
            done += n;
        }
        Ok(())
    }

    pub fn write(&mut self, ptr: DevicePtr, data: &[u8]) -> DeviceResult<()> {
        let mut done = 0;
        for (base, off, n) in self.locate(ptr, data.len() as u64)? {
            let buf = self
                .buffers
                .get_mut(&base)
                .ok_or(DeviceError::Failed("lost buffer".into()))?;
            buf.bytes_mut()[off..off + n].copy_from_slice(&data[done..done + n]);
            done += n;
        }
        Ok(())
    }

    pub fn fill(&mut self, ptr: DevicePtr, value: u8, len: u64) -> DeviceResult<()> {
        for (base, off, n) in self.locate(ptr, len)? {
            let buf = self
                .buffers
                .get_mut(&base)
                .ok_or(DeviceError::Failed("lost buffer".into()))?;
            buf.bytes_mut()[off..off + n].fill(value);
        }
        Ok(())
    }

    pub fn read_f32s(&self, ptr: DevicePtr, n: u64) -> DeviceResult<Vec<f32>> {
        let len = usize::try_from(n.saturating_mul(4)).map_err(|_| DeviceError::OutOfMemory)?;
        let mut bytes = vec![0u8; len];
        self.read(ptr, &mut bytes)?;
        Ok(bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    /// Reads `n` bfloat16 values, widened exactly to f32.
    pub fn read_bf16s(&self, ptr: DevicePtr, n: u64) -> DeviceResult<Vec<f32>> {
        let len = usize::try_from(n.saturating_mul(2)).map_err(|_| DeviceError::OutOfMemory)?;
        let mut bytes = vec![0u8; len];
        self.read(ptr, &mut bytes)?;
        Ok(bytes
            .chunks_exact(2)
            .map(|c| f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16))
            .collect())
    }

    pub fn write_f32s(&mut self, ptr: DevicePtr, values: &[f32]) -> DeviceResult<()> {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.write(ptr, &bytes)
    }
}

/// Physical memory mapped nowhere: a memfd of `size` bytes, zero until written.
pub fn make_memory(size: u64) -> DeviceResult<OwnedFd> {
    let fd = memfd_create("gpushare-sim-chunk", MFdFlags::MFD_CLOEXEC)
        .map_err(|e| DeviceError::Failed(format!("cannot make device memory: {e}")))?;
    let len = libc::off_t::try_from(size).map_err(|_| DeviceError::OutOfMemory)?;
    // Sized, not written: its pages are zero until touched.
    nix::unistd::ftruncate(&fd, len).map_err(|_| DeviceError::OutOfMemory)?;
    Ok(fd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocations_are_zeroed_disjoint_and_bounded() {
        let mut m = SimMemory::new(1 << 20);
        let a = m.alloc(1000).expect("fits");
        let b = m.alloc(1000).expect("fits");
        assert!(b >= a + 1000, "no overlap");
        let mut out = [1u8; 16];
        m.read(a + 984, &mut out).expect("in bounds");
        assert_eq!(out, [0; 16]);
        assert!(m.read(a + 985, &mut out).is_err(), "one byte past the end");
        assert_eq!(m.alloc(1 << 20), Err(DeviceError::OutOfMemory));
        m.free(a).expect("frees");
        assert!(m.free(a).is_err(), "double free");
        let c = m.alloc(10).expect("fits");
        assert_ne!(c, a, "addresses are not reused");
        assert_eq!(m.used(), 1010);
    }

    #[test]
    fn a_chunk_is_shared_with_whoever_maps_its_memfd() {
        let at = 0x7000_0000_0000;
        let mut first = SimMemory::new(8 << 20);
        let fd = first.create_chunk(at, 2 << 20).expect("made");
        first.write(at + 100, &[1, 2, 3]).expect("in bounds");
        assert!(first.create_chunk(at + 4096, 4096).is_err(), "overlaps");
        // Another device (a spare worker) maps the same memory at the same address.
        let mut second = SimMemory::new(8 << 20);
        second
            .import_chunk(at, 2 << 20, fd.as_fd())
            .expect("mapped");
        let mut out = [0u8; 3];
        second.read(at + 100, &mut out).expect("in bounds");
        assert_eq!(out, [1, 2, 3]);
        second.write(at, &[9]).expect("writable");
        drop(first);
        let mut back = [0u8; 1];
        second.read(at, &mut back).expect("still there");
        assert_eq!(back, [9]);
        second.release_chunk(at).expect("released");
        assert_eq!(second.used(), 0);
        assert!(
            SimMemory::new(1 << 20).create_chunk(at, 2 << 20).is_err(),
            "past capacity"
        );
    }

    #[test]
    fn memory_is_placed_at_an_address_asked_for_only_where_nothing_lives() {
        let mut m = SimMemory::new(1 << 20);
        let a = m.alloc(1000).expect("fits");
        m.free(a).expect("frees");
        // After a reset (a new memory), the old address is free again: the same range back.
        let mut after = SimMemory::new(1 << 20);
        after.alloc_at(a, 1000).expect("old address free");
        after.write(a + 996, &[7; 4]).expect("in bounds");
        // Overlapping a live allocation, at either end, is refused with the typed error.
        for (ptr, len) in [(a, 1), (a + 999, 8), (a - 8, 9), (a - 8, 2000)] {
            assert!(
                matches!(
                    after.alloc_at(ptr, len),
                    Err(DeviceError::AddressUnavailable(_))
                ),
                "{ptr:#x}+{len}"
            );
        }
        assert!(matches!(
            after.alloc_at(0, 8),
            Err(DeviceError::AddressUnavailable(_))
        ));
        assert!(matches!(
            after.alloc_at(u64::MAX - 4, 8),
            Err(DeviceError::AddressUnavailable(_))
        ));
        // Right next to it is fine; a fresh allocation never lands on placed memory.
        after.alloc_at(a + 1000, 24).expect("adjacent");
        let fresh = after.alloc(64).expect("fits");
        assert!(fresh >= a + 1024, "{fresh:#x} after {a:#x}");
        assert_eq!(after.used(), 1000 + 24 + 64);
    }
}

//! A client's shared region: a sealed memfd mapped into the broker.

use std::os::fd::{AsFd, OwnedFd};
use std::ptr::NonNull;

use gpushare_protocol::ring::{BrokerRings, ShmLayout};
use memmap2::{MmapOptions, MmapRaw};
use nix::fcntl::{FcntlArg, SealFlag, fcntl};
use nix::sys::memfd::{MFdFlags, memfd_create};

/// The mapping of one client's region. The client can write any byte of it at any time; the
/// broker reads it only through the rings (which check indices) and the arena accessors
/// (which check ranges).
pub struct SharedRegion {
    map: MmapRaw,
    memfd: OwnedFd,
    layout: ShmLayout,
}

#[derive(Debug, thiserror::Error)]
pub enum ShmError {
    #[error("cannot create the shared memory file: {0}")]
    Create(nix::Error),
    #[error("cannot size the shared memory file to {size} bytes: {source}")]
    Size { size: usize, source: nix::Error },
    #[error("cannot seal the shared memory file: {0}")]
    Seal(nix::Error),
    #[error("cannot map the shared memory file: {0}")]
    Map(std::io::Error),
}

impl SharedRegion {
    /// Creates and maps a zeroed region for `layout` (which must be valid). Its size is sealed
    /// so that the client cannot shrink it under the broker (which would fault the broker).
    pub fn create(name: &str, layout: ShmLayout) -> Result<SharedRegion, ShmError> {
        let size = layout.total_size();
        let memfd = memfd_create(name, MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING)
            .map_err(ShmError::Create)?;
        nix::unistd::ftruncate(&memfd, size as libc::off_t)
            .map_err(|source| ShmError::Size { size, source })?;
        fcntl(
            &memfd,
            FcntlArg::F_ADD_SEALS(
                SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SEAL,
            ),
        )
        .map_err(ShmError::Seal)?;
        let map = MmapOptions::new()
            .len(size)
            .map_raw(&memfd)
            .map_err(ShmError::Map)?;
        Ok(SharedRegion { map, memfd, layout })
    }

    pub fn memfd(&self) -> impl AsFd + '_ {
        self.memfd.as_fd()
    }

    fn base(&self) -> NonNull<u8> {
        // mmap never returns null on success.
        NonNull::new(self.map.as_mut_ptr()).unwrap_or(NonNull::dangling())
    }

    /// Initialises the header and returns the broker's ring ends.
    ///
    /// # Safety
    /// Call once per region; the rings must not outlive `self`.
    pub unsafe fn init_rings(&self) -> BrokerRings {
        // SAFETY: the mapping is page-aligned, exactly `layout.total_size()` long, the layout
        // was validated before creation, and the caller keeps `self` alive.
        unsafe { BrokerRings::init(self.base(), &self.layout) }
    }

    /// A checked view of `len` arena bytes at `offset`, or `None` if it leaves the arena.
    pub fn arena_slice(&self, offset: u64, len: u64) -> Option<ArenaSlice<'_>> {
        let range = self.layout.arena_range(offset, len)?;
        // SAFETY: the range lies inside the arena, which lies inside the mapping.
        let ptr = unsafe { self.base().add(self.layout.arena_offset() + range.start) };
        Some(ArenaSlice {
            ptr,
            len: range.len(),
            _region: std::marker::PhantomData,
        })
    }

    /// The whole arena, for registering it with a device for DMA.
    pub fn arena(&self) -> ArenaSlice<'_> {
        // SAFETY: offset 0 and the arena size always form a valid range.
        let ptr = unsafe { self.base().add(self.layout.arena_offset()) };
        ArenaSlice {
            ptr,
            len: self.layout.arena_size as usize,
            _region: std::marker::PhantomData,
        }
    }
}

/// Bytes of a client's arena. The client may change them at any time, so they are never
/// handed out as `&[u8]`: only copied in and out.
#[derive(Clone, Copy)]
pub struct ArenaSlice<'a> {
    ptr: NonNull<u8>,
    len: usize,
    _region: std::marker::PhantomData<&'a SharedRegion>,
}

impl ArenaSlice<'_> {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Copies the arena bytes out into `dst` (which must have the same length).
    pub fn read_into(&self, dst: &mut [u8]) {
        let n = dst.len().min(self.len);
        // SAFETY: `ptr..ptr+len` is inside the live mapping (checked at construction), `dst`
        // is our own memory; the regions cannot overlap. A concurrent client write can only
        // change which bytes we copy, which is the client's own business.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.as_ptr(), dst.as_mut_ptr(), n) }
    }

    /// Copies `src` into the arena.
    pub fn write_from(&self, src: &[u8]) {
        let n = src.len().min(self.len);
        // SAFETY: as for `read_into`, in the other direction.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.as_ptr(), n) }
    }
}

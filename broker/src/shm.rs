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
    id: u64,
}

/// Names every region mapped here (client regions and host regions alike), so that a device
/// in another process can be told which of the regions it was given a copy names.
static REGION_IDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

fn next_region_id() -> u64 {
    REGION_IDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
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

/// A zeroed memfd of `size` bytes whose size is sealed: whoever it is shared with cannot
/// shrink it under a mapping (which would fault the mapper).
pub fn sealed_memfd(name: &str, size: usize) -> Result<OwnedFd, ShmError> {
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
    Ok(memfd)
}

impl SharedRegion {
    /// Creates and maps a zeroed region for `layout` (which must be valid). Its size is sealed
    /// so that the client cannot shrink it under the broker (which would fault the broker).
    pub fn create(name: &str, layout: ShmLayout) -> Result<SharedRegion, ShmError> {
        let size = layout.total_size();
        let memfd = sealed_memfd(name, size)?;
        let map = MmapOptions::new()
            .len(size)
            .map_raw(&memfd)
            .map_err(ShmError::Map)?;
        Ok(SharedRegion {
            map,
            memfd,
            layout,
            id: next_region_id(),
        })
    }

    pub fn memfd(&self) -> impl AsFd + '_ {
        self.memfd.as_fd()
    }

    /// This region's id among the regions mapped here.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Where the client's sync word lies ([`gpushare_protocol::ring::SYNC_WORD`]).
    pub fn sync_word(&self) -> Span {
        Span {
            region: self.id,
            offset: gpushare_protocol::ring::SYNC_WORD as u64,
            len: 4,
        }
    }

    /// Bytes of the whole mapping (rings and arena).
    pub fn size(&self) -> u64 {
        self.layout.total_size() as u64
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
        let at = self.layout.arena_offset() + range.start;
        // SAFETY: the range lies inside the arena, which lies inside the mapping.
        let ptr = unsafe { self.base().add(at) };
        Some(ArenaSlice {
            ptr,
            len: range.len(),
            region: self.id,
            offset: at as u64,
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
            region: self.id,
            offset: self.layout.arena_offset() as u64,
            _region: std::marker::PhantomData,
        }
    }
}

/// Client memory as a device call names it: a region shared with the device (by its id), and
/// where in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Span {
    pub region: u64,
    pub offset: u64,
    pub len: u64,
}

/// Bytes of memory a client shares (its arena, or a host region of its own). The client may
/// change them at any time, so they are never handed out as `&[u8]`: only copied in and out.
#[derive(Clone, Copy)]
pub struct ArenaSlice<'a> {
    ptr: NonNull<u8>,
    len: usize,
    /// The region it lies in ([`SharedRegion::id`], [`HostRegion::id`]), and where.
    region: u64,
    offset: u64,
    _region: std::marker::PhantomData<&'a ()>,
}

/// Page-locked host memory a client shares with the broker (a consolidated client's
/// `cuMemHostAlloc`, `cuMemHostRegister`): its memfd, sealed against shrinking, or its tmpfs
/// file, mapped here too.
pub struct HostRegion {
    ptr: NonNull<u8>,
    len: usize,
    id: u64,
    /// Set for a file the client may shrink (dropped after the mapping, field order).
    guard: Option<crate::shrink_guard::Guard>,
}

// SAFETY: a plain shared mapping, read and written only through `ArenaSlice` copies.
unsafe impl Send for HostRegion {}
// SAFETY: as above.
unsafe impl Sync for HostRegion {}

#[derive(Debug, thiserror::Error)]
pub enum HostRegionError {
    #[error("the host memory must be a memfd sealed against shrinking or a tmpfs file")]
    NotSealed,
    #[error("the host memory file has {have} bytes, not the {want} announced")]
    TooShort { have: u64, want: u64 },
    #[error("{0} bytes is not a whole number of pages")]
    NotPages(u64),
    #[error("cannot map the host memory: {0}")]
    Map(nix::Error),
    #[error(transparent)]
    Guard(#[from] crate::shrink_guard::GuardError),
}

/// Whether `fd` is a memfd sealed against shrinking.
fn sealed(fd: &OwnedFd) -> bool {
    fcntl(fd, FcntlArg::F_GET_SEALS)
        .is_ok_and(|seals| SealFlag::from_bits_truncate(seals).contains(SealFlag::F_SEAL_SHRINK))
}

/// Room below the main thread's stack kept free: the stack grows down into it on demand, up
/// to its limit (between these bounds), and the kernel will not grow it to within its guard
/// gap (1 MiB unless configured otherwise) of another mapping, so a client's region placed
/// there would crash gpushared at its next deep call.
const STACK_ROOM_MIN: u64 = 8 << 20;
const STACK_ROOM_MAX: u64 = 1 << 30;
const STACK_GUARD: u64 = 4 << 20;

/// The addresses a mapping must stay out of for the main thread's stack to grow, from
/// /proc/self/maps and the stack's limit; `None` if they cannot be told.
fn stack_zone() -> Option<std::ops::Range<u64>> {
    static ZONE: std::sync::OnceLock<Option<std::ops::Range<u64>>> = std::sync::OnceLock::new();
    ZONE.get_or_init(|| {
        let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
        let range = maps.lines().find(|l| l.ends_with("[stack]"))?;
        let (_, top) = range.split_whitespace().next()?.split_once('-')?;
        let top = u64::from_str_radix(top, 16).ok()?;
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes one rlimit, which `limit` is.
        let known = unsafe { libc::getrlimit(libc::RLIMIT_STACK, &mut limit) } == 0;
        let room = if known && limit.rlim_cur != libc::RLIM_INFINITY {
            limit.rlim_cur.clamp(STACK_ROOM_MIN, STACK_ROOM_MAX)
        } else {
            STACK_ROOM_MAX
        };
        Some(top.saturating_sub(room + STACK_GUARD)..top)
    })
    .clone()
}

/// Whether `[at, at + len)` reaches where the main thread's stack may grow (or cannot be told
/// not to): such a hint is not honoured.
fn near_stack(at: u64, len: u64) -> bool {
    let end = at.saturating_add(len);
    match stack_zone() {
        Some(zone) => at < zone.end && end > zone.start,
        None => true,
    }
}

impl HostRegion {
    /// Maps `len` bytes of a memfd sealed against shrinking, at `at` when that address is free
    /// here and clear of where the main thread's stack grows (device code may then use the
    /// client's own pointer), else wherever the kernel puts it.
    pub fn map(fd: &OwnedFd, len: u64, at: u64) -> Result<HostRegion, HostRegionError> {
        if !sealed(fd) {
            return Err(HostRegionError::NotSealed);
        }
        Self::map_file(fd, len, at, 0, false)
    }

    /// Maps what a client shares as page-locked memory: `len` bytes at `offset` of a memfd
    /// sealed against shrinking, or of a tmpfs file (which it may shrink: that mapping is
    /// guarded, see [`crate::shrink_guard`]), placed as [`HostRegion::map`] places it.
    pub fn map_client(
        fd: &OwnedFd,
        len: u64,
        at: u64,
        offset: u64,
    ) -> Result<HostRegion, HostRegionError> {
        if sealed(fd) {
            return Self::map_file(fd, len, at, offset, false);
        }
        let on_tmpfs = nix::sys::statfs::fstatfs(fd).is_ok_and(|s| {
            let t = s.filesystem_type();
            t == nix::sys::statfs::TMPFS_MAGIC || t == nix::sys::statfs::HUGETLBFS_MAGIC
        });
        let regular =
            nix::sys::stat::fstat(fd).is_ok_and(|s| s.st_mode & libc::S_IFMT == libc::S_IFREG);
        if !on_tmpfs || !regular {
            return Err(HostRegionError::NotSealed);
        }
        Self::map_file(fd, len, at, offset, true)
    }

    fn map_file(
        fd: &OwnedFd,
        len: u64,
        at: u64,
        offset: u64,
        shrinkable: bool,
    ) -> Result<HostRegion, HostRegionError> {
        use nix::sys::mman::{MapFlags, ProtFlags, mmap};
        if len == 0 || !len.is_multiple_of(4096) {
            return Err(HostRegionError::NotPages(len));
        }
        if !offset.is_multiple_of(4096) {
            return Err(HostRegionError::NotPages(offset));
        }
        let have = nix::sys::stat::fstat(fd)
            .map(|s| s.st_size as u64)
            .unwrap_or(0);
        let want = offset
            .checked_add(len)
            .ok_or(HostRegionError::NotPages(len))?;
        // A file that may shrink need only reach into the last page (NCCL registers a size
        // that is no whole number of pages); a sealed memfd must hold all of it.
        let reach = if shrinkable { want - 4095 } else { want };
        if have < reach {
            return Err(HostRegionError::TooShort { have, want });
        }
        let size =
            std::num::NonZeroUsize::new(len as usize).ok_or(HostRegionError::NotPages(len))?;
        let offset =
            libc::off_t::try_from(offset).map_err(|_| HostRegionError::NotPages(offset))?;
        let prot = ProtFlags::PROT_READ | ProtFlags::PROT_WRITE;
        // SAFETY: a new shared mapping of the file, wherever the kernel puts it.
        let anywhere = || unsafe { mmap(None, size, prot, MapFlags::MAP_SHARED, fd, offset) };
        // No hint means anywhere: MAP_FIXED_NOREPLACE at 0 would map page zero where allowed.
        let at = if near_stack(at, len) { 0 } else { at };
        let ptr = match std::num::NonZeroUsize::new(at as usize) {
            None => anywhere().map_err(HostRegionError::Map)?,
            Some(hint) => {
                // SAFETY: as above; MAP_FIXED_NOREPLACE never replaces a mapping of ours.
                let placed = unsafe {
                    mmap(
                        Some(hint),
                        size,
                        prot,
                        MapFlags::MAP_SHARED | MapFlags::MAP_FIXED_NOREPLACE,
                        fd,
                        offset,
                    )
                };
                match placed {
                    Ok(p) if p.as_ptr() as usize == hint.get() => p,
                    other => {
                        if let Ok(p) = other {
                            // SAFETY: the mapping just made, elsewhere than asked (old kernel).
                            let _ = unsafe { nix::sys::mman::munmap(p, len as usize) };
                        }
                        anywhere().map_err(HostRegionError::Map)?
                    }
                }
            }
        };
        let guard = if shrinkable {
            match crate::shrink_guard::guard(ptr.as_ptr() as usize, len as usize) {
                Ok(g) => Some(g),
                Err(e) => {
                    // SAFETY: the mapping just made, handed to no one.
                    let _ = unsafe { nix::sys::mman::munmap(ptr, len as usize) };
                    return Err(HostRegionError::Guard(e));
                }
            }
        } else {
            None
        };
        Ok(HostRegion {
            ptr: ptr.cast(),
            len: len as usize,
            id: next_region_id(),
            guard,
        })
    }

    /// Whether the client shrank the file under this mapping (its pages read zeros since).
    pub fn spoiled(&self) -> bool {
        self.guard.as_ref().is_some_and(|g| g.spoiled())
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// This region's id among the regions mapped here.
    pub fn id(&self) -> u64 {
        self.id
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The whole region, for registering it with a device.
    pub fn whole(&self) -> ArenaSlice<'_> {
        ArenaSlice {
            ptr: self.ptr,
            len: self.len,
            region: self.id,
            offset: 0,
            _region: std::marker::PhantomData,
        }
    }

    /// A checked view of `len` bytes at `offset`, or `None` if it leaves the region.
    pub fn slice(&self, offset: u64, len: u64) -> Option<ArenaSlice<'_>> {
        self.whole().part(offset, len)
    }
}

impl Drop for HostRegion {
    fn drop(&mut self) {
        if self.spoiled() {
            tracing::warn!(
                bytes = self.len,
                "a client shrank a file it shared as page-locked memory; its copies through it read zeros since"
            );
        }
        // SAFETY: our mapping, unmapped once; the device let go of it first (the session
        // unregisters before dropping).
        let _ = unsafe { nix::sys::mman::munmap(self.ptr.cast(), self.len) };
    }
}

impl<'a> ArenaSlice<'a> {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The region it lies in, and where: what a device call names.
    pub fn span(&self) -> Span {
        Span {
            region: self.region,
            offset: self.offset,
            len: self.len as u64,
        }
    }

    /// The `len` bytes at `offset` within it, or `None` if they leave it.
    pub fn part(self, offset: u64, len: u64) -> Option<ArenaSlice<'a>> {
        let end = offset.checked_add(len)?;
        if end > self.len as u64 {
            return None;
        }
        // SAFETY: inside this slice, so inside the mapping (checked).
        let ptr = unsafe { self.ptr.add(offset as usize) };
        Some(ArenaSlice {
            ptr,
            len: len as usize,
            region: self.region,
            offset: self.offset + offset,
            _region: std::marker::PhantomData,
        })
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

    /// Stores `value` in its first 4 bytes as one atomic word (release: what was written
    /// before it is seen by whoever sees it); unaligned or short, as plain bytes.
    pub fn store_u32(&self, value: u32) {
        if self.len >= 4 && self.ptr.as_ptr().align_offset(4) == 0 {
            // SAFETY: 4 aligned bytes inside the live mapping (checked at construction);
            // shared memory that both sides reach as atomics or plain bytes, never as a Rust
            // reference to non-atomic data.
            let word = unsafe { &*self.ptr.as_ptr().cast::<std::sync::atomic::AtomicU32>() };
            word.store(value, std::sync::atomic::Ordering::Release);
        } else {
            self.write_from(&value.to_le_bytes());
        }
    }

    /// Its first 4 bytes as an atomic word, for read-modify-write by several writers (`None`
    /// when short or unaligned).
    pub fn atomic_u32(&self) -> Option<&'a std::sync::atomic::AtomicU32> {
        if self.len >= 4 && self.ptr.as_ptr().align_offset(4) == 0 {
            // SAFETY: 4 aligned bytes inside the mapping, which lives as long as `'a`
            // (checked at construction); shared memory is only ever reached as atomics or
            // plain bytes, never as a Rust reference to non-atomic data.
            Some(unsafe { &*self.ptr.as_ptr().cast::<std::sync::atomic::AtomicU32>() })
        } else {
            None
        }
    }

    /// Its first 4 bytes as one atomic word (acquire: what was written before a
    /// [`ArenaSlice::store_u32`] of it is seen after).
    pub fn load_u32(&self) -> u32 {
        if self.len >= 4 && self.ptr.as_ptr().align_offset(4) == 0 {
            // SAFETY: as for `store_u32`.
            let word = unsafe { &*self.ptr.as_ptr().cast::<std::sync::atomic::AtomicU32>() };
            word.load(std::sync::atomic::Ordering::Acquire)
        } else {
            let mut bytes = [0u8; 4];
            self.read_into(&mut bytes);
            u32::from_le_bytes(bytes)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sealed_memfd(len: u64) -> OwnedFd {
        let fd = memfd_create("test", MFdFlags::MFD_ALLOW_SEALING).expect("memfd");
        nix::unistd::ftruncate(&fd, len as i64).expect("size");
        fcntl(fd.as_fd(), FcntlArg::F_ADD_SEALS(SealFlag::F_SEAL_SHRINK)).expect("seal");
        fd
    }

    #[test]
    fn a_region_never_lands_where_the_main_stack_grows() {
        let zone = stack_zone().expect("this process's stack");
        // Just below the stack as it is now, where nothing else is mapped.
        let maps = std::fs::read_to_string("/proc/self/maps").expect("maps");
        let stack = maps
            .lines()
            .find(|l| l.ends_with("[stack]"))
            .expect("[stack]");
        let (bottom, _) = stack.split_once('-').expect("a range");
        let below = u64::from_str_radix(bottom, 16).expect("hex") - 2 * 4096;
        assert!(near_stack(below, 8192), "just below the stack");
        assert!(near_stack(zone.start, 4096));
        assert!(!near_stack(zone.start - 8192, 8192), "below the zone");
        let region = HostRegion::map(&sealed_memfd(8192), 8192, below).expect("mapped");
        let at = region.whole().as_ptr() as u64;
        assert!(!zone.contains(&at), "placed at {at:#x}, in {zone:x?}");
    }

    #[test]
    fn a_free_address_far_from_the_stack_is_honoured() {
        // Somewhere free: map and unmap to find it.
        let probe = HostRegion::map(&sealed_memfd(8192), 8192, 0).expect("mapped");
        let at = probe.whole().as_ptr() as u64;
        drop(probe);
        let region = HostRegion::map(&sealed_memfd(8192), 8192, at).expect("mapped");
        assert_eq!(region.whole().as_ptr() as u64, at);
    }
}

//! Memory: device allocations the broker makes (against the user's quota) and page-locked
//! host memory shared with the broker, with what pointer queries need to know of both.
//!
//! Device addresses are the broker's; the process reserves each allocation's address range
//! (no access) in its own address space, so that no host mapping can ever land on a device
//! address and a pointer query can tell host from device memory, as with CUDA's unified
//! addressing. Page-locked host memory is a sealed memfd mapped here and in the broker, which
//! registers it with the device: copies to and from it are DMA.

use std::collections::BTreeMap;
use std::ffi::{c_int, c_uint, c_void};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::RwLock;

use gpushare_protocol::Command;
use gpushare_protocol::control::{BrokerMessage, ClientMessage, HostRegionGrant};

use crate::driver::{self, Driver, say_once};
use crate::status::{Cu, entry, from_error, out};
use crate::types::{CUcontext, CUdeviceptr, CUresult, host_mem, memory_type, ptr_attr, result};

/// What kind of device range an address is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceKind {
    /// An allocation the program made (`cuMemAlloc`).
    Allocation,
    /// A module's global variable.
    Global,
}

#[derive(Debug, Clone, Copy)]
pub struct DeviceRange {
    pub bytes: u64,
    pub kind: DeviceKind,
    /// Whether this process reserved the range in its own address space.
    reserved: bool,
    /// A number unique to the allocation (`CU_POINTER_ATTRIBUTE_BUFFER_ID`).
    pub buffer_id: u64,
}

/// A page-locked host range shared with the broker.
#[derive(Debug, Clone, Copy)]
pub struct HostRegion {
    pub len: usize,
    pub region: u32,
    pub device_ptr: u64,
    pub flags: u32,
    /// `cuMemHostRegister`ed memory of the program's (not ours to unmap).
    pub registered: bool,
}

/// Where a host pointer lies: in a shared region (`region`, offset), or in pageable memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostPlace {
    Shared { region: u32, offset: u64 },
    Pageable,
}

#[derive(Default)]
pub struct Memory {
    device: RwLock<BTreeMap<u64, DeviceRange>>,
    host: RwLock<BTreeMap<usize, HostRegion>>,
    next_buffer_id: std::sync::atomic::AtomicU64,
}

const PAGE: usize = 4096;

impl Memory {
    /// The device range `[ptr, ptr + len)` lies in, and its base.
    pub fn device_range(&self, ptr: u64, len: u64) -> Option<(u64, DeviceRange)> {
        let map = self.device.read().unwrap_or_else(|p| p.into_inner());
        let (&base, &range) = map.range(..=ptr).next_back()?;
        let end = ptr.checked_add(len)?;
        (end <= base.saturating_add(range.bytes) && ptr < base.saturating_add(range.bytes.max(1)))
            .then_some((base, range))
    }

    fn add_device(&self, ptr: u64, bytes: u64, kind: DeviceKind, reserved: bool) {
        let buffer_id = self
            .next_buffer_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1;
        self.device
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                ptr,
                DeviceRange {
                    bytes,
                    kind,
                    reserved,
                    buffer_id,
                },
            );
    }

    fn remove_device(&self, ptr: u64) -> Option<DeviceRange> {
        self.device
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&ptr)
    }

    /// Where host memory at `ptr` (for `len` bytes) lies.
    pub fn host_place(&self, ptr: usize, len: usize) -> HostPlace {
        let map = self.host.read().unwrap_or_else(|p| p.into_inner());
        match map.range(..=ptr).next_back() {
            Some((&base, r)) if ptr.checked_add(len).is_some_and(|end| end <= base + r.len) => {
                HostPlace::Shared {
                    region: r.region,
                    offset: (ptr - base) as u64,
                }
            }
            _ => HostPlace::Pageable,
        }
    }

    fn host_region_at(&self, ptr: usize) -> Option<(usize, HostRegion)> {
        let map = self.host.read().unwrap_or_else(|p| p.into_inner());
        let (&base, &r) = map.range(..=ptr).next_back()?;
        (ptr < base + r.len).then_some((base, r))
    }

    /// Bytes of device memory the program holds.
    pub fn allocated(&self) -> u64 {
        self.device
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .filter(|r| r.kind == DeviceKind::Allocation)
            .map(|r| r.bytes)
            .sum()
    }
}

/// Reserves `[ptr, ptr + bytes)` of this process's address space, inaccessible, so that no
/// host mapping lands there. `false` if any of it is in use.
fn reserve_range(ptr: u64, bytes: u64) -> bool {
    let len = (bytes.max(1) as usize).div_ceil(PAGE) * PAGE;
    if !(ptr as usize).is_multiple_of(PAGE) {
        return true; // cannot reserve a partial page; device allocations are page-aligned
    }
    // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping; PROT_NONE memory is
    // never touched.
    let got = unsafe {
        libc::mmap(
            ptr as *mut c_void,
            len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE
                | libc::MAP_ANONYMOUS
                | libc::MAP_NORESERVE
                | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        )
    };
    if got == libc::MAP_FAILED {
        return false;
    }
    if got as u64 != ptr {
        // An old kernel without MAP_FIXED_NOREPLACE placed it elsewhere: undo.
        // SAFETY: the mapping just made, and only it.
        unsafe { libc::munmap(got, len) };
        return false;
    }
    true
}

fn unreserve_range(ptr: u64, bytes: u64) {
    let len = (bytes.max(1) as usize).div_ceil(PAGE) * PAGE;
    // SAFETY: the range is the PROT_NONE reservation made by `reserve_range`.
    unsafe { libc::munmap(ptr as *mut c_void, len) };
}

/// How many times an allocation whose address collides with host memory is tried again.
const PLACEMENT_TRIES: usize = 8;

impl Driver {
    /// Allocates `bytes` of device memory through the broker and reserves its address.
    pub fn alloc(&self, bytes: u64) -> Cu<u64> {
        if bytes == 0 {
            return Err(result::INVALID_VALUE);
        }
        let mut colliding = Vec::new();
        let outcome = (|| {
            for _ in 0..PLACEMENT_TRIES {
                let (ptr, _) = self.transport.call(Command::Alloc { bytes })?;
                if reserve_range(ptr, bytes) {
                    self.memory
                        .add_device(ptr, bytes, DeviceKind::Allocation, true);
                    return Ok(ptr);
                }
                // The address is in use in this process: keep it held while asking again.
                colliding.push(ptr);
            }
            say_once("device addresses collide with this process's own memory; allocation refused");
            Err(result::OUT_OF_MEMORY)
        })();
        for ptr in colliding {
            let _ = self.transport.post(Command::Free { ptr });
        }
        outcome
    }

    /// Frees an allocation by its base address.
    pub fn free(&self, ptr: u64) -> Cu<()> {
        match self.memory.device_range(ptr, 0) {
            Some((base, r)) if base == ptr && r.kind == DeviceKind::Allocation => {}
            _ => return Err(result::INVALID_VALUE),
        }
        let range = self
            .memory
            .remove_device(ptr)
            .ok_or(result::INVALID_VALUE)?;
        self.transport.post(Command::Free { ptr })?;
        if range.reserved {
            unreserve_range(ptr, range.bytes);
        }
        Ok(())
    }

    /// Records a module global's device range (the broker placed it; copies may name it).
    pub fn note_global(&self, ptr: u64, bytes: u64) {
        if self.memory.device_range(ptr, bytes).is_none() {
            let reserved = reserve_range(ptr, bytes);
            self.memory
                .add_device(ptr, bytes, DeviceKind::Global, reserved);
        }
    }

    /// Shares page-locked host memory with the broker: a new mapping of `len` bytes, or (with
    /// `existing`) the program's own pages at that address, moved into a shared mapping with
    /// their contents.
    fn share_host(&self, len: usize, existing: Option<usize>, flags: u32) -> Cu<usize> {
        let len = len.max(1).div_ceil(PAGE) * PAGE;
        let fd = memfd(len)?;
        let addr = match existing {
            Some(at) => remap_shared(at, len, &fd)?,
            None => map_shared(len, &fd)?,
        };
        let grant = self.share_fd(&fd, len, addr);
        match grant {
            Ok(g) => {
                self.memory
                    .host
                    .write()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(
                        addr,
                        HostRegion {
                            len,
                            region: g.region,
                            device_ptr: g.device_ptr,
                            flags,
                            registered: existing.is_some(),
                        },
                    );
                Ok(addr)
            }
            Err(code) => {
                if existing.is_none() {
                    // SAFETY: the mapping made above, not handed out.
                    unsafe { libc::munmap(addr as *mut c_void, len) };
                }
                Err(code)
            }
        }
    }

    fn share_fd(&self, fd: &OwnedFd, len: usize, at: usize) -> Cu<HostRegionGrant> {
        let s = &self.transport.session;
        let reply = s
            .request(
                |request| ClientMessage::ShareHostMemory {
                    request,
                    bytes: len as u64,
                    at: at as u64,
                },
                &[fd.as_raw_fd()],
            )
            .map_err(|e| from_error(&e))?;
        match reply {
            BrokerMessage::HostShared { result: Ok(g), .. } => Ok(g),
            BrokerMessage::HostShared { result: Err(w), .. } => {
                Err(crate::status::from_code(w.code))
            }
            _ => Err(result::UNKNOWN),
        }
    }

    fn unshare_host(&self, addr: usize) -> Cu<HostRegion> {
        let r = self
            .memory
            .host
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&addr)
            .ok_or(result::INVALID_VALUE)?;
        // The broker must be done with copies from it before it goes.
        self.synchronize()?;
        let reply = self.transport.session.request(
            |request| ClientMessage::UnshareHostMemory {
                request,
                region: r.region,
            },
            &[],
        );
        match reply {
            Ok(BrokerMessage::HostUnshared { result: Ok(()), .. }) => Ok(r),
            Ok(BrokerMessage::HostUnshared { result: Err(w), .. }) => {
                Err(crate::status::from_code(w.code))
            }
            Ok(_) => Err(result::UNKNOWN),
            Err(e) => Err(from_error(&e)),
        }
    }
}

fn memfd(len: usize) -> Cu<OwnedFd> {
    use nix::fcntl::{FcntlArg, SealFlag, fcntl};
    use nix::sys::memfd::{MFdFlags, memfd_create};
    let fd = memfd_create(
        "gpushare-pinned",
        MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING,
    )
    .map_err(|_| result::OUT_OF_MEMORY)?;
    nix::unistd::ftruncate(&fd, len as i64).map_err(|_| result::OUT_OF_MEMORY)?;
    // The broker maps it too: it must never shrink under that mapping.
    fcntl(
        fd.as_fd(),
        FcntlArg::F_ADD_SEALS(
            SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SEAL,
        ),
    )
    .map_err(|_| result::OPERATING_SYSTEM)?;
    Ok(fd)
}

fn map_shared(len: usize, fd: &OwnedFd) -> Cu<usize> {
    // SAFETY: a new shared mapping of the memfd, wherever the kernel puts it.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(result::OUT_OF_MEMORY);
    }
    Ok(p as usize)
}

/// Moves the program's pages at `[at, at + len)` into the memfd, contents and address kept.
fn remap_shared(at: usize, len: usize, fd: &OwnedFd) -> Cu<usize> {
    if !at.is_multiple_of(PAGE) || !anonymous_private(at, len) {
        say_once(
            "cuMemHostRegister supports page-aligned ranges of the program's own anonymous memory only",
        );
        return Err(result::NOT_SUPPORTED);
    }
    let tmp = map_shared(len, fd)?;
    // SAFETY: `at..at+len` is readable anonymous memory of this process (checked above);
    // `tmp` is the fresh mapping of the memfd, `len` long.
    unsafe { std::ptr::copy_nonoverlapping(at as *const u8, tmp as *mut u8, len) };
    // SAFETY: MAP_FIXED replaces the program's anonymous pages at `at` with the shared pages
    // that now hold their contents.
    let p = unsafe {
        libc::mmap(
            at as *mut c_void,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_FIXED,
            fd.as_raw_fd(),
            0,
        )
    };
    // SAFETY: the temporary mapping made above.
    unsafe { libc::munmap(tmp as *mut c_void, len) };
    if p == libc::MAP_FAILED {
        return Err(result::OUT_OF_MEMORY);
    }
    Ok(at)
}

/// Whether `[at, at + len)` lies in private, anonymous, writable mappings (the heap, or
/// anonymous memory), by /proc/self/maps.
fn anonymous_private(at: usize, len: usize) -> bool {
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return false;
    };
    let end = at + len;
    let mut covered = at;
    for line in maps.lines() {
        let mut f = line.split_whitespace();
        let (Some(range), Some(perms)) = (f.next(), f.next()) else {
            continue;
        };
        let path = f.nth(3).unwrap_or("");
        let Some((lo, hi)) = range.split_once('-') else {
            continue;
        };
        let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
        else {
            continue;
        };
        if hi <= covered || lo > covered {
            continue;
        }
        let anonymous = path.is_empty() || path == "[heap]";
        if !anonymous || !perms.starts_with("rw") || perms.as_bytes().get(3) != Some(&b'p') {
            return false;
        }
        covered = hi;
        if covered >= end {
            return true;
        }
    }
    false
}

// ---- entry points --------------------------------------------------------------------

/// # Safety
/// `dptr` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytes: usize) -> CUresult {
    entry("cuMemAlloc_v2", || {
        let d = driver::live()?;
        let ptr = d.alloc(bytes as u64)?;
        // SAFETY: the caller's contract.
        unsafe { out(dptr, ptr) }
    })
}

/// Stream-ordered allocation, made at once (memory available earlier than asked is fine).
///
/// # Safety
/// `dptr` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocAsync(
    dptr: *mut CUdeviceptr,
    bytes: usize,
    _stream: *mut c_void,
) -> CUresult {
    // SAFETY: the same contract.
    unsafe { cuMemAlloc_v2(dptr, bytes) }
}

/// # Safety
/// `dptr` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocAsync_ptsz(
    dptr: *mut CUdeviceptr,
    bytes: usize,
    _stream: *mut c_void,
) -> CUresult {
    // SAFETY: the same contract.
    unsafe { cuMemAlloc_v2(dptr, bytes) }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemFree_v2(ptr: CUdeviceptr) -> CUresult {
    entry("cuMemFree_v2", || {
        let d = driver::live()?;
        if ptr == 0 {
            return Ok(());
        }
        d.free(ptr)
    })
}

/// Stream-ordered free: the broker frees once work before it is done (its free waits).
#[unsafe(no_mangle)]
pub extern "C" fn cuMemFreeAsync(ptr: CUdeviceptr, _stream: *mut c_void) -> CUresult {
    cuMemFree_v2(ptr)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemFreeAsync_ptsz(ptr: CUdeviceptr, _stream: *mut c_void) -> CUresult {
    cuMemFree_v2(ptr)
}

/// # Safety
/// `free` and `total` are NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    entry("cuMemGetInfo_v2", || {
        let d = driver::live()?;
        let (f, t) = d.transport.call(Command::MemInfo)?;
        // SAFETY: the caller's contract.
        unsafe {
            out(free, f as usize)?;
            out(total, t as usize)
        }
    })
}

/// # Safety
/// `base` and `size` are NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetAddressRange_v2(
    base: *mut CUdeviceptr,
    size: *mut usize,
    ptr: CUdeviceptr,
) -> CUresult {
    entry("cuMemGetAddressRange_v2", || {
        let d = driver::live()?;
        let (b, r) = d.memory.device_range(ptr, 0).ok_or(result::NOT_FOUND)?;
        // SAFETY: each is NULL (allowed) or writable, by the caller's contract.
        unsafe {
            if !base.is_null() {
                out(base, b)?;
            }
            if !size.is_null() {
                out(size, r.bytes as usize)?;
            }
        }
        Ok(())
    })
}

/// # Safety
/// `pp` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemHostAlloc(
    pp: *mut *mut c_void,
    bytes: usize,
    flags: c_uint,
) -> CUresult {
    entry("cuMemHostAlloc", || {
        let d = driver::live()?;
        if pp.is_null() {
            return Err(result::INVALID_VALUE);
        }
        let addr = d.share_host(bytes, None, flags)?;
        // SAFETY: checked non-NULL; the caller's contract.
        unsafe { out(pp, addr as *mut c_void) }
    })
}

/// # Safety
/// `pp` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocHost_v2(pp: *mut *mut c_void, bytes: usize) -> CUresult {
    // SAFETY: the same contract.
    unsafe { cuMemHostAlloc(pp, bytes, 0) }
}

/// # Safety
/// `p` is NULL or memory from `cuMemHostAlloc` the program no longer uses.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFreeHost(p: *mut c_void) -> CUresult {
    entry("cuMemFreeHost", || {
        let d = driver::live()?;
        let addr = p as usize;
        match d.memory.host_region_at(addr) {
            Some((base, r)) if base == addr && !r.registered => {}
            _ => return Err(result::INVALID_VALUE),
        }
        let r = d.unshare_host(addr)?;
        // SAFETY: the region's whole mapping, made by `cuMemHostAlloc` and now forgotten.
        unsafe { libc::munmap(p, r.len) };
        Ok(())
    })
}

/// # Safety
/// `p` points to `bytes` bytes of the program's memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemHostRegister_v2(
    p: *mut c_void,
    bytes: usize,
    flags: c_uint,
) -> CUresult {
    entry("cuMemHostRegister_v2", || {
        let d = driver::live()?;
        if p.is_null() || bytes == 0 {
            return Err(result::INVALID_VALUE);
        }
        if flags & host_mem::REGISTER_IOMEMORY != 0 {
            say_once("cuMemHostRegister of I/O memory is not supported");
            return Err(result::NOT_SUPPORTED);
        }
        let start = p as usize / PAGE * PAGE;
        let end = (p as usize + bytes).div_ceil(PAGE) * PAGE;
        if d.memory.host_region_at(start).is_some() || d.memory.host_region_at(end - 1).is_some() {
            return Err(result::HOST_MEMORY_ALREADY_REGISTERED);
        }
        d.share_host(end - start, Some(start), flags).map(drop)
    })
}

/// # Safety
/// As `cuMemHostRegister_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemHostRegister(
    p: *mut c_void,
    bytes: usize,
    flags: c_uint,
) -> CUresult {
    // SAFETY: the same contract.
    unsafe { cuMemHostRegister_v2(p, bytes, flags) }
}

/// The pages stay shared (they hold the program's data); the broker lets go of them.
#[unsafe(no_mangle)]
pub extern "C" fn cuMemHostUnregister(p: *mut c_void) -> CUresult {
    entry("cuMemHostUnregister", || {
        let d = driver::live()?;
        let addr = p as usize / PAGE * PAGE;
        match d.memory.host_region_at(addr) {
            Some((base, r)) if base == addr && r.registered => {}
            _ => return Err(result::HOST_MEMORY_NOT_REGISTERED),
        }
        d.unshare_host(addr).map(drop)
    })
}

/// # Safety
/// `dptr` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemHostGetDevicePointer_v2(
    dptr: *mut CUdeviceptr,
    p: *mut c_void,
    flags: c_uint,
) -> CUresult {
    entry("cuMemHostGetDevicePointer_v2", || {
        let d = driver::live()?;
        if flags != 0 {
            return Err(result::INVALID_VALUE);
        }
        let (base, r) = d
            .memory
            .host_region_at(p as usize)
            .ok_or(result::INVALID_VALUE)?;
        // SAFETY: the caller's contract.
        unsafe { out(dptr, r.device_ptr + (p as usize - base) as u64) }
    })
}

/// # Safety
/// `flags` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemHostGetFlags(flags: *mut c_uint, p: *mut c_void) -> CUresult {
    entry("cuMemHostGetFlags", || {
        let d = driver::live()?;
        let (_, r) = d
            .memory
            .host_region_at(p as usize)
            .ok_or(result::INVALID_VALUE)?;
        // SAFETY: the caller's contract.
        unsafe { out(flags, r.flags | host_mem::DEVICEMAP) }
    })
}

/// Managed (unified) memory needs page faults served across processes: not supported.
#[unsafe(no_mangle)]
pub extern "C" fn cuMemAllocManaged(
    _dptr: *mut CUdeviceptr,
    _bytes: usize,
    _flags: c_uint,
) -> CUresult {
    crate::entry::unsupported("cuMemAllocManaged")
}

/// Where a pointer points, for pointer queries.
enum Pointee {
    Device { base: u64, range: DeviceRange },
    Host { base: usize, region: HostRegion },
    Unknown,
}

fn pointee(d: &Driver, ptr: u64) -> Pointee {
    if let Some((base, range)) = d.memory.device_range(ptr, 0) {
        return Pointee::Device { base, range };
    }
    match d.memory.host_region_at(ptr as usize) {
        Some((base, region)) => Pointee::Host { base, region },
        None => Pointee::Unknown,
    }
}

/// One pointer attribute's value, written to `data`; `None` when the pointer has no such
/// attribute.
///
/// # Safety
/// `data` is valid for writing the attribute's type.
unsafe fn write_attribute(
    d: &Driver,
    attr: c_int,
    p: &Pointee,
    ptr: u64,
    data: *mut c_void,
) -> Cu<bool> {
    // SAFETY: every write below is to `data`, valid for the attribute's type per the contract.
    unsafe {
        let ctx: CUcontext = d.contexts.primary();
        match (attr, p) {
            (ptr_attr::MEMORY_TYPE, Pointee::Device { .. }) => {
                data.cast::<c_uint>().write(memory_type::DEVICE)
            }
            (ptr_attr::MEMORY_TYPE, Pointee::Host { .. }) => {
                data.cast::<c_uint>().write(memory_type::HOST)
            }
            (ptr_attr::CONTEXT, Pointee::Device { .. } | Pointee::Host { .. }) => {
                data.cast::<CUcontext>().write(ctx)
            }
            (ptr_attr::DEVICE_POINTER, Pointee::Device { .. }) => data.cast::<u64>().write(ptr),
            (ptr_attr::DEVICE_POINTER, Pointee::Host { base, region }) => data
                .cast::<u64>()
                .write(region.device_ptr + (ptr as usize - base) as u64),
            (ptr_attr::HOST_POINTER, Pointee::Host { .. }) => {
                data.cast::<*mut c_void>().write(ptr as *mut c_void)
            }
            (ptr_attr::HOST_POINTER, Pointee::Device { .. }) => return Err(result::INVALID_VALUE),
            (ptr_attr::SYNC_MEMOPS, Pointee::Device { .. }) => data.cast::<c_int>().write(1),
            (ptr_attr::BUFFER_ID, Pointee::Device { range, .. }) => {
                data.cast::<u64>().write(range.buffer_id)
            }
            (ptr_attr::IS_MANAGED, Pointee::Device { .. } | Pointee::Host { .. }) => {
                data.cast::<c_int>().write(0)
            }
            (ptr_attr::DEVICE_ORDINAL, Pointee::Device { .. } | Pointee::Host { .. }) => {
                data.cast::<c_int>().write(0)
            }
            (
                ptr_attr::IS_LEGACY_CUDA_IPC_CAPABLE | ptr_attr::IS_GPU_DIRECT_RDMA_CAPABLE,
                Pointee::Device { .. },
            ) => data.cast::<c_int>().write(0),
            (ptr_attr::RANGE_START_ADDR, Pointee::Device { base, .. }) => {
                data.cast::<u64>().write(*base)
            }
            (ptr_attr::RANGE_START_ADDR, Pointee::Host { base, .. }) => {
                data.cast::<u64>().write(*base as u64)
            }
            (ptr_attr::RANGE_SIZE, Pointee::Device { range, .. }) => {
                data.cast::<usize>().write(range.bytes as usize)
            }
            (ptr_attr::RANGE_SIZE, Pointee::Host { region, .. }) => {
                data.cast::<usize>().write(region.len)
            }
            (ptr_attr::MAPPED, Pointee::Device { .. } | Pointee::Host { .. }) => {
                data.cast::<c_int>().write(1)
            }
            (ptr_attr::MEMPOOL_HANDLE, Pointee::Device { .. }) => {
                data.cast::<*mut c_void>().write(std::ptr::null_mut())
            }
            (ptr_attr::ALLOWED_HANDLE_TYPES | ptr_attr::ACCESS_FLAGS, Pointee::Device { .. }) => {
                data.cast::<u64>().write(0)
            }
            (ptr_attr::MEMORY_BLOCK_ID, Pointee::Device { range, .. }) => {
                data.cast::<u64>().write(range.buffer_id)
            }
            (ptr_attr::MAPPING_BASE_ADDR, Pointee::Device { base, .. }) => {
                data.cast::<u64>().write(*base)
            }
            (ptr_attr::MAPPING_SIZE, Pointee::Device { range, .. }) => {
                data.cast::<usize>().write(range.bytes as usize)
            }
            (ptr_attr::P2P_TOKENS, _) => return Err(result::NOT_SUPPORTED),
            _ => return Ok(false),
        }
    }
    Ok(true)
}

/// # Safety
/// `data` is valid for writing the attribute's type.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuPointerGetAttribute(
    data: *mut c_void,
    attr: c_int,
    ptr: CUdeviceptr,
) -> CUresult {
    entry("cuPointerGetAttribute", || {
        let d = driver::get()?;
        if data.is_null() {
            return Err(result::INVALID_VALUE);
        }
        let p = pointee(d, ptr);
        if matches!(p, Pointee::Unknown) {
            return Err(result::INVALID_VALUE);
        }
        // SAFETY: the caller's contract.
        match unsafe { write_attribute(d, attr, &p, ptr, data) }? {
            true => Ok(()),
            false => Err(result::INVALID_VALUE),
        }
    })
}

/// Unknown pointers (pageable host memory) answer with zeros, as CUDA does.
///
/// # Safety
/// `attrs` holds `n` attributes and `data` `n` pointers, each valid for its attribute's type.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuPointerGetAttributes(
    n: c_uint,
    attrs: *const c_int,
    data: *mut *mut c_void,
    ptr: CUdeviceptr,
) -> CUresult {
    entry("cuPointerGetAttributes", || {
        let d = driver::get()?;
        if attrs.is_null() || data.is_null() {
            return Err(result::INVALID_VALUE);
        }
        let p = pointee(d, ptr);
        for i in 0..n as usize {
            // SAFETY: `i < n`, within both arrays by the caller's contract.
            let (attr, slot) = unsafe { (*attrs.add(i), *data.add(i)) };
            if slot.is_null() {
                continue;
            }
            // SAFETY: `slot` is valid for the attribute's type, by the contract.
            let written = unsafe { write_attribute(d, attr, &p, ptr, slot) }.unwrap_or(false);
            if !written {
                // SAFETY: as above; CUDA zeroes what does not apply (8 bytes covers every
                // attribute type, and each slot is at least that large).
                unsafe { slot.cast::<u64>().write(0) };
            }
        }
        Ok(())
    })
}

/// Sets an allocation attribute: only SYNC_MEMOPS, which this driver's copies always honour.
#[unsafe(no_mangle)]
pub extern "C" fn cuPointerSetAttribute(
    _value: *const c_void,
    attr: c_int,
    ptr: CUdeviceptr,
) -> CUresult {
    entry("cuPointerSetAttribute", || {
        let d = driver::live()?;
        d.memory.device_range(ptr, 0).ok_or(result::INVALID_VALUE)?;
        if attr == ptr_attr::SYNC_MEMOPS {
            Ok(())
        } else {
            Err(result::INVALID_VALUE)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_ranges_are_found_by_any_address_inside() {
        let m = Memory::default();
        m.add_device(0x1000_0000, 4096, DeviceKind::Allocation, false);
        m.add_device(0x2000_0000, 64, DeviceKind::Global, false);
        assert_eq!(
            m.device_range(0x1000_0000, 4096).map(|r| r.0),
            Some(0x1000_0000)
        );
        assert_eq!(
            m.device_range(0x1000_0fff, 1).map(|r| r.0),
            Some(0x1000_0000)
        );
        assert!(
            m.device_range(0x1000_0fff, 2).is_none(),
            "runs past the end"
        );
        assert!(m.device_range(0x1000_1000, 0).is_none());
        assert!(m.device_range(0x0fff_ffff, 1).is_none());
        assert_eq!(
            m.allocated(),
            4096,
            "globals are not the program's allocations"
        );
        assert!(m.remove_device(0x1000_0000).is_some());
        assert!(m.device_range(0x1000_0000, 1).is_none());
    }

    #[test]
    fn host_places_are_shared_only_inside_a_region() {
        let m = Memory::default();
        m.host.write().expect("lock").insert(
            0x7f00_0000_0000,
            HostRegion {
                len: 8192,
                region: 3,
                device_ptr: 0x7f00_0000_0000,
                flags: 0,
                registered: false,
            },
        );
        assert_eq!(
            m.host_place(0x7f00_0000_1000, 4096),
            HostPlace::Shared {
                region: 3,
                offset: 4096
            }
        );
        assert_eq!(m.host_place(0x7f00_0000_1000, 4097), HostPlace::Pageable);
        assert_eq!(m.host_place(0x1234, 1), HostPlace::Pageable);
    }

    #[test]
    fn a_reserved_range_keeps_host_mappings_out() {
        // Somewhere free: map and unmap to find it.
        let len = 1 << 20;
        // SAFETY: a throwaway mapping, unmapped at once.
        let probe = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(probe, libc::MAP_FAILED);
        // SAFETY: as above.
        unsafe { libc::munmap(probe, len) };
        let at = probe as u64;
        assert!(reserve_range(at, len as u64));
        assert!(!reserve_range(at, 4096), "taken now");
        unreserve_range(at, len as u64);
        assert!(reserve_range(at, 4096), "free again");
        unreserve_range(at, 4096);
    }

    #[test]
    fn only_anonymous_private_memory_can_be_registered() {
        let v = vec![0u8; 3 * PAGE];
        let page = (v.as_ptr() as usize).div_ceil(PAGE) * PAGE;
        assert!(anonymous_private(page, PAGE), "the heap");
        let text = anonymous_private as *const () as usize / PAGE * PAGE;
        assert!(!anonymous_private(text, PAGE), "code is file-backed");
    }
}

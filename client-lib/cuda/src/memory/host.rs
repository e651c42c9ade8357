//! Page-locked host memory: a sealed memfd mapped here and in the broker, which registers
//! it with the device. `cuMemHostAlloc` maps a new one; `cuMemHostRegister` moves the
//! program's own pages into one, contents and address kept.

use std::ffi::c_void;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use gpushare_protocol::control::{BrokerMessage, ClientMessage, HostRegionGrant};

use super::{HostRegion, PAGE, Pages, shared_file};
use crate::driver::Driver;
use crate::log::say_once;
use crate::status::{Cu, from_error};
use crate::types::result;
use gpushare_protocol::Command;

/// A file shared with gpushared as page-locked memory: `len` bytes (whole pages) from
/// `offset`.
pub(crate) struct HostFile {
    pub file: OwnedFd,
    pub offset: u64,
    pub len: usize,
    pub pages: Pages,
}

impl Driver {
    /// Shares page-locked host memory with the broker: a new mapping of `len` bytes, or (with
    /// `existing`) the program's own pages at that address (see `program_pages`). Its address
    /// and its file.
    pub(super) fn share_host(
        &self,
        len: usize,
        existing: Option<usize>,
        flags: u32,
    ) -> Cu<(usize, HostFile)> {
        // More than the address space holds: no memory for it.
        let len = len
            .max(1)
            .checked_next_multiple_of(PAGE)
            .ok_or(result::OUT_OF_MEMORY)?;
        let (addr, file) = match existing {
            Some(at) => (at, program_pages(at, len)?),
            None => {
                let file = memfd(len)?;
                let addr = map_shared(len, &file)?;
                let pages = Pages::Allocated;
                (
                    addr,
                    HostFile {
                        file,
                        offset: 0,
                        len,
                        pages,
                    },
                )
            }
        };
        match self.share_region(&file, addr, flags) {
            Ok(()) => Ok((addr, file)),
            Err(code) => {
                // The program's memory as it was.
                match file.pages {
                    Pages::Allocated => {
                        // SAFETY: the mapping made above, not handed out.
                        unsafe { libc::munmap(addr as *mut c_void, len) };
                    }
                    Pages::Moved => {
                        make_private(addr, len);
                    }
                    Pages::Mapped => {}
                }
                Err(code)
            }
        }
    }

    /// Shares `f`, mapped at `addr`, with this device's session, and records it.
    pub(super) fn share_region(&self, f: &HostFile, addr: usize, flags: u32) -> Cu<()> {
        let g = self.share_fd(f, addr)?;
        self.memory
            .host
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                addr,
                HostRegion {
                    len: f.len,
                    region: g.region,
                    device_ptr: g.device_ptr,
                    flags,
                    pages: f.pages,
                },
            );
        Ok(())
    }

    /// A page of page-locked host memory shared with gpushared for the driver's own use:
    /// where the program reaches it, and where the device does.
    pub(crate) fn shared_page(&self) -> Cu<(usize, u64)> {
        let (addr, _file) = self.share_host(PAGE, None, 0)?;
        let device = self
            .memory
            .host
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&addr)
            .map(|r| r.device_ptr)
            .ok_or(result::UNKNOWN)?;
        Ok((addr, device))
    }

    fn share_fd(&self, f: &HostFile, at: usize) -> Cu<HostRegionGrant> {
        let s = &self.transport.session;
        let reply = s
            .request(
                |request| ClientMessage::ShareHostMemory {
                    request,
                    bytes: f.len as u64,
                    at: at as u64,
                    offset: f.offset,
                },
                &[f.file.as_raw_fd()],
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

    /// Takes a region back from the broker once the program's work is done with it. On an
    /// error nothing changed: the region stays shared, and the call may be made again.
    pub(super) fn unshare_host(&self, addr: usize) -> Cu<HostRegion> {
        // Out of the table first, so that no new copy names it.
        let r = self
            .memory
            .host
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&addr)
            .ok_or(result::INVALID_VALUE)?;
        let put_back = |code| {
            self.memory
                .host
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .insert(addr, r);
            code
        };
        // The broker must be done with copies from it before it goes. An error of earlier work
        // is not this call's: it stays for the next call that reports such errors.
        if let Err(code) = self.transport.call(Command::ClientSync) {
            self.notice_loss(code);
            return Err(put_back(code));
        }
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
                Err(put_back(crate::status::from_code(w.code)))
            }
            Ok(_) => Err(put_back(result::UNKNOWN)),
            Err(e) => Err(put_back(from_error(&e))),
        }
    }
}

/// Replaces the shared mapping at `[addr, addr + len)` with private memory holding the same
/// bytes (as of the copy: another thread may write meanwhile), as the program's memory was
/// before `cuMemHostRegister`. False, and left shared, where no memory is left for the copy.
pub(crate) fn make_private(addr: usize, len: usize) -> bool {
    let prot = libc::PROT_READ | libc::PROT_WRITE;
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
    // SAFETY: a fresh anonymous mapping; `addr..addr + len` is mapped (the driver's own
    // shared mapping of a registered range), and replaced whole by one of the same length.
    unsafe {
        let copy = libc::mmap(std::ptr::null_mut(), len, prot, flags, -1, 0);
        if copy == libc::MAP_FAILED {
            return false;
        }
        std::ptr::copy_nonoverlapping(addr as *const u8, copy.cast::<u8>(), len);
        let fixed = libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED;
        if libc::mremap(copy, len, len, fixed, addr as *mut c_void) == libc::MAP_FAILED {
            libc::munmap(copy, len);
            return false;
        }
    }
    true
}

fn memfd(len: usize) -> Cu<OwnedFd> {
    use nix::fcntl::{FcntlArg, SealFlag, fcntl};
    use nix::sys::memfd::{MFdFlags, memfd_create};
    let fd = memfd_create(
        "gpushare-pinned",
        MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING,
    )
    .map_err(|_| result::OUT_OF_MEMORY)?;
    let size = i64::try_from(len).map_err(|_| result::OUT_OF_MEMORY)?;
    nix::unistd::ftruncate(&fd, size).map_err(|_| result::OUT_OF_MEMORY)?;
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

/// The program's pages at `[at, at + len)` as gpushared can share them: its anonymous memory
/// moved into a memfd of ours (contents and address kept), or the tmpfs file it maps shared
/// there, as it is (see `shared_file`).
fn program_pages(at: usize, len: usize) -> Cu<HostFile> {
    const WHAT_REGISTERS: &str = "cuMemHostRegister supports page-aligned ranges of the program's anonymous memory and of its shared mappings of tmpfs files only";
    let refuse = |line: &'static str| {
        say_once(line);
        Err(result::NOT_SUPPORTED)
    };
    let over = match shared_file::mappings_over(at, len) {
        Some(over) if at.is_multiple_of(PAGE) => over,
        _ => {
            return refuse(WHAT_REGISTERS);
        }
    };
    if over.iter().all(|m| m.anonymous_rw) {
        let file = memfd(len)?;
        remap_shared(at, len, &file)?;
        let pages = Pages::Moved;
        return Ok(HostFile {
            file,
            offset: 0,
            len,
            pages,
        });
    }
    match over.as_slice() {
        [m] if m.shared_rw => {
            let Some(file) = shared_file::open(m) else {
                return refuse(
                    "cuMemHostRegister: the file behind a shared mapping cannot be opened again",
                );
            };
            if !shared_file::on_tmpfs(&file) {
                return refuse(
                    "cuMemHostRegister supports shared mappings of tmpfs files (/dev/shm, memfd) only",
                );
            }
            let offset = m.offset + (at - m.start) as u64;
            let pages = Pages::Mapped;
            Ok(HostFile {
                file,
                offset,
                len,
                pages,
            })
        }
        _ => refuse(WHAT_REGISTERS),
    }
}

/// Moves the program's anonymous pages at `[at, at + len)` into the memfd, contents and
/// address kept.
fn remap_shared(at: usize, len: usize, fd: &OwnedFd) -> Cu<()> {
    let tmp = map_shared(len, fd)?;
    // SAFETY: `at..at+len` is readable anonymous memory of this process (the caller checked);
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
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_heap_moves_and_code_is_refused() {
        let v = vec![0u8; 3 * PAGE];
        let page = (v.as_ptr() as usize).div_ceil(PAGE) * PAGE;
        let over = shared_file::mappings_over(page, PAGE).expect("mapped");
        assert!(over.iter().all(|m| m.anonymous_rw), "the heap");
        let text = program_pages as *const () as usize / PAGE * PAGE;
        assert_eq!(
            program_pages(text, PAGE).err(),
            Some(result::NOT_SUPPORTED),
            "code is a private file mapping"
        );
    }

    #[test]
    fn the_shared_file_never_changes_size_under_the_brokers_mapping() {
        let fd = memfd(2 * PAGE).expect("memfd");
        assert!(nix::unistd::ftruncate(&fd, PAGE as i64).is_err(), "sealed");
        assert!(
            nix::unistd::ftruncate(&fd, 4 * PAGE as i64).is_err(),
            "sealed"
        );
    }

    #[test]
    fn registering_moves_pages_into_the_shared_file_keeping_contents_and_address() {
        let len = 2 * PAGE;
        // SAFETY: a fresh private anonymous mapping: program memory as cuMemHostRegister sees it.
        let at = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(at, libc::MAP_FAILED);
        let at = at as usize;
        for i in 0..len {
            // SAFETY: inside the mapping above.
            unsafe { (at as *mut u8).add(i).write_volatile(i as u8) };
        }
        let fd = memfd(len).expect("memfd");
        assert_eq!(remap_shared(at, len, &fd), Ok(()), "same address");
        // SAFETY: the remapped range, `len` long.
        let kept = (0..len).all(|i| unsafe { (at as *const u8).add(i).read_volatile() } == i as u8);
        assert!(kept, "same contents");
        // What the broker writes through its own mapping of the file shows at the address.
        let other = map_shared(len, &fd).expect("map");
        // SAFETY: the second mapping, `len` long.
        unsafe { (other as *mut u8).add(PAGE).write_volatile(0xab) };
        // SAFETY: inside the remapped range.
        assert_eq!(unsafe { (at as *const u8).add(PAGE).read_volatile() }, 0xab);
        // SAFETY: both mappings made here, no longer used.
        unsafe {
            libc::munmap(other as *mut c_void, len);
            libc::munmap(at as *mut c_void, len);
        }
    }

    #[test]
    fn registering_part_of_a_page_is_refused() {
        let v = vec![0u8; 3 * PAGE];
        let page = (v.as_ptr() as usize).div_ceil(PAGE) * PAGE;
        assert_eq!(
            program_pages(page + 8, PAGE).err(),
            Some(result::NOT_SUPPORTED)
        );
    }
}

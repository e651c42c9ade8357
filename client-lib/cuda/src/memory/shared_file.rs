//! The program's shared mapping of a tmpfs file (`/dev/shm`, a memfd), which
//! `cuMemHostRegister` shares with gpushared as it is: other processes map the same file (NCCL's
//! shared-memory transport registers a `/dev/shm` buffer that its peer process maps too), so
//! its pages cannot move into a memfd of ours. The file is found by /proc/self/maps and opened
//! again, by its path or among the process's descriptors, and checked to be the same file.

use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;

/// What the mapping at an address is.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Mapping {
    /// `[start, end)` of the mapping.
    pub start: usize,
    pub end: usize,
    /// Readable, writable and shared.
    pub shared_rw: bool,
    /// Private, anonymous and writable (the heap, or anonymous memory).
    pub anonymous_rw: bool,
    /// The file's offset at `start`, its device and inode, and its path as the kernel shows it.
    pub offset: u64,
    pub device: (u32, u32),
    pub inode: u64,
    pub path: String,
}

/// Parses one line of /proc/self/maps.
fn parse(line: &str) -> Option<Mapping> {
    let mut f = line.split_whitespace();
    let (lo, hi) = f.next()?.split_once('-')?;
    let perms = f.next()?.as_bytes();
    let offset = u64::from_str_radix(f.next()?, 16).ok()?;
    let (major, minor) = f.next()?.split_once(':')?;
    let inode = f.next()?.parse().ok()?;
    let path = f.collect::<Vec<_>>().join(" ");
    let rw = perms.starts_with(b"rw");
    let anonymous = path.is_empty() || path == "[heap]";
    Some(Mapping {
        start: usize::from_str_radix(lo, 16).ok()?,
        end: usize::from_str_radix(hi, 16).ok()?,
        shared_rw: rw && perms.get(3) == Some(&b's'),
        anonymous_rw: rw && perms.get(3) == Some(&b'p') && anonymous,
        offset,
        device: (
            u32::from_str_radix(major, 16).ok()?,
            u32::from_str_radix(minor, 16).ok()?,
        ),
        inode,
        path,
    })
}

/// The mappings that cover `[at, at + len)`, in order, or `None` where a gap leaves part of it
/// unmapped.
pub(super) fn mappings_over(at: usize, len: usize) -> Option<Vec<Mapping>> {
    // The file is read a page at a time: another thread's mmap or munmap meanwhile can show a
    // range moving, so a gap is looked at again before it is believed.
    (0..3).find_map(|_| mappings_once(at, len))
}

fn mappings_once(at: usize, len: usize) -> Option<Vec<Mapping>> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    let end = at.checked_add(len)?;
    let mut covered = at;
    let mut found = Vec::new();
    for m in maps.lines().filter_map(parse) {
        if m.end <= covered || m.start > covered {
            continue;
        }
        covered = m.end;
        found.push(m);
        if covered >= end {
            return Some(found);
        }
    }
    None
}

/// The file behind a shared mapping, opened for reading and writing: by its path, else among
/// this process's descriptors (a memfd, a file since removed), else (privileged) through the
/// mapping itself. `None` if none of them is the file.
pub(super) fn open(m: &Mapping) -> Option<OwnedFd> {
    let same = |meta: &std::fs::Metadata| {
        meta.ino() == m.inode && meta.dev() == libc::makedev(m.device.0, m.device.1)
    };
    let open_rw = |path: &std::path::Path| {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .ok()
            .filter(|f| f.metadata().is_ok_and(|meta| same(&meta)))
            .map(OwnedFd::from)
    };
    let by_path = m.path.starts_with('/') && !m.path.ends_with(" (deleted)");
    if let Some(fd) = by_path
        .then(|| open_rw(std::path::Path::new(&m.path)))
        .flatten()
    {
        return Some(fd);
    }
    let fds = std::fs::read_dir("/proc/self/fd").ok()?;
    let open_fd = fds
        .flatten()
        .filter(|e| std::fs::metadata(e.path()).is_ok_and(|meta| same(&meta)))
        .find_map(|e| open_rw(&e.path()));
    // The mapping itself names the file to a privileged process.
    open_fd.or_else(|| {
        let link = format!("/proc/self/map_files/{:x}-{:x}", m.start, m.end);
        open_rw(std::path::Path::new(&link))
    })
}

/// Whether `fd` is a file on tmpfs or hugetlbfs (what gpushared takes unsealed).
pub(super) fn on_tmpfs(fd: &OwnedFd) -> bool {
    use nix::sys::statfs::{HUGETLBFS_MAGIC, TMPFS_MAGIC, fstatfs};
    fstatfs(fd).is_ok_and(|s| [TMPFS_MAGIC, HUGETLBFS_MAGIC].contains(&s.filesystem_type()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn a_maps_line_reads_as_its_mapping() {
        let m = parse("7f0000000000-7f0000002000 rw-s 00003000 00:1a 12345   /dev/shm/nccl-ab cd")
            .expect("parsed");
        assert_eq!((m.start, m.end), (0x7f00_0000_0000, 0x7f00_0000_2000));
        assert!(m.shared_rw && !m.anonymous_rw);
        assert_eq!((m.offset, m.device, m.inode), (0x3000, (0, 0x1a), 12345));
        assert_eq!(m.path, "/dev/shm/nccl-ab cd");
        let heap = parse("55d0c0000000-55d0c0021000 rw-p 00000000 00:00 0 [heap]").expect("heap");
        assert!(heap.anonymous_rw && !heap.shared_rw);
    }

    #[test]
    fn a_shared_tmpfs_mapping_is_found_and_opened_again() {
        // A removed /dev/shm file (no dev-dependency for it: a test-only dependency would
        // build the driver a second way, which the integration tests would then meet).
        let path = format!("/dev/shm/gpushare-unit-{}", std::process::id());
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .expect("a tmpfs file");
        std::fs::remove_file(&path).expect("removed");
        file.set_len(3 * 4096).expect("size");
        // SAFETY: a fresh shared mapping of the file, from its second page.
        let at = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                2 * 4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                4096,
            )
        };
        assert_ne!(at, libc::MAP_FAILED);
        let over = mappings_over(at as usize + 4096, 4096).expect("mapped");
        assert_eq!(over.len(), 1);
        assert!(over[0].shared_rw);
        assert_eq!(over[0].offset, 4096);
        let fd = open(&over[0]).expect("the removed file, found among the descriptors");
        assert!(on_tmpfs(&fd));
        // SAFETY: the mapping made above.
        unsafe { libc::munmap(at, 2 * 4096) };
    }
}

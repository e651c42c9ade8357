//! Descriptors opened before the programs were attached: found by walking `/proc/*/fd`.
//!
//! The eBPF programs learn GPU descriptors from `open*`/`dup*` as they happen; a process that
//! opened `/dev/nvidia*` before the broker started would stay invisible without this walk.

use std::fs;
use std::os::unix::ffi::OsStrExt as _;
use std::path::Path;

/// One open descriptor whose target is under the prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeedFd {
    pub pid: u32,
    pub fd: u32,
}

/// Every descriptor of every process under `proc_root` (normally `/proc`) whose link target
/// starts with `prefix`. Processes that exit or deny access during the walk are skipped: this
/// is a best-effort snapshot of a moving system.
pub fn gpu_fds(proc_root: &Path, prefix: &str) -> Vec<SeedFd> {
    let mut found = Vec::new();
    let Ok(procs) = fs::read_dir(proc_root) else {
        return found;
    };
    for entry in procs.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(fds) = fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        for fd_entry in fds.flatten() {
            let Some(fd) = fd_entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<u32>().ok())
            else {
                continue;
            };
            let Ok(target) = fs::read_link(fd_entry.path()) else {
                continue;
            };
            if target.as_os_str().as_bytes().starts_with(prefix.as_bytes()) {
                found.push(SeedFd { pid, fd });
            }
        }
    }
    found
}

/// `/proc/PID/comm` without its newline, if the process still exists.
pub fn comm(proc_root: &Path, pid: u32) -> Option<String> {
    let raw = fs::read(proc_root.join(pid.to_string()).join("comm")).ok()?;
    Some(String::from_utf8_lossy(&raw).trim_end().to_string())
}

/// The real uid of a process, from `/proc/PID/status`.
pub fn uid(proc_root: &Path, pid: u32) -> Option<u32> {
    let status = fs::read_to_string(proc_root.join(pid.to_string()).join("status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|s| s.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd as _;

    #[test]
    fn finds_this_process_holding_a_file_under_the_prefix() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("nvidia-standin0");
        let file = fs::File::create(&path).expect("create stand-in");
        let prefix = dir.path().join("nvidia").to_string_lossy().into_owned();
        let found = gpu_fds(Path::new("/proc"), &prefix);
        let me = std::process::id();
        assert!(
            found.contains(&SeedFd {
                pid: me,
                fd: file.as_raw_fd() as u32
            }),
            "{found:?}"
        );
        assert!(found.iter().all(|s| s.pid == me), "{found:?}");
        let elsewhere = gpu_fds(Path::new("/proc"), "/nonexistent/prefix");
        assert!(elsewhere.is_empty());
    }

    #[test]
    fn reads_comm_and_uid_of_this_process() {
        let me = std::process::id();
        assert!(comm(Path::new("/proc"), me).is_some_and(|c| !c.is_empty()));
        // SAFETY: getuid has no preconditions and cannot fail.
        let uid_now = unsafe { libc::getuid() };
        assert_eq!(uid(Path::new("/proc"), me), Some(uid_now));
    }
}

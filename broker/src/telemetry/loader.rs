//! Loading the eBPF object into the kernel and attaching its programs.

use std::ffi::CString;
use std::path::Path;

use aya::programs::TracePoint;
use aya::{Ebpf, EbpfLoader};
use gpushare_bpf_common::{Config, PREFIX_CAP, maps};
use tracing::{debug, info};

/// The programs `broker/build.rs` built; empty when the eBPF toolchain was missing.
fn object() -> &'static [u8] {
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/gpushare-bpf.o"))
}

/// Why `object()` is empty, as build.rs saw it (empty when it was built).
const BUILD_NOTE: &str = env!("GPUSHARE_BPF_BUILD_NOTE");

const TRACEFS: &str = "/sys/kernel/tracing";
const OLD_TRACEFS: &str = "/sys/kernel/debug/tracing";

/// (category, tracepoint, program). Without these there is no telemetry worth the name.
const ESSENTIAL: &[(&str, &str, &str)] = &[
    ("syscalls", "sys_enter_ioctl", "ioctl_enter"),
    ("syscalls", "sys_exit_ioctl", "ioctl_exit"),
    ("syscalls", "sys_enter_openat", "fd_openat_enter"),
    ("syscalls", "sys_exit_openat", "fd_new_exit"),
    ("syscalls", "sys_enter_close", "fd_close_enter"),
    ("sched", "sched_process_exit", "process_exit"),
];

/// Attached where the kernel has them (`open` is x86-64 only, `openat2` is 5.6+): each one
/// closes a way a GPU descriptor could be created or go stale unseen.
const OPTIONAL: &[(&str, &str, &str)] = &[
    ("syscalls", "sys_enter_openat2", "fd_openat_enter"),
    ("syscalls", "sys_exit_openat2", "fd_new_exit"),
    ("syscalls", "sys_enter_open", "fd_open_enter"),
    ("syscalls", "sys_exit_open", "fd_new_exit"),
    ("syscalls", "sys_enter_dup", "fd_dup_enter"),
    ("syscalls", "sys_exit_dup", "fd_new_exit"),
    ("syscalls", "sys_enter_dup2", "fd_dup2_enter"),
    ("syscalls", "sys_exit_dup2", "fd_new_exit"),
    ("syscalls", "sys_enter_dup3", "fd_dup2_enter"),
    ("syscalls", "sys_exit_dup3", "fd_new_exit"),
    ("syscalls", "sys_enter_fcntl", "fd_fcntl_enter"),
    ("syscalls", "sys_exit_fcntl", "fd_new_exit"),
    ("sched", "sched_process_exec", "process_exec"),
];

/// Loads the object and writes its configuration, attaching nothing yet.
pub(super) fn load(dev_prefix: &str) -> Result<Ebpf, String> {
    if object().is_empty() {
        return Err(format!(
            "the eBPF programs were not built into this gpushared ({BUILD_NOTE})"
        ));
    }
    let config = config_for(dev_prefix)?;
    let mut ebpf = EbpfLoader::new()
        .load(object())
        .map_err(|e| format!("the kernel refused the eBPF programs: {}", error_chain(&e)))?;
    let map = ebpf
        .map_mut(maps::CONFIG)
        .ok_or("the eBPF object has no CONFIG map (a build mismatch)")?;
    let mut array = aya::maps::Array::<_, Config>::try_from(map)
        .map_err(|e| format!("the eBPF CONFIG map is unusable: {e}"))?;
    array
        .set(0, config, 0)
        .map_err(|e| format!("cannot configure the eBPF programs: {e}"))?;
    Ok(ebpf)
}

fn config_for(dev_prefix: &str) -> Result<Config, String> {
    let bytes = dev_prefix.as_bytes();
    if bytes.is_empty() || bytes.len() > PREFIX_CAP {
        return Err(format!(
            "the device prefix `{dev_prefix}` must be 1 to {PREFIX_CAP} bytes long"
        ));
    }
    let mut config = Config::EMPTY;
    config.prefix[..bytes.len()].copy_from_slice(bytes);
    config.prefix_len = bytes.len() as u32;
    config.exit_group_dead_offset = group_dead_offset().unwrap_or(0);
    Ok(config)
}

/// Offset of `group_dead` in this kernel's `sched_process_exit` record (6.16+).
fn group_dead_offset() -> Option<u32> {
    let format = [TRACEFS, OLD_TRACEFS].iter().find_map(|root| {
        std::fs::read_to_string(format!("{root}/events/sched/sched_process_exit/format")).ok()
    })?;
    let line = format.lines().find(|l| l.contains(" group_dead;"))?;
    let offset = line
        .split(';')
        .find_map(|f| f.trim().strip_prefix("offset:"))?;
    offset.trim().parse().ok()
}

/// Mounts tracefs at /sys/kernel/tracing when no tracefs is mounted (tracepoints are found
/// through it). Returns whether it mounted it.
pub(super) fn ensure_tracefs() -> Result<bool, String> {
    let populated =
        |dir: &str| std::fs::read_dir(dir).is_ok_and(|mut entries| entries.next().is_some());
    if populated(TRACEFS) || populated(OLD_TRACEFS) {
        return Ok(false);
    }
    let (Ok(source), Ok(target), Ok(fstype)) = (
        CString::new("nodev"),
        CString::new(TRACEFS),
        CString::new("tracefs"),
    ) else {
        return Err("internal error building the tracefs mount arguments".into());
    };
    // SAFETY: every pointer is a valid NUL-terminated string that outlives the call, and a null
    // `data` is allowed for tracefs.
    let rc = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        let err = std::io::Error::last_os_error();
        return Err(format!(
            "tracefs is not mounted and mounting it at {TRACEFS} failed ({err}); mount it with \
             `mount -t tracefs nodev {TRACEFS}`"
        ));
    }
    Ok(true)
}

/// Whether the kernel has a tracepoint (its tracefs directory exists).
fn has_tracepoint(category: &str, name: &str) -> bool {
    [TRACEFS, OLD_TRACEFS]
        .iter()
        .any(|root| Path::new(&format!("{root}/events/{category}/{name}")).is_dir())
}

/// Loads every tracepoint program and attaches the essential and available optional ones.
/// Returns how many attachments were made.
pub(super) fn attach_tracepoints(ebpf: &mut Ebpf) -> Result<usize, String> {
    let mut loaded: Vec<&str> = Vec::new();
    for (_, _, program) in ESSENTIAL.iter().chain(OPTIONAL) {
        if loaded.contains(program) {
            continue;
        }
        tracepoint(ebpf, program)?
            .load()
            .map_err(|e| format!("the kernel refused program {program}: {}", error_chain(&e)))?;
        loaded.push(program);
    }
    let mut attached = 0;
    for &(category, name, program) in ESSENTIAL {
        tracepoint(ebpf, program)?
            .attach(category, name)
            .map_err(|e| {
                format!(
                    "cannot attach to tracepoint {category}:{name}: {}",
                    error_chain(&e)
                )
            })?;
        attached += 1;
    }
    for &(category, name, program) in OPTIONAL {
        if !has_tracepoint(category, name) {
            debug!("telemetry: this kernel has no tracepoint {category}:{name}; skipped");
            continue;
        }
        match tracepoint(ebpf, program)?.attach(category, name) {
            Ok(_) => attached += 1,
            Err(e) => info!(
                "telemetry: cannot attach to {category}:{name} ({}); descriptors it creates go unseen",
                error_chain(&e)
            ),
        }
    }
    Ok(attached)
}

fn tracepoint<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut TracePoint, String> {
    let program = ebpf
        .program_mut(name)
        .ok_or_else(|| format!("the eBPF object has no program {name} (a build mismatch)"))?;
    program
        .try_into()
        .map_err(|e| format!("program {name} is not a tracepoint: {e}"))
}

/// An error and its causes on one line (aya's errors wrap the kernel's verifier log).
pub(super) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_holds_the_prefix_and_refuses_odd_ones() {
        let c = config_for("/dev/nvidia").expect("valid prefix");
        assert_eq!(c.prefix_len, 11);
        assert_eq!(&c.prefix[..11], b"/dev/nvidia");
        assert!(c.prefix[11..].iter().all(|&b| b == 0));
        assert!(config_for("").is_err());
        assert!(config_for(&"x".repeat(PREFIX_CAP + 1)).is_err());
    }
}

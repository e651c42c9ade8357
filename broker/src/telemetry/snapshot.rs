//! Reading the maps into per-process activity, and sweeping entries of processes that exited.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use aya::Ebpf;
use aya::maps::HashMap;
use gpushare_bpf_common::{
    COMM_LEN, FdKey, GpuFd, IoctlKey, IoctlStat, ProcInfo, ioc_size, limits, maps, source,
};
use gpushare_protocol::stats::ProcessKind;
use gpushare_protocol::stats::{IoctlStats, ProcessActivity};
use gpushare_protocol::text::printable;

use super::{decode, seed};

/// Reading a hash map while the kernel changes it can restart the walk (a deleted cursor key
/// makes the kernel start over), so walks stop after this many keys.
const fn walk_cap(max_entries: u32) -> usize {
    2 * max_entries as usize
}

/// One reading of the maps.
pub(super) struct Collected {
    /// Processes alive now, by pid.
    pub live: Vec<ProcessActivity>,
    /// Processes that exited since the last reading, as last seen; their entries are gone.
    pub exited: Vec<ProcessActivity>,
}

/// Everything the maps say, split into live and exited processes; the entries of exited ones
/// (and stale descriptors) are removed from the maps.
pub(super) fn collect(ebpf: &mut Ebpf, proc_root: &Path) -> Result<Collected, String> {
    let procs = read_procs(ebpf)?;
    let stats = read_stats(ebpf)?;
    let all_fds = read_fds(ebpf)?;
    // A descriptor learned before its process's last execve is gone (close-on-exec); the
    // programs drop such entries only when the number is used again.
    let (fds, stale): (Vec<_>, Vec<_>) = all_fds
        .into_iter()
        .partition(|(k, v)| procs.get(&k.tgid).is_none_or(|p| v.since_ns >= p.exec_ns));
    let fds: Vec<FdKey> = fds.into_iter().map(|(k, _)| k).collect();
    let stale: Vec<FdKey> = stale.into_iter().map(|(k, _)| k).collect();

    let mut seen: BTreeSet<u32> = procs.keys().copied().collect();
    seen.extend(stats.iter().map(|(k, _)| k.tgid));
    seen.extend(fds.iter().map(|k| k.tgid));
    // Gone: marked exited by the programs, or missing from /proc (an exit the programs missed:
    // an LRU eviction of its entry, or an exit before they were attached).
    let dead: BTreeSet<u32> = seen
        .iter()
        .copied()
        .filter(|t| {
            procs.get(t).is_some_and(|p| p.exited != 0) || !proc_root.join(t.to_string()).exists()
        })
        .collect();

    let mut collected = Collected {
        live: Vec::new(),
        exited: Vec::new(),
    };
    for tgid in seen.iter().copied() {
        let is_dead = dead.contains(&tgid);
        let activity = activity(tgid, procs.get(&tgid), &stats, &fds, proc_root, is_dead);
        if is_dead {
            collected.exited.push(activity);
        } else {
            collected.live.push(activity);
        }
    }
    if !dead.is_empty() || !stale.is_empty() {
        sweep(ebpf, &dead, &stats, &fds, &stale);
    }
    Ok(collected)
}

/// One process's figures from the three maps.
fn activity(
    tgid: u32,
    info: Option<&ProcInfo>,
    stats: &[(IoctlKey, IoctlStat)],
    fds: &[FdKey],
    proc_root: &Path,
    dead: bool,
) -> ProcessActivity {
    let mine = || stats.iter().filter(move |(k, _)| k.tgid == tgid);
    let mut ioctls: Vec<IoctlStats> = mine()
        .map(|(k, s)| IoctlStats {
            cmd: k.cmd,
            name: decode::command_name(k.cmd),
            count: s.count,
            errors: s.errors,
            total_ns: s.total_ns,
            arg_bytes: s.count * u64::from(ioc_size(k.cmd)),
        })
        .collect();
    ioctls.sort_by(|a, b| b.count.cmp(&a.count).then(a.cmd.cmp(&b.cmd)));
    let first = info
        .map(|i| i.first_ns)
        .into_iter()
        .chain(mine().map(|(_, s)| s.first_ns))
        .min()
        .unwrap_or(0);
    let last = info
        .map(|i| i.last_ns)
        .into_iter()
        .chain(mine().map(|(_, s)| s.last_ns))
        .max()
        .unwrap_or(0);
    // /proc has the process's name (the programs saw one thread's); a dead one has only that.
    let from_proc = if dead {
        None
    } else {
        seed::comm(proc_root, tgid)
    };
    let comm = from_proc
        .or_else(|| info.map(|i| comm_str(&i.comm)))
        .unwrap_or_default();
    let uid = info
        .map(|i| i.uid)
        .or_else(|| seed::uid(proc_root, tgid))
        .unwrap_or(0);
    ProcessActivity {
        pid: tgid as i32,
        comm,
        uid,
        first_seen_ns: first,
        last_seen_ns: last,
        ioctls,
        launches: info.map_or(0, |i| i.launches),
        allocs: info.map_or(0, |i| i.allocs),
        frees: info.map_or(0, |i| i.frees),
        ctx_creates: info.map_or(0, |i| i.ctx_creates),
        gpu_fds: if dead {
            0
        } else {
            fds.iter().filter(|k| k.tgid == tgid).count() as u32
        },
        // The broker classifies against its clients when it builds a report.
        kind: ProcessKind::Observed,
        client_id: None,
    }
}

/// How many (GPU descriptor, ioctl command) entries the maps hold for `tgid`.
pub(super) fn entries_for(ebpf: &Ebpf, tgid: u32) -> Result<(usize, usize), String> {
    let fds = read_fds(ebpf)?
        .iter()
        .filter(|(k, _)| k.tgid == tgid)
        .count();
    let stats = read_stats(ebpf)?
        .iter()
        .filter(|(k, _)| k.tgid == tgid)
        .count();
    Ok((fds, stats))
}

/// Adds descriptors found in /proc; a process gets a PROCS entry so it is reported even before
/// its next ioctl.
pub(super) fn insert_seeds(
    ebpf: &mut Ebpf,
    seeds: &[seed::SeedFd],
    proc_root: &Path,
    now_ns: u64,
) -> Result<(), String> {
    {
        let mut gpu_fds = HashMap::<_, FdKey, GpuFd>::try_from(map_mut(ebpf, maps::GPU_FDS)?)
            .map_err(|e| format!("the GPU_FDS map is unusable: {e}"))?;
        for s in seeds {
            let value = GpuFd {
                since_ns: now_ns,
                source: source::SEED,
                _pad: 0,
            };
            gpu_fds
                .insert(
                    FdKey {
                        tgid: s.pid,
                        fd: s.fd,
                    },
                    value,
                    0,
                )
                .map_err(|e| format!("cannot record a GPU descriptor of pid {}: {e}", s.pid))?;
        }
    }
    let mut procs = HashMap::<_, u32, ProcInfo>::try_from(map_mut(ebpf, maps::PROCS)?)
        .map_err(|e| format!("the PROCS map is unusable: {e}"))?;
    let pids: BTreeSet<u32> = seeds.iter().map(|s| s.pid).collect();
    for pid in pids {
        if procs.get(&pid, 0).is_ok() {
            continue;
        }
        let mut comm = [0u8; COMM_LEN];
        if let Some(name) = seed::comm(proc_root, pid) {
            let n = name.len().min(comm.len() - 1);
            comm[..n].copy_from_slice(&name.as_bytes()[..n]);
        }
        let uid = seed::uid(proc_root, pid).unwrap_or(0);
        // BPF_NOEXIST (2): the process may have made itself known meanwhile.
        let _ = procs.insert(pid, ProcInfo::new(comm, uid, now_ns), 2);
    }
    Ok(())
}

fn read_procs(ebpf: &Ebpf) -> Result<BTreeMap<u32, ProcInfo>, String> {
    let procs = HashMap::<_, u32, ProcInfo>::try_from(map(ebpf, maps::PROCS)?)
        .map_err(|e| format!("the PROCS map is unusable: {e}"))?;
    Ok(procs
        .iter()
        .take(walk_cap(limits::PROCS))
        .filter_map(Result::ok)
        .collect())
}

fn read_stats(ebpf: &Ebpf) -> Result<Vec<(IoctlKey, IoctlStat)>, String> {
    let stats = HashMap::<_, IoctlKey, IoctlStat>::try_from(map(ebpf, maps::IOCTL_STATS)?)
        .map_err(|e| format!("the IOCTL_STATS map is unusable: {e}"))?;
    // Through a BTreeMap: a restarted walk may yield a key twice.
    let unique: BTreeMap<IoctlKey, IoctlStat> = stats
        .iter()
        .take(walk_cap(limits::IOCTL_STATS))
        .filter_map(Result::ok)
        .collect();
    Ok(unique.into_iter().collect())
}

fn read_fds(ebpf: &Ebpf) -> Result<Vec<(FdKey, GpuFd)>, String> {
    let fds = HashMap::<_, FdKey, GpuFd>::try_from(map(ebpf, maps::GPU_FDS)?)
        .map_err(|e| format!("the GPU_FDS map is unusable: {e}"))?;
    let unique: BTreeMap<FdKey, GpuFd> = fds
        .iter()
        .take(walk_cap(limits::GPU_FDS))
        .filter_map(Result::ok)
        .collect();
    Ok(unique.into_iter().collect())
}

/// Removes every entry of the `dead` processes, and the `stale` descriptors. Failures are ignored: an entry that another
/// sweep or an LRU eviction removed first is gone either way.
fn sweep(
    ebpf: &mut Ebpf,
    dead: &BTreeSet<u32>,
    stats: &[(IoctlKey, IoctlStat)],
    fds: &[FdKey],
    stale: &[FdKey],
) {
    if let Ok(m) = map_mut(ebpf, maps::IOCTL_STATS)
        && let Ok(mut m) = HashMap::<_, IoctlKey, IoctlStat>::try_from(m)
    {
        for (k, _) in stats.iter().filter(|(k, _)| dead.contains(&k.tgid)) {
            let _ = m.remove(k);
        }
    }
    if let Ok(m) = map_mut(ebpf, maps::GPU_FDS)
        && let Ok(mut m) = HashMap::<_, FdKey, GpuFd>::try_from(m)
    {
        for k in fds.iter().filter(|k| dead.contains(&k.tgid)).chain(stale) {
            let _ = m.remove(k);
        }
    }
    if let Ok(m) = map_mut(ebpf, maps::PROCS)
        && let Ok(mut m) = HashMap::<_, u32, ProcInfo>::try_from(m)
    {
        for tgid in dead {
            let _ = m.remove(tgid);
        }
    }
}

fn map<'a>(ebpf: &'a Ebpf, name: &str) -> Result<&'a aya::maps::Map, String> {
    ebpf.map(name)
        .ok_or_else(|| format!("the eBPF object has no {name} map (a build mismatch)"))
}

fn map_mut<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut aya::maps::Map, String> {
    ebpf.map_mut(name)
        .ok_or_else(|| format!("the eBPF object has no {name} map (a build mismatch)"))
}

/// A process name as it can be shown: any process may name itself with escape sequences.
fn comm_str(raw: &[u8]) -> String {
    let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
    printable(&String::from_utf8_lossy(&raw[..end])).into_owned()
}

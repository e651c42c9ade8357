//! Optional uprobes on libcuda: kernel launches, allocations, frees and context creations of
//! processes that bypass the broker (they make no ioctls in steady state, so only their libcuda
//! calls show their load).
//!
//! A uprobe attached to the library file for all processes traps in every process that maps
//! it — the broker's own launches included, which slowed brokered work (docs/telemetry.md has
//! the cost per hit). So the probes are attached per observed process (a perf-event uprobe
//! with a pid installs its breakpoint in that process only), when the ioctl tracepoints first
//! see it use the GPU, and never in the broker itself. Calls a process makes before it is
//! first seen (its context creation, typically) are not counted.

use std::path::{Path, PathBuf};
use std::process::Command;

use aya::Ebpf;
use aya::programs::UProbe;
use std::num::NonZeroU32;

use aya::programs::uprobe::{UProbeLinkId, UProbeScope};
use tracing::debug;

use super::loader::error_chain;

/// (program, libcuda symbols it counts). Variants that a given driver lacks are skipped; the
/// `_ptsz` ones are what the CUDA runtime resolves for per-thread default streams.
pub const PROBES: &[(&str, &[&str])] = &[
    (
        "cuda_launch",
        &[
            "cuLaunchKernel",
            "cuLaunchKernel_ptsz",
            "cuLaunchKernelEx",
            "cuLaunchKernelEx_ptsz",
            "cuLaunchCooperativeKernel",
            "cuLaunchCooperativeKernel_ptsz",
        ],
    ),
    (
        "cuda_alloc",
        &[
            "cuMemAlloc_v2",
            "cuMemAllocPitch_v2",
            "cuMemAllocManaged",
            "cuMemAllocAsync",
            "cuMemAllocAsync_ptsz",
            "cuMemAllocFromPoolAsync",
            "cuMemAllocFromPoolAsync_ptsz",
            "cuMemCreate",
        ],
    ),
    (
        "cuda_free",
        &[
            "cuMemFree_v2",
            "cuMemFreeAsync",
            "cuMemFreeAsync_ptsz",
            "cuMemRelease",
        ],
    ),
    (
        "cuda_ctx_create",
        &[
            "cuCtxCreate_v2",
            "cuCtxCreate_v3",
            "cuCtxCreate_v4",
            "cuDevicePrimaryCtxRetain",
        ],
    ),
];

/// Where distributions put the driver's libcuda (never the toolkit's link-time stub).
const USUAL_PATHS: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
    "/usr/lib/aarch64-linux-gnu/libcuda.so.1",
    "/usr/lib64/libcuda.so.1",
    "/usr/lib/libcuda.so.1",
    "/usr/local/nvidia/lib64/libcuda.so.1",
    "/usr/lib/wsl/lib/libcuda.so.1",
];

/// The driver's libcuda on this machine: the usual paths, then the dynamic linker's cache.
pub fn find_libcuda() -> Option<PathBuf> {
    if let Some(p) = USUAL_PATHS.iter().map(Path::new).find(|p| p.is_file()) {
        return Some(p.to_path_buf());
    }
    let out = Command::new("ldconfig").arg("-p").output().ok()?;
    from_ldconfig(&String::from_utf8_lossy(&out.stdout)).filter(|p| p.is_file())
}

/// The `libcuda.so.1` line of `ldconfig -p` output.
fn from_ldconfig(listing: &str) -> Option<PathBuf> {
    listing.lines().find_map(|line| {
        let line = line.trim();
        if !line.starts_with("libcuda.so.1 ") {
            return None;
        }
        line.rsplit_once("=> ")
            .map(|(_, p)| PathBuf::from(p.trim()))
    })
}

/// The uprobe programs loaded (not attached), and what `library` offers them.
#[derive(Debug)]
pub struct Probes {
    pub library: PathBuf,
    /// (program, symbol) pairs that attached in the first process tried; empty until then.
    pub symbols: Vec<(&'static str, &'static str)>,
}

/// Links of the probes attached to one process.
pub type ProcessLinks = Vec<(&'static str, UProbeLinkId)>;

/// Loads the uprobe programs without attaching them anywhere.
pub fn load(ebpf: &mut Ebpf, library: &Path) -> Result<Probes, String> {
    for &(program, _) in PROBES {
        probe(ebpf, program)?
            .load()
            .map_err(|e| format!("the kernel refused program {program}: {}", error_chain(&e)))?;
    }
    Ok(Probes {
        library: library.to_path_buf(),
        symbols: Vec::new(),
    })
}

fn probe<'a>(ebpf: &'a mut Ebpf, program: &str) -> Result<&'a mut UProbe, String> {
    ebpf.program_mut(program)
        .ok_or_else(|| format!("the eBPF object has no program {program}"))?
        .try_into()
        .map_err(|e| format!("program {program} is not a uprobe: {e}"))
}

/// Attaches every probe to every symbol `library` exports, for process `pid` only.
pub fn attach_to(ebpf: &mut Ebpf, probes: &mut Probes, pid: NonZeroU32) -> ProcessLinks {
    let mut links = Vec::new();
    let first = probes.symbols.is_empty();
    for &(program, symbols) in PROBES {
        let Ok(p) = probe(ebpf, program) else {
            continue;
        };
        for &symbol in symbols {
            match p.attach(symbol, &probes.library, UProbeScope::OneProcess(pid)) {
                Ok(link) => {
                    links.push((program, link));
                    if first {
                        probes.symbols.push((program, symbol));
                    }
                }
                Err(e) => debug!(
                    pid,
                    "telemetry: no uprobe on {symbol} in {}: {}",
                    probes.library.display(),
                    error_chain(&e)
                ),
            }
        }
    }
    links
}

/// Detaches one process's probes (after it exited, or when telemetry stops).
pub fn detach(ebpf: &mut Ebpf, links: ProcessLinks) {
    for (program, link) in links {
        if let Ok(p) = probe(ebpf, program) {
            let _ = p.detach(link);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_libcuda_from_ldconfig_output() {
        let listing = "1234 libs found in cache `/etc/ld.so.cache'\n\
            \tlibcudart.so.12 (libc6,x86-64) => /usr/local/cuda/lib64/libcudart.so.12\n\
            \tlibcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1\n\
            \tlibcuda.so (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so\n";
        assert_eq!(
            from_ldconfig(listing),
            Some(PathBuf::from("/usr/lib/x86_64-linux-gnu/libcuda.so.1"))
        );
        assert_eq!(from_ldconfig("0 libs found\n"), None);
    }
}

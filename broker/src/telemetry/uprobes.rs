//! Optional uprobes on libcuda: kernel launches, allocations, frees and context creations of
//! processes that bypass the broker (they make no ioctls in steady state, so only their libcuda
//! calls show their load).
//!
//! A uprobe is attached to the library file, so it fires in every process that maps it,
//! whatever its pid; each hit costs that process a trap into the kernel (about a microsecond),
//! which is why gpushared attaches them only with `--uprobes`.

use std::path::{Path, PathBuf};
use std::process::Command;

use aya::Ebpf;
use aya::programs::UProbe;
use aya::programs::uprobe::UProbeScope;
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

/// What `attach` managed.
#[derive(Debug, Default)]
pub struct Attached {
    pub library: PathBuf,
    pub symbols: Vec<&'static str>,
}

/// Loads the uprobe programs and attaches each to every symbol of its list that `library`
/// exports. Err when nothing could be attached.
pub fn attach(ebpf: &mut Ebpf, library: &Path) -> Result<Attached, String> {
    let mut attached = Attached {
        library: library.to_path_buf(),
        symbols: Vec::new(),
    };
    for &(program, symbols) in PROBES {
        let probe: &mut UProbe = ebpf
            .program_mut(program)
            .ok_or_else(|| format!("the eBPF object has no program {program}"))?
            .try_into()
            .map_err(|e| format!("program {program} is not a uprobe: {e}"))?;
        probe
            .load()
            .map_err(|e| format!("the kernel refused program {program}: {}", error_chain(&e)))?;
        for &symbol in symbols {
            match probe.attach(symbol, library, UProbeScope::AllProcesses) {
                Ok(_) => attached.symbols.push(symbol),
                Err(e) => debug!(
                    "telemetry: no uprobe on {symbol} in {}: {}",
                    library.display(),
                    error_chain(&e)
                ),
            }
        }
    }
    if attached.symbols.is_empty() {
        return Err(format!(
            "{} exports none of the probed CUDA functions",
            library.display()
        ));
    }
    Ok(attached)
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

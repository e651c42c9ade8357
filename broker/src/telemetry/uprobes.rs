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
    /// (program, symbol, file offset) for every symbol of [`PROBES`] the library exports:
    /// resolved once, so that attaching to a process parses nothing (attaching by name reads
    /// the driver's whole symbol table again for each probe in each process).
    pub offsets: Vec<(&'static str, &'static str, u64)>,
    /// (program, symbol) pairs that attached in the first process tried; empty until then.
    pub symbols: Vec<(&'static str, &'static str)>,
}

/// Links of the probes attached to one process.
pub type ProcessLinks = Vec<(&'static str, UProbeLinkId)>;

/// Loads the uprobe programs without attaching them anywhere, and finds where in `library`
/// each symbol they count lives.
pub fn load(ebpf: &mut Ebpf, library: &Path) -> Result<Probes, String> {
    for &(program, _) in PROBES {
        probe(ebpf, program)?
            .load()
            .map_err(|e| format!("the kernel refused program {program}: {}", error_chain(&e)))?;
    }
    let wanted: Vec<&'static str> = PROBES.iter().flat_map(|(_, s)| s.iter().copied()).collect();
    let found = symbol_offsets(library, &wanted)?;
    let offsets = PROBES
        .iter()
        .flat_map(|&(program, symbols)| {
            symbols
                .iter()
                .filter_map(|&s| found.get(s).map(|&off| (program, s, off)))
                .collect::<Vec<_>>()
        })
        .collect::<Vec<_>>();
    if offsets.is_empty() {
        return Err(format!(
            "{} exports none of the functions the probes count",
            library.display()
        ));
    }
    Ok(Probes {
        library: library.to_path_buf(),
        offsets,
        symbols: Vec::new(),
    })
}

/// The file offsets of the `wanted` symbols that `library` defines (dynamic symbols first),
/// as the kernel's uprobes take them.
pub fn symbol_offsets(
    library: &Path,
    wanted: &[&'static str],
) -> Result<std::collections::HashMap<&'static str, u64>, String> {
    use object::{Object as _, ObjectSection as _, ObjectSymbol as _};
    let file = std::fs::File::open(library)
        .map_err(|e| format!("cannot open {}: {e}", library.display()))?;
    // SAFETY: a read-only private mapping of the driver's library; a file changed under us
    // (a driver update) could give wrong offsets, never unsafety in this process's memory
    // beyond the parse reading odd bytes, which the parser checks.
    let map = unsafe { memmap2::Mmap::map(&file) }
        .map_err(|e| format!("cannot map {}: {e}", library.display()))?;
    let obj = object::File::parse(&*map)
        .map_err(|e| format!("cannot read {} as ELF: {e}", library.display()))?;
    let translate = matches!(
        obj.kind(),
        object::ObjectKind::Dynamic | object::ObjectKind::Executable
    );
    let mut found = std::collections::HashMap::new();
    for sym in obj.dynamic_symbols().chain(obj.symbols()) {
        let Ok(name) = sym.name() else { continue };
        let Some(&want) = wanted.iter().find(|w| **w == name) else {
            continue;
        };
        if found.contains_key(want) || sym.address() == 0 {
            continue;
        }
        let offset = if translate {
            let Some(section) = sym
                .section_index()
                .and_then(|i| obj.section_by_index(i).ok())
            else {
                continue;
            };
            let Some((file_offset, _)) = section.file_range() else {
                continue;
            };
            sym.address() - section.address() + file_offset
        } else {
            sym.address()
        };
        found.insert(want, offset);
    }
    Ok(found)
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
    for &(program, symbol, offset) in &probes.offsets {
        let Ok(p) = probe(ebpf, program) else {
            continue;
        };
        match p.attach(offset, &probes.library, UProbeScope::OneProcess(pid)) {
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
    fn finds_the_file_offsets_of_exported_functions() {
        // The C library this test links, found where the process mapped it.
        let maps = std::fs::read_to_string("/proc/self/maps").expect("maps");
        let libc = maps
            .lines()
            .filter_map(|l| l.split_whitespace().nth(5))
            .find(|p| p.contains("/libc.so"))
            .expect("libc mapped");
        let size = std::fs::metadata(libc).expect("libc").len();
        let found = symbol_offsets(Path::new(libc), &["malloc", "free", "gpushare_no_such_fn"])
            .expect("libc parses");
        for name in ["malloc", "free"] {
            let off = found[name];
            assert!(off > 0 && off < size, "{name} at {off} in {size} bytes");
        }
        assert_ne!(found["malloc"], found["free"]);
        assert!(!found.contains_key("gpushare_no_such_fn"));
        assert!(symbol_offsets(Path::new("/nonexistent/libcuda.so.1"), &["malloc"]).is_err());
    }

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

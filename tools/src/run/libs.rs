//! Where `gpushare run` finds the libraries it puts in front of a program: next to the
//! `gpushare` binary (a build or a bundle), then the install's private library directory.
//!
//! Layout, installed or bundled: `libgpushare_interpose.so` and `libgpushare_audit.so` in
//! the directory, and gpushare's CUDA driver as `cuda/libcuda.so.1` (with a `libcuda.so`
//! link) and its NVML as `cuda/libnvidia-ml.so.1` — a directory holding nothing else, so that
//! putting it on `LD_LIBRARY_PATH` shadows the real libcuda and NVML and nothing more. A cargo
//! build has them as `libcuda.so` and `libgpushare_nvml.so` beside the binary; `cuda/` is made
//! there, of links to them, on first use.

use std::path::{Path, PathBuf};

use gpushare_conn::env;

/// The governed clients' interposer.
pub const INTERPOSER: &str = "libgpushare_interpose.so";
/// The audit library that sends every libcuda search to gpushare's driver.
pub const AUDIT: &str = "libgpushare_audit.so";
/// The directory that holds gpushare's CUDA driver under the names the loader looks for.
pub const DRIVER_DIR: &str = "cuda";
/// The driver's soname: what the CUDA runtime opens.
pub const DRIVER_SONAME: &str = "libcuda.so.1";
/// The name programs linked with `-lcuda` (and some loaders) ask for.
const DRIVER_DEV_NAME: &str = "libcuda.so";
/// gpushare's NVML, which shows a program only its GPUs, under NVML's soname.
pub const NVML_SONAME: &str = "libnvidia-ml.so.1";
/// The NVML as cargo names it.
const NVML_DEV_NAME: &str = "libgpushare_nvml.so";

/// The directories searched, in order.
fn library_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(dir) = exe_dir() {
        dirs.push(dir.join("../lib/gpushare"));
        dirs.insert(0, dir);
    }
    dirs.push(PathBuf::from("/usr/lib/gpushare"));
    dirs
}

fn exe_dir() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    exe.parent().map(Path::to_path_buf)
}

fn listed(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The interposer, for `--mode governed`.
pub fn interposer() -> anyhow::Result<PathBuf> {
    let candidates: Vec<PathBuf> = library_dirs().iter().map(|d| d.join(INTERPOSER)).collect();
    first_file(&candidates).ok_or_else(|| {
        anyhow::anyhow!(
            "cannot find {INTERPOSER} (looked in {}); pass --interposer PATH or set {}",
            listed(&candidates),
            env::INTERPOSER_ENV
        )
    })
}

/// The audit library, for consolidated mode.
pub fn audit() -> anyhow::Result<PathBuf> {
    let candidates: Vec<PathBuf> = library_dirs().iter().map(|d| d.join(AUDIT)).collect();
    first_file(&candidates).ok_or_else(|| not_installed(AUDIT, &candidates))
}

/// The directory that holds gpushare's CUDA driver as `libcuda.so.1`, for consolidated mode.
pub fn driver_dir() -> anyhow::Result<PathBuf> {
    // A cargo build: the driver as cargo names it, beside the binary (its links are made
    // again, as a newer build may have more to link).
    if let Some(dir) = exe_dir()
        && dir.join(DRIVER_DEV_NAME).is_file()
    {
        return link_driver_dir(&dir);
    }
    let dirs: Vec<PathBuf> = library_dirs().iter().map(|d| d.join(DRIVER_DIR)).collect();
    if let Some(dir) = dirs.iter().find(|d| d.join(DRIVER_SONAME).is_file()) {
        return Ok(canonical(dir));
    }
    let candidates: Vec<PathBuf> = dirs.iter().map(|d| d.join(DRIVER_SONAME)).collect();
    Err(not_installed("gpushare's CUDA driver", &candidates))
}

/// Makes `<build>/cuda/` of links to the driver cargo built as `<build>/libcuda.so`.
/// Several runs may do this at once: whatever one of them made is as good as any.
fn link_driver_dir(build: &Path) -> anyhow::Result<PathBuf> {
    let dir = build.join(DRIVER_DIR);
    let made = |r: std::io::Result<()>| match r {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => Err(e),
        _ => Ok(()),
    };
    let target = Path::new("..").join(DRIVER_DEV_NAME);
    let nvml = build
        .join(NVML_DEV_NAME)
        .is_file()
        .then(|| Path::new("..").join(NVML_DEV_NAME));
    made(std::fs::create_dir(&dir))
        .and_then(|()| made(std::os::unix::fs::symlink(&target, dir.join(DRIVER_SONAME))))
        .and_then(|()| {
            made(std::os::unix::fs::symlink(
                &target,
                dir.join(DRIVER_DEV_NAME),
            ))
        })
        .map_err(|e| {
            anyhow::anyhow!(
                "cannot make {} (links to gpushare's CUDA driver in this build): {e}",
                dir.display()
            )
        })?;
    // Without it NVML shows every GPU, as before gpushare had one: not worth failing for (a
    // read-only bundle made before it).
    if let Some(nvml) = &nvml {
        let _ = std::os::unix::fs::symlink(nvml, dir.join(NVML_SONAME));
    }
    anyhow::ensure!(
        dir.join(DRIVER_SONAME).is_file(),
        "{} is not a link to gpushare's CUDA driver {}: remove it and run again",
        dir.join(DRIVER_SONAME).display(),
        build.join(DRIVER_DEV_NAME).display()
    );
    Ok(canonical(&dir))
}

fn first_file(candidates: &[PathBuf]) -> Option<PathBuf> {
    candidates
        .iter()
        .find(|p| p.is_file())
        .map(|p| canonical(p))
}

/// An absolute path without `..`: the loader gets it as the child's environment, and the
/// child may change its working directory.
fn canonical(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf())
}

fn not_installed(what: &str, candidates: &[PathBuf]) -> anyhow::Error {
    anyhow::anyhow!(
        "cannot find {what} (looked for {}): is gpushare installed completely?",
        listed(candidates)
    )
}

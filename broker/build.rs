//! Builds the eBPF programs in `../bpf` for `bpfel-unknown-none` so that a plain `cargo build`
//! of the workspace rebuilds them (the aya convention: see the `aya-build` crate; this script
//! does the same by hand so that it can step aside cleanly).
//!
//! The programs need nightly Rust with `rust-src` (for `-Z build-std=core`) and `bpf-linker`,
//! which `scripts/setup.sh` installs. Where any of that is missing, or `GPUSHARE_NO_BPF=1` is
//! set, this script warns, writes an empty object, and the broker builds anyway: its telemetry
//! then reports itself off with the reason (`GPUSHARE_BPF_BUILD_NOTE`).

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

const OBJECT: &str = "gpushare-bpf.o";
const TARGET: &str = "bpfel-unknown-none";
const HOW_TO_FIX: &str =
    "run scripts/setup.sh (as root) to install the eBPF toolchain, then rebuild";

fn main() {
    let Some(out_dir) = env::var_os("OUT_DIR").map(PathBuf::from) else {
        println!("cargo:warning=OUT_DIR is not set; cannot build the eBPF programs");
        return;
    };
    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let bpf_dir = manifest_dir.join("..").join("bpf");
    for watched in [
        "src",
        "Cargo.toml",
        "Cargo.lock",
        "common/src",
        "common/Cargo.toml",
    ] {
        println!("cargo:rerun-if-changed={}", bpf_dir.join(watched).display());
    }
    println!("cargo:rerun-if-env-changed=GPUSHARE_NO_BPF");

    let object = out_dir.join(OBJECT);
    let note = match build(&bpf_dir, &out_dir, &object) {
        Ok(()) => String::new(),
        Err(reason) => {
            println!(
                "cargo:warning=eBPF telemetry programs not built: {reason}; {HOW_TO_FIX}. \
                 gpushared still builds and runs, with telemetry off."
            );
            if let Err(e) = std::fs::write(&object, []) {
                println!("cargo:warning=cannot write {}: {e}", object.display());
            }
            // The note is one line of a rustc-env directive.
            format!("{reason}; {HOW_TO_FIX}").replace(['\n', '\r'], " ")
        }
    };
    println!("cargo:rustc-env=GPUSHARE_BPF_BUILD_NOTE={note}");
}

fn build(bpf_dir: &Path, out_dir: &Path, object: &Path) -> Result<(), String> {
    if env::var("GPUSHARE_NO_BPF").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true")) {
        return Err("GPUSHARE_NO_BPF is set".into());
    }
    let cargo_bin = cargo_home().map(|h| h.join("bin"));
    let rustup = find_tool("rustup", cargo_bin.as_deref())
        .ok_or("rustup not found (the programs are built with its nightly toolchain)")?;

    let sysroot =
        output(Command::new(&rustup).args(["run", "nightly", "rustc", "--print", "sysroot"]))
            .map_err(|e| format!("no nightly Rust toolchain ({e})"))?;
    let core_src = Path::new(sysroot.trim()).join("lib/rustlib/src/rust/library/core");
    // Re-run when rust-src or bpf-linker appears (a missing path always counts as changed).
    println!("cargo:rerun-if-changed={}", core_src.display());
    if !core_src.is_dir() {
        return Err("the nightly toolchain lacks rust-src (needed for -Z build-std=core)".into());
    }
    let Some(linker) = find_tool("bpf-linker", cargo_bin.as_deref()) else {
        if let Some(bin) = &cargo_bin {
            println!(
                "cargo:rerun-if-changed={}",
                bin.join("bpf-linker").display()
            );
        }
        return Err("bpf-linker not found".into());
    };
    println!("cargo:rerun-if-changed={}", linker.display());

    let target_dir = shared_target_dir(out_dir);
    let arch = env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_else(|_| "x86_64".into());
    let mut cmd = Command::new(&rustup);
    cmd.args([
        "run",
        "nightly",
        "cargo",
        "build",
        "--release",
        "-Z",
        "build-std=core",
    ])
    .args(["--target", TARGET])
    .arg("--manifest-path")
    .arg(bpf_dir.join("Cargo.toml"))
    .arg("--target-dir")
    .arg(&target_dir);
    // The outer build's compiler settings must not leak into the nightly one.
    for key in [
        "RUSTC",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "RUSTFLAGS",
        "RUSTUP_TOOLCHAIN",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
    ] {
        cmd.env_remove(key);
    }
    // `bpf_target_arch` tells aya-ebpf how to read probe arguments; BTF gives the verifier's
    // messages source lines and lets the loader name things.
    cmd.env(
        "CARGO_ENCODED_RUSTFLAGS",
        format!("--cfg=bpf_target_arch=\"{arch}\"\x1f-Cdebuginfo=2\x1f-Clink-arg=--btf"),
    );
    if let Some(bin) = &cargo_bin {
        // bpf-linker lives in cargo's bin directory, which a build may not have on PATH.
        let path = env::var_os("PATH").unwrap_or_default();
        let mut dirs: Vec<PathBuf> = env::split_paths(&path).collect();
        dirs.push(bin.clone());
        if let Ok(joined) = env::join_paths(dirs) {
            cmd.env("PATH", joined);
        }
    }
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run the nightly cargo: {e}"))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        for line in stderr
            .lines()
            .filter(|l| !l.trim().is_empty())
            .rev()
            .take(30)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
        {
            println!("cargo:warning=bpf: {line}");
        }
        return Err(format!(
            "the nightly build of {} failed ({})",
            bpf_dir.display(),
            out.status
        ));
    }
    let built = target_dir.join(TARGET).join("release").join("gpushare-bpf");
    std::fs::copy(&built, object).map_err(|e| {
        format!(
            "cannot copy {} to {}: {e}",
            built.display(),
            object.display()
        )
    })?;
    Ok(())
}

/// `target/bpf` of the outer build when OUT_DIR has cargo's usual shape
/// (`target/<profile>/build/<pkg>-<hash>/out`), so debug, release and clippy builds share one
/// incremental eBPF build; else a directory inside OUT_DIR.
fn shared_target_dir(out_dir: &Path) -> PathBuf {
    let mut up = out_dir.ancestors();
    match (up.nth(2), up.nth(1)) {
        (Some(build), Some(target)) if build.file_name().is_some_and(|n| n == "build") => {
            target.join("bpf")
        }
        _ => out_dir.join("bpf-target"),
    }
}

fn cargo_home() -> Option<PathBuf> {
    env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
}

fn find_tool(name: &str, extra: Option<&Path>) -> Option<PathBuf> {
    let path = env::var_os("PATH").unwrap_or_default();
    env::split_paths(&path)
        .chain(extra.map(Path::to_path_buf))
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

fn output(cmd: &mut Command) -> Result<String, String> {
    let out = cmd.output().map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

//! Gives `libgpushare.so` its ELF soname, `libgpushare.so.0`, the name programs linked
//! against it record and the installed library is found by (packaging/). The 0 is
//! the C ABI's major version: bump it (here, in packaging/ and in the header's comment) when
//! a change breaks programs built against an older `gpushare.h`.
//!
//! A program linked against the library now asks the dynamic loader for `libgpushare.so.0`,
//! so this script also puts a `libgpushare.so.0 -> libgpushare.so` symlink next to the
//! library in the target directory: uninstalled use (`cc … -L target/release -lgpushare`
//! with an rpath or `LD_LIBRARY_PATH`, and the C ABI tests) keeps working.

use std::path::{Path, PathBuf};

const SONAME: &str = "libgpushare.so.0";
const LIBRARY: &str = "libgpushare.so";

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() != Ok("linux") {
        return;
    }
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,{SONAME}");

    if let Some(dir) = artifact_dir() {
        link_soname(&dir);
    }
}

/// The directory cargo puts the cdylib in: OUT_DIR is `<that dir>/build/<pkg>-<hash>/out`.
/// None when the layout is another (a separate `build-dir`): then there is no link to make.
fn artifact_dir() -> Option<PathBuf> {
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR")?);
    let build = out_dir.parent()?.parent()?;
    if build.file_name()? != "build" {
        return None;
    }
    build.parent().map(Path::to_path_buf)
}

/// Makes `dir/libgpushare.so.0` a relative symlink to `libgpushare.so` (dangling until the
/// library is linked, which happens after this script runs). Failure is only a warning: the
/// library itself is fine, just uninstalled programs won't find it by its soname.
fn link_soname(dir: &Path) {
    let link = dir.join(SONAME);
    if std::fs::read_link(&link).is_ok_and(|target| target == Path::new(LIBRARY)) {
        return;
    }
    let _ = std::fs::remove_file(&link);
    if let Err(e) = std::os::unix::fs::symlink(LIBRARY, &link) {
        println!(
            "cargo:warning=cannot create {} -> {LIBRARY}: {e}; programs linked against the \
             uninstalled library will not find it by its soname",
            link.display()
        );
    }
}

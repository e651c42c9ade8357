//! Compiling the tests' C programs with the system C compiler (`$CC`, else `cc`).

use std::path::Path;
use std::process::Command;

/// Compiles `source` with `-Wall` and `flags` into `out`; panics with the compiler's output if
/// it fails, or if there is no compiler to run.
pub fn compile(source: &Path, flags: &[&str], out: &Path) {
    let cc = std::env::var_os("CC").unwrap_or_else(|| "cc".into());
    let output = Command::new(&cc)
        .arg("-Wall")
        .arg("-o")
        .arg(out)
        .arg(source)
        .args(flags)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run the C compiler `{}` ({e}): these tests need one (install gcc or clang, or set CC)",
                cc.to_string_lossy()
            )
        });
    assert!(
        output.status.success(),
        "compiling {}: {}",
        source.display(),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Builds the stand-in NVML (`tests/c/nvml_standin.c`: fake GPUs whose UUIDs come from
/// `$GPUSHARE_TEST_NVML_UUIDS`) as `out`, a `libnvidia-ml.so.1`.
pub fn nvml_standin(out: &Path) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("c/nvml_standin.c");
    compile(
        &src,
        &["-shared", "-fPIC", "-Wl,-soname,libnvidia-ml.so.1"],
        out,
    );
}

//! Governed programs for the tests: the stand-in libcuda (`c/standin_libcuda.c`: every
//! wrapped entry point, counted, with fake device addresses) and an unmodified program
//! (`c/governed_app.c`) that opens it with `dlopen`, compiled with the system C compiler, and
//! run under `gpushare run --mode governed`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::binary;

pub struct Built {
    _dir: tempfile::TempDir,
    /// The stand-in libcuda.
    pub standin: PathBuf,
    /// The program.
    pub app: PathBuf,
}

/// The stand-in driver and the program, compiled once per test process.
pub fn built() -> &'static Built {
    static BUILT: OnceLock<Built> = OnceLock::new();
    BUILT.get_or_init(|| {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("c");
        let dir = tempfile::tempdir().expect("temp dir");
        let standin = dir.path().join("libcuda-standin.so");
        let app = dir.path().join("governed_app");
        // -Bsymbolic: the driver's own references to its functions stay its own, as in the
        // real libcuda (the interposer's exports must not capture them).
        let builds: [(Vec<&str>, PathBuf, &Path); 2] = [
            (
                vec!["-shared", "-fPIC", "-Wl,-Bsymbolic"],
                src.join("standin_libcuda.c"),
                &standin,
            ),
            (vec!["-ldl", "-pthread"], src.join("governed_app.c"), &app),
        ];
        for (flags, source, out) in builds {
            crate::cc::compile(&source, &flags, out);
        }
        Built {
            _dir: dir,
            standin,
            app,
        }
    })
}

/// The interposer library, as built.
pub fn interposer() -> PathBuf {
    binary("libgpushare_interpose.so")
}

/// The program under `gpushare run` against `socket`, with `args` after the driver's path.
pub fn governed_app(socket: &Path, run_args: &[&str], args: &[&str]) -> Command {
    let b = built();
    let mut cmd = Command::new(binary("gpushare"));
    cmd.arg("--socket")
        .arg(socket)
        .arg("run")
        .arg("--mode")
        .arg("governed")
        .arg("--interposer")
        .arg(interposer())
        .args(run_args)
        .arg("--")
        .arg(&b.app)
        .arg(&b.standin)
        .args(args)
        .env("GPUSHARE_REAL_LIBCUDA", &b.standin)
        .env_remove("LD_PRELOAD");
    cmd
}

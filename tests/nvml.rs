//! gpushare's NVML shim (`client-lib/nvml`, installed as `libnvidia-ml.so.1`) between a
//! program that lists GPUs as pynvml and PyTorch do (`tests/c/nvml_user.c`, which opens the
//! library by its soname) and a stand-in NVML with three fake GPUs (`tests/c/nvml_standin.c`):
//! what the program sees with and without `GPUSHARE_GPU_UUIDS`, and without a real NVML.
//!
//! Needs `cc` and the shim built (`cargo build -p gpushare-nvml`, or the workspace) for
//! `libgpushare_nvml.so`; a test fails, loudly, when either is missing.

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use gpushare_tests::{binary, cc};

const UUIDS: [&str; 3] = [
    "GPU-00000000-0000-0000-0000-000000000001",
    "GPU-00000000-0000-0000-0000-000000000002",
    "GPU-00000000-0000-0000-0000-000000000003",
];
const PCI: [&str; 3] = ["00000000:01:00.0", "00000000:02:00.0", "00000000:03:00.0"];

/// The built shim, the stand-in NVML and the user program, each in its own folder.
struct Setup {
    dir: tempfile::TempDir,
    /// Holds only `libnvidia-ml.so.1`, a link to the shim: the program's LD_LIBRARY_PATH.
    shim_dir: PathBuf,
    /// The stand-in NVML, `libnvidia-ml.so.1`.
    standin: PathBuf,
    user: PathBuf,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().expect("temp dir");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("c");
    let shim_dir = dir.path().join("shim");
    let real_dir = dir.path().join("real");
    for d in [&shim_dir, &real_dir] {
        std::fs::create_dir(d).expect("create dir");
    }
    let built = binary("libgpushare_nvml.so");
    std::os::unix::fs::symlink(&built, shim_dir.join("libnvidia-ml.so.1"))
        .unwrap_or_else(|e| panic!("link {}: {e}", built.display()));
    let standin = real_dir.join("libnvidia-ml.so.1");
    cc::nvml_standin(&standin);
    let user = dir.path().join("nvml_user");
    cc::compile(&src.join("nvml_user.c"), &["-ldl", "-pthread"], &user);
    Setup {
        dir,
        shim_dir,
        standin,
        user,
    }
}

impl Setup {
    /// The user program asking for `args`, with the shim first on its library path and the
    /// stand-in as the real NVML.
    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(&self.user);
        cmd.args(args)
            .env("LD_LIBRARY_PATH", &self.shim_dir)
            .env("GPUSHARE_REAL_NVML", &self.standin)
            .env_remove("GPUSHARE_GPU_UUIDS")
            .env_remove("GPUSHARE_TEST_NVML_UUIDS")
            .env_remove("CUDA_VISIBLE_DEVICES");
        cmd
    }
}

fn run(mut cmd: Command) -> (Output, String, String) {
    let out = cmd.output().unwrap_or_else(|e| panic!("run {cmd:?}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out, stdout, stderr)
}

/// Runs `cmd`, which must succeed, and returns its lines.
fn lines(cmd: Command) -> Vec<String> {
    let (out, stdout, stderr) = run(cmd);
    assert!(
        out.status.success(),
        "nvml_user failed ({}):\n{stdout}{stderr}",
        out.status
    );
    stdout.lines().map(str::to_string).collect()
}

/// The line the program prints for stand-in GPU `gpu` (0-based) at NVML index `index`.
fn device_line(index: usize, gpu: usize) -> String {
    format!(
        "nvml device {index} uuid={} pci={} name=Stand-in GPU {gpu} index={index} temp={}",
        UUIDS[gpu],
        PCI[gpu],
        40 + gpu
    )
}

fn expect(got: &[String], want: &[String]) {
    assert_eq!(
        got, want,
        "what the program printed, and what it should have"
    );
}

#[test]
fn without_uuids_every_gpu_passes_through() {
    let s = setup();
    let got = lines(s.command(&[UUIDS[0], UUIDS[2], PCI[1]]));
    let want = vec![
        "error string 6 = Not Found".to_string(),
        "count 3".into(),
        device_line(0, 0),
        device_line(1, 1),
        device_line(2, 2),
        "handle 3 -> error 2".into(),
        format!("lookup {} -> found index 0", UUIDS[0]),
        format!("lookup {} -> found index 2", UUIDS[2]),
        format!("lookup {} -> found index 1", PCI[1]),
        format!("nearest 2: {} {}", UUIDS[1], UUIDS[2]),
        format!("gpu set 3: {} {} {}", UUIDS[0], UUIDS[1], UUIDS[2]),
    ];
    expect(&got, &want);
}

#[test]
fn one_uuid_shows_that_gpu_alone_at_index_0() {
    let s = setup();
    let mut cmd = s.command(&[UUIDS[0], UUIDS[1], UUIDS[2], PCI[0], PCI[2]]);
    cmd.env("GPUSHARE_GPU_UUIDS", UUIDS[2]);
    let got = lines(cmd);
    let want = vec![
        "error string 6 = Not Found".to_string(),
        "count 1".into(),
        // The stand-in's UUID, PCI id and name; the temperature, which the shim only
        // forwards, says the stand-in's third GPU answered.
        device_line(0, 2),
        "handle 1 -> error 2".into(),
        format!("lookup {} -> error 6", UUIDS[0]),
        format!("lookup {} -> error 6", UUIDS[1]),
        format!("lookup {} -> found index 0", UUIDS[2]),
        format!("lookup {} -> error 6", PCI[0]),
        format!("lookup {} -> found index 0", PCI[2]),
        "nearest 0:".into(),
        format!("gpu set 1: {}", UUIDS[2]),
    ];
    expect(&got, &want);
}

#[test]
fn two_uuids_are_indexed_in_the_given_order() {
    let s = setup();
    let mut cmd = s.command(&[UUIDS[0], UUIDS[1], UUIDS[2]]);
    cmd.env("GPUSHARE_GPU_UUIDS", format!("{},{}", UUIDS[2], UUIDS[0]));
    let got = lines(cmd);
    let want = vec![
        "error string 6 = Not Found".to_string(),
        "count 2".into(),
        device_line(0, 2),
        device_line(1, 0),
        "handle 2 -> error 2".into(),
        format!("lookup {} -> found index 1", UUIDS[0]),
        format!("lookup {} -> error 6", UUIDS[1]),
        format!("lookup {} -> found index 0", UUIDS[2]),
        // Near the stand-in's third GPU: the other two, less the one not visible.
        format!("nearest 1: {}", UUIDS[0]),
        // Sets come in index order.
        format!("gpu set 2: {} {}", UUIDS[2], UUIDS[0]),
    ];
    expect(&got, &want);
}

#[test]
fn a_uuid_nvml_does_not_know_is_dropped_and_said_once() {
    let s = setup();
    let mut cmd = s.command(&[]);
    cmd.env(
        "GPUSHARE_GPU_UUIDS",
        format!("GPU-not-a-gpu, {} ,GPU-not-a-gpu", UUIDS[1]),
    );
    let (out, stdout, stderr) = run(cmd);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("count 1\n"), "{stdout}");
    assert!(stdout.contains(&device_line(0, 1)), "{stdout}");
    let note = "gpushare: GPUSHARE_GPU_UUIDS names GPU-not-a-gpu, which NVML does not know (Not Found): the program does not see it";
    assert_eq!(stderr.matches(note).count(), 1, "stderr:\n{stderr}");
}

#[test]
fn without_a_real_nvml_every_call_fails_with_library_not_found_said_once() {
    let s = setup();
    let missing = s.dir.path().join("nowhere/libnvidia-ml.so.1");
    let mut cmd = s.command(&[]);
    cmd.env("GPUSHARE_REAL_NVML", &missing)
        .env("GPUSHARE_GPU_UUIDS", UUIDS[0]);
    let (out, stdout, stderr) = run(cmd);
    assert_eq!(out.status.code(), Some(3), "{stdout}{stderr}");
    // nvmlErrorString still answers (programs print nvmlInit's error with it).
    assert_eq!(
        stdout,
        "error string 6 = Not Found\ninit error 12 (NVML Shared Library Not Found)\n"
    );
    let note = format!(
        "gpushare: no NVIDIA NVML to forward to (GPUSHARE_REAL_NVML={}: no such file)",
        missing.display()
    );
    assert!(stderr.starts_with(&note), "stderr:\n{stderr}");
    assert!(
        stderr.contains("every NVML call fails with NVML_ERROR_LIBRARY_NOT_FOUND"),
        "stderr:\n{stderr}"
    );
    assert_eq!(stderr.matches("gpushare: ").count(), 1, "stderr:\n{stderr}");
}

#[test]
fn the_search_skips_the_shim_and_copies_of_it() {
    let s = setup();
    // LD_LIBRARY_PATH: the shim, a copy of it (another file), then the stand-in's folder.
    let copy_dir = s.dir.path().join("copy");
    std::fs::create_dir(&copy_dir).expect("create dir");
    std::fs::copy(
        binary("libgpushare_nvml.so"),
        copy_dir.join("libnvidia-ml.so.1"),
    )
    .expect("copy the shim");
    let real_dir = s.standin.parent().expect("stand-in's folder");
    let path = std::env::join_paths([&s.shim_dir, &copy_dir, &real_dir.to_path_buf()])
        .expect("library path");
    let mut cmd = s.command(&[]);
    cmd.env_remove("GPUSHARE_REAL_NVML")
        .env("LD_LIBRARY_PATH", path)
        .env("GPUSHARE_GPU_UUIDS", UUIDS[1]);
    let got = lines(cmd);
    assert_eq!(got[1..3], ["count 1".to_string(), device_line(0, 1)]);
}

#[test]
fn the_shim_exports_every_name_of_its_symbol_list() {
    let list = Path::new(env!("CARGO_MANIFEST_DIR")).join("../client-lib/nvml/symbols.txt");
    let text =
        std::fs::read_to_string(&list).unwrap_or_else(|e| panic!("read {}: {e}", list.display()));
    let names: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    assert!(names.len() > 400, "{} names only", names.len());
    let built = binary("libgpushare_nvml.so");
    let path = CString::new(built.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: a NUL-terminated path; the shim runs nothing when it is loaded.
    let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    assert!(!handle.is_null(), "dlopen {}", built.display());
    let missing: Vec<&str> = names
        .iter()
        .copied()
        .filter(|name| {
            let name = CString::new(*name).expect("name");
            // SAFETY: a handle from dlopen and a NUL-terminated name.
            unsafe { libc::dlsym(handle, name.as_ptr()) }.is_null()
        })
        .collect();
    assert!(missing.is_empty(), "not exported: {missing:?}");
    // SAFETY: as above.
    let marker = unsafe { libc::dlsym(handle, c"gpushare_nvml_shim".as_ptr()) };
    assert!(!marker.is_null(), "the shim's marker is not exported");
}

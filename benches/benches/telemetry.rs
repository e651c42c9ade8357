//! What the eBPF telemetry costs the processes it watches: the same syscalls with the programs
//! detached and attached.
//!
//! - `telemetry/ioctl_gpu_fd/*`: an ioctl (NVIDIA's RM_CONTROL number) on a "GPU" descriptor,
//!   a stand-in file under the telemetry prefix: both programs run and account it.
//! - `telemetry/ioctl_other_fd/*`: the same ioctl on a file outside the prefix: what every
//!   process that never touches the GPU pays per ioctl (one map lookup that misses, twice).
//! - `telemetry/openat_close/*`: open and close a file outside the prefix: the path check.
//! - `telemetry/getppid/*`: a syscall no program watches: the cost of syscall tracepoints
//!   being enabled at all.
//!
//! The stand-in's ioctl fails at once (ENOTTY), so the relative numbers here are far worse
//! than on a real GPU, whose RM ioctls take microseconds: the absolute difference (ns per call)
//! is what carries over. Needs root; prints `SKIPPED` and measures only the detached cases
//! otherwise. `cargo bench -p gpushare-benches --bench telemetry`.

use std::hint::black_box;
use std::os::fd::{AsRawFd as _, RawFd};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use gpushare_broker::telemetry::{Telemetry, TelemetryOptions};
use nix::libc;

/// `_IOWR('F', 0x2a, [u8; 32])`: NVIDIA's RM_CONTROL.
const RM_CONTROL: libc::Ioctl = 0xc020_462a;

struct Files {
    dir: tempfile::TempDir,
    gpu: std::fs::File,
    other: std::fs::File,
}

impl Files {
    fn new() -> Files {
        let dir = tempfile::tempdir().expect("temp dir");
        let open = |name: &str| {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(dir.path().join(name))
                .expect("create stand-in file")
        };
        let gpu = open("nvidia-standin0");
        let other = open("plain-file");
        Files { dir, gpu, other }
    }

    fn prefix(&self) -> String {
        self.dir
            .path()
            .join("nvidia")
            .to_string_lossy()
            .into_owned()
    }
}

fn ioctl(fd: RawFd, buf: &mut [u8; 64]) -> i32 {
    // SAFETY: `buf` is a live buffer larger than the 32 bytes the command declares; the result
    // (ENOTTY on a regular file) is only passed to black_box.
    unsafe { libc::ioctl(fd, RM_CONTROL, buf.as_mut_ptr()) }
}

fn open_close(path: &std::ffi::CStr) {
    // SAFETY: `path` is NUL-terminated and outlives the call; the descriptor is closed at once.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
        if fd >= 0 {
            libc::close(fd);
        }
    }
}

fn getppid() -> i32 {
    // SAFETY: getppid has no preconditions.
    unsafe { libc::getppid() }
}

/// A named case: a closure run once per iteration.
type Case<'a> = (&'static str, Box<dyn FnMut() + 'a>);

/// The cases, in the order of the module comment.
fn cases(files: &Files) -> Vec<Case<'_>> {
    let gpu = files.gpu.as_raw_fd();
    let other = files.other.as_raw_fd();
    let other_path = std::ffi::CString::new(
        files
            .dir
            .path()
            .join("plain-file")
            .to_string_lossy()
            .into_owned(),
    )
    .expect("path without NUL");
    let mut buf_gpu = [0u8; 64];
    let mut buf_other = [0u8; 64];
    vec![
        (
            "ioctl_gpu_fd",
            Box::new(move || {
                black_box(ioctl(gpu, &mut buf_gpu));
            }),
        ),
        (
            "ioctl_other_fd",
            Box::new(move || {
                black_box(ioctl(other, &mut buf_other));
            }),
        ),
        ("openat_close", Box::new(move || open_close(&other_path))),
        (
            "getppid",
            Box::new(|| {
                black_box(getppid());
            }),
        ),
    ]
}

/// Median ns per call over `rounds` rounds of `n` calls: a plain figure for the summary.
fn median_ns(f: &mut dyn FnMut(), n: u32, rounds: usize) -> f64 {
    let mut per_call: Vec<f64> = (0..rounds)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..n {
                f();
            }
            start.elapsed().as_nanos() as f64 / f64::from(n)
        })
        .collect();
    per_call.sort_by(f64::total_cmp);
    per_call[rounds / 2]
}

fn telemetry_overhead(c: &mut Criterion) {
    let files = Files::new();
    let mut group = c.benchmark_group("telemetry");
    group
        .sample_size(50)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));

    let mut detached = Vec::new();
    for (name, mut f) in cases(&files) {
        group.bench_function(format!("{name}/detached"), |b| b.iter(&mut f));
        detached.push((name, median_ns(&mut f, 100_000, 11)));
    }

    let opts = TelemetryOptions {
        dev_prefix: files.prefix(),
        uprobes: false,
        libcuda: None,
    };
    // The stand-in was opened before the programs were attached: seeding from /proc must make
    // it a GPU descriptor, which the sanity check below confirms.
    let telemetry = match Telemetry::start(&opts) {
        Ok(t) => t,
        Err(reason) => {
            let _ = std::io::Write::write_all(
                &mut std::io::stderr(),
                format!("SKIPPED telemetry overhead (attached cases): {reason}\n").as_bytes(),
            );
            group.finish();
            return;
        }
    };
    let mut attached = Vec::new();
    for (name, mut f) in cases(&files) {
        group.bench_function(format!("{name}/attached"), |b| b.iter(&mut f));
        attached.push((name, median_ns(&mut f, 100_000, 11)));
    }
    group.finish();

    println!("\ntelemetry overhead summary (median ns per call, 11 x 100k calls):");
    println!(
        "{:<16} {:>10} {:>10} {:>10} {:>8}",
        "case", "detached", "attached", "added", "ratio"
    );
    for ((name, off), (_, on)) in detached.iter().zip(&attached) {
        println!(
            "{name:<16} {off:>10.1} {on:>10.1} {:>10.1} {:>7.2}x",
            on - off,
            on / off
        );
    }
    let me = std::process::id() as i32;
    let counted: u64 = telemetry
        .snapshot()
        .iter()
        .filter(|p| p.pid == me)
        .map(|p| p.total_ioctls())
        .sum();
    assert!(
        counted > 0,
        "the benchmark's GPU ioctls were not counted: the attached figures are meaningless"
    );

    println!("({counted} ioctls of this process counted by telemetry)");
}

criterion_group!(benches, telemetry_overhead);
criterion_main!(benches);

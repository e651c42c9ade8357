//! A process that touches a stand-in GPU device file the way a CUDA program touches
//! `/dev/nvidia*`, for the eBPF telemetry tests and benchmark.
//!
//! `gpushare-ioctl-child STEP...`, steps run in order on one "current" descriptor:
//! - `open=PATH`: open PATH read-write (created if missing); it becomes current.
//! - `ioctl=N` or `ioctl=N:CMD`: N ioctls on the current descriptor with command CMD (hex with
//!   `0x`, or decimal; default 0xc020462a, NVIDIA's RM_CONTROL `_IOWR('F', 0x2a, 32 bytes)`).
//!   On a regular file they fail with ENOTTY, which is fine: the syscall happened.
//! - `close`: close the current descriptor.
//! - `dup`: replace the current descriptor by a `dup` of it (the old one is closed).
//! - `dup2=N`: replace it by descriptor N, made with `dup2`.
//! - `wait`: print `ready`, then wait for a line (or end of input) on stdin.
//! - `exec`: replace this process (same pid) by a new run of this program with the steps that
//!   follow; descriptors are close-on-exec, so the current one is gone.
//!
//! It exits 0 after the last step, 2 on a bad step or a failed open/dup.

use std::io::{BufRead as _, Write as _};
use std::os::fd::{IntoRawFd as _, RawFd};

/// `_IOWR('F', 0x2a, [u8; 32])`.
const RM_CONTROL: u64 = 0xc020_462a;

fn main() {
    let mut current: Option<RawFd> = None;
    // A buffer the size any stand-in command might name; the kernel never touches it here.
    let mut arg = vec![0u8; 1 << 14];
    let args: Vec<String> = std::env::args().collect();
    for (i, step) in args.iter().enumerate().skip(1) {
        let step = step.clone();
        let (verb, value) = step.split_once('=').unwrap_or((step.as_str(), ""));
        match verb {
            "open" => {
                let file = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .open(value)
                    .unwrap_or_else(|e| fail(&format!("cannot open {value}: {e}")));
                current = Some(file.into_raw_fd());
            }
            "ioctl" => {
                let fd = current.unwrap_or_else(|| fail("ioctl before open"));
                let (count, cmd) = value.split_once(':').unwrap_or((value, ""));
                let count: u64 = count
                    .parse()
                    .unwrap_or_else(|_| fail(&format!("bad count in {step}")));
                let cmd = if cmd.is_empty() {
                    RM_CONTROL
                } else {
                    parse_number(cmd).unwrap_or_else(|| fail(&format!("bad command in {step}")))
                };
                for _ in 0..count {
                    // SAFETY: `arg` is a live, writable buffer larger than any size an ioctl
                    // number can encode (14 bits); the result is deliberately ignored.
                    unsafe { libc::ioctl(fd, cmd as libc::Ioctl, arg.as_mut_ptr()) };
                }
            }
            "close" => {
                let fd = current.take().unwrap_or_else(|| fail("close before open"));
                // SAFETY: `fd` is a descriptor this process opened and still owns.
                unsafe { libc::close(fd) };
            }
            "dup" => {
                let fd = current.unwrap_or_else(|| fail("dup before open"));
                // SAFETY: plain descriptor syscalls on a descriptor this process owns.
                let new = unsafe { libc::dup(fd) };
                if new < 0 {
                    fail(&format!("dup: {}", std::io::Error::last_os_error()));
                }
                // SAFETY: as above; `fd` is not used again.
                unsafe { libc::close(fd) };
                current = Some(new);
            }
            "dup2" => {
                let fd = current.unwrap_or_else(|| fail("dup2 before open"));
                let target: RawFd = value
                    .parse()
                    .unwrap_or_else(|_| fail(&format!("bad descriptor in {step}")));
                // SAFETY: plain descriptor syscalls on descriptors this process owns.
                if unsafe { libc::dup2(fd, target) } < 0 {
                    fail(&format!("dup2: {}", std::io::Error::last_os_error()));
                }
                // SAFETY: as above; `fd` is not used again.
                unsafe { libc::close(fd) };
                current = Some(target);
            }
            "wait" => {
                println!("ready");
                let _ = std::io::stdout().flush();
                let mut line = String::new();
                let _ = std::io::stdin().lock().read_line(&mut line);
            }
            "exec" => {
                use std::os::unix::process::CommandExt as _;
                let err = std::process::Command::new("/proc/self/exe")
                    .arg0(&args[0])
                    .args(&args[i + 1..])
                    .exec();
                fail(&format!("exec: {err}"));
            }
            _ => fail(&format!("unknown step `{step}`")),
        }
    }
}

fn parse_number(s: &str) -> Option<u64> {
    match s.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => s.parse().ok(),
    }
}

fn fail(message: &str) -> ! {
    eprintln!("gpushare-ioctl-child: {message}");
    std::process::exit(2);
}

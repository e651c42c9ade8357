//! A small helper process that keeps the CUDA driver initialised while gpushared restarts.
//!
//! After a sticky fault gpushared restarts itself (exec), and the new image must bring CUDA
//! up again before anyone is served; `cuInit` in a fresh process is several times faster when
//! another process has the driver initialised. So gpushared starts a holder: a child that
//! calls `cuInit` (no context, no GPU memory) and then waits on a pipe. The pipe's write end goes through the restart's exec, so the
//! next image adopts the same holder; it never holds the faulted context, which is torn down
//! with the old image. When gpushared exits for good (or is killed), the pipe closes and the
//! holder exits too.

use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::process::{Command, Stdio};
use std::sync::Mutex;

/// The hidden command-line flag that makes gpushared the holder.
pub const HOLDER_FLAG: &str = "--hold-cuda-driver";
/// Names the pipe to the holder (the number of its write end) in a restarted image.
pub const HOLDER_ENV: &str = "GPUSHARE_CUDA_HOLDER";

/// This image's end of the pipe to its holder.
static PIPE: Mutex<Option<OwnedFd>> = Mutex::new(None);

/// The holder process: initialise the driver, then wait until gpushared is gone.
pub fn run_holder() -> ! {
    // SAFETY: only probes whether the library can be loaded.
    if unsafe { cudarc::driver::sys::is_culib_present() } {
        let _ = cudarc::driver::result::init();
    }
    // EOF (or an error) on stdin: every gpushared image that held the pipe is gone.
    let mut byte = [0u8; 1];
    while matches!(std::io::stdin().read(&mut byte), Ok(n) if n > 0) {}
    std::process::exit(0)
}

/// Adopts the holder a previous image started (named in [`HOLDER_ENV`]), or starts one.
pub fn keep_driver_warm() {
    let mut pipe = PIPE.lock().unwrap_or_else(|e| e.into_inner());
    if pipe.is_some() {
        return;
    }
    if let Some(fd) = adopt() {
        tracing::debug!("kept the CUDA driver holder of the previous image");
        *pipe = Some(fd);
        return;
    }
    match start() {
        Ok((fd, pid)) => {
            tracing::debug!(
                pid,
                "CUDA driver holder started (keeps a restart after a fault fast)"
            );
            *pipe = Some(fd);
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot start the CUDA driver holder; a restart after a GPU fault will take about 0.1 s longer")
        }
    }
}

/// Just before exec: lets the pipe survive it, and says how the next image finds it.
pub fn hand_over() -> Option<String> {
    let pipe = PIPE.lock().unwrap_or_else(|e| e.into_inner());
    let fd = pipe.as_ref()?.as_raw_fd();
    // Clearing close-on-exec on our own descriptor, right before the exec.
    nix::fcntl::fcntl(
        pipe.as_ref()?,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
    )
    .ok()?;
    Some(fd.to_string())
}

fn adopt() -> Option<OwnedFd> {
    let text = std::env::var(HOLDER_ENV).ok()?;
    let fd: RawFd = text.parse().ok()?;
    // Only gpushared's own restart names one: a pipe nothing else in this process uses.
    if fd < 3 {
        return None;
    }
    let link = std::fs::read_link(format!("/proc/self/fd/{fd}")).ok()?;
    if !link.to_string_lossy().starts_with("pipe:") {
        return None;
    }
    // SAFETY: checked above that it is an open pipe that the previous image handed over and
    // that nothing else owns.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    // Close-on-exec again: only the restart's own exec passes it on.
    nix::fcntl::fcntl(
        &owned,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
    )
    .ok()?;
    Some(owned)
}

fn start() -> std::io::Result<(OwnedFd, u32)> {
    use std::os::unix::process::CommandExt;
    let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    let mut cmd = Command::new("/proc/self/exe");
    cmd.arg(HOLDER_FLAG)
        .stdin(Stdio::from(read))
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: runs in the child between fork and exec and only makes a syscall. Closing
    // everything above stdio keeps the child from inheriting any of our GPU descriptors, which
    // would keep a faulted context alive after we are gone.
    unsafe {
        cmd.pre_exec(|| {
            libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32);
            Ok(())
        });
    }
    let child = cmd.spawn()?;
    let pid = child.id();
    // Reaped if it ends early; otherwise it outlives this image as our child.
    std::thread::Builder::new()
        .name("cuda-holder-wait".into())
        .spawn(move || {
            let mut child = child;
            let _ = child.wait();
        })?;
    Ok((write, pid))
}

//! A device worker process as gpushared holds it: started from gpushared's own executable,
//! spoken to on a SEQPACKET control socket (channels, shared memory and big payloads go over
//! it, with their descriptors), watched until it exits, and killed when it must go.

use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpushare_protocol::socket::{SocketError, recv_message, send_message};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};

use super::wire::{FromWorker, ToWorker, WorkerSpec};

/// The command-line flag that makes gpushared a device worker.
pub const WORKER_FLAG: &str = "--device-worker";
/// The environment variable that names the worker's end of its control socket.
pub const WORKER_FD_ENV: &str = "GPUSHARE_WORKER_FD";
/// How long a control request may wait for the worker's answer.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a worker could not be started or asked.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("cannot start a device worker ({exe}): {source}")]
    Spawn {
        exe: PathBuf,
        source: std::io::Error,
    },
    #[error("the device worker exited: {0}")]
    Exited(String),
    #[error("the device worker did not answer within {0:?}")]
    Silent(Duration),
    #[error("the device worker refused: {0}")]
    Refused(String),
    #[error("cannot open the device: {0}")]
    DeviceFailed(String),
    #[error("talking to the device worker: {0}")]
    Socket(String),
}

/// A running (or ended) worker.
pub struct WorkerProcess {
    pub pid: i32,
    control: Mutex<OwnedFd>,
    alive: Arc<AtomicBool>,
    exit: Arc<Mutex<Option<String>>>,
}

impl WorkerProcess {
    /// Starts `exe --device-worker` with `spec`; returns once it runs (not once its device is
    /// open: see [`WorkerProcess::ready`]).
    pub fn spawn(exe: &Path, spec: &WorkerSpec) -> Result<WorkerProcess, WorkerError> {
        let spawn_err = |source: std::io::Error| WorkerError::Spawn {
            exe: exe.to_path_buf(),
            source,
        };
        let (ours, theirs) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .map_err(|e| spawn_err(e.into()))?;
        let their_fd: RawFd = theirs.as_raw_fd();
        let mut command = std::process::Command::new(exe);
        command
            .arg(WORKER_FLAG)
            .env(WORKER_FD_ENV, their_fd.to_string())
            // One malloc arena, and no malloc'd blocks mapped on their own: the heap then
            // grows by brk, away from where the driver reserves module data's addresses
            // (worker/zone.rs says why that matters).
            .env("MALLOC_ARENA_MAX", "1")
            .env("MALLOC_MMAP_MAX_", "0");
        // A worker never outlives gpushared (it holds a GPU context for it): it exits when its
        // control socket closes, which gpushared's end does when gpushared ends however it
        // ends. (PR_SET_PDEATHSIG would not do: it fires when the *thread* that started the
        // worker exits.) So it needs no signal of its own, and has a process group of its own:
        // a Ctrl-C at gpushared's terminal or a signal to gpushared's group (timeout(1)) would
        // kill it beside gpushared, which then took the death for a GPU fault mid-shutdown.
        command.process_group(0);
        // SAFETY: between fork and exec only async-signal-safe calls (fcntl, personality).
        unsafe {
            command.pre_exec(move || {
                // The worker keeps its end of the socket across exec (it is close-on-exec here).
                if libc::fcntl(their_fd, libc::F_SETFD, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // Device addresses are carved from the worker's own address space, and a
                // consolidated client must find them free in its own. With the bottom-up
                // layout the worker's mappings grow up from a third of the address space,
                // tens of TiB below where programs' libraries and mmaps go (top-down from the
                // stack), so the two cannot meet (docs/consolidated.md). Without address
                // randomisation every worker's host mappings, and so where the driver puts a
                // module's globals in device memory, come out the same: a spare that takes
                // over finds a client's globals where the client looked them up
                // (docs/reliability.md, "Module globals").
                let current = libc::personality(0xffff_ffff);
                if current != -1 {
                    let flags = current | libc::ADDR_COMPAT_LAYOUT | libc::ADDR_NO_RANDOMIZE;
                    libc::personality(flags as libc::c_ulong);
                }
                Ok(())
            })
        };
        let mut child = command.spawn().map_err(spawn_err)?;
        drop(theirs);
        let pid = child.id() as i32;
        let alive = Arc::new(AtomicBool::new(true));
        let exit = Arc::new(Mutex::new(None));
        {
            let (alive, exit) = (alive.clone(), exit.clone());
            let reaper = std::thread::Builder::new()
                .name(format!("gpushare-reap-{pid}"))
                .spawn(move || {
                    let how = match child.wait() {
                        Ok(status) => describe(status),
                        Err(e) => format!("cannot wait for it: {e}"),
                    };
                    *exit.lock().unwrap_or_else(|e| e.into_inner()) = Some(how);
                    alive.store(false, Ordering::Release);
                });
            if let Err(e) = reaper {
                tracing::warn!(pid, error = %e, "cannot start the thread that watches a device worker");
            }
        }
        let worker = WorkerProcess {
            pid,
            control: Mutex::new(ours),
            alive,
            exit,
        };
        worker.send(&ToWorker::Start(spec.clone()), &[])?;
        Ok(worker)
    }

    /// Waits until the worker has opened its device; returns what it reports.
    pub fn ready(&self, timeout: Duration) -> Result<FromWorker, WorkerError> {
        let control = self.control.lock().unwrap_or_else(|e| e.into_inner());
        match self.receive(&control, timeout)? {
            FromWorker::Failed { reason } => Err(WorkerError::DeviceFailed(reason)),
            other => Ok(other),
        }
    }

    pub fn alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    /// How it exited, once it has.
    pub fn exit(&self) -> Option<String> {
        if self.alive() {
            return None;
        }
        self.exit.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Why it can no longer serve, if it cannot.
    pub fn gone(&self) -> Option<String> {
        (!self.alive()).then(|| {
            self.exit()
                .unwrap_or_else(|| "the device worker exited".into())
        })
    }

    /// Ends it now (a worker whose context is lost, or that hangs).
    pub fn kill(&self) {
        if self.alive() {
            // SAFETY: a signal to our own child, which the reaper has not reaped (alive).
            unsafe { libc::kill(self.pid, libc::SIGKILL) };
        }
    }

    /// Sends a control message with descriptors and waits for its answer.
    pub fn request(&self, msg: &ToWorker, fds: &[RawFd]) -> Result<(), WorkerError> {
        let control = self.control.lock().unwrap_or_else(|e| e.into_inner());
        send_message(control.as_fd(), msg, fds).map_err(|e| self.socket_error(e))?;
        match self.receive(&control, CONTROL_TIMEOUT)? {
            FromWorker::Ack => Ok(()),
            FromWorker::Refused { reason } => Err(WorkerError::Refused(reason)),
            other => Err(WorkerError::Socket(format!("unexpected answer {other:?}"))),
        }
    }

    /// Sends a control message with descriptors and waits for an answer that brings one.
    pub fn request_fd(&self, msg: &ToWorker, fds: &[RawFd]) -> Result<OwnedFd, WorkerError> {
        let control = self.control.lock().unwrap_or_else(|e| e.into_inner());
        send_message(control.as_fd(), msg, fds).map_err(|e| self.socket_error(e))?;
        match self.receive_with_fds(&control, CONTROL_TIMEOUT)? {
            (FromWorker::Refused { reason }, _) => Err(WorkerError::Refused(reason)),
            (_, mut fds) if !fds.is_empty() => Ok(fds.remove(0)),
            (other, _) => Err(WorkerError::Socket(format!("unexpected answer {other:?}"))),
        }
    }

    fn send(&self, msg: &ToWorker, fds: &[RawFd]) -> Result<(), WorkerError> {
        let control = self.control.lock().unwrap_or_else(|e| e.into_inner());
        send_message(control.as_fd(), msg, fds).map_err(|e| self.socket_error(e))
    }

    fn receive(&self, control: &OwnedFd, timeout: Duration) -> Result<FromWorker, WorkerError> {
        self.receive_with_fds(control, timeout).map(|(msg, _)| msg)
    }

    fn receive_with_fds(
        &self,
        control: &OwnedFd,
        timeout: Duration,
    ) -> Result<(FromWorker, Vec<OwnedFd>), WorkerError> {
        let started = std::time::Instant::now();
        loop {
            let left = timeout.saturating_sub(started.elapsed());
            if left.is_zero() {
                return Err(WorkerError::Silent(timeout));
            }
            let slice = left.min(Duration::from_millis(100));
            let mut fds = [PollFd::new(control.as_fd(), PollFlags::POLLIN)];
            let ms = PollTimeout::try_from(slice.as_millis() as i32).unwrap_or(PollTimeout::MAX);
            match poll(&mut fds, ms) {
                Ok(0) | Err(nix::errno::Errno::EINTR) => {
                    if let Some(why) = self.gone() {
                        return Err(WorkerError::Exited(why));
                    }
                }
                Ok(_) => {
                    return recv_message::<FromWorker>(control.as_fd())
                        .map_err(|e| self.socket_error(e));
                }
                Err(e) => return Err(WorkerError::Socket(e.to_string())),
            }
        }
    }

    fn socket_error(&self, e: SocketError) -> WorkerError {
        match e {
            SocketError::Closed => {
                // The reaper may not have seen the exit yet.
                for _ in 0..50 {
                    if let Some(why) = self.gone() {
                        return WorkerError::Exited(why);
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                WorkerError::Exited("it closed its control socket".into())
            }
            other => WorkerError::Socket(other.to_string()),
        }
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// How a process ended, in words.
fn describe(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(0), _) => "it exited".into(),
        (Some(code), _) => format!("it exited with status {code}"),
        (None, Some(sig)) => {
            let name = nix::sys::signal::Signal::try_from(sig)
                .map(|s| s.as_str().to_string())
                .unwrap_or_else(|_| sig.to_string());
            format!("it was killed by {name}")
        }
        _ => "it ended".into(),
    }
}

//! One session with gpushared: the control socket, the shared region and its rings.

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gpushare_protocol::control::{ClientMessage, Hello, Role, ShutdownKind, WELCOME_FDS, Welcome};
use gpushare_protocol::ring::{ClientRings, SHM_MAGIC, ShmLayout};
use gpushare_protocol::wake::Wakeup;
use gpushare_protocol::{ErrorCode, PROTOCOL_VERSION, PriorityClass};
use memmap2::{MmapOptions, MmapRaw};

use crate::error::{Error, Result};
use crate::notices::Notices;
use crate::socket::ControlSocket;
use crate::state::{Dead, RingState, lock};

/// How a session is asked for.
#[derive(Debug, Clone)]
pub struct SessionOptions {
    /// Broker socket; defaults to `$GPUSHARE_SOCKET` or `/run/gpushare/gpushare.sock`.
    pub socket: PathBuf,
    /// Name shown in `gpushare status`; defaults to the process name.
    pub name: String,
    pub role: Role,
    /// Ask for a less important class than the policy grants (never more).
    pub class: Option<PriorityClass>,
    /// Submission ring entries (0 = broker default).
    pub sq_entries: u32,
    /// Data arena bytes (0 = broker default).
    pub arena_size: u64,
    /// The GPU to run on (index); `None` lets the broker pick the least loaded.
    pub gpu: Option<u32>,
    /// How long to spin for a completion before sleeping.
    pub spin: Duration,
    /// How long any call waits for gpushared without a sign of life before the session is
    /// declared dead (`GPUSHARE_TIMEOUT`, 30 s by default): a stopped or wedged broker is
    /// reported, never waited on forever.
    pub timeout: Duration,
}

impl SessionOptions {
    /// Defaults for `role`: the socket from the environment, the process name.
    pub fn new(role: Role) -> SessionOptions {
        SessionOptions {
            socket: gpushare_protocol::socket_path_from_env(),
            name: process_name(),
            role,
            class: None,
            sq_entries: 0,
            arena_size: 0,
            gpu: None,
            spin: Duration::from_micros(50),
            timeout: crate::env::broker_timeout(),
        }
    }

    fn hello(&self) -> Hello {
        Hello {
            protocol_version: PROTOCOL_VERSION,
            role: self.role,
            client_name: self.name.clone(),
            requested_class: self.class,
            sq_entries: self.sq_entries,
            arena_size: self.arena_size,
            gpu: self.gpu,
        }
    }
}

/// How long a high-priority client's wait for a completion spins at least: it waits for its
/// own request (as a program on its own CUDA context spins in `cuStreamSynchronize`), and a
/// sleep adds a wake-up to every request it makes.
pub const HIGH_SPIN: Duration = Duration::from_millis(5);

/// How long a synchronization's wait spins at least: it waits for the device, as
/// `cuStreamSynchronize` spins, and a sleep adds a wake-up to every sync (docs/benchmarks.md,
/// runs 45-46). It stops early when no core is spare (`gpushare_protocol::wake::spin_turn`).
pub const SYNC_SPIN: Duration = Duration::from_millis(2);

/// How long a session of `class` spins for a completion, asked to spin `asked`.
pub fn spin_for(asked: Duration, class: PriorityClass) -> Duration {
    if class == PriorityClass::High {
        asked.max(HIGH_SPIN)
    } else {
        asked
    }
}

/// This process's name as `gpushare status` shows it.
pub fn process_name() -> String {
    std::fs::read_to_string("/proc/self/comm")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "client".into())
}

/// One session with gpushared: its control socket, rings and arena. Every method takes
/// `&self`: threads share a session, and no lock is held while waiting for the broker.
pub struct Session {
    pub(crate) socket: ControlSocket,
    /// Held for a whole request/reply exchange on the control socket.
    pub(crate) requests: Mutex<u64>,
    pub(crate) ring: Mutex<RingState>,
    map: MmapRaw,
    layout: ShmLayout,
    pub(crate) submit_wake: Wakeup,
    pub(crate) complete_wake: Wakeup,
    welcome: Welcome,
    pub(crate) is_dead: AtomicBool,
    pub(crate) dead: Mutex<Option<Dead>>,
    pub(crate) spin: Duration,
    /// How long a synchronization's wait spins ([`SYNC_SPIN`] at least, unless the
    /// environment says otherwise).
    pub(crate) sync_spin: Duration,
    /// How long a wait goes without a sign of life before the broker is asked whether it is
    /// there (and the session is over if it does not answer in the socket's timeout).
    pub(crate) probe_after: Duration,
    pub(crate) commands: AtomicU64,
    /// Completions read from the ring; with `commands`, shows none was lost or doubled.
    pub(crate) completions: AtomicU64,
    pub(crate) notices: Arc<Notices>,
    /// Bumped whenever the broker says handles were lost (a notice or a `DeviceReset`
    /// status), so that a client's cached handles are made again.
    pub(crate) handles_lost: AtomicU64,
}

impl Session {
    /// Connects, says hello and maps the shared region the broker grants. `notices` collects
    /// the device-reset notices of this session (a client may share one across the sessions
    /// it has over time).
    pub fn open(opts: &SessionOptions, notices: Arc<Notices>) -> Result<Session> {
        let socket = ControlSocket::connect_within(&opts.socket, opts.timeout)?;
        let (welcome, fds) = socket.handshake(opts.hello())?;
        let layout = welcome
            .layout
            .ok_or_else(|| Error::Protocol("Welcome without a shared region".into()))?;
        layout
            .validate()
            .map_err(|e| Error::Protocol(e.to_string()))?;
        let [memfd, submit_wake, complete_wake]: [OwnedFd; WELCOME_FDS] =
            fds.try_into().map_err(|v: Vec<OwnedFd>| {
                Error::Protocol(format!("Welcome carried {} descriptors, not 3", v.len()))
            })?;
        let map = MmapOptions::new()
            .len(layout.total_size())
            .map_raw(&memfd)?;
        drop(memfd);
        let base =
            NonNull::new(map.as_mut_ptr()).ok_or_else(|| Error::Protocol("null mapping".into()))?;
        // SAFETY: the mapping is page-aligned, `total_size()` long, initialised by the broker
        // before it sent Welcome, and lives in the session as long as the rings do.
        let header = unsafe { ClientRings::read_header(base) };
        if header.magic != SHM_MAGIC || header.sq_entries != layout.sq_entries {
            return Err(Error::Protocol(
                "shared region header does not match the Welcome".into(),
            ));
        }
        // SAFETY: as above.
        let rings = unsafe { ClientRings::attach(base, &layout) };
        let spin = crate::env::spin(spin_for(opts.spin, welcome.class));
        let sync_spin = crate::env::spin(spin_for(opts.spin, welcome.class).max(SYNC_SPIN));
        Ok(Session {
            socket,
            requests: Mutex::new(1),
            ring: Mutex::new(RingState::new(rings)),
            map,
            layout,
            submit_wake: Wakeup::from_fd(submit_wake),
            complete_wake: Wakeup::from_fd(complete_wake),
            welcome,
            is_dead: AtomicBool::new(false),
            dead: Mutex::new(None),
            spin,
            sync_spin,
            probe_after: opts.timeout.min(PROBE_AFTER),
            commands: AtomicU64::new(0),
            completions: AtomicU64::new(0),
            notices,
            handles_lost: AtomicU64::new(0),
        })
    }

    /// Opens a session, retrying while gpushared is away (not listening, restarting, the old
    /// image closing) for up to `timeout`. A refusal, or an answer that is not a broker's,
    /// ends the wait at once.
    pub fn open_retrying(
        opts: &SessionOptions,
        notices: Arc<Notices>,
        timeout: Duration,
    ) -> Result<Session> {
        let started = Instant::now();
        let mut pause = Duration::from_millis(2);
        loop {
            match Session::open(opts, notices.clone()) {
                Ok(session) => return Ok(session),
                Err(Error::Rejected(w)) if w.code != ErrorCode::ShuttingDown => {
                    return Err(Error::Rejected(w));
                }
                Err(e @ (Error::InvalidArgument(_) | Error::Protocol(_))) => return Err(e),
                Err(e) => {
                    let waited = started.elapsed();
                    if waited >= timeout {
                        return Err(e);
                    }
                    std::thread::sleep(pause.min(timeout - waited));
                    pause = (pause * 2).min(RECONNECT_PAUSE);
                }
            }
        }
    }

    /// What the broker granted: client id, class, weight, quota, device.
    pub fn welcome(&self) -> &Welcome {
        &self.welcome
    }

    pub fn layout(&self) -> &ShmLayout {
        &self.layout
    }

    /// The control socket's descriptor: the session lasts while any copy of it is open (a
    /// forked child closes its copy).
    pub fn control_fd(&self) -> std::os::fd::RawFd {
        self.socket.raw_fd()
    }

    /// Commands submitted so far.
    pub fn commands_submitted(&self) -> u64 {
        self.commands.load(Ordering::Relaxed)
    }

    /// Completions received so far; equals [`Session::commands_submitted`] once everything
    /// submitted has completed.
    pub fn completions_received(&self) -> u64 {
        self.completions.load(Ordering::Relaxed)
    }

    /// How many times the broker said handles of this session were lost.
    pub fn handles_lost(&self) -> u64 {
        self.handles_lost.load(Ordering::Acquire)
    }

    pub(crate) fn note_handles_lost(&self) {
        self.handles_lost.fetch_add(1, Ordering::AcqRel);
    }

    /// A pointer to arena byte `offset`. Callers keep `offset` (and what they touch after
    /// it) inside the arena, and coordinate with the broker through the rings.
    pub fn arena_ptr(&self, offset: usize) -> *mut u8 {
        debug_assert!(offset <= self.layout.arena_size as usize);
        // SAFETY: the caller keeps `offset` within the arena; the mapping outlives `self`.
        unsafe {
            self.map
                .as_mut_ptr()
                .add(self.layout.arena_offset() + offset)
        }
    }

    /// A copy of `len` arena bytes at `offset`, if that range is inside the arena.
    pub fn arena_copy(&self, offset: u64, len: u64) -> Option<Vec<u8>> {
        let end = offset.checked_add(len)?;
        if end > self.layout.arena_size {
            return None;
        }
        let (offset, len) = (usize::try_from(offset).ok()?, usize::try_from(len).ok()?);
        let mut out = Vec::new();
        out.try_reserve_exact(len).ok()?;
        // SAFETY: `[offset, offset + len)` is inside the arena (checked); the broker only
        // writes arena bytes a copy to the host targets, and copies raw bytes either way.
        unsafe {
            std::ptr::copy_nonoverlapping(self.arena_ptr(offset), out.as_mut_ptr(), len);
            out.set_len(len);
        }
        Some(out)
    }

    /// Copies `src` into the arena at `offset`; the caller owns that range for now.
    pub fn arena_write(&self, offset: usize, src: &[u8]) -> Result<()> {
        let end = offset.checked_add(src.len());
        if end.is_none_or(|e| e > self.layout.arena_size as usize) {
            return Err(Error::InvalidArgument(format!(
                "{} bytes at arena offset {offset} do not fit a {}-byte arena",
                src.len(),
                self.layout.arena_size
            )));
        }
        // SAFETY: inside the arena (checked); the caller owns the range.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.arena_ptr(offset), src.len()) };
        Ok(())
    }

    /// Copies arena bytes at `offset` into `dst`; the broker is done writing them.
    pub fn arena_read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        let end = offset.checked_add(dst.len());
        if end.is_none_or(|e| e > self.layout.arena_size as usize) {
            return Err(Error::InvalidArgument(format!(
                "{} bytes at arena offset {offset} do not fit a {}-byte arena",
                dst.len(),
                self.layout.arena_size
            )));
        }
        // SAFETY: inside the arena (checked); the broker finished writing the range.
        unsafe {
            std::ptr::copy_nonoverlapping(self.arena_ptr(offset), dst.as_mut_ptr(), dst.len())
        };
        Ok(())
    }

    pub fn check_alive(&self) -> Result<()> {
        if self.is_dead.load(Ordering::Acquire) {
            let dead = lock(&self.dead).clone().unwrap_or(Dead::Gone);
            return Err(dead.error());
        }
        Ok(())
    }

    pub fn is_dead(&self) -> bool {
        self.is_dead.load(Ordering::Acquire)
    }

    pub(crate) fn mark_dead(&self, why: Dead) {
        let mut d = lock(&self.dead);
        if d.is_none() {
            *d = Some(why);
        }
        self.is_dead.store(true, Ordering::Release);
        // Wake any other waiter so it sees the news.
        self.complete_wake.signal();
    }

    /// Whether the session ended because gpushared restarts after a fault (and why).
    pub fn restarted(&self) -> Option<String> {
        if !self.is_dead.load(Ordering::Acquire) {
            return None;
        }
        match lock(&self.dead).as_ref() {
            Some(Dead::Shutdown(ShutdownKind::Restarting, reason)) => Some(reason.clone()),
            _ => None,
        }
    }
}

/// A wait this long without a completion asks the broker whether it is there (a ping, which
/// its control plane answers whatever the data thread does).
const PROBE_AFTER: Duration = Duration::from_secs(1);

/// Longest pause between two attempts to reach a restarting gpushared. An attempt while it is
/// away costs a failed connect(), so trying often is cheap and shortens the wait.
const RECONNECT_PAUSE: Duration = Duration::from_millis(10);

impl Drop for Session {
    fn drop(&mut self) {
        let _ = self.socket.send(&ClientMessage::Goodbye, &[]);
    }
}

#[cfg(test)]
mod spin_tests {
    use super::*;

    #[test]
    fn a_high_priority_session_spins_longer_and_others_as_asked() {
        let asked = Duration::from_micros(50);
        assert_eq!(spin_for(asked, PriorityClass::High), HIGH_SPIN);
        assert_eq!(spin_for(asked, PriorityClass::Normal), asked);
        assert_eq!(spin_for(asked, PriorityClass::BestEffort), asked);
        // Asking for more than the floor keeps what was asked.
        let long = HIGH_SPIN * 2;
        assert_eq!(spin_for(long, PriorityClass::High), long);
    }
}

//! The client: a session with the broker, its rings and its arena.
//!
//! A [`Client`] holds one session ([`Conn`]: the control socket, the rings, the arena). With
//! [`ConnectOptions::rebuild`] it also records what it needs to make its device state again
//! after a GPU reset ([`crate::rebuild`]), and does so by itself: in the same session when the
//! broker reset the device in place, or in a new session when gpushared restarted after the
//! fault (the session is then replaced under the user's handles).

use std::collections::{HashMap, HashSet};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use gpushare_protocol::command::{ModuleLaunch, opcode};
use gpushare_protocol::control::{
    BrokerMessage, ClientMessage, Hello, ModuleFormat, Role, ShutdownKind, WELCOME_FDS, Welcome,
};
use gpushare_protocol::ring::{ClientRings, CompletionEntry, SHM_MAGIC, ShmLayout};
use gpushare_protocol::stats::StatusReport;
use gpushare_protocol::{
    Command, DevicePtr, ErrorCode, EventId, Kernel, PROTOCOL_VERSION, PriorityClass, StreamId,
};
use memmap2::{MmapOptions, MmapRaw};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use crate::control::ControlSocket;
use crate::error::{Error, Result};
use crate::rebuild::{Lost, RebuildError, Registry, Waited};

/// How a client connects.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// Broker socket; defaults to `$GPUSHARE_SOCKET` or `/run/gpushare/gpushare.sock`.
    pub socket: PathBuf,
    /// Name shown in `gpushare status`; defaults to the process name.
    pub name: String,
    /// Ask for a less important class than the policy grants (never more).
    pub class: Option<PriorityClass>,
    /// Submission ring entries (0 = broker default).
    pub sq_entries: u32,
    /// Data arena bytes (0 = broker default, or the default staging area plus
    /// `host_buffers`).
    pub arena_size: u64,
    /// Bytes of the arena set aside for [`HostBuffer`](crate::HostBuffer)s: host memory the
    /// device copies to and from directly (page-locked on a GPU), like CUDA's pinned memory.
    /// The rest of the arena stages ordinary copies.
    pub host_buffers: u64,
    /// How long to spin for a completion before sleeping.
    pub spin: Duration,
    /// The GPU to run on (index); `None` lets the broker pick the least loaded.
    pub gpu: Option<u32>,
    /// Rebuild this client's device state by itself after a GPU reset caused by another
    /// client (or a restart of gpushared after one): its buffers come back at the same device
    /// addresses holding what was uploaded into them, its modules, functions, streams and
    /// events come back too, and every handle keeps working. The call that meets the reset
    /// fails once with [`Error::Rebuilt`] (the work submitted before the fault was lost and
    /// is not run again: submit it again); the calls after it work. With several threads,
    /// each thread whose work was lost hears it once: in the call it meets the rebuild
    /// with, or in the first call that waits for that work.
    ///
    /// Costs host memory: a copy of every byte uploaded from the host into a device buffer
    /// (the whole buffer, from its first upload) and of every module image, and one host
    /// copy more per upload. Buffers only the device wrote come back without their contents.
    pub rebuild: bool,
    /// With `rebuild`: how long to wait for gpushared to come back after it restarted.
    pub rebuild_timeout: Duration,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        let name = std::fs::read_to_string("/proc/self/comm")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "client".into());
        ConnectOptions {
            socket: gpushare_protocol::socket_path_from_env(),
            name,
            class: None,
            sq_entries: 0,
            arena_size: 0,
            host_buffers: 0,
            spin: Duration::from_micros(50),
            gpu: None,
            rebuild: false,
            rebuild_timeout: Duration::from_secs(30),
        }
    }
}

/// What the broker granted this session.
pub type SessionInfo = Welcome;

/// Why the session is over.
#[derive(Debug, Clone)]
enum Dead {
    Shutdown(ShutdownKind, String),
    Evicted(String),
    Gone,
    Protocol(String),
}

impl Dead {
    fn error(&self) -> Error {
        match self {
            Dead::Shutdown(kind, r) => Error::shutdown(*kind, r.clone()),
            Dead::Evicted(r) => Error::Evicted(r.clone()),
            Dead::Gone => Error::BrokerGone,
            Dead::Protocol(r) => Error::Protocol(r.clone()),
        }
    }
}

struct RingState {
    rings: ClientRings,
    next_seq: u64,
    /// Submitted and not yet reaped; never more than the completion ring holds.
    in_flight: u32,
    /// Tags somebody waits for, and their completions once reaped.
    wanted: HashSet<u64>,
    done: HashMap<u64, CompletionEntry>,
    /// First error of a command nobody waited for, reported at the next synchronization.
    async_error: Option<(u16, u32)>,
    sleepers: u32,
}

/// Staging area the client asks for when it also wants host buffers but no explicit arena.
const DEFAULT_STAGING: u64 = 16 << 20;
/// Host buffers start on page boundaries (DMA-friendly, and never share a page).
const HOST_BUFFER_ALIGN: usize = 4096;
/// How long a command that failed with `DeviceReset` waits for the broker's notice of what
/// the reset took (it comes on the control socket, possibly just after the completion).
const NOTICE_WAIT: Duration = Duration::from_secs(5);
/// Longest pause between two attempts to reach a restarting gpushared. An attempt while it is
/// away costs a failed connect(), so trying often is cheap and shortens the wait.
const RECONNECT_PAUSE: Duration = Duration::from_millis(10);

/// First-fit allocator over the host-buffer part of the arena: offset → length of free runs.
struct HostRegion {
    free: std::collections::BTreeMap<usize, usize>,
}

impl HostRegion {
    fn alloc(&mut self, len: usize) -> Option<usize> {
        let len = len.max(1).div_ceil(HOST_BUFFER_ALIGN) * HOST_BUFFER_ALIGN;
        let (&at, &run) = self.free.iter().find(|&(_, &run)| run >= len)?;
        self.free.remove(&at);
        if run > len {
            self.free.insert(at + len, run - len);
        }
        Some(at)
    }

    fn release(&mut self, at: usize, len: usize) {
        let mut start = at;
        let mut len = len.max(1).div_ceil(HOST_BUFFER_ALIGN) * HOST_BUFFER_ALIGN;
        if let Some((&prev, &plen)) = self.free.range(..at).next_back()
            && prev + plen == at
        {
            self.free.remove(&prev);
            start = prev;
            len += plen;
        }
        if let Some(&next_len) = self.free.get(&(start + len)) {
            self.free.remove(&(start + len));
            len += next_len;
        }
        self.free.insert(start, len);
    }
}

/// Staging state for host copies through the arena.
struct Staging {
    /// The staging events, and the `handles_lost` count they were made at.
    events: Option<([EventId; 2], u64)>,
}

/// Device-reset notices, shared by the sessions a client has had.
struct Notices {
    /// Resets the broker told us about and nobody has taken yet.
    resets: Mutex<Vec<DeviceReset>>,
    count: AtomicU64,
    /// With rebuild on: resets whose losses are not made again yet.
    unrebuilt: Mutex<Vec<DeviceReset>>,
    pending: AtomicBool,
    track: bool,
}

/// One session with gpushared: its control socket, rings and arena.
struct Conn {
    socket: ControlSocket,
    /// Held for a whole request/reply exchange on the control socket.
    requests: Mutex<u64>,
    ring: Mutex<RingState>,
    staging: Mutex<Staging>,
    /// Bytes at the start of the arena used for staged copies and launch parameters.
    staging_size: usize,
    map: MmapRaw,
    layout: ShmLayout,
    submit_wake: OwnedFd,
    complete_wake: OwnedFd,
    welcome: Welcome,
    is_dead: AtomicBool,
    dead: Mutex<Option<Dead>>,
    spin: Duration,
    commands: AtomicU64,
    /// Completions read from the ring; with `commands`, shows none was lost or doubled.
    completions: AtomicU64,
    notices: Arc<Notices>,
    /// Bumped whenever the broker says handles were lost (a notice or a `DeviceReset`
    /// status), so the library's own cached handles are made again.
    handles_lost: AtomicU64,
}

pub(crate) struct Inner {
    /// The session now; a rebuild after a restart of gpushared replaces it.
    conn: RwLock<Arc<Conn>>,
    /// Sessions a rebuild replaced. Kept (mapped) for the client's life: a host-buffer slice
    /// handed out before the restart still points into the old arena.
    retired: Mutex<Vec<Arc<Conn>>>,
    /// How this client connected, for [`Client::reconnect`] and rebuilds.
    options: ConnectOptions,
    host_region: Mutex<HostRegion>,
    notices: Arc<Notices>,
    /// With rebuild on: the record of the client's device state.
    registry: Option<Mutex<Registry>>,
    /// A rebuild failed (for good): every call fails with its error.
    failed: AtomicBool,
}

/// The GPU was reset after a fault (another client's, or a hang): everything this client
/// held on the device is gone. The session goes on: new allocations work at once, and
/// commands naming lost handles fail with [`ErrorCode::DeviceReset`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceReset {
    pub gpu: u32,
    pub reason: String,
    pub lost: gpushare_protocol::control::LostState,
}

/// A connection to `gpushared`. Cheap to clone; all clones share one session, and the
/// session ends when the last clone (and every buffer, stream and event) is dropped.
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<Inner>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn op_name(op: u16) -> &'static str {
    match op {
        opcode::NOP => "nop",
        opcode::ALLOC => "allocate",
        opcode::ALLOC_AT => "allocate at an address",
        opcode::FREE => "free",
        opcode::COPY_HTOD => "copy host→device",
        opcode::COPY_DTOH => "copy device→host",
        opcode::COPY_DTOD => "copy device→device",
        opcode::MEMSET => "memset",
        opcode::STREAM_CREATE => "create stream",
        opcode::STREAM_DESTROY => "destroy stream",
        opcode::STREAM_SYNC => "synchronize stream",
        opcode::EVENT_CREATE => "create event",
        opcode::EVENT_RECORD => "record event",
        opcode::EVENT_QUERY => "query event",
        opcode::EVENT_SYNC => "synchronize event",
        opcode::EVENT_ELAPSED => "event elapsed time",
        opcode::EVENT_DESTROY => "destroy event",
        opcode::CLIENT_SYNC => "synchronize",
        opcode::ITERATION_END => "end iteration",
        opcode::DECLARE_JOB => "declare job",
        opcode::DECLARE_DEADLINE => "declare deadline",
        opcode::LAUNCH_MODULE => "launch module function",
        _ => "launch built-in kernel",
    }
}

/// The arena offset of `range` within host buffer `buf`, checked.
fn host_range(buf: &crate::HostBuffer, range: &std::ops::Range<usize>) -> Result<u64> {
    if range.start > range.end || range.end > buf.len() {
        return Err(Error::InvalidArgument(format!(
            "range {range:?} is outside a {}-byte host buffer",
            buf.len()
        )));
    }
    Ok((buf.offset() + range.start) as u64)
}

fn signal(fd: &OwnedFd) {
    let one = 1u64.to_ne_bytes();
    let _ = nix::unistd::write(fd, &one);
}

fn drain(fd: &OwnedFd) {
    let mut buf = [0u8; 8];
    let _ = nix::unistd::read(fd, &mut buf);
}

// ---- one session ---------------------------------------------------------------------

impl Conn {
    /// Connects and maps the shared region the broker grants.
    fn open(opts: &ConnectOptions, notices: Arc<Notices>) -> Result<Conn> {
        let arena_request = match (opts.arena_size, opts.host_buffers) {
            (0, 0) => 0,
            (0, h) => DEFAULT_STAGING + h,
            (a, _) => a,
        };
        let socket = ControlSocket::connect(&opts.socket)?;
        socket.send(
            &ClientMessage::Hello(Hello {
                protocol_version: PROTOCOL_VERSION,
                role: Role::Client,
                client_name: opts.name.clone(),
                requested_class: opts.class,
                sq_entries: opts.sq_entries,
                arena_size: arena_request,
                gpu: opts.gpu,
            }),
            &[],
        )?;
        let (welcome, fds) = match socket.recv()? {
            (BrokerMessage::Welcome(w), fds) => (*w, fds),
            (BrokerMessage::Rejected(e), _) => return Err(Error::Rejected(e)),
            (BrokerMessage::ShuttingDown { kind, reason }, _) => {
                return Err(Error::shutdown(kind, reason));
            }
            (other, _) => return Err(Error::Protocol(format!("expected Welcome, got {other:?}"))),
        };
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
        // before it sent Welcome, and lives in `Conn` as long as the rings do.
        let header = unsafe { ClientRings::read_header(base) };
        if header.magic != SHM_MAGIC || header.sq_entries != layout.sq_entries {
            return Err(Error::Protocol(
                "shared region header does not match the Welcome".into(),
            ));
        }
        // SAFETY: as above.
        let rings = unsafe { ClientRings::attach(base, &layout) };
        let host_bytes =
            (opts.host_buffers as usize).div_ceil(HOST_BUFFER_ALIGN) * HOST_BUFFER_ALIGN;
        let staging_size = (layout.arena_size as usize).saturating_sub(host_bytes);
        if staging_size < 2 * HOST_BUFFER_ALIGN {
            return Err(Error::InvalidArgument(format!(
                "the broker granted a {}-byte arena, too small for {} bytes of host buffers plus staging",
                layout.arena_size, opts.host_buffers
            )));
        }
        Ok(Conn {
            socket,
            requests: Mutex::new(1),
            ring: Mutex::new(RingState {
                rings,
                next_seq: 1,
                in_flight: 0,
                wanted: HashSet::new(),
                done: HashMap::new(),
                async_error: None,
                sleepers: 0,
            }),
            staging: Mutex::new(Staging { events: None }),
            staging_size,
            map,
            layout,
            submit_wake,
            complete_wake,
            welcome,
            is_dead: AtomicBool::new(false),
            dead: Mutex::new(None),
            spin: opts.spin,
            commands: AtomicU64::new(0),
            completions: AtomicU64::new(0),
            notices,
            handles_lost: AtomicU64::new(0),
        })
    }

    // ---- ring plumbing ---------------------------------------------------------------

    fn check_alive(&self) -> Result<()> {
        if self.is_dead.load(Ordering::Acquire) {
            let dead = lock(&self.dead).clone().unwrap_or(Dead::Gone);
            return Err(dead.error());
        }
        Ok(())
    }

    fn mark_dead(&self, why: Dead) {
        let mut d = lock(&self.dead);
        if d.is_none() {
            *d = Some(why);
        }
        self.is_dead.store(true, Ordering::Release);
        // Wake any other waiter so it sees the news.
        signal(&self.complete_wake);
    }

    /// Whether the session ended because gpushared restarts after a fault (and why).
    fn restarted(&self) -> Option<String> {
        if !self.is_dead.load(Ordering::Acquire) {
            return None;
        }
        match lock(&self.dead).as_ref() {
            Some(Dead::Shutdown(ShutdownKind::Restarting, reason)) => Some(reason.clone()),
            _ => None,
        }
    }

    fn reap(&self, ring: &mut RingState) {
        let n = match ring.rings.completions.available() {
            Ok(n) => n,
            Err(e) => {
                self.mark_dead(Dead::Protocol(e.to_string()));
                return;
            }
        };
        if n == 0 {
            return;
        }
        self.completions.fetch_add(n as u64, Ordering::Relaxed);
        for _ in 0..n {
            let c = ring.rings.completions.pop();
            ring.in_flight = ring.in_flight.saturating_sub(1);
            if ring.wanted.remove(&c.user_tag) {
                ring.done.insert(c.user_tag, c);
            } else if c.status != 0 && ring.async_error.is_none() {
                if c.status == ErrorCode::DeviceReset.as_u32() {
                    self.handles_lost.fetch_add(1, Ordering::AcqRel);
                }
                ring.async_error = Some(((c.user_tag & 0xff) as u16, c.status));
            }
        }
        ring.rings.completions.release();
        if ring.rings.completions.producer_waiting() {
            signal(&self.submit_wake);
        }
        if !ring.done.is_empty() && ring.sleepers > 0 {
            // Completions for other waiters: make sure they wake.
            signal(&self.complete_wake);
        }
    }

    /// Submits a command; returns its tag. With `wait`, the completion is kept for
    /// [`Conn::wait`]; otherwise an error it carries is reported at the next sync.
    fn submit(&self, cmd: Command, wait: bool) -> Result<u64> {
        let entry_op = cmd.encode(0).opcode;
        let spin_until = Instant::now() + self.spin;
        loop {
            self.check_alive()?;
            {
                let mut ring = lock(&self.ring);
                self.reap(&mut ring);
                let cq_room = ring.in_flight < self.layout.cq_entries;
                let sq_room = match ring.rings.submissions.free_slots() {
                    Ok(n) => n > 0,
                    Err(e) => {
                        drop(ring);
                        self.mark_dead(Dead::Protocol(e.to_string()));
                        continue;
                    }
                };
                if cq_room && sq_room {
                    let tag = ring.next_seq << 8 | (entry_op as u64 & 0xff);
                    ring.next_seq += 1;
                    let pushed = ring
                        .rings
                        .submissions
                        .try_push(cmd.encode(tag))
                        .unwrap_or(false);
                    if pushed {
                        ring.rings.submissions.publish();
                        ring.in_flight += 1;
                        if wait {
                            ring.wanted.insert(tag);
                        }
                        if ring.rings.submissions.consumer_needs_wakeup() {
                            signal(&self.submit_wake);
                        }
                        self.commands.fetch_add(1, Ordering::Relaxed);
                        return Ok(tag);
                    }
                }
            }
            // Full: wait for the broker to make progress.
            if Instant::now() < spin_until {
                std::hint::spin_loop();
            } else {
                self.sleep_for_completion()?;
            }
        }
    }

    /// Waits for the completion of `tag`.
    fn wait(&self, tag: u64) -> Result<CompletionEntry> {
        let spin_until = Instant::now() + self.spin;
        loop {
            {
                let mut ring = lock(&self.ring);
                self.reap(&mut ring);
                if let Some(c) = ring.done.remove(&tag) {
                    return Ok(c);
                }
            }
            self.check_alive()?;
            if Instant::now() < spin_until {
                std::hint::spin_loop();
            } else {
                self.sleep_for_completion()?;
            }
        }
    }

    /// Sleeps until the broker signals a completion, the control socket has news, or a
    /// short timeout passes.
    fn sleep_for_completion(&self) -> Result<()> {
        {
            let mut ring = lock(&self.ring);
            ring.sleepers += 1;
            if ring.sleepers == 1 {
                ring.rings.completions.prepare_sleep();
            }
            if matches!(ring.rings.completions.available(), Ok(n) if n > 0) {
                self.finish_sleep(&mut ring);
                return Ok(());
            }
        }
        let mut fds = [
            PollFd::new(self.complete_wake.as_fd(), PollFlags::POLLIN),
            PollFd::new(self.socket.as_fd(), PollFlags::POLLIN),
        ];
        let _ = poll(&mut fds, PollTimeout::from(100u8));
        let control_news = fds[1].revents().is_some_and(|r| !r.is_empty());
        drain(&self.complete_wake);
        {
            let mut ring = lock(&self.ring);
            self.finish_sleep(&mut ring);
        }
        if control_news {
            self.read_news(PollTimeout::ZERO);
        }
        self.check_alive()
    }

    fn finish_sleep(&self, ring: &mut RingState) {
        ring.sleepers -= 1;
        if ring.sleepers == 0 {
            ring.rings.completions.finish_sleep();
        }
    }

    /// Reads a message the broker sent without being asked (shutdown, eviction, reset
    /// notice, hang-up), waiting up to `wait` for one.
    fn read_news(&self, wait: PollTimeout) {
        // Someone in a request exchange will read it instead.
        let Ok(_guard) = self.requests.try_lock() else {
            return;
        };
        let mut fds = [PollFd::new(self.socket.as_fd(), PollFlags::POLLIN)];
        if !matches!(poll(&mut fds, wait), Ok(n) if n > 0) {
            return;
        }
        match self.socket.recv() {
            Ok((BrokerMessage::ShuttingDown { kind, reason }, _)) => {
                self.mark_dead(Dead::Shutdown(kind, reason))
            }
            Ok((BrokerMessage::Evicted { reason }, _)) => self.mark_dead(Dead::Evicted(reason)),
            Ok((BrokerMessage::DeviceReset { gpu, reason, lost }, _)) => {
                self.note_reset(DeviceReset { gpu, reason, lost })
            }
            Ok(_) => {}
            Err(Error::BrokerGone) => self.mark_dead(Dead::Gone),
            Err(e) => self.mark_dead(Dead::Protocol(e.to_string())),
        }
    }

    /// Waits (up to `timeout`) until the broker says what a reset took (a notice is pending,
    /// or more notices than `seen` arrived: another thread may have taken and rebuilt it
    /// already), or the session ends.
    fn wait_for_notice(&self, timeout: Duration, seen: u64) {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline
            && !self.notices.pending.load(Ordering::Acquire)
            && self.notices.count.load(Ordering::Acquire) == seen
            && !self.is_dead.load(Ordering::Acquire)
        {
            if self.requests.try_lock().is_ok() {
                self.read_news(PollTimeout::from(20u8));
            } else {
                // Another thread's request reads the notice.
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }

    /// Submits and waits; turns a failed status into an error.
    fn call(&self, cmd: Command, op: &'static str) -> Result<CompletionEntry> {
        let tag = self.submit(cmd, true)?;
        self.finish(tag, op)
    }

    /// Waits for the completion of `tag` (submitted with `wait`) and turns its status into a
    /// result.
    fn finish(&self, tag: u64, op: &'static str) -> Result<CompletionEntry> {
        let c = self.wait(tag)?;
        match ErrorCode::from_u32(c.status) {
            None if c.status == 0 => Ok(c),
            Some(code) => {
                if code == ErrorCode::DeviceReset {
                    self.handles_lost.fetch_add(1, Ordering::AcqRel);
                }
                Err(Error::Command { op, code })
            }
            None => Err(Error::Protocol(format!(
                "unknown status {} for {op}",
                c.status
            ))),
        }
    }

    /// Reports (and clears) the first error of a command nobody waited for.
    fn take_async_error(&self) -> Result<()> {
        let err = lock(&self.ring).async_error.take();
        match err {
            None => Ok(()),
            Some((op, status)) => Err(Error::Command {
                op: op_name(op),
                code: ErrorCode::from_u32(status).unwrap_or(ErrorCode::Internal),
            }),
        }
    }

    /// A staged copy that failed part-way: waits for its other pieces and drops their errors,
    /// so they are not reported again by an unrelated later sync.
    fn abandon_on_error<T>(&self, r: Result<T>) -> Result<T> {
        if r.is_err() {
            let _ = self.drain_in_flight();
            let _ = self.take_async_error();
        }
        r
    }

    /// Submits and waits for one command; returns its `(result, result2)`.
    fn submit_wait(&self, cmd: Command) -> Result<(u64, u64)> {
        let op = op_name(cmd.encode(0).opcode);
        self.call(cmd, op).map(|c| (c.result, c.result2))
    }

    /// Waits until every submitted command has completed (not necessarily executed).
    fn drain_in_flight(&self) -> Result<()> {
        let spin_until = Instant::now() + self.spin;
        loop {
            {
                let mut ring = lock(&self.ring);
                self.reap(&mut ring);
                if ring.in_flight as usize == ring.wanted.len() + ring.done.len() {
                    return Ok(());
                }
            }
            self.check_alive()?;
            if Instant::now() < spin_until {
                std::hint::spin_loop();
            } else {
                self.sleep_for_completion()?;
            }
        }
    }

    fn synchronize(&self) -> Result<()> {
        self.sync_with(Command::ClientSync, "synchronize")
    }

    fn sync_stream(&self, stream: StreamId) -> Result<()> {
        self.sync_with(Command::StreamSync { stream }, "synchronize stream")
    }

    /// A sync reports the first error since the last one: an earlier command's, else its own.
    /// When both say a reset took the work, that is one loss, reported once.
    fn sync_with(&self, cmd: Command, op: &'static str) -> Result<()> {
        let synced = self.call(cmd, op);
        let mut ring = lock(&self.ring);
        match (&synced, ring.async_error) {
            (Err(e), Some((_, status)))
                if e.code() == Some(ErrorCode::DeviceReset)
                    && status == ErrorCode::DeviceReset.as_u32() =>
            {
                ring.async_error = None;
            }
            _ => {}
        }
        drop(ring);
        synced?;
        self.take_async_error()
    }

    fn staging_events(&self, staging: &mut Staging) -> Result<[EventId; 2]> {
        let lost = self.handles_lost.load(Ordering::Acquire);
        if let Some((e, made)) = staging.events
            && made == lost
        {
            return Ok(e);
        }
        // First use, or a device reset took the old ones.
        let a = self.call(Command::EventCreate, "create event")?.result as EventId;
        let b = self.call(Command::EventCreate, "create event")?.result as EventId;
        staging.events = Some(([a, b], lost));
        Ok([a, b])
    }

    fn arena_ptr(&self, offset: usize) -> *mut u8 {
        // SAFETY: callers keep `offset` within the arena; the mapping outlives `self`.
        unsafe {
            self.map
                .as_mut_ptr()
                .add(self.layout.arena_offset() + offset)
        }
    }

    /// A copy of `len` arena bytes at `offset`, if that range is inside the arena.
    fn arena_copy(&self, offset: u64, len: u64) -> Option<Vec<u8>> {
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

    /// Copies host bytes to device memory through the arena (double-buffered), and waits
    /// until the data is on the device.
    fn copy_to_device(&self, stream: StreamId, dst: DevicePtr, src: &[u8]) -> Result<()> {
        let mut staging = lock(&self.staging);
        let events = self.staging_events(&mut staging)?;
        let half = self.staging_size / 2;
        for (i, chunk) in src.chunks(half).enumerate() {
            let slot = i % 2;
            if i >= 2 {
                let synced = self.call(
                    Command::EventSync {
                        event: events[slot],
                    },
                    "synchronize event",
                );
                self.abandon_on_error(synced)?;
            }
            // SAFETY: `slot * half + chunk.len()` is within the arena; nothing else writes this
            // half while we hold the staging lock, and the copy that last read it is done.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    chunk.as_ptr(),
                    self.arena_ptr(slot * half),
                    chunk.len(),
                )
            };
            let cmd = Command::CopyHtoD {
                stream,
                arena_offset: (slot * half) as u64,
                dst: dst.wrapping_add((i * half) as u64),
                len: chunk.len() as u64,
            };
            self.submit(cmd, false)?;
            self.submit(
                Command::EventRecord {
                    stream,
                    event: events[slot],
                },
                false,
            )?;
        }
        self.sync_stream(stream)
    }

    /// Copies device memory to host bytes through the arena (double-buffered).
    fn copy_to_host(&self, stream: StreamId, dst: &mut [u8], src: DevicePtr) -> Result<()> {
        let mut staging = lock(&self.staging);
        let events = self.staging_events(&mut staging)?;
        let half = self.staging_size / 2;
        let chunks: Vec<(usize, usize)> = (0..dst.len())
            .step_by(half.max(1))
            .map(|o| (o, half.min(dst.len() - o)))
            .collect();
        let issue = |i: usize| -> Result<()> {
            let (off, len) = chunks[i];
            let slot = i % 2;
            let cmd = Command::CopyDtoH {
                stream,
                src: src.wrapping_add(off as u64),
                arena_offset: (slot * half) as u64,
                len: len as u64,
            };
            self.submit(cmd, false)?;
            self.submit(
                Command::EventRecord {
                    stream,
                    event: events[slot],
                },
                false,
            )?;
            Ok(())
        };
        if !chunks.is_empty() {
            issue(0)?;
        }
        for i in 0..chunks.len() {
            if i + 1 < chunks.len() {
                issue(i + 1)?;
            }
            let slot = i % 2;
            let synced = self.call(
                Command::EventSync {
                    event: events[slot],
                },
                "synchronize event",
            );
            self.abandon_on_error(synced)?;
            self.take_async_error()?;
            let (off, len) = chunks[i];
            // SAFETY: the copy into this half is complete (event synchronized) and no later
            // copy targets it until we issue chunk i + 2, after this read.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    self.arena_ptr(slot * half),
                    dst[off..].as_mut_ptr(),
                    len,
                )
            };
        }
        Ok(())
    }

    // ---- control-socket requests -------------------------------------------------

    fn request(
        &self,
        build: impl FnOnce(u64) -> ClientMessage,
        fds: &[i32],
    ) -> Result<BrokerMessage> {
        self.check_alive()?;
        let mut next = lock(&self.requests);
        let id = *next;
        *next += 1;
        self.socket.send(&build(id), fds)?;
        // One reply per request, in order; shutdown and eviction may come instead, and
        // device-reset notices before it.
        let reply = loop {
            match self.socket.recv() {
                Ok((BrokerMessage::DeviceReset { gpu, reason, lost }, _)) => {
                    self.note_reset(DeviceReset { gpu, reason, lost })
                }
                other => break other,
            }
        };
        match reply {
            Ok((BrokerMessage::ShuttingDown { kind, reason }, _)) => {
                self.mark_dead(Dead::Shutdown(kind, reason.clone()));
                Err(Error::shutdown(kind, reason))
            }
            Ok((BrokerMessage::Evicted { reason }, _)) => {
                self.mark_dead(Dead::Evicted(reason.clone()));
                Err(Error::Evicted(reason))
            }
            Ok((BrokerMessage::RequestFailed { error, .. }, _)) => Err(Error::Request(error)),
            Ok((msg, _)) => Ok(msg),
            Err(e) => {
                if e.is_fatal() {
                    self.mark_dead(Dead::Gone);
                }
                Err(e)
            }
        }
    }

    fn note_reset(&self, reset: DeviceReset) {
        let n = &self.notices;
        self.handles_lost.fetch_add(1, Ordering::AcqRel);
        if n.track {
            lock(&n.unrebuilt).push(reset.clone());
            n.pending.store(true, Ordering::Release);
        }
        lock(&n.resets).push(reset);
        // Counted last: a thread that sees the new count (`Client::run`) also sees `pending`.
        n.count.fetch_add(1, Ordering::AcqRel);
    }

    fn status(&self) -> Result<StatusReport> {
        match self.request(|request| ClientMessage::Status { request }, &[])? {
            BrokerMessage::Status { report, .. } => Ok(*report),
            other => Err(Error::Protocol(format!("expected Status, got {other:?}"))),
        }
    }

    fn load_module(&self, format: ModuleFormat, image: &[u8]) -> Result<u64> {
        use nix::sys::memfd::{MFdFlags, memfd_create};
        let fd =
            memfd_create("gpushare-module", MFdFlags::MFD_CLOEXEC).map_err(std::io::Error::from)?;
        let mut file = std::fs::File::from(fd);
        std::io::Write::write_all(&mut file, image)?;
        let raw = file.as_raw_fd();
        let reply = self.request(
            |request| ClientMessage::LoadModule {
                request,
                format,
                image_len: image.len() as u64,
            },
            &[raw],
        )?;
        match reply {
            BrokerMessage::ModuleLoaded { result: Ok(id), .. } => Ok(id),
            BrokerMessage::ModuleLoaded { result: Err(e), .. } => Err(Error::Request(e)),
            other => Err(Error::Protocol(format!(
                "expected ModuleLoaded, got {other:?}"
            ))),
        }
    }

    fn get_function(&self, module: u64, name: &str) -> Result<u64> {
        let reply = self.request(
            |request| ClientMessage::GetFunction {
                request,
                module,
                name: name.into(),
            },
            &[],
        )?;
        match reply {
            BrokerMessage::Function { result, .. } => result.map_err(Error::Request),
            other => Err(Error::Protocol(format!("expected Function, got {other:?}"))),
        }
    }

    fn unload_module(&self, module: u64) -> Result<()> {
        match self.request(
            |request| ClientMessage::UnloadModule { request, module },
            &[],
        )? {
            BrokerMessage::ModuleUnloaded { result, .. } => result.map_err(Error::Request),
            other => Err(Error::Protocol(format!(
                "expected ModuleUnloaded, got {other:?}"
            ))),
        }
    }

    fn launch_function(
        &self,
        stream: StreamId,
        function: u64,
        (grid, block, shared_mem_bytes): ([u32; 3], [u32; 3], u32),
        params: &[u8],
    ) -> Result<()> {
        let mut launch = ModuleLaunch {
            function,
            grid,
            block,
            shared_mem_bytes,
            params_offset: 0,
            params_len: u32::try_from(params.len())
                .map_err(|_| Error::InvalidArgument("parameters too large".into()))?,
        };
        let cmd = |launch| Command::LaunchModule { stream, launch };
        if params.is_empty() {
            return self.submit(cmd(launch), false).map(drop);
        }
        if params.len() > self.staging_size {
            return Err(Error::InvalidArgument(
                "parameters larger than the arena".into(),
            ));
        }
        // The broker copies the parameters when it accepts the launch; hold the arena until then.
        let _staging = lock(&self.staging);
        launch.params_offset = 0;
        // SAFETY: `params.len()` fits in the arena (checked above); we hold the staging lock.
        unsafe { std::ptr::copy_nonoverlapping(params.as_ptr(), self.arena_ptr(0), params.len()) };
        self.call(cmd(launch), "launch module function").map(|_| ())
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        let _ = self.socket.send(&ClientMessage::Goodbye, &[]);
    }
}

// ---- the client ------------------------------------------------------------------------

impl Client {
    /// Connects with default options (socket from `GPUSHARE_SOCKET` or the default path).
    pub fn connect() -> Result<Client> {
        Client::connect_with(ConnectOptions::default())
    }

    pub fn connect_with(opts: ConnectOptions) -> Result<Client> {
        let notices = Arc::new(Notices {
            resets: Mutex::new(Vec::new()),
            count: AtomicU64::new(0),
            unrebuilt: Mutex::new(Vec::new()),
            pending: AtomicBool::new(false),
            track: opts.rebuild,
        });
        let conn = Conn::open(&opts, notices.clone())?;
        let mut free = std::collections::BTreeMap::new();
        let host_bytes = conn.layout.arena_size as usize - conn.staging_size;
        if host_bytes > 0 {
            free.insert(conn.staging_size, host_bytes);
        }
        Ok(Client {
            inner: Arc::new(Inner {
                conn: RwLock::new(Arc::new(conn)),
                retired: Mutex::new(Vec::new()),
                registry: opts.rebuild.then(|| Mutex::new(Registry::new())),
                options: opts,
                host_region: Mutex::new(HostRegion { free }),
                notices,
                failed: AtomicBool::new(false),
            }),
        })
    }

    /// The session now.
    fn conn(&self) -> Arc<Conn> {
        self.inner
            .conn
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// What the broker granted: client id, class, weight, quota, device. (After a rebuild
    /// that reconnected, the new session's.)
    pub fn session(&self) -> SessionInfo {
        self.conn().welcome.clone()
    }

    /// Commands submitted so far in this session.
    pub fn commands_submitted(&self) -> u64 {
        self.conn().commands.load(Ordering::Relaxed)
    }

    /// Completions received so far in this session. After [`Client::synchronize`] it equals
    /// [`Client::commands_submitted`]: every command got exactly one completion.
    pub fn completions_received(&self) -> u64 {
        self.conn().completions.load(Ordering::Relaxed)
    }

    /// A new session with the same options, for after the broker restarted or evicted this one
    /// (an error with [`Error::is_fatal`]). Buffers, streams and events of the old session are
    /// gone with it: the caller uploads again what it needs. (A client with
    /// [`ConnectOptions::rebuild`] reconnects by itself after a restart caused by a fault.)
    pub fn reconnect(&self) -> Result<Client> {
        Client::connect_with(self.inner.options.clone())
    }

    /// Whether this client rebuilds its device state after a reset
    /// ([`ConnectOptions::rebuild`]).
    pub fn rebuilds_state(&self) -> bool {
        self.inner.registry.is_some()
    }

    /// How many times this client's device state was rebuilt after a reset.
    pub fn rebuilds(&self) -> u64 {
        self.inner.registry.as_ref().map_or(0, |r| lock(r).rebuilds)
    }

    /// Host memory held for rebuilding, bytes: copies of uploaded bytes and module images,
    /// and the arenas of sessions a rebuild replaced (kept mapped for the client's life).
    pub fn rebuild_memory(&self) -> u64 {
        let record = self
            .inner
            .registry
            .as_ref()
            .map_or(0, |r| lock(r).host_bytes());
        let retired: u64 = lock(&self.inner.retired)
            .iter()
            .map(|c| c.layout.arena_size)
            .sum();
        record + retired
    }

    // ---- rebuilding ----------------------------------------------------------------

    /// Runs `op` on the session now. With rebuild on: first makes again what a reset took
    /// (failing this call once with [`Error::Rebuilt`]), and when `op` itself meets a reset,
    /// rebuilds and fails with [`Error::Rebuilt`] instead of the reset's error.
    fn run<T>(&self, op: impl FnOnce(&Conn) -> Result<T>) -> Result<T> {
        let Some(registry) = &self.inner.registry else {
            return op(&self.conn());
        };
        let conn = self.conn();
        // Notices so far: one arriving while `op` runs means a reset it may have met, even
        // when another thread takes the notice and rebuilds first.
        let seen = self.inner.notices.count.load(Ordering::Acquire);
        let outcome = if self.inner.failed.load(Ordering::Acquire)
            || self.inner.notices.pending.load(Ordering::Acquire)
            || conn.restarted().is_some()
        {
            Err(self.rebuild(registry, &conn))
        } else {
            match op(&conn) {
                Err(e) if self.lost_to_fault(&conn, &e, seen) => Err(self.rebuild(registry, &conn)),
                other => other,
            }
        };
        if let Err(Error::Rebuilt(_)) = &outcome {
            // This thread now knows that what it submitted before was lost.
            lock(registry).told_this_thread();
        }
        outcome
    }

    /// After a call that waited for `waited`'s work (rebuild on): if a rebuild found some of
    /// that work not yet waited for, the reset took it, and this call says so (`Rebuilt`),
    /// rather than let the caller read results that were never computed.
    fn check_waited(&self, waited: Waited, outcome: Result<()>) -> Result<()> {
        let Some(registry) = &self.inner.registry else {
            return outcome;
        };
        outcome?;
        let mut reg = lock(registry);
        if reg.waited(waited) {
            reg.told_this_thread();
            return Err(Error::Rebuilt(reg.last_reason.clone()));
        }
        Ok(())
    }

    /// Whether `e` means a reset took this client's device state (the notice of what it
    /// took, or the end of the session, has arrived by the time this answers). `seen`: the
    /// notices counted when the call began.
    fn lost_to_fault(&self, conn: &Conn, e: &Error, seen: u64) -> bool {
        match e {
            Error::BrokerRestarting(_) => true,
            e if e.code() == Some(ErrorCode::DeviceReset) => {
                conn.wait_for_notice(NOTICE_WAIT, seen);
                let notices = &self.inner.notices;
                notices.pending.load(Ordering::Acquire)
                    || notices.count.load(Ordering::Acquire) != seen
                    || conn.restarted().is_some()
            }
            _ => false,
        }
    }

    /// Makes again what resets took, once (other threads that met the same reset wait, then
    /// get the same answer). Returns the error for the call that met it.
    fn rebuild(&self, registry: &Mutex<Registry>, seen: &Arc<Conn>) -> Error {
        let mut reg = lock(registry);
        if let Some(failed) = &reg.failed {
            return Error::RebuildFailed(failed.clone());
        }
        let current = self.conn();
        let started = Instant::now();
        let mut waited = Duration::ZERO;
        let mut rebuilt_here = true;
        let outcome = if !Arc::ptr_eq(&current, seen) {
            // Another thread reconnected and rebuilt meanwhile.
            rebuilt_here = false;
            Ok("gpushared restarted".to_string())
        } else if let Some(reason) = current.restarted() {
            self.rebuild_after_restart(&mut reg, &current)
                .map(|reconnecting| {
                    waited = reconnecting;
                    reason
                })
        } else {
            let resets: Vec<DeviceReset> = {
                let mut unrebuilt = lock(&self.inner.notices.unrebuilt);
                self.inner.notices.pending.store(false, Ordering::Release);
                std::mem::take(&mut *unrebuilt)
            };
            let reason = resets
                .last()
                .map_or_else(|| "the GPU was reset".to_string(), |r| r.reason.clone());
            if resets.is_empty() {
                rebuilt_here = false; // another thread rebuilt meanwhile
                Ok(reason)
            } else {
                let lost = Lost::listed(resets.into_iter().map(|r| r.lost));
                self.rebuild_in_place(&mut reg, &current, &lost)
                    .map(|()| reason)
            }
        };
        match outcome {
            Ok(reason) if !rebuilt_here => Error::Rebuilt(reason),
            Ok(reason) => {
                reg.rebuilds += 1;
                reg.lose_unsynced();
                reg.last_reason = reason.clone();
                tracing_free_log(&format!(
                    "gpushare: device state rebuilt in {:.1} ms ({:.1} ms of it waiting for gpushared to come back) after: {reason}",
                    started.elapsed().as_secs_f64() * 1e3,
                    waited.as_secs_f64() * 1e3
                ));
                Error::Rebuilt(reason)
            }
            Err(e) => {
                reg.failed = Some(e.clone());
                self.inner.failed.store(true, Ordering::Release);
                Error::RebuildFailed(e)
            }
        }
    }

    /// In the same session (the broker reset the device in place): makes again what the
    /// broker's notices list.
    fn rebuild_in_place(
        &self,
        reg: &mut Registry,
        conn: &Conn,
        lost: &Lost,
    ) -> Result<(), RebuildError> {
        // Completions of work the reset took carry `DeviceReset`: not news any more. So does
        // the first sync covering work the reset took before it ran.
        let _ = conn.drain_in_flight();
        let _ = conn.take_async_error();
        let _ = conn.synchronize();
        remake(reg, conn, lost)
    }

    /// gpushared restarted: a new session (waiting for the broker to come back), the host
    /// buffers' bytes carried into its arena, then everything made again. Returns how long
    /// it waited for the broker.
    fn rebuild_after_restart(
        &self,
        reg: &mut Registry,
        old: &Arc<Conn>,
    ) -> Result<Duration, RebuildError> {
        let started = Instant::now();
        let conn = Arc::new(self.reconnect_after_restart()?);
        let waited = started.elapsed();
        if conn.layout.arena_size != old.layout.arena_size || conn.staging_size != old.staging_size
        {
            return Err(RebuildError::Step {
                what: "keeping the host buffers".into(),
                cause: format!(
                    "the new session's arena is {} bytes, the old one's {}",
                    conn.layout.arena_size, old.layout.arena_size
                ),
            });
        }
        let host_bytes = old.layout.arena_size as usize - old.staging_size;
        // SAFETY: both arenas are mapped, equally laid out (checked), and the host-buffer part
        // starts at `staging_size` in each; the old session is over, so nothing writes it.
        unsafe {
            std::ptr::copy_nonoverlapping(
                old.arena_ptr(old.staging_size),
                conn.arena_ptr(conn.staging_size),
                host_bytes,
            )
        };
        *self.inner.conn.write().unwrap_or_else(|p| p.into_inner()) = conn.clone();
        lock(&self.inner.retired).push(old.clone());
        {
            // What an in-place reset listed is gone with the old session anyway.
            let mut unrebuilt = lock(&self.inner.notices.unrebuilt);
            unrebuilt.clear();
            self.inner.notices.pending.store(false, Ordering::Release);
        }
        remake(reg, &conn, &Lost::Everything)?;
        Ok(waited)
    }

    /// Connects again after a restart, with backoff, for up to `rebuild_timeout`.
    fn reconnect_after_restart(&self) -> Result<Conn, RebuildError> {
        let opts = &self.inner.options;
        let started = Instant::now();
        let mut pause = Duration::from_millis(2);
        loop {
            match Conn::open(opts, self.inner.notices.clone()) {
                Ok(conn) => return Ok(conn),
                Err(Error::Rejected(w)) if w.code != ErrorCode::ShuttingDown => {
                    return Err(RebuildError::Refused(w.to_string()));
                }
                Err(e @ (Error::InvalidArgument(_) | Error::Protocol(_))) => {
                    return Err(RebuildError::Step {
                        what: "connecting again".into(),
                        cause: e.to_string(),
                    });
                }
                // Not back yet (no socket, refused, the old image closing).
                Err(e) => {
                    let waited = started.elapsed();
                    if waited >= opts.rebuild_timeout {
                        return Err(RebuildError::BrokerNotBack {
                            waited_ms: waited.as_millis() as u64,
                            last: e.to_string(),
                        });
                    }
                    std::thread::sleep(pause.min(opts.rebuild_timeout - waited));
                    pause = (pause * 2).min(RECONNECT_PAUSE);
                }
            }
        }
    }

    /// Runs a command the user named (by the library's handle ids): translated to the
    /// broker's ids, and recorded for rebuilding, when rebuild is on.
    fn user_command(&self, cmd: Command, wait: bool) -> Result<(u64, u64)> {
        if let Some(registry) = &self.inner.registry
            && matches!(
                cmd,
                Command::Free { .. } | Command::StreamDestroy { .. } | Command::EventDestroy { .. }
            )
        {
            return self.release(registry, cmd, wait);
        }
        self.run(|conn| {
            let send = |c: Command| {
                if wait {
                    conn.submit_wait(c)
                } else {
                    conn.submit(c, false).map(|_| (0, 0))
                }
            };
            let Some(registry) = &self.inner.registry else {
                return send(cmd);
            };
            let shadow = match cmd {
                Command::CopyHtoD {
                    arena_offset, len, ..
                } => conn.arena_copy(arena_offset, len),
                _ => None,
            };
            let tag = {
                let mut reg = lock(registry);
                if let (Some(bytes), Command::CopyHtoD { dst, .. }) = (&shadow, cmd) {
                    reg.record_upload(dst, bytes);
                }
                if !wait {
                    reg.submitted_async(&cmd);
                }
                let translated = reg.translate(cmd);
                reg.forget(&cmd);
                // Submitted with the record held: a rebuild (which holds it) cannot come
                // between translating and submitting, so no command naming the old handles
                // reaches the broker after the rebuild's own commands, where its error would
                // fall on the rebuild or on a later, unrelated call.
                conn.submit(translated, wait)?
            };
            let result = if wait {
                let c = conn.finish(tag, op_name(cmd.encode(0).opcode))?;
                (c.result, c.result2)
            } else {
                (0, 0)
            };
            let makes = matches!(
                cmd,
                Command::Alloc { .. }
                    | Command::AllocAt { .. }
                    | Command::StreamCreate
                    | Command::EventCreate
            );
            if makes && !wait {
                // Without the broker's answer there is nothing to record (nor a handle the
                // caller could use).
                return Ok(result);
            }
            Ok(lock(registry).record(&cmd, result))
        })
    }

    /// Releases a buffer, stream or event (rebuild on): forgotten at once, and never the
    /// call that meets a reset (what a reset took is released already).
    fn release(&self, registry: &Mutex<Registry>, cmd: Command, wait: bool) -> Result<(u64, u64)> {
        let broker_cmd = {
            let mut reg = lock(registry);
            let translated = reg.translate(cmd);
            reg.forget(&cmd);
            translated
        };
        let conn = self.conn();
        if conn.restarted().is_some() {
            return Ok((0, 0));
        }
        let sent = if wait {
            conn.submit_wait(broker_cmd)
        } else {
            conn.submit(broker_cmd, false).map(|_| (0, 0))
        };
        match sent {
            Err(Error::BrokerRestarting(_)) => Ok((0, 0)),
            Err(e) if e.code() == Some(ErrorCode::DeviceReset) => Ok((0, 0)),
            other => other,
        }
    }

    /// Unloads a module when its handle is dropped (errors have nowhere to go).
    pub(crate) fn release_module(&self, module: u64) {
        let _ = self.unload_module(module);
    }

    /// A stream id of the user's as the broker knows it.
    fn broker_stream(&self, stream: StreamId) -> StreamId {
        match &self.inner.registry {
            Some(r) => lock(r).stream(stream),
            None => stream,
        }
    }

    // ---- commands ------------------------------------------------------------------

    /// Submits without waiting (the error, if any, comes with the next sync).
    pub fn submit_async(&self, cmd: Command) -> Result<()> {
        self.user_command(cmd, false).map(drop)
    }

    /// Submits and waits for one command; returns its `(result, result2)`.
    pub fn submit_wait(&self, cmd: Command) -> Result<(u64, u64)> {
        let outcome = self.user_command(cmd, true);
        let waited = match (cmd, &outcome) {
            (Command::ClientSync, _) => Waited::All,
            (Command::StreamSync { stream }, _) => Waited::Stream(stream),
            (Command::EventSync { event }, _) | (Command::EventQuery { event }, Ok((1, _))) => {
                Waited::Event(event)
            }
            _ => return outcome,
        };
        let result = outcome.as_ref().map_or((0, 0), |&r| r);
        self.check_waited(waited, outcome.map(drop))
            .map(|()| result)
    }

    /// One round trip through the broker that does nothing.
    pub fn nop(&self) -> Result<()> {
        self.run(|c| c.call(Command::Nop, "nop").map(drop))
    }

    /// Submits `n` no-ops back to back and waits until all have completed.
    pub fn nop_batch(&self, n: u64) -> Result<()> {
        self.run(|c| {
            for _ in 0..n {
                c.submit(Command::Nop, false)?;
            }
            c.drain_in_flight()
        })
    }

    /// Marks the end of one iteration (a training step, one inference request): where the
    /// scheduler may switch jobs (SRTF, PACK) and checks a declared deadline. Returns the
    /// iteration's latency as the scheduler saw it (zero under FIFO) and whether it missed
    /// the deadline.
    pub fn end_iteration(&self) -> Result<(Duration, bool)> {
        let (latency, missed) = self.user_command(Command::IterationEnd, true)?;
        Ok((Duration::from_nanos(latency), missed != 0))
    }

    /// Declares this job's expected remaining GPU time and memory (persistent: weights and
    /// state; ephemeral: per-iteration scratch) for SRTF/PACK and memory admission.
    pub fn declare_job(
        &self,
        remaining: Duration,
        persistent_bytes: u64,
        ephemeral_bytes: u64,
    ) -> Result<()> {
        self.user_command(
            Command::DeclareJob {
                remaining_ns: remaining.as_nanos().min(u64::MAX as u128) as u64,
                persistent_bytes,
                ephemeral_bytes,
            },
            true,
        )
        .map(drop)
    }

    /// Declares a periodic deadline: each iteration should end within `deadline` of its
    /// start, one iteration every `period` (CudaMon). Lower-priority clients then yield SMs
    /// when deadlines are missed.
    pub fn declare_deadline(&self, period: Duration, deadline: Duration) -> Result<()> {
        self.user_command(
            Command::DeclareDeadline {
                period_ns: period.as_nanos().min(u64::MAX as u128) as u64,
                deadline_ns: deadline.as_nanos().min(u64::MAX as u128) as u64,
            },
            true,
        )
        .map(drop)
    }

    /// Allocates `bytes` of device memory.
    pub fn alloc_raw(&self, bytes: u64) -> Result<DevicePtr> {
        Ok(self.user_command(Command::Alloc { bytes }, true)?.0)
    }

    /// Frees an allocation by its base pointer, waiting for the answer.
    pub fn free_raw(&self, ptr: DevicePtr) -> Result<()> {
        self.user_command(Command::Free { ptr }, true).map(drop)
    }

    /// Allocates room for `len` values of `T`.
    pub fn alloc<T>(&self, len: usize) -> Result<crate::DeviceBuffer<T>> {
        let bytes = (len as u64)
            .checked_mul(std::mem::size_of::<T>() as u64)
            .ok_or_else(|| {
                Error::InvalidArgument(format!("{len} elements overflow the address space"))
            })?;
        let ptr = self.alloc_raw(bytes.max(1))?;
        Ok(crate::DeviceBuffer::from_raw(self.clone(), ptr, len))
    }

    /// The stream every client has (id 0).
    pub fn default_stream(&self) -> crate::Stream {
        crate::Stream::default_of(self.clone())
    }

    pub fn create_stream(&self) -> Result<crate::Stream> {
        let id = self.user_command(Command::StreamCreate, true)?.0;
        Ok(crate::Stream::from_raw(self.clone(), id as StreamId))
    }

    pub fn create_event(&self) -> Result<crate::Event> {
        let id = self.user_command(Command::EventCreate, true)?.0;
        Ok(crate::Event::from_raw(self.clone(), id as EventId))
    }

    /// Launches a built-in kernel on `stream` without waiting.
    pub fn launch(&self, stream: &crate::Stream, kernel: Kernel) -> Result<()> {
        self.submit_async(Command::Launch {
            stream: stream.id(),
            kernel,
        })
    }

    /// Waits for all of this client's work; reports the first error any of it met. Work a
    /// device reset took before this client saw it finish fails here with `DeviceReset`, once.
    pub fn synchronize(&self) -> Result<()> {
        let outcome = self.run(|c| c.synchronize());
        self.check_waited(Waited::All, outcome)
    }

    pub(crate) fn sync_stream(&self, stream: StreamId) -> Result<()> {
        let outcome = self.run(|c| c.sync_stream(self.broker_stream(stream)));
        self.check_waited(Waited::Stream(stream), outcome)
    }

    /// Copies host bytes to device memory through the arena (double-buffered), and waits
    /// until the data is on the device.
    pub fn copy_to_device_raw(&self, stream: StreamId, dst: DevicePtr, src: &[u8]) -> Result<()> {
        // The shadow is written first: a rebuild that another thread runs while this copy is
        // on its way must already restore these bytes.
        if let Some(registry) = &self.inner.registry {
            lock(registry).record_upload(dst, src);
        }
        self.run(|c| c.copy_to_device(self.broker_stream(stream), dst, src))
    }

    /// Copies device memory to host bytes through the arena (double-buffered).
    pub fn copy_to_host_raw(&self, stream: StreamId, dst: &mut [u8], src: DevicePtr) -> Result<()> {
        let outcome = self.run(|c| c.copy_to_host(self.broker_stream(stream), dst, src));
        self.check_waited(Waited::Stream(stream), outcome)
    }

    /// Copies within device memory on `stream` (asynchronous).
    pub fn copy_device_raw(
        &self,
        stream: StreamId,
        dst: DevicePtr,
        src: DevicePtr,
        len: u64,
    ) -> Result<()> {
        self.submit_async(Command::CopyDtoD {
            stream,
            src,
            dst,
            len,
        })
    }

    /// Sets `len` bytes at `dst` to `value` on `stream` (asynchronous).
    pub fn memset_raw(&self, stream: StreamId, dst: DevicePtr, value: u8, len: u64) -> Result<()> {
        self.submit_async(Command::Memset {
            stream,
            dst,
            value,
            len,
        })
    }

    // ---- host buffers --------------------------------------------------------------

    /// A buffer of `len` bytes in the shared arena that the device copies to and from
    /// directly. Needs [`ConnectOptions::host_buffers`] set at connect.
    pub fn host_buffer(&self, len: usize) -> Result<crate::HostBuffer> {
        let offset = lock(&self.inner.host_region).alloc(len).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "no room for a {len}-byte host buffer (ConnectOptions::host_buffers sets the space)"
            ))
        })?;
        Ok(crate::HostBuffer::new(self.clone(), offset, len))
    }

    pub(crate) fn release_host_buffer(&self, offset: usize, len: usize) {
        lock(&self.inner.host_region).release(offset, len);
    }

    /// The arena bytes of a host buffer (in the session now).
    pub(crate) fn host_buffer_ptr(&self, offset: usize) -> *mut u8 {
        self.conn().arena_ptr(offset)
    }

    /// Copies a whole host buffer to `dst` on `stream`, asynchronously (no staging copy).
    pub fn copy_host_buffer_to_device(
        &self,
        stream: &crate::Stream,
        src: &crate::HostBuffer,
        dst: DevicePtr,
    ) -> Result<()> {
        self.copy_host_buffer_range_to_device(stream, src, 0..src.len(), dst)
    }

    /// Copies `range` of a host buffer to `dst` on `stream`, asynchronously.
    pub fn copy_host_buffer_range_to_device(
        &self,
        stream: &crate::Stream,
        src: &crate::HostBuffer,
        range: std::ops::Range<usize>,
        dst: DevicePtr,
    ) -> Result<()> {
        let arena_offset = host_range(src, &range)?;
        self.submit_async(Command::CopyHtoD {
            stream: stream.id(),
            arena_offset,
            dst,
            len: range.len() as u64,
        })
    }

    /// Copies `dst.len()` bytes from `src` into a host buffer on `stream`, asynchronously;
    /// the data is there once the stream is synchronized.
    pub fn copy_device_to_host_buffer(
        &self,
        stream: &crate::Stream,
        src: DevicePtr,
        dst: &crate::HostBuffer,
    ) -> Result<()> {
        self.copy_device_to_host_buffer_range(stream, src, dst, 0..dst.len())
    }

    /// Copies `range.len()` bytes from `src` into `range` of a host buffer, asynchronously.
    pub fn copy_device_to_host_buffer_range(
        &self,
        stream: &crate::Stream,
        src: DevicePtr,
        dst: &crate::HostBuffer,
        range: std::ops::Range<usize>,
    ) -> Result<()> {
        let arena_offset = host_range(dst, &range)?;
        self.submit_async(Command::CopyDtoH {
            stream: stream.id(),
            src,
            arena_offset,
            len: range.len() as u64,
        })
    }

    // ---- control-socket requests ---------------------------------------------------

    /// The oldest device reset not yet taken: what the GPU reset took from this client.
    /// Commands that fail with [`ErrorCode::DeviceReset`] mean one happened; reading the
    /// control socket is what delivers the notice, so this also looks for one now. (With
    /// rebuild on, the library has made it all again by the next call.)
    pub fn take_device_reset(&self) -> Option<DeviceReset> {
        self.conn().read_news(PollTimeout::ZERO);
        let mut resets = lock(&self.inner.notices.resets);
        (!resets.is_empty()).then(|| resets.remove(0))
    }

    /// How many device resets this client has lived through (in place; a restart of
    /// gpushared ends the session instead).
    pub fn device_resets(&self) -> u64 {
        self.conn().read_news(PollTimeout::ZERO);
        self.inner.notices.count.load(Ordering::Relaxed)
    }

    /// The broker's status report.
    pub fn status(&self) -> Result<StatusReport> {
        self.run(|c| c.status())
    }

    /// Loads a PTX, cubin or fatbin module (devices that support modules only; the sim device
    /// answers `NotSupported`).
    pub fn load_module(&self, format: ModuleFormat, image: &[u8]) -> Result<crate::Module> {
        let id = self.load_module_raw(format, image)?;
        Ok(crate::Module::from_raw(self.clone(), id))
    }

    /// Loads a module and returns its raw id, which nothing unloads automatically: the caller
    /// unloads it (the C ABI's `gpushare_module_unload`) or the broker does when the session
    /// ends. Prefer [`Client::load_module`] in Rust.
    pub fn load_module_raw(&self, format: ModuleFormat, image: &[u8]) -> Result<u64> {
        self.run(|c| {
            let broker = c.load_module(format, image)?;
            Ok(match &self.inner.registry {
                Some(r) => lock(r).add_module(broker, format, image),
                None => broker,
            })
        })
    }

    pub(crate) fn get_function(&self, module: u64, name: &str) -> Result<u64> {
        self.run(|c| match &self.inner.registry {
            Some(r) => {
                let broker_module = lock(r).module(module);
                let broker = c.get_function(broker_module, name)?;
                Ok(lock(r).add_function(broker, module, name))
            }
            None => c.get_function(module, name),
        })
    }

    /// Unloads a module. With rebuild on it is forgotten at once and never the call that
    /// meets a reset (a module a restart took is gone already).
    pub(crate) fn unload_module(&self, module: u64) -> Result<()> {
        let Some(registry) = &self.inner.registry else {
            return self.conn().unload_module(module);
        };
        let broker = {
            let mut reg = lock(registry);
            let broker = reg.module(module);
            reg.remove_module(module);
            broker
        };
        let conn = self.conn();
        if conn.restarted().is_some() {
            return Ok(());
        }
        match conn.unload_module(broker) {
            Err(Error::BrokerRestarting(_)) => Ok(()),
            other => other,
        }
    }

    /// Launches a module function with packed parameters on `stream`.
    pub fn launch_function(
        &self,
        stream: &crate::Stream,
        function: &crate::Function,
        grid: [u32; 3],
        block: [u32; 3],
        shared_mem_bytes: u32,
        params: &[u8],
    ) -> Result<()> {
        self.launch_function_raw(
            stream.id(),
            function.id(),
            grid,
            block,
            shared_mem_bytes,
            params,
        )
    }

    /// Launches a module function by its raw ids (what the C ABI holds) with packed
    /// parameters on `stream`. Prefer [`Client::launch_function`] in Rust.
    pub fn launch_function_raw(
        &self,
        stream: StreamId,
        function: u64,
        grid: [u32; 3],
        block: [u32; 3],
        shared_mem_bytes: u32,
        params: &[u8],
    ) -> Result<()> {
        self.run(|c| match &self.inner.registry {
            Some(r) => {
                let reg = lock(r);
                let (stream, function) = (reg.stream(stream), reg.function(function));
                // Submitted with the record held, as in `user_command`.
                c.launch_function(stream, function, (grid, block, shared_mem_bytes), params)
            }
            None => c.launch_function(stream, function, (grid, block, shared_mem_bytes), params),
        })
    }
}

/// Makes again what `lost` names of the record, in `conn`: allocations at their old
/// addresses with their shadows uploaded, streams, events, modules and their functions.
fn remake(reg: &mut Registry, conn: &Conn, lost: &Lost) -> Result<(), RebuildError> {
    let step = |what: String| {
        move |e: Error| RebuildError::Step {
            what,
            cause: e.to_string(),
        }
    };
    for (&ptr, buffer) in &reg.buffers {
        if !lost.buffer(ptr) {
            continue;
        }
        let bytes = buffer.bytes;
        if buffer.shadow_lost {
            return Err(RebuildError::Step {
                what: format!("restoring the {bytes} bytes uploaded to {ptr:#x}"),
                cause: "there was no host memory to keep a copy of them".into(),
            });
        }
        conn.call(Command::AllocAt { bytes, ptr }, "allocate at an address")
            .map_err(|e| match e.code() {
                Some(ErrorCode::AddressUnavailable) => RebuildError::AddressUnavailable {
                    ptr,
                    bytes,
                    cause: e.to_string(),
                },
                _ => step(format!("allocating {bytes} bytes at {ptr:#x} again"))(e),
            })?;
        if let Some(shadow) = &buffer.shadow {
            conn.copy_to_device(0, ptr, shadow)
                .map_err(step(format!("uploading {bytes} bytes to {ptr:#x} again")))?;
        }
    }
    for broker in reg.streams.values_mut() {
        if lost.stream(*broker) {
            let id = conn
                .call(Command::StreamCreate, "create stream")
                .map_err(step("creating a stream again".into()))?
                .result;
            *broker = id as StreamId;
        }
    }
    for broker in reg.events.values_mut() {
        if lost.event(*broker) {
            let id = conn
                .call(Command::EventCreate, "create event")
                .map_err(step("creating an event again".into()))?
                .result;
            *broker = id as EventId;
        }
    }
    let mut reloaded = HashSet::new();
    for (&id, module) in reg.modules.iter_mut() {
        if lost.module(module.broker) {
            module.broker = conn
                .load_module(module.format, &module.image)
                .map_err(step(format!("loading a {:?} module again", module.format)))?;
            reloaded.insert(id);
        }
    }
    for function in reg.functions.values_mut() {
        if reloaded.contains(&function.module) {
            let module = reg
                .modules
                .get(&function.module)
                .map_or(u64::MAX, |m| m.broker);
            function.broker = conn
                .get_function(module, &function.name)
                .map_err(step(format!("looking up {} again", function.name)))?;
        }
    }
    // The scheduler forgot the job profile and deadline with the rest.
    for cmd in reg.declarations.clone() {
        conn.submit_wait(cmd).map_err(step(format!(
            "declaring {} again",
            op_name(cmd.encode(0).opcode)
        )))?;
    }
    conn.synchronize()
        .map_err(step("waiting for the rebuilt state".into()))
}

/// One line on stderr when `GPUSHARE_LOG_REBUILD` is set (the library has no logger).
fn tracing_free_log(line: &str) {
    if std::env::var_os("GPUSHARE_LOG_REBUILD").is_some() {
        let _ = std::io::Write::write_all(&mut std::io::stderr(), format!("{line}\n").as_bytes());
    }
}

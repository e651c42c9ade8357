//! The client: a session with the broker, its rings and its arena.
//!
//! A [`Client`] holds one session ([`conn::Conn`]: the connection core's session plus the
//! library's staging area). With [`ConnectOptions::rebuild`] it also records what it needs to
//! make its device state again after a GPU reset ([`crate::rebuild`]) and does so by itself
//! ([`recover`]).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Duration;

use gpushare_conn::{Notices, op_name};
use gpushare_protocol::control::{ModuleFormat, Welcome};
use gpushare_protocol::stats::StatusReport;
use gpushare_protocol::{Command, DevicePtr, ErrorCode, EventId, Kernel, PriorityClass, StreamId};
use nix::poll::PollTimeout;

use crate::rebuild::{Registry, Waited};
use crate::{Error, Result};

mod conn;
mod recover;

use conn::{Conn, HOST_BUFFER_ALIGN};

pub use gpushare_conn::DeviceReset;

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

/// A connection to `gpushared`. Cheap to clone; all clones share one session, and the
/// session ends when the last clone (and every buffer, stream and event) is dropped.
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
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

impl Client {
    /// Connects with default options (socket from `GPUSHARE_SOCKET` or the default path).
    pub fn connect() -> Result<Client> {
        Client::connect_with(ConnectOptions::default())
    }

    pub fn connect_with(opts: ConnectOptions) -> Result<Client> {
        let notices = Arc::new(Notices::new(opts.rebuild));
        let conn = Conn::open(&opts, notices.clone())?;
        let mut free = std::collections::BTreeMap::new();
        let host_bytes = conn.arena_size() - conn.staging_size;
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
        self.conn().welcome().clone()
    }

    /// Commands submitted so far in this session.
    pub fn commands_submitted(&self) -> u64 {
        self.conn().commands_submitted()
    }

    /// Completions received so far in this session. After [`Client::synchronize`] it equals
    /// [`Client::commands_submitted`]: every command got exactly one completion.
    pub fn completions_received(&self) -> u64 {
        self.conn().completions_received()
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
            .map(|c| c.arena_size() as u64)
            .sum();
        record + retired
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
        self.inner.notices.take()
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

//! The client: a session with the broker, its rings and its arena.
//!
//! A [`Client`] holds one session ([`conn::Conn`]: the connection core's session, with its
//! payload ring over the arena's staging area). With [`ConnectOptions::rebuild`] it also
//! records what it needs to make its device state again after a GPU reset
//! ([`crate::rebuild`]) and does so by itself ([`recover`]).
//!
//! Where each part lives: this file (the session, commands over the ring, status and reset
//! notices), `options.rs` ([`ConnectOptions`]), `conn.rs` (the session, its launches with
//! parameters and its staged copies), `host.rs` (host buffers in the arena), `modules.rs`
//! (modules, functions and their launches),
//! `recover.rs` (rebuilding after a reset).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Duration;

use gpushare_conn::{Notices, op_name};
use gpushare_protocol::control::Welcome;
use gpushare_protocol::stats::StatusReport;
use gpushare_protocol::{Command, DevicePtr, ErrorCode, EventId, Kernel, StreamId};
use nix::poll::PollTimeout;

use crate::rebuild::{Registry, Waited};
use crate::{Error, Result};

mod conn;
mod host;
mod modules;
mod options;
mod recover;

use conn::Conn;
use host::HostRegion;
pub use options::ConnectOptions;

pub use gpushare_conn::DeviceReset;

/// What the broker granted this session.
pub type SessionInfo = Welcome;

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

impl Client {
    /// Connects with default options (socket from `GPUSHARE_SOCKET` or the default path).
    pub fn connect() -> Result<Client> {
        Client::connect_with(ConnectOptions::default())
    }

    pub fn connect_with(opts: ConnectOptions) -> Result<Client> {
        let notices = Arc::new(Notices::new(opts.rebuild));
        let conn = Conn::open(&opts, notices.clone())?;
        let host_region = HostRegion::new(conn.staging_size, conn.arena_size() - conn.staging_size);
        Ok(Client {
            inner: Arc::new(Inner {
                conn: RwLock::new(Arc::new(conn)),
                retired: Mutex::new(Vec::new()),
                registry: opts.rebuild.then(|| Mutex::new(Registry::new())),
                options: opts,
                host_region: Mutex::new(host_region),
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

    /// Copies host bytes to device memory staged through the arena (in pieces, several in
    /// flight), and waits until the data is on the device.
    pub fn copy_to_device_raw(&self, stream: StreamId, dst: DevicePtr, src: &[u8]) -> Result<()> {
        // The shadow is written first: a rebuild that another thread runs while this copy is
        // on its way must already restore these bytes.
        if let Some(registry) = &self.inner.registry {
            lock(registry).record_upload(dst, src);
        }
        self.run(|c| c.copy_to_device(self.broker_stream(stream), dst, src))
    }

    /// Copies device memory to host bytes staged through the arena (in pieces, several in
    /// flight).
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

    // ---- status and reset notices --------------------------------------------------

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
}

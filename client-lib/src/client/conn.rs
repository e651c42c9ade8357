//! A client library session: the connection core's [`Session`] plus what the library keeps
//! in its arena (the staging area for host copies, host buffers after it).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpushare_conn::{Notices, Session, SessionOptions};
use gpushare_protocol::command::ModuleLaunch;
use gpushare_protocol::control::Role;
use gpushare_protocol::{Command, DevicePtr, EventId, StreamId};

use super::{ConnectOptions, lock};
use crate::{Error, Result};

/// Staging area the client asks for when it also wants host buffers but no explicit arena.
const DEFAULT_STAGING: u64 = 16 << 20;
/// Host buffers start on page boundaries (DMA-friendly, and never share a page).
pub(crate) const HOST_BUFFER_ALIGN: usize = 4096;

/// What the library asks the broker for.
fn session_options(opts: &ConnectOptions) -> SessionOptions {
    let arena_size = match (opts.arena_size, opts.host_buffers) {
        (0, 0) => 0,
        (0, h) => DEFAULT_STAGING + h,
        (a, _) => a,
    };
    SessionOptions {
        socket: opts.socket.clone(),
        name: opts.name.clone(),
        role: Role::Client,
        class: opts.class,
        sq_entries: opts.sq_entries,
        arena_size,
        gpu: opts.gpu,
        spin: opts.spin,
        timeout: opts.timeout,
    }
}

/// Staging state for host copies through the arena.
struct Staging {
    /// The staging events, and the `handles_lost` count they were made at.
    events: Option<([EventId; 2], u64)>,
}

/// One session with gpushared, as the library uses it.
pub(crate) struct Conn {
    session: Session,
    staging: Mutex<Staging>,
    /// Bytes at the start of the arena used for staged copies and launch parameters.
    pub staging_size: usize,
}

impl std::ops::Deref for Conn {
    type Target = Session;
    fn deref(&self) -> &Session {
        &self.session
    }
}

impl Conn {
    /// Connects and maps the shared region the broker grants.
    pub fn open(opts: &ConnectOptions, notices: Arc<Notices>) -> Result<Conn> {
        Conn::with_staging(Session::open(&session_options(opts), notices)?, opts)
    }

    /// Like [`Conn::open`], retrying while gpushared is away, for up to `timeout`.
    pub fn open_retrying(
        opts: &ConnectOptions,
        notices: Arc<Notices>,
        timeout: Duration,
    ) -> Result<Conn> {
        let session = Session::open_retrying(&session_options(opts), notices, timeout)?;
        Conn::with_staging(session, opts)
    }

    fn with_staging(session: Session, opts: &ConnectOptions) -> Result<Conn> {
        let arena = session.layout().arena_size as usize;
        let host_bytes =
            (opts.host_buffers as usize).div_ceil(HOST_BUFFER_ALIGN) * HOST_BUFFER_ALIGN;
        let staging_size = arena.saturating_sub(host_bytes);
        if staging_size < 2 * HOST_BUFFER_ALIGN {
            return Err(Error::InvalidArgument(format!(
                "the broker granted a {arena}-byte arena, too small for {} bytes of host buffers plus staging",
                opts.host_buffers
            )));
        }
        Ok(Conn {
            session,
            staging: Mutex::new(Staging { events: None }),
            staging_size,
        })
    }

    /// The arena's size in bytes.
    pub fn arena_size(&self) -> usize {
        self.layout().arena_size as usize
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

    fn staging_events(&self, staging: &mut Staging) -> Result<[EventId; 2]> {
        let lost = self.handles_lost();
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

    /// Copies host bytes to device memory through the arena (double-buffered), and waits
    /// until the data is on the device.
    pub fn copy_to_device(&self, stream: StreamId, dst: DevicePtr, src: &[u8]) -> Result<()> {
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
    pub fn copy_to_host(&self, stream: StreamId, dst: &mut [u8], src: DevicePtr) -> Result<()> {
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

    pub fn launch_function(
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

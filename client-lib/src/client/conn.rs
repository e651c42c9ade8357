//! A client library session: the connection core's [`Session`] plus what the library keeps
//! in its arena: the connection core's payload ring at its start (launch parameters and
//! copies staged through it), host buffers after it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpushare_conn::{Held, Notices, Payload, Payloads, Session, SessionOptions};
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

/// What staged copies share: one at a time, they wait for the device through one event.
struct Staging {
    /// The staging event, and the `handles_lost` count it was made at.
    event: Option<(EventId, u64)>,
}

/// One session with gpushared, as the library uses it.
pub(crate) struct Conn {
    session: Session,
    /// The payload ring over the first `staging_size` bytes of the arena.
    payloads: Payloads,
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
            payloads: Payloads::new(staging_size),
            staging: Mutex::new(Staging { event: None }),
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

    fn staging_event(&self, staging: &mut Staging) -> Result<EventId> {
        let lost = self.handles_lost();
        if let Some((e, made)) = staging.event
            && made == lost
        {
            return Ok(e);
        }
        // First use, or a device reset took the old one.
        let e = self.call(Command::EventCreate, "create event")?.result as EventId;
        staging.event = Some((e, lost));
        Ok(e)
    }

    /// Waits until the device is done with what `stream` was given so far (the DMA of the
    /// payloads held for it): an event recorded after it, synchronized.
    fn settle(&self, staging: &mut Staging, stream: StreamId) -> Result<()> {
        let event = self.staging_event(staging)?;
        self.submit(Command::EventRecord { stream, event }, false)?;
        let synced = self.call(Command::EventSync { event }, "synchronize event");
        self.abandon_on_error(synced).map(drop)
    }

    /// Room for `len` bytes of a copy's payload; when the ring is full of this copy's own
    /// earlier pieces, waits for the device to be done with them (`done` then sees them,
    /// before they come free).
    fn reserve_piece(
        &self,
        staging: &mut Staging,
        held: &mut Held<'_>,
        stream: StreamId,
        len: usize,
        mut done: impl FnMut() -> Result<()>,
    ) -> Result<Payload> {
        loop {
            if let Some(p) = held.reserve(len)? {
                return Ok(p);
            }
            self.settle(staging, stream)?;
            done()?;
            held.clear();
        }
    }

    /// Copies host bytes to device memory through the arena, piece by piece (the device
    /// reads each piece by DMA), and waits until the data is on the device.
    pub fn copy_to_device(&self, stream: StreamId, dst: DevicePtr, src: &[u8]) -> Result<()> {
        let mut staging = lock(&self.staging);
        let mut held = self.payloads.held(&self.session);
        let piece = self.payloads.piece();
        for (i, chunk) in src.chunks(piece).enumerate() {
            let p = self.reserve_piece(&mut staging, &mut held, stream, chunk.len(), || Ok(()))?;
            // SAFETY: `p` is `chunk.len()` bytes of the arena reserved for this copy; the
            // device reads them only after the command below.
            unsafe { std::ptr::copy_nonoverlapping(chunk.as_ptr(), p.ptr, chunk.len()) };
            let cmd = Command::CopyHtoD {
                stream,
                arena_offset: p.offset,
                dst: dst.wrapping_add((i * piece) as u64),
                len: chunk.len() as u64,
            };
            self.submit(cmd, false)?;
        }
        // The payloads stay held until the device has read them.
        let synced = self.sync_stream(stream);
        drop(held);
        synced
    }

    /// Copies device memory to host bytes through the arena, piece by piece (the device
    /// writes each piece by DMA), reading them out once the device is done.
    pub fn copy_to_host(&self, stream: StreamId, dst: &mut [u8], src: DevicePtr) -> Result<()> {
        let mut staging = lock(&self.staging);
        let mut held = self.payloads.held(&self.session);
        let piece = self.payloads.piece();
        // Pieces copied into the arena and not read out yet: (payload, offset in `dst`).
        let mut waiting: Vec<(Payload, usize)> = Vec::new();
        let read_out = |waiting: &mut Vec<(Payload, usize)>, dst: &mut [u8]| -> Result<()> {
            self.take_async_error()?;
            for (p, at) in waiting.drain(..) {
                // SAFETY: the device wrote these `p.len` arena bytes (its event was
                // synchronized) and nothing else uses them until they come free; `at + p.len`
                // is inside `dst`.
                unsafe { std::ptr::copy_nonoverlapping(p.ptr, dst[at..].as_mut_ptr(), p.len) };
            }
            Ok(())
        };
        let mut at = 0;
        while at < dst.len() {
            let len = piece.min(dst.len() - at);
            let p = self.reserve_piece(&mut staging, &mut held, stream, len, || {
                read_out(&mut waiting, dst)
            })?;
            let cmd = Command::CopyDtoH {
                stream,
                src: src.wrapping_add(at as u64),
                arena_offset: p.offset,
                len: len as u64,
            };
            self.submit(cmd, false)?;
            waiting.push((p, at));
            at += len;
        }
        if !waiting.is_empty() {
            self.settle(&mut staging, stream)?;
            read_out(&mut waiting, dst)?;
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
        let launch = ModuleLaunch {
            function,
            grid,
            block,
            shared_mem_bytes,
            params_offset: 0,
            params_len: u32::try_from(params.len())
                .map_err(|_| Error::InvalidArgument("parameters too large".into()))?,
        };
        if params.is_empty() {
            return self
                .submit(Command::LaunchModule { stream, launch }, false)
                .map(drop);
        }
        if params.len() > self.staging_size {
            return Err(Error::InvalidArgument(
                "parameters larger than the arena".into(),
            ));
        }
        // Posted without waiting: the broker copies the parameters out when it runs the
        // launch, and their room comes free once its completion has been read.
        self.payloads
            .send(
                &self.session,
                params.len(),
                false,
                // SAFETY: `p` is `params.len()` bytes of the arena reserved for this launch.
                |p| unsafe { std::ptr::copy_nonoverlapping(params.as_ptr(), p.ptr, params.len()) },
                |params_offset| Command::LaunchModule {
                    stream,
                    launch: ModuleLaunch {
                        params_offset,
                        ..launch
                    },
                },
                |_| (),
            )
            .map(drop)
    }
}

//! Streams. Each is a stream of this client's in the broker, under an id the driver chooses
//! (so creating one never waits). The NULL and legacy default streams are the client's
//! stream 0, which the broker keeps in CUDA's legacy order with the client's blocking
//! streams; the per-thread default stream is a stream of the calling thread's own.

use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::{c_int, c_uint};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

use gpushare_protocol::Command;

use crate::driver::{self, Driver};
use crate::handle;
use crate::status::{Cu, entry, out};
use crate::types::{CUcontext, CUevent, CUresult, CUstream, result, stream};

/// What the program said when it made a stream.
#[derive(Debug, Clone, Copy, Default)]
pub struct StreamMeta {
    pub flags: u32,
    pub priority: i32,
}

pub struct Streams {
    next: AtomicU32,
    meta: Mutex<HashMap<u32, StreamMeta>>,
    /// Threads' default streams alive (not in `meta`: the program cannot destroy them).
    per_thread: AtomicUsize,
}

impl Default for Streams {
    fn default() -> Streams {
        Streams {
            next: AtomicU32::new(1),
            meta: Mutex::new(HashMap::new()),
            per_thread: AtomicUsize::new(0),
        }
    }
}

/// Devices a thread may have a default stream on (a process of more sees them all, but its
/// threads' default streams beyond these are refused).
const PER_THREAD_DEVICES: usize = 16;

/// The calling thread's per-thread default stream on each device, made at its first use
/// there; destroyed when the thread ends.
struct PerThread {
    id: [Cell<u32>; PER_THREAD_DEVICES],
}

impl Drop for PerThread {
    fn drop(&mut self) {
        let Ok(first) = driver::first() else {
            return;
        };
        for d in crate::route::opened(first) {
            let Some(id) = self.id.get(d.device as usize).map(Cell::get) else {
                continue;
            };
            if id != 0 {
                let _ = d.transport.post(Command::StreamDestroy { stream: id });
                d.streams.per_thread.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }
}

thread_local! {
    static PER_THREAD: PerThread = const {
        PerThread { id: [const { Cell::new(0) }; PER_THREAD_DEVICES] }
    };
}

impl Driver {
    /// Makes a stream in the broker under a fresh id.
    fn new_stream(&self, flags: u32, priority: i32) -> Cu<u32> {
        let id = self.streams.next.fetch_add(1, Ordering::Relaxed);
        if id == 0 {
            return Err(result::OUT_OF_MEMORY); // wrapped: four billion streams made
        }
        self.transport.post(Command::StreamCreateAs {
            stream: id,
            flags,
            priority,
        })?;
        Ok(id)
    }

    /// The broker's bound, said at creation as CUDA says it runs out: the program's streams,
    /// the threads' default streams and stream 0 all count.
    fn room_for_a_stream(&self, meta: &HashMap<u32, StreamMeta>) -> Cu<()> {
        let threads = self.streams.per_thread.load(Ordering::Relaxed);
        if meta.len() + threads + 1 >= gpushare_protocol::MAX_STREAMS {
            return Err(result::OUT_OF_MEMORY);
        }
        Ok(())
    }

    /// Makes a stream of the program's, which `cuStreamDestroy` destroys. (A thread's default
    /// stream is not one: only the thread's end destroys it, whatever handle a program makes
    /// up.)
    pub fn create_stream(&self, flags: u32, priority: i32) -> Cu<u32> {
        // Checked and inserted under one lock: two threads cannot both take the last room.
        let mut meta = self.streams.meta.lock().unwrap_or_else(|p| p.into_inner());
        self.room_for_a_stream(&meta)?;
        let id = self.new_stream(flags, priority)?;
        meta.insert(id, StreamMeta { flags, priority });
        Ok(id)
    }

    fn per_thread_stream(&self) -> Cu<u32> {
        let dev = self.device as usize;
        if dev >= PER_THREAD_DEVICES {
            return Err(result::INVALID_DEVICE);
        }
        let known = PER_THREAD.with(|p| p.id[dev].get());
        if known != 0 {
            return Ok(known);
        }
        let meta = self.streams.meta.lock().unwrap_or_else(|p| p.into_inner());
        self.room_for_a_stream(&meta)?;
        // Blocking, like CUDA's: it keeps legacy order with stream 0.
        let id = self.new_stream(0, 0)?;
        self.streams.per_thread.fetch_add(1, Ordering::Relaxed);
        drop(meta);
        PER_THREAD.with(|p| p.id[dev].set(id));
        Ok(id)
    }

    /// The broker stream a handle means: a default stream of this device, or a stream this
    /// device's session made (another device's is `CUDA_ERROR_INVALID_HANDLE`, as CUDA's of
    /// another context). `per_thread`: the call is a per-thread-default-stream form (`_ptsz`,
    /// `_ptds`), where NULL means the thread's own stream.
    #[inline]
    pub fn stream(&self, h: CUstream, per_thread: bool) -> Cu<u32> {
        match h as usize {
            0 if per_thread => self.per_thread_stream(),
            0 | stream::LEGACY => Ok(0),
            stream::PER_THREAD => self.per_thread_stream(),
            _ => match handle::stream_id(h) {
                Some((dev, id)) if dev == self.device => Ok(id),
                _ => Err(result::INVALID_HANDLE),
            },
        }
    }

    fn stream_meta(&self, id: u32) -> StreamMeta {
        self.streams
            .meta
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&id)
            .copied()
            .unwrap_or_default()
    }

    /// Waits for a stream's work; reports the first error since the last sync.
    pub fn sync_stream(&self, id: u32) -> Cu<()> {
        self.wait_for(Command::StreamSync { stream: id })
    }
}

fn create(ph: *mut CUstream, flags: c_uint, priority: c_int) -> Cu<()> {
    let d = driver::live()?;
    if ph.is_null() || flags & !stream::NON_BLOCKING != 0 {
        return Err(result::INVALID_VALUE);
    }
    let id = d.create_stream(flags, priority)?;
    // SAFETY: checked non-NULL; writable by the caller's contract.
    unsafe { out(ph, handle::stream_handle(d.device, id)) }
}

/// # Safety
/// `ph` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamCreate(ph: *mut CUstream, flags: c_uint) -> CUresult {
    entry("cuStreamCreate", || create(ph, flags, 0))
}

/// # Safety
/// `ph` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamCreateWithPriority(
    ph: *mut CUstream,
    flags: c_uint,
    priority: c_int,
) -> CUresult {
    entry("cuStreamCreateWithPriority", || create(ph, flags, priority))
}

fn destroy(h: CUstream) -> Cu<()> {
    let d = crate::route::by_stream(h)?;
    let (_, id) = handle::stream_id(h).ok_or(result::INVALID_HANDLE)?;
    d.streams
        .meta
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&id)
        .ok_or(result::INVALID_HANDLE)?;
    d.transport.post(Command::StreamDestroy { stream: id })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamDestroy(h: CUstream) -> CUresult {
    entry("cuStreamDestroy", || destroy(h))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamDestroy_v2(h: CUstream) -> CUresult {
    entry("cuStreamDestroy_v2", || destroy(h))
}

fn synchronize(h: CUstream, per_thread: bool) -> Cu<()> {
    let d = crate::route::by_stream(h)?;
    let id = d.stream(h, per_thread)?;
    crate::graph::refuse_while_capturing(d, id)?;
    d.sync_stream(id)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamSynchronize(h: CUstream) -> CUresult {
    entry("cuStreamSynchronize", || synchronize(h, false))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamSynchronize_ptsz(h: CUstream) -> CUresult {
    entry("cuStreamSynchronize_ptsz", || synchronize(h, true))
}

fn query(h: CUstream, per_thread: bool) -> Cu<()> {
    let d = crate::route::by_stream(h)?;
    let id = d.stream(h, per_thread)?;
    crate::graph::refuse_while_capturing(d, id)?;
    let ask = Command::StreamQuery { stream: id };
    if d.nothing_to_wait_for(&ask) {
        return d.deferred();
    }
    let (idle, _) = d.transport.call(ask)?;
    d.deferred()?;
    if idle == 1 {
        Ok(())
    } else {
        Err(result::NOT_READY)
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamQuery(h: CUstream) -> CUresult {
    entry("cuStreamQuery", || query(h, false))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamQuery_ptsz(h: CUstream) -> CUresult {
    entry("cuStreamQuery_ptsz", || query(h, true))
}

/// A wait on another device's event is kept by waiting for the event here, in the calling
/// thread, before the stream's later work is sent (each device's work runs in a session of
/// its own, and gpushared orders work within one).
fn wait_event(h: CUstream, event: CUevent, per_thread: bool) -> Cu<()> {
    let d = crate::route::by_stream(h)?;
    let id = d.stream(h, per_thread)?;
    let owner = crate::route::by_event(event)?;
    if owner.device != d.device {
        crate::graph::refuse_while_capturing(d, id)?;
        return owner.sync_event(owner.event(event)?);
    }
    let ev = d.event(event)?;
    if crate::graph::wait_in_capture(d, id, ev)? {
        return Ok(());
    }
    d.transport.post(Command::StreamWaitEvent {
        stream: id,
        event: ev,
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamWaitEvent(h: CUstream, event: CUevent, _flags: c_uint) -> CUresult {
    entry("cuStreamWaitEvent", || wait_event(h, event, false))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamWaitEvent_ptsz(h: CUstream, event: CUevent, _flags: c_uint) -> CUresult {
    entry("cuStreamWaitEvent_ptsz", || wait_event(h, event, true))
}

fn get_flags(h: CUstream, flags: *mut c_uint, per_thread: bool) -> Cu<()> {
    let d = crate::route::by_stream(h)?;
    let id = d.stream(h, per_thread)?;
    // SAFETY: the caller's contract.
    unsafe { out(flags, d.stream_meta(id).flags) }
}

/// # Safety
/// `flags` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetFlags(h: CUstream, flags: *mut c_uint) -> CUresult {
    entry("cuStreamGetFlags", || get_flags(h, flags, false))
}

/// # Safety
/// `flags` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetFlags_ptsz(h: CUstream, flags: *mut c_uint) -> CUresult {
    entry("cuStreamGetFlags_ptsz", || get_flags(h, flags, true))
}

fn get_priority(h: CUstream, priority: *mut c_int, per_thread: bool) -> Cu<()> {
    let d = crate::route::by_stream(h)?;
    let id = d.stream(h, per_thread)?;
    // SAFETY: the caller's contract.
    unsafe { out(priority, d.stream_meta(id).priority) }
}

/// # Safety
/// `priority` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetPriority(h: CUstream, priority: *mut c_int) -> CUresult {
    entry("cuStreamGetPriority", || get_priority(h, priority, false))
}

/// # Safety
/// `priority` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetPriority_ptsz(h: CUstream, priority: *mut c_int) -> CUresult {
    entry("cuStreamGetPriority_ptsz", || {
        get_priority(h, priority, true)
    })
}

fn get_id(h: CUstream, id_out: *mut u64, per_thread: bool) -> Cu<()> {
    let d = crate::route::by_stream(h)?;
    let id = d.stream(h, per_thread)?;
    // SAFETY: the caller's contract.
    unsafe { out(id_out, id as u64) }
}

/// # Safety
/// `id` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetId(h: CUstream, id: *mut u64) -> CUresult {
    entry("cuStreamGetId", || get_id(h, id, false))
}

/// # Safety
/// `id` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetId_ptsz(h: CUstream, id: *mut u64) -> CUresult {
    entry("cuStreamGetId_ptsz", || get_id(h, id, true))
}

fn get_ctx(h: CUstream, pctx: *mut CUcontext, per_thread: bool) -> Cu<()> {
    let d = crate::route::by_stream(h)?;
    d.stream(h, per_thread)?;
    let ctx = d
        .contexts
        .primary_of(d.device)
        .ok_or(result::INVALID_CONTEXT)?;
    // SAFETY: the caller's contract.
    unsafe { out(pctx, ctx.handle()) }
}

/// # Safety
/// `pctx` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetCtx(h: CUstream, pctx: *mut CUcontext) -> CUresult {
    entry("cuStreamGetCtx", || get_ctx(h, pctx, false))
}

/// # Safety
/// `pctx` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetCtx_ptsz(h: CUstream, pctx: *mut CUcontext) -> CUresult {
    entry("cuStreamGetCtx_ptsz", || get_ctx(h, pctx, true))
}

/// # Safety
/// `dev` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetDevice(h: CUstream, dev: *mut c_int) -> CUresult {
    entry("cuStreamGetDevice", || {
        let d = crate::route::by_stream(h)?;
        d.stream(h, false)?;
        // SAFETY: the caller's contract.
        unsafe { out(dev, d.device) }
    })
}

/// # Safety
/// `dev` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetDevice_ptsz(h: CUstream, dev: *mut c_int) -> CUresult {
    entry("cuStreamGetDevice_ptsz", || {
        let d = crate::route::by_stream(h)?;
        d.stream(h, true)?;
        // SAFETY: the caller's contract.
        unsafe { out(dev, d.device) }
    })
}

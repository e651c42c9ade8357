//! Events, under ids the driver chooses (creating and recording one never waits); queries,
//! synchronizations and timings ask the broker.

use std::collections::HashMap;
use std::ffi::{c_float, c_uint};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use gpushare_protocol::Command;

use crate::driver::{self, Driver};
use crate::handle;
use crate::status::{Cu, entry, out};
use crate::types::{CUevent, CUresult, CUstream, event, result};

pub struct Events {
    next: AtomicU32,
    /// Live events and their flags.
    flags: Mutex<HashMap<u32, u32>>,
}

impl Default for Events {
    fn default() -> Events {
        Events {
            next: AtomicU32::new(1),
            flags: Mutex::new(HashMap::new()),
        }
    }
}

impl Driver {
    /// A new event of `flags` that `make` makes in the broker under a fresh id.
    pub fn new_event(&self, flags: u32, make: impl FnOnce(u32) -> Cu<()>) -> Cu<u32> {
        // The broker's bound, said at creation.
        let mut live = self.events.flags.lock().unwrap_or_else(|p| p.into_inner());
        if live.len() >= gpushare_protocol::MAX_EVENTS {
            return Err(result::OUT_OF_MEMORY);
        }
        let id = self.events.next.fetch_add(1, Ordering::Relaxed);
        make(id)?;
        live.insert(id, flags);
        Ok(id)
    }

    /// The id of an event of this device's; `CUDA_ERROR_INVALID_HANDLE` for anything else.
    pub fn event(&self, h: CUevent) -> Cu<u32> {
        match handle::event_id(h) {
            Some((dev, id)) if dev == self.device => Ok(id),
            _ => Err(result::INVALID_HANDLE),
        }
    }

    pub fn event_flags(&self, id: u32) -> Option<u32> {
        self.events
            .flags
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&id)
            .copied()
    }
}

/// # Safety
/// `ph` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventCreate(ph: *mut CUevent, flags: c_uint) -> CUresult {
    entry("cuEventCreate", || {
        let d = driver::live()?;
        if ph.is_null() {
            return Err(result::INVALID_VALUE);
        }
        // CUDA: an event shared between processes keeps no time.
        if flags & event::INTERPROCESS != 0 && flags & event::DISABLE_TIMING == 0 {
            return Err(result::INVALID_VALUE);
        }
        let id = d.new_event(flags, |id| {
            d.transport
                .post(Command::EventCreateAs { event: id, flags })
        })?;
        // SAFETY: checked non-NULL; writable by the caller's contract.
        unsafe { out(ph, handle::event_handle(d.device, id)) }
    })
}

fn destroy(h: CUevent) -> Cu<()> {
    let d = crate::route::by_event(h)?;
    let id = d.event(h)?;
    d.events
        .flags
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&id)
        .ok_or(result::INVALID_HANDLE)?;
    d.transport.post(Command::EventDestroy { event: id })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventDestroy(h: CUevent) -> CUresult {
    entry("cuEventDestroy", || destroy(h))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventDestroy_v2(h: CUevent) -> CUresult {
    entry("cuEventDestroy_v2", || destroy(h))
}

/// How long a timing event's record waits for the work before it to reach the device.
const QUEUED_WITHIN: Duration = Duration::from_millis(1);

/// An event and the stream it is recorded on are of one device (as CUDA's of one context).
fn record(h: CUevent, s: CUstream, per_thread: bool) -> Cu<()> {
    let d = crate::route::by_event(h)?;
    let ev = d.event(h)?;
    let stream = d.stream(s, per_thread)?;
    if crate::graph::record_in_capture(d, stream, ev)? {
        return Ok(());
    }
    let timing = d
        .event_flags(ev)
        .is_some_and(|f| f & event::DISABLE_TIMING == 0);
    // Behind work sent without waiting (the work a timer's stop closes, or the kernel that
    // holds its stream), not right after a wait: a timer's start after the program waited
    // goes at once, so that the work it times is not held back behind a question.
    let session = &d.transport.session;
    let behind_work = timing && !session.last_waited() && !session.quiet(Some(stream));
    d.transport
        .post(Command::EventRecord { stream, event: ev })?;
    if behind_work {
        d.until_queued(stream)?;
    }
    Ok(())
}

impl Driver {
    /// Returns once what was sent before on `stream` has reached the device's queue (or after
    /// [`QUEUED_WITHIN`]), as a CUDA call returns with its work queued. A GPU timer that holds
    /// the stream with a kernel spinning on host memory, records its events around the work
    /// and then lets the kernel go (XLA's autotuner) would otherwise let it go while the work
    /// is still on its way through gpushared, and time the way as well (docs/benchmarks.md,
    /// "Run L5"). A stream query is the question: gpushared answers it from the device worker,
    /// behind everything sent before it. Bounded, because work the scheduler holds back may
    /// wait for that very kernel to end.
    fn until_queued(&self, stream: u32) -> Cu<()> {
        self.transport
            .session
            .submit_and_await(Command::StreamQuery { stream }, QUEUED_WITHIN)
            .map(drop)
            .map_err(|e| crate::status::from_error(&e))
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventRecord(h: CUevent, s: CUstream) -> CUresult {
    entry("cuEventRecord", || record(h, s, false))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventRecord_ptsz(h: CUevent, s: CUstream) -> CUresult {
    entry("cuEventRecord_ptsz", || record(h, s, true))
}

/// The flag (`CU_EVENT_RECORD_EXTERNAL`) only matters inside graph capture.
#[unsafe(no_mangle)]
pub extern "C" fn cuEventRecordWithFlags(h: CUevent, s: CUstream, _flags: c_uint) -> CUresult {
    entry("cuEventRecordWithFlags", || record(h, s, false))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventRecordWithFlags_ptsz(h: CUevent, s: CUstream, _flags: c_uint) -> CUresult {
    entry("cuEventRecordWithFlags_ptsz", || record(h, s, true))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventQuery(h: CUevent) -> CUresult {
    entry("cuEventQuery", || {
        let d = crate::route::by_event(h)?;
        let ev = d.event(h)?;
        let (done, _) = d.transport.call(Command::EventQuery { event: ev })?;
        d.deferred()?;
        if done == 1 {
            Ok(())
        } else {
            Err(result::NOT_READY)
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventSynchronize(h: CUevent) -> CUresult {
    entry("cuEventSynchronize", || {
        let d = crate::route::by_event(h)?;
        d.sync_event(d.event(h)?)
    })
}

impl Driver {
    /// Waits for an event of this device's; reports the first error since the last sync.
    pub fn sync_event(&self, ev: u32) -> Cu<()> {
        self.wait_for(Command::EventSync { event: ev })
    }
}

fn elapsed(ms: *mut c_float, start: CUevent, end: CUevent) -> Cu<()> {
    let d = crate::route::by_event(start)?;
    let (s, e) = (d.event(start)?, d.event(end)?);
    for id in [s, e] {
        match d.event_flags(id) {
            Some(f) if f & event::DISABLE_TIMING != 0 => return Err(result::INVALID_HANDLE),
            Some(_) => {}
            None => return Err(result::INVALID_HANDLE),
        }
    }
    let (ns, _) = d
        .transport
        .call(Command::EventElapsed { start: s, end: e })?;
    // SAFETY: the caller's contract.
    unsafe { out(ms, (ns as f64 / 1e6) as c_float) }
}

/// # Safety
/// `ms` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventElapsedTime(
    ms: *mut c_float,
    start: CUevent,
    end: CUevent,
) -> CUresult {
    entry("cuEventElapsedTime", || elapsed(ms, start, end))
}

/// # Safety
/// `ms` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventElapsedTime_v2(
    ms: *mut c_float,
    start: CUevent,
    end: CUevent,
) -> CUresult {
    entry("cuEventElapsedTime_v2", || elapsed(ms, start, end))
}

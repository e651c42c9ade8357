//! Which device's driver a call goes to. A process sees one device, or under
//! `gpushare run --gpus N` several, and CUDA lets one process work on all of them: each device
//! it works on has a session of its own with gpushared (on that GPU's worker, scheduler and
//! quota), opened at the device's first call and kept for the process's life. A call goes to
//! its current context's device, or where it names a stream or an event, to the device that
//! made it (handles carry their device: `crate::handle`), or for memory, to the device whose
//! memory it is.

use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Mutex, OnceLock};

use crate::driver::{self, Driver};
use crate::log::say;
use crate::status::Cu;
use crate::types::{CUdevice, CUevent, CUstream, result};

/// One device's driver, once opened, or why it could not be.
struct Slot {
    driver: OnceLock<&'static Driver>,
    failed: AtomicI32,
}

/// Every device's slot, by ordinal (the first driver's too, never read through it).
static SLOTS: OnceLock<Box<[Slot]>> = OnceLock::new();
/// Opening is serial: two threads' first calls on a device open one session.
static OPENING: Mutex<()> = Mutex::new(());

/// Called once at `cuInit`, with how many devices the process sees.
pub(crate) fn prepare(count: usize) {
    let _ = SLOTS.set(
        (0..count)
            .map(|_| Slot {
                driver: OnceLock::new(),
                failed: AtomicI32::new(0),
            })
            .collect(),
    );
}

/// The driver of the calling thread's current device: `first` (the bound device's) where the
/// process sees one device or no context is current.
#[inline]
pub fn current(first: &'static Driver) -> Cu<&'static Driver> {
    if first.gpus.visible.len() < 2 {
        return Ok(first);
    }
    match first.contexts.current_device() {
        Some(dev) if dev != first.device => device(first, dev),
        _ => Ok(first),
    }
}

/// Device `dev`'s driver, opened now if this is its first call.
pub fn device(first: &'static Driver, dev: CUdevice) -> Cu<&'static Driver> {
    if dev == first.device {
        return Ok(first);
    }
    let slot = usize::try_from(dev)
        .ok()
        .and_then(|i| SLOTS.get()?.get(i))
        .ok_or(result::INVALID_DEVICE)?;
    if let Some(d) = slot.driver.get() {
        return Ok(d);
    }
    let _serial = OPENING.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(d) = slot.driver.get() {
        return Ok(d);
    }
    match slot.failed.load(Ordering::Relaxed) {
        0 => {}
        code => return Err(code),
    }
    match driver::connect_device(first, dev) {
        Ok(d) => {
            let d: &'static Driver = Box::leak(Box::new(d));
            crate::memory::pinned::adopt(d, || {
                let _ = slot.driver.set(d);
            });
            if std::env::var(gpushare_conn::env::CUDA_TRACE_ENV).is_ok() {
                say(&format!(
                    "device {dev} (gpushared's GPU {}): its first work; a session of its own",
                    d.device_info().index
                ));
            }
            Ok(d)
        }
        Err(code) => {
            say(&format!(
                "device {dev}: gpushared gave no session on it, so this process cannot run work there"
            ));
            slot.failed.store(code, Ordering::Relaxed);
            Err(code)
        }
    }
}

/// The driver of device `dev`, one the program sees (said once if not), opened now if this is
/// its first call: for calls that name their device.
pub fn on_device(dev: CUdevice) -> Cu<&'static Driver> {
    crate::device::check(dev)?;
    device(driver::first()?, dev)?.intact()
}

/// Device `dev`'s driver if it has been opened (a handle of its exists only then).
pub fn opened_device(first: &'static Driver, dev: CUdevice) -> Option<&'static Driver> {
    if dev == first.device {
        return Some(first);
    }
    let i = usize::try_from(dev).ok()?;
    SLOTS.get()?.get(i)?.driver.get().copied()
}

/// Every device's driver opened so far, the first one first.
pub fn opened(first: &'static Driver) -> impl Iterator<Item = &'static Driver> {
    let others = SLOTS.get().map(|s| &s[..]).unwrap_or_default();
    // The first device's slot stays empty (`device` answers `first` for it).
    std::iter::once(first).chain(others.iter().filter_map(|s| s.driver.get().copied()))
}

/// Every other device's driver opened so far than `d`.
pub fn opened_except(d: &Driver) -> impl Iterator<Item = &'static Driver> {
    let device = d.device;
    driver::first()
        .into_iter()
        .flat_map(opened)
        .filter(move |o| o.device != device)
}

/// The driver a stream belongs to: its device's, or for the default streams (which every
/// device has), the current device's.
pub fn by_stream(h: CUstream) -> Cu<&'static Driver> {
    let first = driver::first()?;
    match crate::handle::stream_id(h) {
        Some((dev, _)) => opened_device(first, dev).ok_or(result::INVALID_HANDLE),
        None => current(first),
    }?
    .intact()
}

/// The driver an event belongs to.
pub fn by_event(h: CUevent) -> Cu<&'static Driver> {
    let first = driver::first()?;
    let (dev, _) = crate::handle::event_id(h).ok_or(result::INVALID_HANDLE)?;
    opened_device(first, dev)
        .ok_or(result::INVALID_HANDLE)?
        .intact()
}

/// The driver whose device memory (or page-locked host memory) holds `ptr`, if any does.
pub fn by_pointer(ptr: u64) -> Option<&'static Driver> {
    let first = driver::first().ok()?;
    if first.gpus.visible.len() < 2 {
        return Some(first);
    }
    let found = opened(first).find(|d| d.memory.device_range(ptr, 0).is_some());
    found.or_else(|| opened(first).find(|d| d.memory.host_region_at(ptr as usize).is_some()))
}

/// The driver of the device whose memory `ptr` is, else the current device's: for calls that
/// name memory (frees, pointer queries), which CUDA answers whatever context is current.
pub fn for_pointer(ptr: u64) -> Cu<&'static Driver> {
    match by_pointer(ptr) {
        Some(d) => d.intact(),
        None => driver::unbroken(),
    }
}

/// The driver whose device memory holds `ptr`, where it is another than `d`.
pub fn other_owner(d: &Driver, ptr: u64) -> Option<&'static Driver> {
    if d.gpus.visible.len() < 2 || d.memory.device_range(ptr, 0).is_some() {
        return None;
    }
    let first = driver::first().ok()?;
    opened(first).find(|o| o.device != d.device && o.memory.device_range(ptr, 0).is_some())
}

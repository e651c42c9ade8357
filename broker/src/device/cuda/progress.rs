//! Progress writes (`device::progress`): the stream writes a value into gpushared's progress
//! page with `cuStreamWriteValue32`, which needs the page registered in this context first.

use std::collections::HashMap;
use std::sync::Mutex;

use cudarc::driver::sys;

use super::error::driver;
use super::{CudaDevice, CudaStream};
use crate::device::DeviceResult;
use crate::device::gate;
use crate::device::progress::slot_word;
use crate::shm::ArenaSlice;

/// Progress pages registered in this context: host address → device address.
#[derive(Default)]
pub(super) struct ProgressPages(Mutex<HashMap<usize, u64>>);

impl ProgressPages {
    /// Where the device reaches `page`, registering it on first use.
    fn device_address(&self, dev: &CudaDevice, page: ArenaSlice<'_>) -> DeviceResult<u64> {
        let mut pages = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let base = page.as_ptr() as usize;
        if let Some(&at) = pages.get(&base) {
            return Ok(at);
        }
        // gpushared's page stays mapped for as long as the worker lives; it is never
        // unregistered (the context goes first).
        let at = dev.pinned.register_host(page)?;
        pages.insert(base, at);
        Ok(at)
    }
}

/// Where the device reaches slot `slot` of `page`, with the context bound.
fn slot_address(dev: &CudaDevice, page: ArenaSlice<'_>, slot: u32) -> DeviceResult<u64> {
    let word = slot_word(page, slot)?;
    dev.bind()?;
    let offset = word.as_ptr() as u64 - page.as_ptr() as u64;
    Ok(dev.progress.device_address(dev, page)? + offset)
}

pub(super) fn write(
    dev: &CudaDevice,
    stream: &mut CudaStream,
    page: ArenaSlice<'_>,
    slot: u32,
    value: u32,
) -> DeviceResult<()> {
    let at = slot_address(dev, page, slot)?;
    // SAFETY: `at` is 4 bytes inside a registered, mapped page (checked above); the stream
    // is live.
    unsafe { write_value(stream.raw, at, value) }
}

/// Queues, on the stream, a wait until slot `slot` of `page` lets it pass (the priority gate:
/// any bit of [`gate::PASS_MASK`] set).
pub(super) fn wait_gate(
    dev: &CudaDevice,
    stream: &mut CudaStream,
    page: ArenaSlice<'_>,
    slot: u32,
) -> DeviceResult<()> {
    let at = slot_address(dev, page, slot)?;
    // SAFETY: `at` is 4 bytes inside a registered, mapped page (checked above); the stream
    // is live.
    let r = unsafe {
        sys::cuStreamWaitValue32_v2(
            stream.raw,
            at,
            gate::PASS_MASK,
            sys::CUstreamWaitValue_flags_enum::CU_STREAM_WAIT_VALUE_AND as u32,
        )
    };
    // The gate only orders work: where the device cannot wait on a word, the kernel goes
    // ungated rather than failing.
    if let Err(e) = r.result() {
        static TOLD: std::sync::Once = std::sync::Once::new();
        TOLD.call_once(|| {
            tracing::warn!(error = %driver("cuStreamWaitValue32", e), "the priority gate cannot wait on this device; lower-priority kernels go ungated");
        });
    }
    Ok(())
}

/// Queues, on `raw`, a write of `value` at `at` once the stream's earlier work is done.
///
/// # Safety
/// `at` is 4 bytes of host memory registered with the stream's context; `raw` is live.
pub(super) unsafe fn write_value(raw: sys::CUstream, at: u64, value: u32) -> DeviceResult<()> {
    // SAFETY: the caller's contract.
    let r = unsafe {
        sys::cuStreamWriteValue32_v2(
            raw,
            at,
            value,
            sys::CUstreamWriteValue_flags_enum::CU_STREAM_WRITE_VALUE_DEFAULT as u32,
        )
    };
    r.result().map_err(|e| driver("cuStreamWriteValue32", e))
}

/// A client's host function in stream order: the stream writes `value` at `done` once its
/// earlier work is done, then waits until the word at `go` is at least `value` (the client
/// writes it when its function has run). Both are the client's registered host memory, at
/// the addresses the device reaches it by (checked by its session).
pub(super) fn host_point(
    dev: &CudaDevice,
    stream: &mut CudaStream,
    done: u64,
    go: u64,
    value: u32,
) -> DeviceResult<()> {
    dev.bind()?;
    // SAFETY: both addresses are 4 bytes of host memory registered with this context (the
    // session checked them against the client's shared host memory); the stream is live.
    unsafe { write_value(stream.raw, done, value) }?;
    // SAFETY: as above.
    let r = unsafe {
        sys::cuStreamWaitValue32_v2(
            stream.raw,
            go,
            value,
            sys::CUstreamWaitValue_flags_enum::CU_STREAM_WAIT_VALUE_GEQ as u32,
        )
    };
    r.result().map_err(|e| driver("cuStreamWaitValue32", e))
}

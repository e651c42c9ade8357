//! Words of page-locked host memory that a stream writes when its work is done
//! (`cuStreamWriteValue32`), so that a wait for the stream reads host memory, as the driver's
//! own spinning synchronization does, instead of asking the driver each time (`cuStreamQuery`):
//! on an H200 an empty kernel's launch and wait took 8.5 µs that way against 9.1–9.4 µs
//! polling the driver (`probes/sync_poll.c`, docs/benchmarks.md). One word per stream, from
//! pages of them; freed with the context.

use std::ffi::c_void;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use cudarc::driver::sys;

/// Words in one page.
const PER_PAGE: usize = 4096 / 4;

/// A stream's word: where the host reads it and where the device writes it.
#[derive(Debug, Clone, Copy)]
pub(super) struct SyncWord {
    host: *const AtomicU32,
    pub(super) device: u64,
    page: usize,
    index: usize,
}

// SAFETY: the word is page-locked host memory that lives as long as the context (never freed
// before it), read only through atomics.
unsafe impl Send for SyncWord {}

impl SyncWord {
    /// The value the device wrote last.
    #[inline]
    pub(super) fn load(&self) -> u32 {
        // SAFETY: a live, aligned word of our page (see the type's SAFETY note).
        unsafe { (*self.host).load(Ordering::Acquire) }
    }
}

struct Page {
    host: *mut AtomicU32,
    device: u64,
}

#[derive(Default)]
struct Pool {
    pages: Vec<Page>,
    free: Vec<(usize, usize)>,
}

/// The context's words.
#[derive(Default)]
pub(super) struct SyncWords(Mutex<Pool>);

// SAFETY: the pages are page-locked host memory of the context, only reached through the
// mutex (their addresses) and atomics (their words).
unsafe impl Send for SyncWords {}
// SAFETY: as above.
unsafe impl Sync for SyncWords {}

impl SyncWords {
    /// A word for a new stream, set to 0; `None` if no page could be had (the stream's waits
    /// then ask the driver). The caller has bound the context.
    pub(super) fn take(&self) -> Option<SyncWord> {
        let mut pool = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if pool.free.is_empty() {
            let page = alloc_page()?;
            let n = pool.pages.len();
            pool.pages.push(page);
            pool.free.extend((0..PER_PAGE).rev().map(|i| (n, i)));
        }
        let (page, index) = pool.free.pop()?;
        let p = pool.pages.get(page)?;
        // SAFETY: `index` < PER_PAGE, inside the page.
        let host = unsafe { p.host.add(index) };
        // SAFETY: as above; nobody else holds this word.
        unsafe { (*host).store(0, Ordering::Release) };
        Some(SyncWord {
            host,
            device: p.device + (index * 4) as u64,
            page,
            index,
        })
    }

    /// Gives back a destroyed stream's word.
    pub(super) fn give_back(&self, word: SyncWord) {
        let mut pool = self.0.lock().unwrap_or_else(|e| e.into_inner());
        pool.free.push((word.page, word.index));
    }
}

/// One page of words, page-locked and mapped for the device.
fn alloc_page() -> Option<Page> {
    let mut host: *mut c_void = std::ptr::null_mut();
    // SAFETY: out-parameter on our stack; the context is bound by the caller.
    let r = unsafe { sys::cuMemHostAlloc(&mut host, PER_PAGE * 4, sys::CU_MEMHOSTALLOC_DEVICEMAP) };
    if r.result().is_err() || host.is_null() {
        return None;
    }
    let mut device = 0;
    // SAFETY: `host` was just allocated with DEVICEMAP.
    if unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device, host, 0) }
        .result()
        .is_err()
    {
        // SAFETY: allocated above, not handed out.
        let _ = unsafe { sys::cuMemFreeHost(host) };
        return None;
    }
    Some(Page {
        host: host.cast(),
        device,
    })
}

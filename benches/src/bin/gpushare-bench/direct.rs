//! Direct CUDA in the benchmark process (cudarc): the baseline, and the MPS client.

use std::ffi::c_void;
use std::time::Instant;

use anyhow::{Context, Result, anyhow};
use cudarc::driver::result as cu;
use cudarc::driver::sys;
use gpushare_broker::device::Backend;
use gpushare_broker::device::cuda::{BUILTIN_PTX, CudaDevice, CudaStream};
use gpushare_protocol::{Kernel, PriorityClass};
use serde_json::{Value, json};

use crate::workload::{self, COPY_SIZES};

/// The benchmark's raw driver calls, each on handles this file created and keeps alive.
mod raw {
    use std::ffi::c_void;

    use anyhow::{Result, anyhow};
    use cudarc::driver::result as cu;
    use cudarc::driver::sys;

    fn ok(what: &str, r: sys::CUresult) -> Result<()> {
        r.result().map_err(|e| anyhow!("{what}: {e:?}"))
    }

    pub fn launch_empty(f: sys::CUfunction, s: sys::CUstream) -> Result<()> {
        // SAFETY: `f` takes no parameters; live function and stream.
        ok("launch", unsafe {
            sys::cuLaunchKernel(
                f,
                1,
                1,
                1,
                1,
                1,
                1,
                0,
                s,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        })
    }

    pub fn record(e: sys::CUevent, s: sys::CUstream) -> Result<()> {
        // SAFETY: live event and stream.
        unsafe { cu::event::record(e, s) }.map_err(|e| anyhow!("record: {e:?}"))
    }

    pub fn query(e: sys::CUevent) -> Result<()> {
        // SAFETY: live event.
        unsafe { cu::event::query(e) }.map_err(|e| anyhow!("query: {e:?}"))
    }

    pub fn elapsed(a: sys::CUevent, b: sys::CUevent) -> Result<f32> {
        // SAFETY: live events, both recorded and complete.
        unsafe { cu::event::elapsed(a, b) }.map_err(|e| anyhow!("elapsed: {e:?}"))
    }

    /// gpushared's progress write (`device/cuda/progress.rs`): `value` at device address `at`
    /// once the stream's earlier work is done.
    pub fn write_value(s: sys::CUstream, at: u64, value: u32) -> Result<()> {
        // SAFETY: `at` is 4 bytes of page-locked host memory this file allocated; live stream.
        ok("write value", unsafe {
            sys::cuStreamWriteValue32_v2(
                s,
                at,
                value,
                sys::CUstreamWriteValue_flags_enum::CU_STREAM_WRITE_VALUE_DEFAULT as u32,
            )
        })
    }

    /// Waits for the stream as the device worker does: `cuStreamQuery` until it is done.
    pub fn poll(s: sys::CUstream) -> Result<()> {
        loop {
            // SAFETY: live stream.
            match unsafe { sys::cuStreamQuery(s) } {
                sys::cudaError_enum::CUDA_ERROR_NOT_READY => std::hint::spin_loop(),
                r => return ok("query", r),
            }
        }
    }

    /// Host addresses are passed as integers so closures stay `Fn`; each names `size`
    /// valid bytes of a buffer that outlives the copy.
    pub fn htod_async(dev: u64, host: usize, size: usize, s: sys::CUstream) -> Result<()> {
        // SAFETY: see above; `dev` holds at least `size` bytes.
        ok("htod", unsafe {
            sys::cuMemcpyHtoDAsync_v2(dev, host as *const c_void, size, s)
        })
    }

    pub fn dtoh_async(host: usize, dev: u64, size: usize, s: sys::CUstream) -> Result<()> {
        // SAFETY: as for `htod_async`.
        ok("dtoh", unsafe {
            sys::cuMemcpyDtoHAsync_v2(host as *mut c_void, dev, size, s)
        })
    }

    pub fn htod(dev: u64, host: usize, size: usize) -> Result<()> {
        // SAFETY: as for `htod_async`.
        ok("htod", unsafe {
            sys::cuMemcpyHtoD_v2(dev, host as *const c_void, size)
        })
    }

    pub fn dtoh(host: usize, dev: u64, size: usize) -> Result<()> {
        // SAFETY: as for `htod_async`.
        ok("dtoh", unsafe {
            sys::cuMemcpyDtoH_v2(host as *mut c_void, dev, size)
        })
    }
}

struct Ctx {
    stream: sys::CUstream,
}

fn context() -> Result<Ctx> {
    cu::init().map_err(|e| anyhow!("cuInit: {e:?}"))?;
    let dev = cu::device::get(0).map_err(|e| anyhow!("cuDeviceGet: {e:?}"))?;
    // SAFETY: valid device; the context lives for the process.
    let ctx = unsafe { cu::primary_ctx::retain(dev) }.map_err(|e| anyhow!("retain: {e:?}"))?;
    // SAFETY: just retained.
    unsafe { cu::ctx::set_current(ctx) }.map_err(|e| anyhow!("set_current: {e:?}"))?;
    let stream = cu::stream::create(cu::stream::StreamKind::NonBlocking)
        .map_err(|e| anyhow!("stream: {e:?}"))?;
    Ok(Ctx { stream })
}

fn sync(s: sys::CUstream) -> Result<()> {
    // SAFETY: live stream.
    unsafe { cu::stream::synchronize(s) }.map_err(|e| anyhow!("sync: {e:?}"))
}

/// The built-in PTX's `gpushare_empty` kernel, loaded into the current context.
fn empty_kernel() -> Result<sys::CUfunction> {
    let mut ptx = BUILTIN_PTX.as_bytes().to_vec();
    ptx.push(0);
    // SAFETY: NUL-terminated PTX.
    let module = unsafe { cu::module::load_data(ptx.as_ptr() as *const c_void) }
        .map_err(|e| anyhow!("load: {e:?}"))?;
    let name = std::ffi::CString::new("gpushare_empty")?;
    // SAFETY: loaded module, NUL-terminated name.
    unsafe { cu::module::get_function(module, name) }.map_err(|e| anyhow!("function: {e:?}"))
}

pub fn launch(quick: bool) -> Result<Value> {
    let c = context()?;
    let f = empty_kernel()?;
    workload::measure_launches(quick, || raw::launch_empty(f, c.stream), || sync(c.stream))
}

pub fn copy(quick: bool) -> Result<Value> {
    let c = context()?;
    let max = COPY_SIZES.iter().map(|s| s.1).max().unwrap_or(0);
    // SAFETY: pinned host allocation, freed at the end.
    let pinned = unsafe { cu::malloc_host(max, 0) }.map_err(|e| anyhow!("cuMemAllocHost: {e:?}"))?
        as *mut u8;
    // SAFETY: `pinned` has `max` bytes.
    unsafe { std::ptr::write_bytes(pinned, 0x5a, max) };
    let mut pageable = vec![0x5au8; max];
    // SAFETY: plain device allocation.
    let dev = unsafe { cu::malloc_sync(max) }.map_err(|e| anyhow!("cuMemAlloc: {e:?}"))?;
    let mut pinned_out = serde_json::Map::new();
    let mut pageable_out = serde_json::Map::new();
    for (label, size) in COPY_SIZES {
        let reps = workload::copy_reps(size, quick);
        let time = |f: &dyn Fn() -> Result<()>| -> Result<f64> {
            f()?;
            sync(c.stream)?;
            let t = Instant::now();
            for _ in 0..reps {
                f()?;
            }
            sync(c.stream)?;
            Ok((size * reps) as f64 / t.elapsed().as_secs_f64() / 1e9)
        };
        let (host, pg) = (pinned as usize, pageable.as_mut_ptr() as usize);
        let htod = time(&|| raw::htod_async(dev, host, size, c.stream))?;
        let dtoh = time(&|| raw::dtoh_async(host, dev, size, c.stream))?;
        pinned_out.insert(label.into(), json!({"htod_gbps": htod, "dtoh_gbps": dtoh}));
        let htod = time(&|| raw::htod(dev, pg, size))?;
        let dtoh = time(&|| raw::dtoh(pg, dev, size))?;
        pageable_out.insert(label.into(), json!({"htod_gbps": htod, "dtoh_gbps": dtoh}));
    }
    // SAFETY: allocated above, freed once.
    unsafe {
        let _ = cu::free_sync(dev);
        let _ = cu::free_host(pinned as *mut c_void);
    }
    Ok(json!({"pinned": pinned_out, "pageable": pageable_out}))
}

/// Allocates an iteration's buffers on `dev` (their first word zeroed) and builds its kernels.
pub fn prepare_iteration(
    dev: &CudaDevice,
    stream: &mut CudaStream,
    it: &workload::Iteration,
) -> Result<(Vec<u64>, Vec<Kernel>)> {
    let ptrs: Vec<u64> = it
        .buffers
        .iter()
        .map(|b| dev.alloc(b.elems as u64 * 4).map_err(|e| anyhow!("{e}")))
        .collect::<Result<_>>()?;
    for &p in &ptrs {
        dev.memset(stream, p, 0, 4).map_err(|e| anyhow!("{e}"))?;
    }
    let kernels = (it.kernels)(&ptrs);
    Ok((ptrs, kernels))
}

/// DNN-like iterations through the same device layer the broker uses (cuBLAS GEMMs and the
/// built-in kernels), called directly in this process.
pub fn iteration(quick: bool) -> Result<Value> {
    let dev = CudaDevice::open(0).map_err(|e| anyhow!("{e}"))?;
    let mut stream = dev
        .create_stream(PriorityClass::Normal)
        .map_err(|e| anyhow!("{e}"))?;
    let mut out = serde_json::Map::new();
    for it in workload::iterations() {
        let (ptrs, kernels) = prepare_iteration(&dev, &mut stream, &it)?;
        let run = || -> Result<f64> {
            let t = Instant::now();
            for k in &kernels {
                dev.launch(&mut stream, k).map_err(|e| anyhow!("{e}"))?;
            }
            dev.sync_stream(&mut stream).map_err(|e| anyhow!("{e}"))?;
            Ok(t.elapsed().as_secs_f64() * 1e3)
        };
        out.insert(it.name.into(), workload::time_iterations(quick, run)?);
        for p in ptrs {
            dev.free(p).context("free")?;
        }
    }
    dev.destroy_stream(stream);
    Ok(Value::Object(out))
}

/// What the driver calls on the broker's hot paths cost, in µs (median of many).
pub fn probe() -> Result<Value> {
    let c = context()?;
    let f = empty_kernel()?;
    let ev = |flags| cu::event::create(flags).map_err(|e| anyhow!("event: {e:?}"));
    let (e1, e2) = (
        ev(sys::CUevent_flags::CU_EVENT_DEFAULT)?,
        ev(sys::CUevent_flags::CU_EVENT_DEFAULT)?,
    );
    let e3 = ev(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)?;
    let n = 20_000;
    let time = |f: &mut dyn FnMut() -> Result<()>| -> Result<f64> {
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            let t = Instant::now();
            f()?;
            v.push(t.elapsed().as_secs_f64() * 1e6);
        }
        Ok(workload::percentile(&mut v, 50.0))
    };
    let s = c.stream;
    let launch = time(&mut || raw::launch_empty(f, s))?;
    sync(s)?;
    let record = time(&mut || raw::record(e1, s))?;
    let record_no_timing = time(&mut || raw::record(e3, s))?;
    sync(s)?;
    let query = time(&mut || raw::query(e1))?;
    raw::record(e2, s)?;
    sync(s)?;
    let elapsed = time(&mut || raw::elapsed(e1, e2).map(|_| ()))?;
    let idle_sync = time(&mut || sync(s))?;
    let launch_sync = time(&mut || {
        raw::launch_empty(f, s)?;
        sync(s)
    })?;
    let bracketed = time(&mut || {
        raw::record(e1, s)?;
        raw::launch_empty(f, s)?;
        raw::record(e2, s)?;
        sync(s)?;
        raw::elapsed(e1, e2).map(|_| ())
    })?;
    // The progress page's writes around a kernel (gpushared writes an opening value before
    // the first work after a sync and a closing one before the sync), and the worker's
    // polling wait.
    // SAFETY: page-locked host memory, freed below after the stream's work is done.
    let page = unsafe { cu::malloc_host(4096, 0) }.map_err(|e| anyhow!("cuMemHostAlloc: {e:?}"))?;
    let mut at = 0;
    // SAFETY: `page` came from cuMemHostAlloc; `at` is written by the call.
    unsafe { sys::cuMemHostGetDevicePointer_v2(&mut at, page, 0) }
        .result()
        .map_err(|e| anyhow!("cuMemHostGetDevicePointer: {e:?}"))?;
    let write = time(&mut || raw::write_value(s, at, 1))?;
    sync(s)?;
    // One call on an idle stream: its own cost (the stream is waited for outside the time),
    // and with the wait.
    let alone = |f: &mut dyn FnMut() -> Result<()>| -> Result<f64> {
        let mut v = Vec::with_capacity(n / 4);
        for _ in 0..n / 4 {
            let t = Instant::now();
            f()?;
            v.push(t.elapsed().as_secs_f64() * 1e6);
            sync(s)?;
        }
        Ok(workload::percentile(&mut v, 50.0))
    };
    let write_alone = alone(&mut || raw::write_value(s, at, 1))?;
    let launch_alone = alone(&mut || raw::launch_empty(f, s))?;
    let write_sync = time(&mut || {
        raw::write_value(s, at, 1)?;
        sync(s)
    })?;
    // The same write into device memory (no system-wide fence needed to reach it).
    // SAFETY: a plain device allocation, freed below.
    let dev_word = unsafe { cu::malloc_sync(4096) }.map_err(|e| anyhow!("cuMemAlloc: {e:?}"))?;
    let write_dev = time(&mut || raw::write_value(s, dev_word, 1))?;
    sync(s)?;
    let write_dev_sync = time(&mut || {
        raw::write_value(s, dev_word, 1)?;
        sync(s)
    })?;
    let progress_dev_sync = time(&mut || {
        raw::write_value(s, dev_word, 1)?;
        raw::launch_empty(f, s)?;
        raw::write_value(s, dev_word, 2)?;
        sync(s)
    })?;
    sync(s)?;
    // SAFETY: allocated above; the stream's work is done.
    let _ = unsafe { cu::free_sync(dev_word) };
    let launch_poll = time(&mut || {
        raw::launch_empty(f, s)?;
        raw::poll(s)
    })?;
    let launch_close_sync = time(&mut || {
        raw::launch_empty(f, s)?;
        raw::write_value(s, at, 2)?;
        sync(s)
    })?;
    let progress_sync = time(&mut || {
        raw::write_value(s, at, 1)?;
        raw::launch_empty(f, s)?;
        raw::write_value(s, at, 2)?;
        sync(s)
    })?;
    let progress_poll = time(&mut || {
        raw::write_value(s, at, 1)?;
        raw::launch_empty(f, s)?;
        raw::write_value(s, at, 2)?;
        raw::poll(s)
    })?;
    sync(s)?;
    // SAFETY: allocated above; the stream's work is done.
    let _ = unsafe { cu::free_host(page) };
    Ok(json!({
        "launch_us": launch, "event_record_us": record, "event_record_no_timing_us": record_no_timing,
        "event_query_us": query, "event_elapsed_us": elapsed, "sync_idle_stream_us": idle_sync,
        "launch_sync_us": launch_sync, "launch_sync_with_event_bracket_us": bracketed,
        "write_value32_us": write, "launch_poll_query_us": launch_poll,
        "launch_write_sync_us": launch_close_sync, "write_launch_write_sync_us": progress_sync,
        "write_launch_write_poll_us": progress_poll, "write_value32_alone_us": write_alone,
        "launch_alone_us": launch_alone, "write_sync_us": write_sync,
        "write_value32_device_us": write_dev, "write_device_sync_us": write_dev_sync,
        "write_launch_write_device_sync_us": progress_dev_sync,
    }))
}

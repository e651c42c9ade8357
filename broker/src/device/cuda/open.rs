//! Opening a GPU: the driver initialised, the device's primary context retained and made
//! current, its attributes read, the built-in kernels loaded; and why that can fail.

use std::sync::Mutex;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use cudarc::driver::result as cu;
use cudarc::driver::sys;
use gpushare_protocol::control::DeviceInfo;

use super::builtins::Builtins;
use super::chunks::Chunks;
use super::error::driver;
use super::memory::PinnedArenas;
use super::partition::Partitions;
use super::{CudaDevice, context, gemm, info, progress, sync_words};
use crate::device::DeviceError;

/// Why no CUDA device could be opened.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("the CUDA driver library (libcuda.so) was not found")]
    NoDriver,
    #[error("no CUDA device is present")]
    NoDevice,
    #[error("GPU {asked} does not exist (this machine has {count})")]
    NoSuchGpu { asked: i32, count: i32 },
    #[error("{0}")]
    Driver(#[from] DeviceError),
}

/// Initialises the CUDA driver in this process (no context, no GPU memory) and counts the
/// GPUs: what gpushared needs to start a device worker per GPU. The initialised driver also
/// makes each worker's `cuInit` quick.
pub fn device_count() -> Result<i32, ProbeError> {
    // SAFETY: only probes whether the library can be loaded.
    if !unsafe { sys::is_culib_present() } {
        return Err(ProbeError::NoDriver);
    }
    let started = Instant::now();
    cu::init().map_err(|e| driver("cuInit", e))?;
    tracing::debug!(took = ?started.elapsed(), "CUDA driver initialised");
    match cu::device::get_count().map_err(|e| driver("cuDeviceGetCount", e))? {
        0 => Err(ProbeError::NoDevice),
        n => Ok(n),
    }
}

impl CudaDevice {
    /// Opens every GPU of the machine.
    pub fn open_all() -> Result<Vec<CudaDevice>, ProbeError> {
        (0..device_count()?).map(CudaDevice::open).collect()
    }

    /// Opens GPU `ordinal`: retains its primary context and loads the built-in kernels.
    pub fn open(ordinal: i32) -> Result<CudaDevice, ProbeError> {
        let count = device_count()?;
        if ordinal < 0 || ordinal >= count {
            return Err(ProbeError::NoSuchGpu {
                asked: ordinal,
                count,
            });
        }
        let device = cu::device::get(ordinal).map_err(|e| driver("cuDeviceGet", e))?;
        let started = Instant::now();
        // SAFETY: `device` is valid; the retained context is released in Drop.
        let ctx = unsafe { cu::primary_ctx::retain(device) }
            .map_err(|e| driver("cuDevicePrimaryCtxRetain", e))?;
        let context_took = started.elapsed();
        // SAFETY: `ctx` was just retained.
        unsafe { context::make_current(ctx) }?;

        let attr = |a| {
            // SAFETY: `device` is valid; unknown attributes return an error, mapped to 0.
            unsafe { cu::device::get_attribute(device, a) }
                .unwrap_or(0)
                .max(0) as u32
        };
        use sys::CUdevice_attribute::*;
        let sm_count = attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
        let cc = (
            attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
            attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR),
        );
        let clock_khz = attr(CU_DEVICE_ATTRIBUTE_CLOCK_RATE) as f64;
        let mem_clock_khz = attr(CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE) as f64;
        let bus_bits = attr(CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH) as f64;
        // SAFETY: `device` is valid.
        let total_memory = unsafe { cu::device::total_mem(device) }
            .map_err(|e| driver("cuDeviceTotalMem", e))? as u64;
        let name = cu::device::get_name(device).unwrap_or_else(|_| "NVIDIA GPU".into());
        let attributes = info::all_attributes(device);
        let at = |a: usize| attributes.get(a).copied().unwrap_or(0).max(0) as u32;
        let info = DeviceInfo {
            index: ordinal as u32,
            name,
            total_memory,
            sm_count,
            compute_capability: cc,
            fp32_flops: info::fp32_flops(sm_count, clock_khz),
            memory_bandwidth: info::memory_bandwidth(mem_clock_khz, bus_bits),
            host_bandwidth: 0.0,
            uuid: info::uuid(device),
            // CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, _PCI_BUS_ID, _PCI_DEVICE_ID.
            pci: (at(50), at(33), at(34)),
            driver_version: info::driver_version(),
            attributes,
        };
        let priorities = cu::stream::get_priority_range().unwrap_or((0, 0));
        let builtins = Builtins::load(cc, sm_count)?;
        // After the built-in kernels, never beside them: the libraries then load in one
        // order in every worker (see `builtins::compile_anyway`).
        gemm::start_loading_cublas();
        tracing::debug!(
            gpu = ordinal,
            context = ?context_took,
            kernels = ?(started.elapsed() - context_took),
            "CUDA context and built-in kernels ready"
        );
        tracing::info!(
            gpu = ordinal,
            name = %info.name,
            sms = sm_count,
            compute = format_args!("{}.{}", cc.0, cc.1),
            kernels = builtins.origin,
            "CUDA device open"
        );
        Ok(CudaDevice {
            ordinal,
            device,
            ctx,
            interrupted: AtomicBool::new(false),
            info,
            builtins,
            faults: Mutex::new(None),
            priorities,
            pinned: PinnedArenas::default(),
            progress: progress::ProgressPages::default(),
            sync_words: sync_words::SyncWords::default(),
            chunks: Chunks::default(),
            partitions: Partitions::probe(device, sm_count),
            gate_hold: Default::default(),
        })
    }

    /// Holds the priority gate open for a driver call that may wait for the context's queued
    /// work (`device::gate`).
    pub(super) fn hold_gate(&self) -> crate::device::gate::HeldOpen<'_> {
        self.gate_hold.hold()
    }

    pub fn ordinal(&self) -> i32 {
        self.ordinal
    }
}

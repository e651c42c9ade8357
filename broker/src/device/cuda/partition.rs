//! SM partitions through CUDA green contexts: a client the scheduler keeps to `n` SMs has its
//! kernels launched on a stream of a green context that owns `n` SMs, so its blocks never
//! occupy the others, whatever is queued.
//!
//! A module loaded in the primary context launches on a green context's stream, and events,
//! cross-stream waits and cuBLAS work there too, so a client's work moves onto a partition
//! without reloading anything. Making a partition takes a while, so one is made per size and
//! kept.

use std::collections::BTreeMap;
use std::ptr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use cudarc::driver::sys::{self, CUdevResource, CUdevice, CUgreenCtx, CUstream};

use super::error::check;
use crate::device::DeviceResult;

/// The green contexts of one GPU, one per partition size, made on first use.
pub struct Partitions {
    device: CUdevice,
    sm_count: u32,
    /// The device's whole SM resource; `None` where the driver has no green contexts.
    whole: Option<CUdevResource>,
    /// Partition sizes are multiples of this (8 SMs on Hopper).
    granularity: u32,
    /// By size: the green context, or `None` where the driver refused to make it (not asked
    /// again).
    made: Mutex<BTreeMap<u32, Option<GreenCtx>>>,
    /// Said once that a partition was asked for and cannot be made.
    warned: AtomicBool,
}

struct GreenCtx {
    raw: CUgreenCtx,
}

// SAFETY: plain driver handles; green contexts are never made current (streams are created
// from the handle), and the map is behind a mutex.
unsafe impl Send for Partitions {}
// SAFETY: as above.
unsafe impl Sync for Partitions {}

impl Partitions {
    /// Asks the driver for the device's SMs as a partitionable resource.
    pub fn probe(device: CUdevice, sm_count: u32) -> Partitions {
        // SAFETY: a zeroed resource is a valid out-parameter (plain data).
        let mut whole: CUdevResource = unsafe { std::mem::zeroed() };
        // SAFETY: `device` is valid; `whole` is written by the driver.
        let r = unsafe {
            sys::cuDeviceGetDevResource(
                device,
                &mut whole,
                sys::CUdevResourceType::CU_DEV_RESOURCE_TYPE_SM,
            )
        };
        let (whole, granularity) = match check("cuDeviceGetDevResource", r) {
            Ok(()) => {
                // SAFETY: the driver filled the SM member of the union.
                let sm = unsafe { whole.__bindgen_anon_1.sm };
                (Some(whole), sm.minSmPartitionSize.max(1))
            }
            Err(e) => {
                tracing::info!(error = %e, "no SM partitions on this GPU (green contexts need CUDA 12.4 and a recent driver); partitioned clients are rate-controlled to their share of SM-time instead");
                (None, 1)
            }
        };
        Partitions {
            device,
            sm_count,
            whole,
            granularity,
            made: Mutex::new(BTreeMap::new()),
            warned: AtomicBool::new(false),
        }
    }

    /// Whether the driver can make green contexts on this device.
    pub fn available(&self) -> bool {
        self.whole.is_some()
    }

    /// The partition that runs a client limited to `sms` SMs: the largest size the driver
    /// can make that is not above it (never below one group). `None`: the whole device.
    pub fn size_for(&self, sms: u32) -> Option<u32> {
        if self.whole.is_none() {
            if !self.warned.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    sms,
                    "the scheduler asked for an SM partition, but this GPU or driver has no green contexts: partitioned clients run on the whole GPU"
                );
            }
            return None;
        }
        let size = (sms / self.granularity * self.granularity).max(self.granularity);
        (size < self.sm_count).then_some(size)
    }

    /// A new stream of `priority` on the partition of `size` SMs (from [`size_for`]);
    /// `None` for a size the driver already refused to make.
    ///
    /// [`size_for`]: Partitions::size_for
    pub fn stream(&self, size: u32, priority: i32) -> DeviceResult<Option<CUstream>> {
        let mut made = self.made.lock().unwrap_or_else(|e| e.into_inner());
        let green = match made.get(&size) {
            Some(Some(g)) => g.raw,
            Some(None) => return Ok(None),
            None => match self.make(size) {
                Ok(g) => {
                    made.insert(size, Some(GreenCtx { raw: g }));
                    g
                }
                Err(e) => {
                    made.insert(size, None);
                    return Err(e);
                }
            },
        };
        let mut stream = ptr::null_mut();
        // SAFETY: `green` is a live green context of ours; `stream` is written by the driver.
        check("cuGreenCtxStreamCreate", unsafe {
            sys::cuGreenCtxStreamCreate(
                &mut stream,
                green,
                sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32,
                priority,
            )
        })?;
        Ok(Some(stream))
    }

    fn make(&self, size: u32) -> DeviceResult<CUgreenCtx> {
        let Some(whole) = self.whole else {
            return Err(crate::device::DeviceError::NotSupported {
                backend: "cuda".into(),
                what: "SM partitions (green contexts)".into(),
            });
        };
        // SAFETY: zeroed resources are valid out-parameters (plain data).
        let (mut group, mut rest): (CUdevResource, CUdevResource) =
            unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
        let mut groups = 1u32;
        // SAFETY: all pointers are to live locals; one group is asked for.
        check("cuDevSmResourceSplitByCount", unsafe {
            sys::cuDevSmResourceSplitByCount(&mut group, &mut groups, &whole, &mut rest, 0, size)
        })?;
        let mut desc = ptr::null_mut();
        // SAFETY: `group` is the resource the driver just split off.
        check("cuDevResourceGenerateDesc", unsafe {
            sys::cuDevResourceGenerateDesc(&mut desc, &mut group, 1)
        })?;
        let mut green = ptr::null_mut();
        // SAFETY: `desc` came from the driver for this device. The green context retains the
        // primary context the broker already holds, so memory and modules are shared.
        check("cuGreenCtxCreate", unsafe {
            sys::cuGreenCtxCreate(
                &mut green,
                desc,
                self.device,
                sys::CUgreenCtxCreate_flags::CU_GREEN_CTX_DEFAULT_STREAM as u32,
            )
        })?;
        // SAFETY: the SM member is what a split writes.
        let got = unsafe { group.__bindgen_anon_1.sm.smCount };
        tracing::info!(asked = size, sms = got, "SM partition made (green context)");
        Ok(green)
    }
}

impl Drop for Partitions {
    fn drop(&mut self) {
        let made = std::mem::take(self.made.get_mut().unwrap_or_else(|e| e.into_inner()));
        for g in made.into_values().flatten() {
            // SAFETY: made by us; every stream on it was destroyed with its client's stream.
            let _ = unsafe { sys::cuGreenCtxDestroy(g.raw) };
        }
    }
}

//! Copies between a client's arena and the device, device-to-device copies and fills, all
//! queued on the client's stream. (Hot paths: `#[inline]` so the Device impl that calls each
//! costs no extra call.)

use std::ffi::c_void;

use cudarc::driver::result as cu;
use cudarc::driver::sys;
use gpushare_protocol::DevicePtr;

use super::error::{check, driver};
use super::{CudaDevice, CudaStream};
use crate::device::{DeviceError, DeviceResult};
use crate::shm::ArenaSlice;

#[inline]
pub(super) fn htod(
    dev: &CudaDevice,
    stream: &mut CudaStream,
    src: ArenaSlice<'_>,
    dst: DevicePtr,
) -> DeviceResult<()> {
    stream.begin(dev)?;
    let (p, n) = (src.as_ptr() as *const c_void, src.len());
    if dev.pinned.contains(src.as_ptr(), n) {
        // SAFETY: page-locked arena range (bounds-checked by the session) and a device
        // range checked against the client's allocations; the arena outlives the copy.
        check("cuMemcpyHtoDAsync", unsafe {
            sys::cuMemcpyHtoDAsync_v2(dst, p, n, stream.raw)
        })
    } else {
        // SAFETY: as above; synchronous with respect to the host buffer.
        check("cuMemcpyHtoD", unsafe { sys::cuMemcpyHtoD_v2(dst, p, n) })
    }
}

#[inline]
pub(super) fn dtoh(
    dev: &CudaDevice,
    stream: &mut CudaStream,
    src: DevicePtr,
    dst: ArenaSlice<'_>,
) -> DeviceResult<()> {
    stream.begin(dev)?;
    let (p, n) = (dst.as_ptr() as *mut c_void, dst.len());
    if dev.pinned.contains(dst.as_ptr(), n) {
        // SAFETY: as in `htod`, in the other direction.
        check("cuMemcpyDtoHAsync", unsafe {
            sys::cuMemcpyDtoHAsync_v2(p, src, n, stream.raw)
        })
    } else {
        // Pageable: order after the stream's earlier work, then copy.
        // SAFETY: live stream.
        unsafe { cu::stream::synchronize(stream.raw) }
            .map_err(|e| driver("cuStreamSynchronize", e))?;
        // SAFETY: as above.
        check("cuMemcpyDtoH", unsafe { sys::cuMemcpyDtoH_v2(p, src, n) })
    }
}

#[inline]
pub(super) fn dtod(
    dev: &CudaDevice,
    stream: &mut CudaStream,
    src: DevicePtr,
    dst: DevicePtr,
    len: u64,
) -> DeviceResult<()> {
    stream.begin(dev)?;
    dtod_on(stream.raw, src, dst, len)
}

/// Queues a device-to-device copy on a raw stream (a client's, or a graph's capture stream);
/// both ranges were checked against the client's memory.
pub(super) fn dtod_on(
    raw: sys::CUstream,
    src: DevicePtr,
    dst: DevicePtr,
    len: u64,
) -> DeviceResult<()> {
    let n =
        usize::try_from(len).map_err(|_| DeviceError::InvalidArgument("copy too large".into()))?;
    // SAFETY: both ranges checked against the client's allocations; `raw` is live.
    unsafe { cu::memcpy_dtod_async(dst, src, n, raw) }.map_err(|e| driver("cuMemcpyDtoDAsync", e))
}

/// Arena bytes to the device, read before this returns: from pageable memory the driver
/// stages them at once; a page-locked arena is copied out to pageable memory first.
pub(super) fn htod_staged(
    dev: &CudaDevice,
    stream: &mut CudaStream,
    src: ArenaSlice<'_>,
    dst: DevicePtr,
) -> DeviceResult<()> {
    stream.begin(dev)?;
    let n = src.len();
    let bounce;
    let p = if dev.pinned.contains(src.as_ptr(), n) {
        let mut bytes = vec![0u8; n];
        src.read_into(&mut bytes);
        bounce = bytes;
        bounce.as_ptr() as *const c_void
    } else {
        src.as_ptr() as *const c_void
    };
    // SAFETY: pageable host bytes (the arena or our copy of it), which the driver stages
    // before returning; a device range checked against the client's allocations.
    check("cuMemcpyHtoDAsync", unsafe {
        sys::cuMemcpyHtoDAsync_v2(dst, p, n, stream.raw)
    })
}

/// Device bytes into the arena after the stream's earlier work, there when this returns.
pub(super) fn dtoh_staged(
    dev: &CudaDevice,
    stream: &mut CudaStream,
    src: DevicePtr,
    dst: ArenaSlice<'_>,
) -> DeviceResult<()> {
    stream.begin(dev)?;
    // SAFETY: live stream.
    unsafe { cu::stream::synchronize(stream.raw) }.map_err(|e| driver("cuStreamSynchronize", e))?;
    // SAFETY: an arena range (bounds-checked by the session) and a device range checked
    // against the client's allocations; synchronous.
    check("cuMemcpyDtoH", unsafe {
        sys::cuMemcpyDtoH_v2(dst.as_ptr() as *mut c_void, src, dst.len())
    })
}

/// Sets `count` 2- or 4-byte elements.
pub(super) fn memset_wide(
    dev: &CudaDevice,
    stream: &mut CudaStream,
    dst: DevicePtr,
    value: u32,
    elem_bytes: u8,
    count: u64,
) -> DeviceResult<()> {
    stream.begin(dev)?;
    memset_on(stream.raw, dst, value, elem_bytes, count)
}

#[inline]
pub(super) fn memset(
    dev: &CudaDevice,
    stream: &mut CudaStream,
    dst: DevicePtr,
    value: u8,
    len: u64,
) -> DeviceResult<()> {
    stream.begin(dev)?;
    memset_on(stream.raw, dst, u32::from(value), 1, len)
}

/// Queues a memset of `count` elements of `elem_bytes` (2 or 4; otherwise bytes) on a raw
/// stream (a client's, or a graph's capture stream); the range was checked against the
/// client's memory.
pub(super) fn memset_on(
    raw: sys::CUstream,
    dst: DevicePtr,
    value: u32,
    elem_bytes: u8,
    count: u64,
) -> DeviceResult<()> {
    let n = usize::try_from(count)
        .map_err(|_| DeviceError::InvalidArgument("memset too large".into()))?;
    match elem_bytes {
        // SAFETY: range checked against the client's allocations; `raw` is live.
        2 => check("cuMemsetD16Async", unsafe {
            sys::cuMemsetD16Async(dst, value as u16, n, raw)
        }),
        // SAFETY: as above.
        4 => check("cuMemsetD32Async", unsafe {
            sys::cuMemsetD32Async(dst, value, n, raw)
        }),
        // SAFETY: as above.
        _ => unsafe { cu::memset_d8_async(dst, value as u8, n, raw) }
            .map_err(|e| driver("cuMemsetD8Async", e)),
    }
}

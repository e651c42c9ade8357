//! Copies and memsets. Device memory is the broker's; page-locked host memory is shared with
//! it (copies are DMA, ordered on the stream); pageable host memory is staged through the
//! arena: to the device without waiting (the bytes are in the arena once this returns), to
//! the host by waiting for the bytes, as CUDA does for pageable memory.

use std::ffi::{c_uchar, c_uint, c_ushort, c_void};

use gpushare_protocol::Command;

use crate::driver::Driver;
use crate::memory::HostPlace;
use crate::status::{Cu, entry};
use crate::types::{CUcontext, CUdeviceptr, CUresult, CUstream, result};

/// Where an address of a unified-addressing copy lies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Device,
    Host(HostPlace),
}

impl Driver {
    /// Where device code reaches `[ptr, ptr + len)`, the device side of a copy or a memset:
    /// device memory, or page-locked host memory (by its host address too, as with CUDA's
    /// unified addressing).
    fn device_address(&self, ptr: u64, len: u64) -> Cu<u64> {
        if self.memory.device_span(ptr, len) {
            return Ok(ptr);
        }
        if let Some(d) = self.memory.host_device_range(ptr, len) {
            return Ok(d);
        }
        if crate::status::trace::level() >= crate::status::trace::ERRORS {
            crate::log::say(&format!(
                "{len} bytes at {ptr:#x} are not device memory of this process ({})",
                self.memory.describe(ptr)
            ));
        }
        Err(result::INVALID_VALUE)
    }

    /// Where a unified-addressing copy's address lies: by its first byte, so that a length
    /// running past the end of device memory is refused as such (the copy checks it), never
    /// taken for host memory the process would write through. Another device's memory is
    /// device memory too (the device copies send it across: `crate::across`).
    fn side(&self, ptr: u64, len: usize) -> Side {
        if self.memory.device_range(ptr, 0).is_some()
            || crate::route::other_owner(self, ptr).is_some()
        {
            Side::Device
        } else {
            Side::Host(self.memory.host_place(ptr as usize, len))
        }
    }

    /// Host to device. `sync`: the program waits for the copy (CUDA's synchronous form).
    ///
    /// # Safety
    /// `src` is valid for reading `len` bytes.
    pub unsafe fn copy_htod(
        &self,
        dst: u64,
        src: *const u8,
        len: usize,
        stream: u32,
        sync: bool,
    ) -> Cu<()> {
        if len == 0 {
            return Ok(());
        }
        if src.is_null() {
            return Err(result::INVALID_VALUE);
        }
        // SAFETY: `src` is host memory of `len` bytes, by the caller's contract.
        if unsafe { self.copy_across(dst, src as u64, len, stream, false) }? {
            return Ok(());
        }
        let dst = self.device_address(dst, len as u64)?;
        match self.memory.host_place(src as usize, len) {
            HostPlace::Shared { region, offset } => {
                let cmd = Command::CopyHtoDHost {
                    stream,
                    region,
                    offset,
                    dst,
                    len: len as u64,
                };
                if self.send_or_capture(stream, cmd)? && sync {
                    self.sync_stream(stream)?;
                }
                Ok(())
            }
            HostPlace::Pageable => {
                crate::graph::refuse_pageable_in_capture(self, stream)?;
                let step = self.transport.piece();
                let mut done = 0;
                while done < len {
                    let n = step.min(len - done);
                    self.transport.send_with_payload(
                        n,
                        false,
                        // SAFETY: `src + done .. + n` is inside the program's buffer (the
                        // caller's contract) and `p.ptr` is `n` reserved arena bytes.
                        |p| unsafe { std::ptr::copy_nonoverlapping(src.add(done), p.ptr, n) },
                        |offset| Command::CopyHtoDStaged {
                            stream,
                            arena_offset: offset,
                            dst: dst + done as u64,
                            len: n as u64,
                        },
                        |_| (),
                    )?;
                    done += n;
                }
                Ok(())
            }
        }
    }

    /// Device to host. `sync`: CUDA's synchronous form (pageable memory is waited for in
    /// both forms).
    ///
    /// # Safety
    /// `dst` is valid for writing `len` bytes.
    pub unsafe fn copy_dtoh(
        &self,
        dst: *mut u8,
        src: u64,
        len: usize,
        stream: u32,
        sync: bool,
    ) -> Cu<()> {
        if len == 0 {
            return Ok(());
        }
        if dst.is_null() {
            return Err(result::INVALID_VALUE);
        }
        // SAFETY: `dst` is host memory of `len` bytes, by the caller's contract.
        if unsafe { self.copy_across(dst as u64, src, len, stream, false) }? {
            return Ok(());
        }
        let src = self.device_address(src, len as u64)?;
        match self.memory.host_place(dst as usize, len) {
            HostPlace::Shared { region, offset } => {
                let cmd = Command::CopyDtoHHost {
                    stream,
                    src,
                    region,
                    offset,
                    len: len as u64,
                };
                if self.send_or_capture(stream, cmd)? && sync {
                    self.sync_stream(stream)?;
                }
                Ok(())
            }
            HostPlace::Pageable => {
                crate::graph::refuse_pageable_in_capture(self, stream)?;
                let step = self.transport.piece();
                let mut done = 0;
                while done < len {
                    let n = step.min(len - done);
                    let copied = self.transport.send_with_payload(
                        n,
                        true,
                        |_| (),
                        |offset| Command::CopyDtoHStaged {
                            stream,
                            src: src + done as u64,
                            arena_offset: offset,
                            len: n as u64,
                        },
                        // SAFETY: the broker wrote `n` bytes at `p.ptr` before completing;
                        // `dst + done .. + n` is inside the program's buffer.
                        |p| unsafe { std::ptr::copy_nonoverlapping(p.ptr, dst.add(done), n) },
                    );
                    if let Err(code) = copied {
                        self.notice_loss(code);
                        return Err(code);
                    }
                    done += n;
                }
                self.deferred()
            }
        }
    }

    /// Sends a command of `stream`'s work to gpushared, or adds it to the stream's capture
    /// when the stream is capturing a graph: whether it was sent.
    fn send_or_capture(&self, stream: u32, cmd: Command) -> Cu<bool> {
        if crate::graph::capture(self, stream, || crate::graph::Op::Command(cmd))? {
            return Ok(false);
        }
        self.transport.post(cmd)?;
        Ok(true)
    }

    pub fn copy_dtod(&self, dst: u64, src: u64, len: usize, stream: u32) -> Cu<()> {
        if len == 0 {
            return Ok(());
        }
        // SAFETY: only device memory is copied (`devices_only`).
        if unsafe { self.copy_across(dst, src, len, stream, true) }? {
            return Ok(());
        }
        let dst = self.device_address(dst, len as u64)?;
        let src = self.device_address(src, len as u64)?;
        let cmd = Command::CopyDtoD {
            stream,
            src,
            dst,
            len: len as u64,
        };
        self.send_or_capture(stream, cmd).map(drop)
    }

    /// A copy between any two addresses (unified addressing).
    ///
    /// # Safety
    /// Each address is device memory, or host memory valid for `len` bytes.
    pub unsafe fn copy_any(
        &self,
        dst: u64,
        src: u64,
        len: usize,
        stream: u32,
        sync: bool,
    ) -> Cu<()> {
        match (self.side(dst, len), self.side(src, len)) {
            (Side::Device, Side::Device) => self.copy_dtod(dst, src, len, stream),
            // SAFETY: host memory of `len` bytes, per the contract.
            (Side::Device, Side::Host(_)) => unsafe {
                self.copy_htod(dst, src as *const u8, len, stream, sync)
            },
            // SAFETY: as above.
            (Side::Host(_), Side::Device) => unsafe {
                self.copy_dtoh(dst as *mut u8, src, len, stream, sync)
            },
            (Side::Host(_), Side::Host(_)) => {
                // Host to host: in order with the stream's work, so after it.
                self.sync_stream(stream)?;
                // SAFETY: both are the program's buffers of `len` bytes, by its contract.
                unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, len) };
                Ok(())
            }
        }
    }

    pub fn memset(
        &self,
        dst: u64,
        value: u32,
        elem_bytes: u8,
        count: usize,
        stream: u32,
    ) -> Cu<()> {
        if count == 0 {
            return Ok(());
        }
        let len = (count as u64)
            .checked_mul(elem_bytes as u64)
            .ok_or(result::INVALID_VALUE)?;
        if self.memset_across(dst, value, elem_bytes, count, stream)? {
            return Ok(());
        }
        let dst = self.device_address(dst, len)?;
        let cmd = if elem_bytes == 1 {
            Command::Memset {
                stream,
                dst,
                value: value as u8,
                len,
            }
        } else {
            Command::MemsetWide {
                stream,
                dst,
                value,
                elem_bytes,
                count: count as u64,
            }
        };
        self.send_or_capture(stream, cmd).map(drop)
    }
}

/// Generates the legacy-stream and per-thread forms of a copy or memset entry point: `$body`
/// gets the driver and the broker stream.
macro_rules! stream_forms {
    ($( $(#[$doc:meta])* $legacy:ident / $per_thread:ident ( $($arg:ident : $ty:ty),* ) [$stream:ident] => |$d:ident, $s:ident| $body:expr; )*) => {$(
        $(#[$doc])*
        /// # Safety
        /// Pointers are the program's, valid for the sizes it passes (CUDA's contract).
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $legacy($($arg: $ty),*) -> CUresult {
            entry(stringify!($legacy), || {
                let $d = crate::route::by_stream($stream)?;
                let $s = $d.stream($stream, false)?;
                // SAFETY: the program's pointers, valid for its sizes (CUDA's contract).
                #[allow(unused_unsafe)]
                unsafe { $body }
            })
        }

        /// # Safety
        /// As the legacy-stream form.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $per_thread($($arg: $ty),*) -> CUresult {
            entry(stringify!($per_thread), || {
                let $d = crate::route::by_stream($stream)?;
                let $s = $d.stream($stream, true)?;
                // SAFETY: the program's pointers, valid for its sizes (CUDA's contract).
                #[allow(unused_unsafe)]
                unsafe { $body }
            })
        }
    )*};
}

/// The stream the synchronous forms use: the default one.
const NULL: CUstream = std::ptr::null_mut();

stream_forms! {
    cuMemcpyHtoD_v2 / cuMemcpyHtoD_v2_ptds (dst: CUdeviceptr, src: *const c_void, n: usize) [NULL]
        => |d, s| d.copy_htod(dst, src.cast(), n, s, true);
    cuMemcpyHtoDAsync_v2 / cuMemcpyHtoDAsync_v2_ptsz (dst: CUdeviceptr, src: *const c_void, n: usize, stream: CUstream) [stream]
        => |d, s| d.copy_htod(dst, src.cast(), n, s, false);
    cuMemcpyDtoH_v2 / cuMemcpyDtoH_v2_ptds (dst: *mut c_void, src: CUdeviceptr, n: usize) [NULL]
        => |d, s| d.copy_dtoh(dst.cast(), src, n, s, true);
    cuMemcpyDtoHAsync_v2 / cuMemcpyDtoHAsync_v2_ptsz (dst: *mut c_void, src: CUdeviceptr, n: usize, stream: CUstream) [stream]
        => |d, s| d.copy_dtoh(dst.cast(), src, n, s, false);
    cuMemcpyDtoD_v2 / cuMemcpyDtoD_v2_ptds (dst: CUdeviceptr, src: CUdeviceptr, n: usize) [NULL]
        => |d, s| d.copy_dtod(dst, src, n, s);
    cuMemcpyDtoDAsync_v2 / cuMemcpyDtoDAsync_v2_ptsz (dst: CUdeviceptr, src: CUdeviceptr, n: usize, stream: CUstream) [stream]
        => |d, s| d.copy_dtod(dst, src, n, s);
    cuMemcpy / cuMemcpy_ptds (dst: CUdeviceptr, src: CUdeviceptr, n: usize) [NULL]
        => |d, s| d.copy_any(dst, src, n, s, true);
    cuMemcpyAsync / cuMemcpyAsync_ptsz (dst: CUdeviceptr, src: CUdeviceptr, n: usize, stream: CUstream) [stream]
        => |d, s| d.copy_any(dst, src, n, s, false);
    cuMemsetD8_v2 / cuMemsetD8_v2_ptds (dst: CUdeviceptr, value: c_uchar, n: usize) [NULL]
        => |d, s| d.memset(dst, value as u32, 1, n, s);
    cuMemsetD8Async / cuMemsetD8Async_ptsz (dst: CUdeviceptr, value: c_uchar, n: usize, stream: CUstream) [stream]
        => |d, s| d.memset(dst, value as u32, 1, n, s);
    cuMemsetD16_v2 / cuMemsetD16_v2_ptds (dst: CUdeviceptr, value: c_ushort, n: usize) [NULL]
        => |d, s| d.memset(dst, value as u32, 2, n, s);
    cuMemsetD16Async / cuMemsetD16Async_ptsz (dst: CUdeviceptr, value: c_ushort, n: usize, stream: CUstream) [stream]
        => |d, s| d.memset(dst, value as u32, 2, n, s);
    cuMemsetD32_v2 / cuMemsetD32_v2_ptds (dst: CUdeviceptr, value: c_uint, n: usize) [NULL]
        => |d, s| d.memset(dst, value, 4, n, s);
    cuMemsetD32Async / cuMemsetD32Async_ptsz (dst: CUdeviceptr, value: c_uint, n: usize, stream: CUstream) [stream]
        => |d, s| d.memset(dst, value, 4, n, s);
}

fn check_peer(d: &Driver, dst_ctx: CUcontext, src_ctx: CUcontext) -> Cu<()> {
    d.contexts.get(dst_ctx)?;
    d.contexts.get(src_ctx)?;
    Ok(())
}

stream_forms! {
    /// A copy between the two contexts' memory (another device's is copied across devices:
    /// `crate::across`).
    cuMemcpyPeer / cuMemcpyPeer_ptds (dst: CUdeviceptr, dst_ctx: CUcontext, src: CUdeviceptr, src_ctx: CUcontext, n: usize) [NULL]
        => |d, s| { check_peer(d, dst_ctx, src_ctx)?; d.copy_dtod(dst, src, n, s) };
    cuMemcpyPeerAsync / cuMemcpyPeerAsync_ptsz (dst: CUdeviceptr, dst_ctx: CUcontext, src: CUdeviceptr, src_ctx: CUcontext, n: usize, stream: CUstream) [stream]
        => |d, s| { check_peer(d, dst_ctx, src_ctx)?; d.copy_dtod(dst, src, n, s) };
}

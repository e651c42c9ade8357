//! The sim device's memory: zero-initialised host buffers at made-up device addresses.

use std::collections::BTreeMap;

use gpushare_protocol::DevicePtr;

use crate::device::{DeviceError, DeviceResult};

/// Where sim device addresses start; well away from 0 so a null pointer is never valid.
const BASE_ADDRESS: u64 = 0x7000_0000_0000;
/// Allocation granularity (like cudaMalloc's 256-byte alignment).
const ALIGN: u64 = 256;

/// A zeroed heap buffer whose allocation failure is reported, not aborted on.
struct Buffer {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: the buffer is plain owned memory; access goes through `&`/`&mut` methods.
unsafe impl Send for Buffer {}

impl Buffer {
    fn zeroed(len: usize) -> Option<Buffer> {
        if len == 0 {
            return Some(Buffer {
                ptr: std::ptr::NonNull::dangling(),
                len: 0,
            });
        }
        let layout = std::alloc::Layout::from_size_align(len, 64).ok()?;
        // SAFETY: non-zero size; a null return is handled.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        Some(Buffer {
            ptr: std::ptr::NonNull::new(ptr)?,
            len,
        })
    }
    fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` owns `len` initialised (zeroed) bytes.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, uniquely borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        if self.len > 0
            && let Ok(layout) = std::alloc::Layout::from_size_align(self.len, 64)
        {
            // SAFETY: allocated in `zeroed` with this layout.
            unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) }
        }
    }
}

/// All allocations of the sim device. Addresses are never reused, so a stale pointer can
/// never alias a newer allocation.
pub struct SimMemory {
    buffers: BTreeMap<u64, Buffer>,
    next: u64,
    used: u64,
    capacity: u64,
}

impl SimMemory {
    pub fn new(capacity: u64) -> SimMemory {
        SimMemory {
            buffers: BTreeMap::new(),
            next: BASE_ADDRESS,
            used: 0,
            capacity,
        }
    }

    pub fn alloc(&mut self, bytes: u64) -> DeviceResult<DevicePtr> {
        let size = bytes.max(1);
        if self.used.saturating_add(size) > self.capacity {
            return Err(DeviceError::OutOfMemory);
        }
        let len = usize::try_from(size).map_err(|_| DeviceError::OutOfMemory)?;
        let buffer = Buffer::zeroed(len).ok_or(DeviceError::OutOfMemory)?;
        let ptr = self.next;
        self.next = ptr
            .checked_add(size.div_ceil(ALIGN) * ALIGN + ALIGN)
            .ok_or(DeviceError::OutOfMemory)?;
        self.buffers.insert(ptr, buffer);
        self.used += size;
        Ok(ptr)
    }

    pub fn free(&mut self, ptr: DevicePtr) -> DeviceResult<()> {
        let buffer = self.buffers.remove(&ptr).ok_or_else(|| {
            DeviceError::InvalidArgument(format!("{ptr:#x} is not an allocation"))
        })?;
        self.used -= (buffer.len as u64).max(1);
        Ok(())
    }

    pub fn used(&self) -> u64 {
        self.used
    }

    fn locate(&self, ptr: DevicePtr, len: u64) -> DeviceResult<(u64, usize)> {
        let (&base, buf) = self.buffers.range(..=ptr).next_back().ok_or_else(|| {
            DeviceError::InvalidArgument(format!("{ptr:#x} is not device memory"))
        })?;
        let offset = ptr - base;
        let end = offset.checked_add(len);
        match end {
            Some(end) if end <= buf.len as u64 => Ok((base, offset as usize)),
            _ => Err(DeviceError::InvalidArgument(format!(
                "{len} bytes at {ptr:#x} run past the end of their allocation"
            ))),
        }
    }

    pub fn read(&self, ptr: DevicePtr, out: &mut [u8]) -> DeviceResult<()> {
        let (base, off) = self.locate(ptr, out.len() as u64)?;
        let buf = &self.buffers[&base];
        out.copy_from_slice(&buf.bytes()[off..off + out.len()]);
        Ok(())
    }

    pub fn write(&mut self, ptr: DevicePtr, data: &[u8]) -> DeviceResult<()> {
        let (base, off) = self.locate(ptr, data.len() as u64)?;
        let buf = self
            .buffers
            .get_mut(&base)
            .ok_or(DeviceError::Failed("lost buffer".into()))?;
        buf.bytes_mut()[off..off + data.len()].copy_from_slice(data);
        Ok(())
    }

    pub fn fill(&mut self, ptr: DevicePtr, value: u8, len: u64) -> DeviceResult<()> {
        let (base, off) = self.locate(ptr, len)?;
        let buf = self
            .buffers
            .get_mut(&base)
            .ok_or(DeviceError::Failed("lost buffer".into()))?;
        buf.bytes_mut()[off..off + len as usize].fill(value);
        Ok(())
    }

    pub fn read_f32s(&self, ptr: DevicePtr, n: u64) -> DeviceResult<Vec<f32>> {
        let len = usize::try_from(n.saturating_mul(4)).map_err(|_| DeviceError::OutOfMemory)?;
        let mut bytes = vec![0u8; len];
        self.read(ptr, &mut bytes)?;
        Ok(bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    /// Reads `n` bfloat16 values, widened exactly to f32.
    pub fn read_bf16s(&self, ptr: DevicePtr, n: u64) -> DeviceResult<Vec<f32>> {
        let len = usize::try_from(n.saturating_mul(2)).map_err(|_| DeviceError::OutOfMemory)?;
        let mut bytes = vec![0u8; len];
        self.read(ptr, &mut bytes)?;
        Ok(bytes
            .chunks_exact(2)
            .map(|c| f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16))
            .collect())
    }

    pub fn write_f32s(&mut self, ptr: DevicePtr, values: &[f32]) -> DeviceResult<()> {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.write(ptr, &bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocations_are_zeroed_disjoint_and_bounded() {
        let mut m = SimMemory::new(1 << 20);
        let a = m.alloc(1000).expect("fits");
        let b = m.alloc(1000).expect("fits");
        assert!(b >= a + 1000, "no overlap");
        let mut out = [1u8; 16];
        m.read(a + 984, &mut out).expect("in bounds");
        assert_eq!(out, [0; 16]);
        assert!(m.read(a + 985, &mut out).is_err(), "one byte past the end");
        assert_eq!(m.alloc(1 << 20), Err(DeviceError::OutOfMemory));
        m.free(a).expect("frees");
        assert!(m.free(a).is_err(), "double free");
        let c = m.alloc(10).expect("fits");
        assert_ne!(c, a, "addresses are not reused");
        assert_eq!(m.used(), 1010);
    }
}

//! Host buffers: the part of the shared arena the device copies to and from directly, handed
//! out first-fit, and the copies between them and device memory.

use gpushare_protocol::{Command, DevicePtr};

use super::conn::HOST_BUFFER_ALIGN;
use super::{Client, lock};
use crate::{Error, Result};

/// First-fit allocator over the host-buffer part of the arena: offset → length of free runs.
pub(super) struct HostRegion {
    free: std::collections::BTreeMap<usize, usize>,
}

impl HostRegion {
    /// The `len` bytes from arena offset `start`, all free.
    pub(super) fn new(start: usize, len: usize) -> HostRegion {
        let mut free = std::collections::BTreeMap::new();
        if len > 0 {
            free.insert(start, len);
        }
        HostRegion { free }
    }

    fn alloc(&mut self, len: usize) -> Option<usize> {
        let len = len.max(1).div_ceil(HOST_BUFFER_ALIGN) * HOST_BUFFER_ALIGN;
        let (&at, &run) = self.free.iter().find(|&(_, &run)| run >= len)?;
        self.free.remove(&at);
        if run > len {
            self.free.insert(at + len, run - len);
        }
        Some(at)
    }

    fn release(&mut self, at: usize, len: usize) {
        let mut start = at;
        let mut len = len.max(1).div_ceil(HOST_BUFFER_ALIGN) * HOST_BUFFER_ALIGN;
        if let Some((&prev, &plen)) = self.free.range(..at).next_back()
            && prev + plen == at
        {
            self.free.remove(&prev);
            start = prev;
            len += plen;
        }
        if let Some(&next_len) = self.free.get(&(start + len)) {
            self.free.remove(&(start + len));
            len += next_len;
        }
        self.free.insert(start, len);
    }
}

/// The arena offset of `range` within host buffer `buf`, checked.
fn host_range(buf: &crate::HostBuffer, range: &std::ops::Range<usize>) -> Result<u64> {
    if range.start > range.end || range.end > buf.len() {
        return Err(Error::InvalidArgument(format!(
            "range {range:?} is outside a {}-byte host buffer",
            buf.len()
        )));
    }
    Ok((buf.offset() + range.start) as u64)
}

impl Client {
    /// A buffer of `len` bytes in the shared arena that the device copies to and from
    /// directly. Needs [`ConnectOptions::host_buffers`] set at connect.
    ///
    /// [`ConnectOptions::host_buffers`]: super::ConnectOptions::host_buffers
    pub fn host_buffer(&self, len: usize) -> Result<crate::HostBuffer> {
        let offset = lock(&self.inner.host_region).alloc(len).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "no room for a {len}-byte host buffer (ConnectOptions::host_buffers sets the space)"
            ))
        })?;
        Ok(crate::HostBuffer::new(self.clone(), offset, len))
    }

    pub(crate) fn release_host_buffer(&self, offset: usize, len: usize) {
        lock(&self.inner.host_region).release(offset, len);
    }

    /// The arena bytes of a host buffer (in the session now).
    pub(crate) fn host_buffer_ptr(&self, offset: usize) -> *mut u8 {
        self.conn().arena_ptr(offset)
    }

    /// Copies a whole host buffer to `dst` on `stream`, asynchronously (no staging copy).
    pub fn copy_host_buffer_to_device(
        &self,
        stream: &crate::Stream,
        src: &crate::HostBuffer,
        dst: DevicePtr,
    ) -> Result<()> {
        self.copy_host_buffer_range_to_device(stream, src, 0..src.len(), dst)
    }

    /// Copies `range` of a host buffer to `dst` on `stream`, asynchronously.
    pub fn copy_host_buffer_range_to_device(
        &self,
        stream: &crate::Stream,
        src: &crate::HostBuffer,
        range: std::ops::Range<usize>,
        dst: DevicePtr,
    ) -> Result<()> {
        let arena_offset = host_range(src, &range)?;
        self.submit_async(Command::CopyHtoD {
            stream: stream.id(),
            arena_offset,
            dst,
            len: range.len() as u64,
        })
    }

    /// Copies `dst.len()` bytes from `src` into a host buffer on `stream`, asynchronously;
    /// the data is there once the stream is synchronized.
    pub fn copy_device_to_host_buffer(
        &self,
        stream: &crate::Stream,
        src: DevicePtr,
        dst: &crate::HostBuffer,
    ) -> Result<()> {
        self.copy_device_to_host_buffer_range(stream, src, dst, 0..dst.len())
    }

    /// Copies `range.len()` bytes from `src` into `range` of a host buffer, asynchronously.
    pub fn copy_device_to_host_buffer_range(
        &self,
        stream: &crate::Stream,
        src: DevicePtr,
        dst: &crate::HostBuffer,
        range: std::ops::Range<usize>,
    ) -> Result<()> {
        let arena_offset = host_range(dst, &range)?;
        self.submit_async(Command::CopyDtoH {
            stream: stream.id(),
            src,
            arena_offset,
            len: range.len() as u64,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: usize = HOST_BUFFER_ALIGN;

    #[test]
    fn buffers_are_aligned_first_fit_and_an_empty_region_has_none() {
        assert_eq!(HostRegion::new(4096, 0).alloc(1), None);
        let mut r = HostRegion::new(4096, 4 * A);
        assert_eq!(r.alloc(1), Some(4096));
        // One byte still takes a whole aligned run, as does a zero-length buffer.
        assert_eq!(r.alloc(0), Some(4096 + A));
        assert_eq!(r.alloc(2 * A), Some(4096 + 2 * A));
        assert_eq!(r.alloc(1), None);
    }

    #[test]
    fn freed_runs_merge_with_their_neighbours() {
        let mut r = HostRegion::new(0, 3 * A);
        let (a, b, c) = (r.alloc(A), r.alloc(A), r.alloc(A));
        assert_eq!((a, b, c), (Some(0), Some(A), Some(2 * A)));
        r.release(0, A);
        r.release(2 * A, A);
        // Two free runs of one unit each: two units do not fit yet.
        assert_eq!(r.alloc(2 * A), None);
        r.release(A, A);
        assert_eq!(r.free.len(), 1, "the three runs are one again");
        assert_eq!(r.alloc(3 * A), Some(0));
    }
}

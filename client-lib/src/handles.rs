//! Typed handles: device buffers, streams, events, modules and functions. Each one frees
//! its broker-side object when dropped.

use std::marker::PhantomData;
use std::time::Duration;

use gpushare_protocol::{Command, DevicePtr, EventId, StreamId};
use zerocopy::{FromBytes, Immutable, IntoBytes};

use crate::client::Client;
use crate::{Error, Result};

/// `len` values of `T` in device memory.
pub struct DeviceBuffer<T> {
    client: Client,
    ptr: DevicePtr,
    len: usize,
    _values: PhantomData<T>,
}

impl<T> DeviceBuffer<T> {
    pub(crate) fn from_raw(client: Client, ptr: DevicePtr, len: usize) -> Self {
        DeviceBuffer {
            client,
            ptr,
            len,
            _values: PhantomData,
        }
    }

    /// The device address (what built-in kernels take).
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn byte_len(&self) -> u64 {
        (self.len * std::mem::size_of::<T>()) as u64
    }

    /// Gives up ownership without freeing (the memory is freed when the client disconnects).
    pub fn into_raw(self) -> DevicePtr {
        let this = std::mem::ManuallyDrop::new(self);
        // SAFETY: `this` is never used or dropped again, so moving the client out once is
        // sound; dropping it releases our share of the session (no Free is sent).
        drop(unsafe { std::ptr::read(&this.client) });
        this.ptr
    }
}

impl<T: IntoBytes + FromBytes + Immutable> DeviceBuffer<T> {
    /// Copies `src` to the start of the buffer and waits until it is on the device.
    pub fn copy_from_host(&self, src: &[T]) -> Result<()> {
        if src.len() > self.len {
            return Err(Error::InvalidArgument(format!(
                "cannot copy {} values into a buffer of {}",
                src.len(),
                self.len
            )));
        }
        self.client.copy_to_device_raw(0, self.ptr, src.as_bytes())
    }

    /// Copies the start of the buffer into `dst`.
    pub fn copy_to_host(&self, dst: &mut [T]) -> Result<()> {
        if dst.len() > self.len {
            return Err(Error::InvalidArgument(format!(
                "cannot copy {} values out of a buffer of {}",
                dst.len(),
                self.len
            )));
        }
        self.client
            .copy_to_host_raw(0, dst.as_mut_bytes(), self.ptr)
    }

    /// The whole buffer as a vector.
    pub fn to_vec(&self) -> Result<Vec<T>> {
        let mut out = T::new_vec_zeroed(self.len)
            .map_err(|_| Error::InvalidArgument("buffer too large for host memory".into()))?;
        self.copy_to_host(&mut out)?;
        Ok(out)
    }

    /// Copies the whole of `src` (same length) on `stream`, asynchronously.
    pub fn copy_from_device(&self, stream: &Stream, src: &DeviceBuffer<T>) -> Result<()> {
        if src.len != self.len {
            return Err(Error::InvalidArgument(
                "device copy between buffers of different lengths".into(),
            ));
        }
        self.client
            .copy_device_raw(stream.id(), self.ptr, src.ptr, self.byte_len())
    }

    /// Sets every byte to `value` on `stream`, asynchronously.
    pub fn memset(&self, stream: &Stream, value: u8) -> Result<()> {
        self.client
            .memset_raw(stream.id(), self.ptr, value, self.byte_len())
    }
}

impl<T> Drop for DeviceBuffer<T> {
    fn drop(&mut self) {
        // Asynchronous: a failure here (broker gone) leaves nothing to free.
        let _ = self.client.submit_async(Command::Free { ptr: self.ptr });
    }
}

/// An ordered queue of device work.
pub struct Stream {
    client: Client,
    id: StreamId,
}

impl Stream {
    pub(crate) fn from_raw(client: Client, id: StreamId) -> Stream {
        Stream { client, id }
    }

    pub(crate) fn default_of(client: Client) -> Stream {
        Stream { client, id: 0 }
    }

    pub fn id(&self) -> StreamId {
        self.id
    }

    /// Waits for the stream's work; reports the first error any asynchronous command met.
    /// Work a device reset took before this client saw it finish fails here with
    /// `DeviceReset`, once.
    pub fn synchronize(&self) -> Result<()> {
        self.client.sync_stream(self.id)
    }

    /// Launches a built-in kernel on this stream.
    pub fn launch(&self, kernel: gpushare_protocol::Kernel) -> Result<()> {
        self.client.launch(self, kernel)
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if self.id != 0 {
            let _ = self
                .client
                .submit_async(Command::StreamDestroy { stream: self.id });
        }
    }
}

/// A marker in a stream, for waiting and for timing device work.
pub struct Event {
    client: Client,
    id: EventId,
}

impl Event {
    pub(crate) fn from_raw(client: Client, id: EventId) -> Event {
        Event { client, id }
    }

    pub fn id(&self) -> EventId {
        self.id
    }

    /// Records the event at the current end of `stream`.
    pub fn record(&self, stream: &Stream) -> Result<()> {
        self.client.submit_async(Command::EventRecord {
            stream: stream.id(),
            event: self.id,
        })
    }

    /// Whether the work before the event is done.
    pub fn query(&self) -> Result<bool> {
        Ok(self
            .client
            .submit_wait(Command::EventQuery { event: self.id })?
            .0
            == 1)
    }

    pub fn synchronize(&self) -> Result<()> {
        self.client
            .submit_wait(Command::EventSync { event: self.id })
            .map(|_| ())
    }

    /// Device time from `start` to this event.
    pub fn elapsed_since(&self, start: &Event) -> Result<Duration> {
        let ns = self
            .client
            .submit_wait(Command::EventElapsed {
                start: start.id,
                end: self.id,
            })?
            .0;
        Ok(Duration::from_nanos(ns))
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        let _ = self
            .client
            .submit_async(Command::EventDestroy { event: self.id });
    }
}

/// A loaded PTX/cubin/fatbin module.
pub struct Module {
    client: Client,
    id: u64,
}

impl Module {
    pub(crate) fn from_raw(client: Client, id: u64) -> Module {
        Module { client, id }
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    /// Looks up a kernel by its (mangled) name.
    pub fn function(&self, name: &str) -> Result<Function> {
        Ok(Function {
            id: self.client.get_function(self.id, name)?,
        })
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        self.client.release_module(self.id);
    }
}

/// A kernel in a loaded module. Valid while its module is loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Function {
    id: u64,
}

impl Function {
    pub fn id(&self) -> u64 {
        self.id
    }
}

/// Host memory in the shared arena that the device copies to and from directly (page-locked
/// on a GPU, like CUDA's pinned memory). Fill it, copy it with
/// [`Client::copy_host_buffer_to_device`]; after a copy into it, synchronize the stream
/// before reading. Returned to the client's pool when dropped.
pub struct HostBuffer {
    client: Client,
    offset: usize,
    len: usize,
}

impl HostBuffer {
    pub(crate) fn new(client: Client, offset: usize, len: usize) -> HostBuffer {
        HostBuffer {
            client,
            offset,
            len,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(crate) fn offset(&self) -> usize {
        self.offset
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the range was allocated to this buffer alone inside the mapped arena, which
        // lives as long as `client`. Only copies this client submitted write it, and the docs
        // say to synchronize before reading after one.
        unsafe { std::slice::from_raw_parts(self.client.host_buffer_ptr(self.offset), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as for `as_slice`; `&mut self` makes this the only reference on our side.
        unsafe {
            std::slice::from_raw_parts_mut(self.client.host_buffer_ptr(self.offset), self.len)
        }
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        self.client.release_host_buffer(self.offset, self.len);
    }
}

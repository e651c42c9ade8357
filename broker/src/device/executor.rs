//! [`Executor`]: a backend with the tables a caller's handles are looked up in (streams,
//! events, modules, functions) and the client memory shared with it (regions, and payloads
//! too big for a channel). It runs [`super::call::Call`]s ([`Executor::run`] is in `call.rs`)
//! for a device worker, and for gpushared itself with `--in-process-device`: both run this.

use std::collections::{HashMap, HashSet};
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use super::backend::Backend;
use super::call::{GateWord, Place, ProgressValue};
use super::progress::slot_word;
use super::reply::{Answer, Handle, Reply};
use super::{DeviceError, DeviceResult};
use crate::shm::Span;
use crate::shm::{ArenaSlice, HostRegion};

/// How long a call waits for a region or payload that is still on its way (in a worker, the
/// control socket brings them, and gpushared waits for their acknowledgement first; this is
/// a bound).
const ARRIVAL_WAIT: Duration = Duration::from_secs(5);

/// A stream slot: taken out when the stream is destroyed.
type StreamSlot<S> = Arc<Mutex<Option<S>>>;

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A backend, and everything it made for its callers, by handle.
pub struct Executor<B: Backend> {
    backend: B,
    streams: Mutex<HashMap<Handle, StreamSlot<B::Stream>>>,
    events: Mutex<HashMap<Handle, Arc<Mutex<B::Event>>>>,
    modules: Mutex<HashMap<Handle, Arc<B::Module>>>,
    functions: Mutex<HashMap<Handle, Arc<B::Function>>>,
    graphs: Mutex<HashMap<Handle, Arc<B::Graph>>>,
    /// Client memory shared with it, by region id; and payloads too big for a channel, by
    /// blob id.
    regions: Mutex<HashMap<u64, Arc<HostRegion>>>,
    blobs: Mutex<HashMap<u64, Arc<HostRegion>>>,
    arrived: Condvar,
    /// Streams a call failed on since their last synchronization (which reports it).
    failed: Mutex<HashSet<Handle>>,
}

impl<B: Backend> Executor<B> {
    pub fn new(backend: B) -> Executor<B> {
        Executor {
            backend,
            streams: Mutex::default(),
            events: Mutex::default(),
            modules: Mutex::default(),
            functions: Mutex::default(),
            graphs: Mutex::default(),
            regions: Mutex::default(),
            blobs: Mutex::default(),
            arrived: Condvar::new(),
            failed: Mutex::default(),
        }
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// Maps client memory that calls may name by `region` (at `at` where it can: device code
    /// then reaches host memory by the client's own pointer; 0: anywhere).
    pub fn share_region(
        &self,
        region: u64,
        fd: &OwnedFd,
        len: u64,
        at: u64,
        offset: u64,
    ) -> DeviceResult<()> {
        let mapped = HostRegion::map_client(fd, len, at, offset)
            .map_err(|e| DeviceError::Failed(format!("cannot map client memory: {e}")))?;
        lock(&self.regions).insert(region, Arc::new(mapped));
        self.arrived.notify_all();
        Ok(())
    }

    /// The region is gone: nothing names it any more.
    pub fn unshare_region(&self, region: u64) {
        lock(&self.regions).remove(&region);
    }

    /// A payload too big for a channel, for the call that names it (mapped at `at` when that
    /// is free, 0: anywhere).
    pub fn add_blob(&self, id: u64, fd: &OwnedFd, len: u64, at: u64) -> DeviceResult<()> {
        let mapped = HostRegion::map(fd, len, at)
            .map_err(|e| DeviceError::Failed(format!("cannot map a call's payload: {e}")))?;
        lock(&self.blobs).insert(id, Arc::new(mapped));
        self.arrived.notify_all();
        Ok(())
    }

    /// The bytes of payload `id` (waiting a while for them to arrive).
    pub fn take_blob(&self, id: u64) -> DeviceResult<Vec<u8>> {
        let blobs = lock(&self.blobs);
        let (mut blobs, _) = self
            .arrived
            .wait_timeout_while(blobs, ARRIVAL_WAIT, |b| !b.contains_key(&id))
            .unwrap_or_else(|e| e.into_inner());
        let blob = blobs
            .remove(&id)
            .ok_or_else(|| DeviceError::InvalidArgument(format!("payload {id} never came")))?;
        drop(blobs);
        let whole = blob.whole();
        let mut bytes = vec![0u8; whole.len()];
        whole.read_into(&mut bytes);
        Ok(bytes)
    }

    /// Makes a chunk at `at` (see [`Backend::create_chunk`]).
    pub fn create_chunk(&self, at: u64, size: u64) -> DeviceResult<OwnedFd> {
        self.backend.create_chunk(at, size)
    }

    /// Makes physical memory mapped nowhere (see [`Backend::make_memory`]).
    pub fn make_memory(&self, size: u64) -> DeviceResult<OwnedFd> {
        self.backend.make_memory(size)
    }

    pub fn import_chunk(&self, at: u64, size: u64, fd: BorrowedFd<'_>) -> DeviceResult<()> {
        self.backend.import_chunk(at, size, fd)
    }

    pub fn release_chunk(&self, at: u64, size: u64) -> DeviceResult<()> {
        self.backend.release_chunk(at, size)
    }

    pub fn reserve_peer(&self, base: u64, size: u64) -> DeviceResult<()> {
        self.backend.reserve_peer(base, size)
    }

    pub fn import_peer_chunk(&self, at: u64, size: u64, fd: BorrowedFd<'_>) -> DeviceResult<()> {
        self.backend.import_peer_chunk(at, size, fd)
    }

    /// Drops every handle (the backend's context is gone, and they with it).
    pub fn forget_handles(&self) {
        lock(&self.streams).clear();
        lock(&self.events).clear();
        lock(&self.graphs).clear();
        lock(&self.functions).clear();
        lock(&self.modules).clear();
    }

    /// Runs `f` on a live stream; the answer also says what the stream's device time
    /// measurements found since the last answer.
    pub(super) fn on_stream(
        &self,
        id: Handle,
        f: impl FnOnce(&mut B::Stream) -> DeviceResult<Reply>,
    ) -> Answer {
        self.on_stream_with(id, None, |s, _| f(s))
    }

    /// [`Executor::on_stream`] for a call that also names client memory.
    pub(super) fn on_stream_with(
        &self,
        id: Handle,
        span: Option<Span>,
        f: impl FnOnce(&mut B::Stream, Option<ArenaSlice<'_>>) -> DeviceResult<Reply>,
    ) -> Answer {
        // The region first: it may still be on its way, and the stream stays free meanwhile.
        let region = match span.map(|s| self.region(s.region)).transpose() {
            Ok(r) => r,
            Err(e) => return Answer::failed(e),
        };
        let slot = match self.stream(id) {
            Ok(s) => s,
            Err(e) => return Answer::failed(e),
        };
        let mut guard = lock(&slot);
        let Some(stream) = guard.as_mut() else {
            return Answer::failed(DeviceError::InvalidArgument(format!(
                "stream {id} destroyed"
            )));
        };
        let slice = match (&region, span) {
            (Some(r), Some(span)) => match slice(r, span) {
                Ok(s) => Some(s),
                Err(e) => return Answer::failed(e),
            },
            _ => None,
        };
        let reply = f(stream, slice).unwrap_or_else(Reply::Failed);
        let busy = self.backend.take_busy_ns(stream);
        let measuring = self.backend.measuring(stream);
        Answer {
            reply,
            news: Some((busy, measuring)),
        }
    }

    /// Runs `f` on the client memory `span` names.
    pub(super) fn with_span<T>(
        &self,
        span: Span,
        f: impl FnOnce(ArenaSlice<'_>) -> DeviceResult<T>,
    ) -> DeviceResult<T> {
        let region = self.region(span.region)?;
        f(slice(&region, span)?)
    }

    /// Notes that a call on `stream` failed.
    pub(super) fn failed_on(&self, stream: Handle) {
        lock(&self.failed).insert(stream);
    }

    /// Whether a call on `stream` failed since its last synchronization (this one, which
    /// clears it).
    pub(super) fn failed_since_sync(&self, stream: Handle) -> bool {
        lock(&self.failed).remove(&stream)
    }

    /// Writes a progress value from the CPU (once the device took a stream's first call, or a
    /// wait saw its work finish). A page that cannot be reached only leaves the work counted
    /// as lost at a fault.
    pub(super) fn write_progress(&self, value: Option<ProgressValue>) {
        let Some(ProgressValue { page, slot, value }) = value else {
            return;
        };
        let _ = self.with_span(page, |page| {
            slot_word(page, slot)?.store_u32(value);
            Ok(())
        });
    }

    /// Queues a kernel or graph on `id` with `queue`: first moves the stream's work to the SM
    /// partition `sms` asks for, then marks where the kernel starts with the event `start`, if
    /// any (on the stream it will run on).
    pub(super) fn on_kernel(
        &self,
        id: Handle,
        start: Option<Handle>,
        place: Place,
        queue: impl FnOnce(&mut B::Stream) -> DeviceResult<()>,
    ) -> Answer {
        let start = match start.map(|e| self.event(e)).transpose() {
            Ok(start) => start,
            Err(e) => return Answer::failed(e),
        };
        if let Some(gate) = place.gate {
            self.learn_gate(gate);
        }
        self.on_stream_with(id, place.gate.map(|g| g.page), |s, page| {
            self.backend.limit_sms(s, place.sms)?;
            // On the lane it now goes to, before its start is marked: time at the gate is
            // not the kernel's.
            if let (Some(gate), Some(page)) = (place.gate, page) {
                self.backend.wait_gate(s, page, gate.slot)?;
            }
            if let Some(e) = &start {
                self.backend.record_start(&mut lock(e), s)?;
            }
            queue(s).map(|()| Reply::Done)
        })
    }

    /// Holds the priority gate open, where the backend does that, for a call that may wait for
    /// work held there (`device::gate`).
    pub(super) fn hold_gate(&self) -> Option<crate::device::gate::HeldOpen<'_>> {
        self.backend
            .gate_hold()
            .map(crate::device::gate::GateHold::hold)
    }

    /// Tells a backend that holds the gate open around some of its calls where the gate's word
    /// is (once: a worker serves one trust domain, with one page).
    fn learn_gate(&self, gate: GateWord) {
        let Some(hold) = self.backend.gate_hold() else {
            return;
        };
        if hold.knows() {
            return;
        }
        let Ok(region) = self.region(gate.page.region) else {
            return;
        };
        let offset = match slice(&region, gate.page).and_then(|page| slot_word(page, gate.slot)) {
            Ok(word) => word.span().offset,
            Err(_) => return,
        };
        hold.learn(region, offset);
    }

    fn region(&self, id: u64) -> DeviceResult<Arc<HostRegion>> {
        let regions = lock(&self.regions);
        // Mostly there: a timed wait reads the clock before it looks.
        if let Some(r) = regions.get(&id) {
            return Ok(r.clone());
        }
        let (regions, _) = self
            .arrived
            .wait_timeout_while(regions, ARRIVAL_WAIT, |r| !r.contains_key(&id))
            .unwrap_or_else(|e| e.into_inner());
        regions
            .get(&id)
            .cloned()
            .ok_or_else(|| DeviceError::InvalidArgument(format!("memory region {id} unknown")))
    }

    pub(super) fn add_stream(&self, id: Handle, stream: B::Stream) -> DeviceResult<()> {
        insert(&self.streams, id, Arc::new(Mutex::new(Some(stream))))
    }

    /// Takes a stream out of the table (and out of the calls still holding its slot).
    pub(super) fn remove_stream(&self, id: Handle) -> Option<B::Stream> {
        let slot = lock(&self.streams).remove(&id)?;
        lock(&slot).take()
    }

    fn stream(&self, id: Handle) -> DeviceResult<StreamSlot<B::Stream>> {
        lock(&self.streams)
            .get(&id)
            .cloned()
            .ok_or_else(|| DeviceError::InvalidArgument(format!("no stream {id}")))
    }

    pub(super) fn add_event(&self, id: Handle, event: B::Event) -> DeviceResult<()> {
        insert(&self.events, id, Arc::new(Mutex::new(event)))
    }

    pub(super) fn remove_event(&self, id: Handle) {
        lock(&self.events).remove(&id);
    }

    pub(super) fn event(&self, id: Handle) -> DeviceResult<Arc<Mutex<B::Event>>> {
        lock(&self.events)
            .get(&id)
            .cloned()
            .ok_or_else(|| DeviceError::InvalidArgument(format!("no event {id}")))
    }

    pub(super) fn add_module(&self, id: Handle, module: B::Module) -> DeviceResult<()> {
        insert(&self.modules, id, Arc::new(module))
    }

    pub(super) fn remove_module(&self, id: Handle) {
        lock(&self.modules).remove(&id);
    }

    pub(super) fn module(&self, id: Handle) -> DeviceResult<Arc<B::Module>> {
        lock(&self.modules)
            .get(&id)
            .cloned()
            .ok_or_else(|| DeviceError::InvalidArgument(format!("no module {id}")))
    }

    pub(super) fn add_function(&self, id: Handle, function: B::Function) -> DeviceResult<()> {
        insert(&self.functions, id, Arc::new(function))
    }

    pub(super) fn remove_function(&self, id: Handle) {
        lock(&self.functions).remove(&id);
    }

    pub(super) fn function(&self, id: Handle) -> DeviceResult<Arc<B::Function>> {
        lock(&self.functions)
            .get(&id)
            .cloned()
            .ok_or_else(|| DeviceError::InvalidArgument(format!("no function {id}")))
    }

    pub(super) fn add_graph(&self, id: Handle, graph: B::Graph) -> DeviceResult<()> {
        insert(&self.graphs, id, Arc::new(graph))
    }

    /// Changes a graph's nodes in place (launches queued before keep the graph they had);
    /// fails where the backend cannot.
    pub(super) fn update_graph(&self, id: Handle, payload: &[u8]) -> DeviceResult<()> {
        let changes = gpushare_protocol::graph::decode_changes(payload)
            .map_err(|e| DeviceError::InvalidArgument(format!("a graph update: {e}")))?;
        let g = self.graph(id)?;
        let changes = changes
            .into_iter()
            .map(|c| {
                let node = c.node;
                super::graph::resolve_op(c.op, |f| self.function(f)).map(|step| (node, step))
            })
            .collect::<DeviceResult<Vec<_>>>()?;
        self.backend.update_graph(&g, changes)
    }

    pub(super) fn remove_graph(&self, id: Handle) {
        lock(&self.graphs).remove(&id);
    }

    pub(super) fn graph(&self, id: Handle) -> DeviceResult<Arc<B::Graph>> {
        lock(&self.graphs)
            .get(&id)
            .cloned()
            .ok_or_else(|| DeviceError::InvalidArgument(format!("no graph {id}")))
    }
}

/// Adds `value` as `id`, which must be new.
fn insert<T>(table: &Mutex<HashMap<Handle, T>>, id: Handle, value: T) -> DeviceResult<()> {
    match lock(table).entry(id) {
        std::collections::hash_map::Entry::Occupied(_) => Err(DeviceError::InvalidArgument(
            format!("handle {id} is in use"),
        )),
        std::collections::hash_map::Entry::Vacant(v) => {
            v.insert(value);
            Ok(())
        }
    }
}

fn slice(region: &HostRegion, span: Span) -> DeviceResult<ArenaSlice<'_>> {
    region
        .slice(span.offset, span.len)
        .ok_or_else(|| DeviceError::InvalidArgument("a copy outside its region".into()))
}

//! `sim`: a CPU model of a GPU for tests, CI and demos.
//!
//! It runs the built-in kernels for real on the CPU and charges each command modelled device
//! time from [`cost::CostModel`]. One command runs at a time, in the order commands arrive; a
//! command starts at `max(its stream's ready time, the device's busy-until time)`. Modelled
//! time advances only with work, so results are deterministic. With `realtime` modelled time
//! is the wall clock (for demos, `gpushare top` and scheduling tests): a command is accepted at
//! once and runs from `max(…, now)` for its modelled time, as queued GPU work does, and
//! synchronizations, events and stream queries wait for that end on the wall clock.

mod attributes;
mod clock;
pub mod cost;
mod device;
pub mod kernels;
mod marks;
pub mod memory;
pub mod module;

use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use gpushare_protocol::command::{LaunchAttributes, ModuleLaunch};
use gpushare_protocol::control::{DeviceInfo, ModuleFormat};
use gpushare_protocol::text::Printable;
use gpushare_protocol::{DevicePtr, Kernel, PriorityClass};

use self::cost::CostModel;
use self::memory::SimMemory;
use super::graph::{Node, Step};
use super::{Backend, DeviceError, DeviceResult, FunctionShape};
use crate::shm::ArenaSlice;

/// The sim's chunks come in 2 MiB granules, as an H100's physical allocations do.
const CHUNK_GRANULARITY: u64 = 2 << 20;

/// How the sim device is set up.
#[derive(Debug, Clone, Copy)]
pub struct SimOptions {
    /// The device's index among the broker's devices.
    pub index: u32,
    pub memory: u64,
    pub cost: CostModel,
    /// Also spend the modelled time on the wall clock.
    pub realtime: bool,
    /// Behave like the CUDA driver after a fault: no recovery in place (the broker restarts).
    pub restart_on_fault: bool,
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions {
            index: 0,
            memory: 16 << 30,
            cost: CostModel::H100_LIKE,
            realtime: false,
            restart_on_fault: false,
        }
    }
}

struct SimState {
    memory: SimMemory,
    /// Modelled time at which the device finishes its last accepted command.
    busy_until_ns: u64,
    epoch: u64,
}

pub struct SimDevice {
    info: DeviceInfo,
    options: SimOptions,
    state: Mutex<SimState>,
    /// Set by an injected illegal-address fault: like CUDA's sticky errors, every later call
    /// fails until the device is reset. Beside the state, so that the fault check never
    /// waits behind long work (a large copy) that holds it.
    poisoned: Mutex<Option<String>>,
    /// An injected illegal address not reported yet. A GPU's driver learns of a fault some
    /// time after it (an illegal address 100–160 ms later on an H200), and work accepted
    /// meanwhile never runs; the sim reports it at the next synchronization (any stream's
    /// or event's), which tests can order.
    unseen: Mutex<Option<String>>,
    interrupted: AtomicBool,
    /// Where modelled time starts on the wall clock (`realtime` only).
    origin: Instant,
    /// Done-marks waiting for the modelled end of the work before them (`realtime` only).
    marks: std::sync::Arc<marks::TimedMarks>,
}

pub struct SimStream {
    ready_ns: u64,
    /// Modelled busy time of finished work not yet taken by `take_busy_ns`.
    busy_ns: u64,
    /// Work not finished yet (in real time): when it ends, and its busy time. As on a GPU,
    /// device time is known only once the work is done, so any call may be the one that
    /// learns it.
    running: std::collections::VecDeque<(u64, u64)>,
    /// An injected hang runs on this stream: its work never finishes.
    hung: bool,
    /// An injected illegal address faulted on this stream.
    faulted: bool,
    epoch: u64,
}

pub struct SimEvent {
    time_ns: Option<u64>,
}

pub use self::module::{SimFunction, SimModule};

impl Backend for SimDevice {
    type Stream = SimStream;
    type Event = SimEvent;
    type Module = SimModule;
    type Function = SimFunction;
    /// Its nodes, run in turn when launched.
    type Graph = Vec<Node<SimFunction>>;

    fn backend(&self) -> &'static str {
        "sim"
    }

    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn alloc(&self, bytes: u64) -> DeviceResult<DevicePtr> {
        let mut st = self.state();
        self.check_healthy()?;
        st.memory.alloc(bytes)
    }

    fn free(&self, ptr: DevicePtr) -> DeviceResult<()> {
        let mut st = self.state();
        self.check_healthy()?;
        st.memory.free(ptr)
    }

    fn granularity(&self) -> DeviceResult<u64> {
        Ok(CHUNK_GRANULARITY)
    }

    fn reserve(&self, hint: u64, size: u64) -> DeviceResult<u64> {
        if hint == 0 {
            let span = size.div_ceil(CHUNK_GRANULARITY) * CHUNK_GRANULARITY;
            // Granule-aligned, like a GPU's reservation.
            let base =
                memory::take_addresses(span + CHUNK_GRANULARITY).ok_or(DeviceError::OutOfMemory)?;
            return Ok(base.div_ceil(CHUNK_GRANULARITY) * CHUNK_GRANULARITY);
        }
        // Addresses are this process's own: the range asked for is taken from now on.
        memory::skip_addresses_below(hint.saturating_add(size));
        Ok(hint)
    }

    fn create_chunk(&self, at: u64, size: u64) -> DeviceResult<OwnedFd> {
        let mut st = self.state();
        self.check_healthy()?;
        st.memory.create_chunk(at, size)
    }

    fn make_memory(&self, size: u64) -> DeviceResult<OwnedFd> {
        self.check_healthy()?;
        memory::make_memory(size)
    }

    fn import_chunk(&self, at: u64, size: u64, fd: BorrowedFd<'_>) -> DeviceResult<()> {
        let mut st = self.state();
        self.check_healthy()?;
        st.memory.import_chunk(at, size, fd)
    }

    fn release_chunk(&self, at: u64, _size: u64) -> DeviceResult<()> {
        self.state().memory.release_chunk(at)
    }

    fn reserve_peer(&self, _base: u64, _size: u64) -> DeviceResult<()> {
        // The sim's addresses are the process's own, and another GPU's are taken in it already.
        Ok(())
    }

    fn import_peer_chunk(&self, at: u64, size: u64, fd: BorrowedFd<'_>) -> DeviceResult<()> {
        let mut st = self.state();
        self.check_healthy()?;
        st.memory.import_peer_chunk(at, size, fd)
    }

    fn register_arena(&self, _arena: ArenaSlice<'_>) -> DeviceResult<()> {
        Ok(())
    }

    fn unregister_arena(&self, _arena: ArenaSlice<'_>) {}

    fn create_stream(&self, _class: PriorityClass) -> DeviceResult<SimStream> {
        Ok(SimStream {
            ready_ns: 0,
            busy_ns: 0,
            running: std::collections::VecDeque::new(),
            hung: false,
            faulted: false,
            epoch: self.state().epoch,
        })
    }

    fn destroy_stream(&self, _stream: SimStream) {}

    fn copy_htod(
        &self,
        stream: &mut SimStream,
        src: ArenaSlice<'_>,
        dst: DevicePtr,
    ) -> DeviceResult<()> {
        let mut bytes = vec![0u8; src.len()];
        src.read_into(&mut bytes);
        let cost = self.options.cost.host_copy_ns(bytes.len() as u64);
        self.run_on(stream, cost, |m| m.write(dst, &bytes))
    }

    fn copy_dtoh(
        &self,
        stream: &mut SimStream,
        src: DevicePtr,
        dst: ArenaSlice<'_>,
    ) -> DeviceResult<()> {
        let cost = self.options.cost.host_copy_ns(dst.len() as u64);
        let bytes = self.run_on(stream, cost, |m| {
            let mut bytes = vec![0u8; dst.len()];
            m.read(src, &mut bytes)?;
            Ok(bytes)
        })?;
        dst.write_from(&bytes);
        Ok(())
    }

    fn copy_dtod(
        &self,
        stream: &mut SimStream,
        src: DevicePtr,
        dst: DevicePtr,
        len: u64,
    ) -> DeviceResult<()> {
        let n = usize::try_from(len).map_err(|_| DeviceError::OutOfMemory)?;
        let cost = self.options.cost.device_copy_ns(len);
        self.run_on(stream, cost, |m| {
            let mut bytes = vec![0u8; n];
            m.read(src, &mut bytes)?;
            m.write(dst, &bytes)
        })
    }

    fn memset(
        &self,
        stream: &mut SimStream,
        dst: DevicePtr,
        value: u8,
        len: u64,
    ) -> DeviceResult<()> {
        let cost = self.options.cost.memset_ns(len);
        self.run_on(stream, cost, |m| m.fill(dst, value, len))
    }

    fn launch(&self, stream: &mut SimStream, kernel: &Kernel) -> DeviceResult<()> {
        if let Kernel::Fault { hang } = *kernel {
            let st = self.state();
            self.check_healthy()?;
            if hang {
                stream.hung = true;
            } else {
                *self.unseen() = Some("illegal address (injected fault)".into());
                tracing::debug!(epoch = st.epoch, "sim: injected illegal address");
                stream.faulted = true;
            }
            return Ok(()); // like a real launch, the failure shows later
        }
        let cost = self.options.cost.kernel_ns(kernel);
        self.run_on(stream, cost, |m| kernels::run(m, kernel))
    }

    fn make_graph(&self, nodes: Vec<Node<SimFunction>>) -> DeviceResult<Self::Graph> {
        self.check_healthy()?;
        for n in &nodes {
            if let Step::Kernel {
                function, launch, ..
            } = &n.step
                && launch.shared_mem_bytes > SimFunction::MAX_DYNAMIC_SHARED
            {
                return Err(DeviceError::InvalidArgument(format!(
                    "a graph's kernel `{}` asks for {} bytes of dynamic shared memory",
                    Printable(function.name()),
                    launch.shared_mem_bytes
                )));
            }
        }
        Ok(nodes)
    }

    fn launch_graph(&self, stream: &mut SimStream, graph: &Self::Graph) -> DeviceResult<()> {
        crate::device::graph::run_in_order(self, stream, graph)
    }

    fn launch_module(
        &self,
        stream: &mut SimStream,
        function: &SimFunction,
        launch: &ModuleLaunch,
        _attributes: &LaunchAttributes,
        params: &[u8],
    ) -> DeviceResult<()> {
        // As CUDA refuses it (measured: scripts/probes/launch_shapes.c).
        if launch.shared_mem_bytes > SimFunction::MAX_DYNAMIC_SHARED {
            return Err(DeviceError::InvalidArgument(format!(
                "{} bytes of dynamic shared memory a block: at most {} for `{}`",
                launch.shared_mem_bytes,
                SimFunction::MAX_DYNAMIC_SHARED,
                Printable(function.name())
            )));
        }
        let cost = function.micros(params)?.saturating_mul(1_000);
        self.run_on(stream, cost, |_| Ok(()))
    }

    fn sync_stream(&self, stream: &mut SimStream) -> DeviceResult<()> {
        // Work ran when it was accepted (in realtime it ends at its modelled time); only an
        // injected hang never finishes.
        if stream.hung {
            // It never finishes: only a reset ends the wait.
            while !self.interrupted.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(1));
            }
            return Err(DeviceError::Cancelled);
        }
        self.wait_for(stream.ready_ns)?;
        self.see_faults()
    }

    fn host_point(
        &self,
        stream: &mut SimStream,
        done: DevicePtr,
        go: DevicePtr,
        value: u32,
    ) -> DeviceResult<()> {
        // The stream's earlier work is done (in modelled time); then `done` is written and
        // the stream (this call) waits for the client's `go`, as a GPU stream would.
        self.wait_for(stream.ready_ns)?;
        self.run_on(stream, 0, |m| m.write(done, &value.to_le_bytes()))?;
        self.wait_until(|| {
            let mut word = [0u8; 4];
            self.state().memory.read(go, &mut word)?;
            Ok(u32::from_le_bytes(word) >= value)
        })
    }

    fn write_done_mark(
        &self,
        stream: &mut SimStream,
        page: ArenaSlice<'_>,
        slot: u32,
        value: u32,
    ) -> DeviceResult<()> {
        self.write_mark(stream, page, slot, value)
    }

    fn wait_gate(
        &self,
        stream: &mut SimStream,
        page: ArenaSlice<'_>,
        slot: u32,
    ) -> DeviceResult<()> {
        // As a GPU stream: looked at once the stream's earlier work is done (in modelled
        // time), and the work after it starts no sooner than the gate opens.
        let word = crate::device::progress::slot_word(page, slot)?;
        self.wait_for(stream.ready_ns)?;
        self.wait_until(|| Ok(crate::device::gate::passes(word.load_u32())))
    }

    fn stream_busy(&self, stream: &SimStream) -> bool {
        // Work runs when it is accepted, so only a hung stream, or the one whose kernel
        // faulted (its work never finished), has any pending.
        ((stream.hung || stream.faulted) && stream.epoch == self.state().epoch)
            || !self.reached(stream.ready_ns)
    }

    fn fault(&self) -> Option<String> {
        self.poisoned().clone()
    }

    fn resets_in_place(&self) -> bool {
        !self.options.restart_on_fault
    }

    fn interrupt(&self) {
        self.interrupted.store(true, Ordering::Release);
    }

    fn reset(&self) -> DeviceResult<()> {
        let mut st = self.state();
        st.memory = SimMemory::new(self.options.memory);
        st.busy_until_ns = 0;
        self.marks.clear();
        *self.poisoned() = None;
        *self.unseen() = None;
        st.epoch += 1;
        self.interrupted.store(false, Ordering::Release);
        Ok(())
    }

    fn take_busy_ns(&self, stream: &mut SimStream) -> u64 {
        while let Some(&(end, cost)) = stream.running.front() {
            if stream.hung || !self.reached(end) {
                break;
            }
            stream.running.pop_front();
            stream.busy_ns = stream.busy_ns.saturating_add(cost);
        }
        std::mem::take(&mut stream.busy_ns)
    }

    fn measuring(&self, stream: &SimStream) -> bool {
        !stream.running.is_empty()
    }

    fn create_event(&self) -> DeviceResult<SimEvent> {
        Ok(SimEvent { time_ns: None })
    }

    fn record_event(&self, event: &mut SimEvent, stream: &mut SimStream) -> DeviceResult<()> {
        event.time_ns = Some(stream.ready_ns);
        Ok(())
    }

    fn record_start(&self, event: &mut SimEvent, stream: &mut SimStream) -> DeviceResult<()> {
        // The device runs one thing at a time: what is queued next starts when the stream's
        // work is done and the device is free.
        event.time_ns = Some(
            stream
                .ready_ns
                .max(self.state().busy_until_ns)
                .max(self.now_ns()),
        );
        Ok(())
    }

    fn event_done(&self, event: &SimEvent) -> DeviceResult<bool> {
        Ok(event.time_ns.is_none_or(|t| self.reached(t)))
    }

    fn sync_event(&self, event: &SimEvent) -> DeviceResult<()> {
        self.wait_for(event.time_ns.unwrap_or(0))?;
        self.see_faults()
    }

    fn elapsed_ns(&self, start: &SimEvent, end: &SimEvent) -> DeviceResult<u64> {
        match (start.time_ns, end.time_ns) {
            (Some(s), Some(e)) => Ok(e.saturating_sub(s)),
            _ => Err(DeviceError::InvalidArgument(
                "event was never recorded".into(),
            )),
        }
    }

    fn load_module(&self, format: ModuleFormat, image: &[u8]) -> DeviceResult<SimModule> {
        SimModule::parse(image).unwrap_or_else(|| {
            Err(DeviceError::NotSupported {
                backend: "sim".into(),
                what: format!(
                    "loading {format:?} modules (the sim device runs only the built-in kernels and its own test modules; use --backend cuda on a GPU machine)"
                ),
            })
        })
    }

    fn get_function(&self, module: &SimModule, name: &str) -> DeviceResult<SimFunction> {
        module.function(name)
    }

    fn function_shape(&self, function: &SimFunction) -> DeviceResult<FunctionShape> {
        Ok(function.shape())
    }

    fn function_names(&self, module: &SimModule) -> DeviceResult<Vec<String>> {
        Ok(module.names().to_vec())
    }

    fn stream_wait_event(&self, stream: &mut SimStream, event: &SimEvent) -> DeviceResult<()> {
        self.check_healthy()?;
        if let Some(t) = event.time_ns {
            stream.ready_ns = stream.ready_ns.max(t);
        }
        Ok(())
    }

    fn stream_done(&self, stream: &SimStream) -> DeviceResult<bool> {
        self.check_healthy()?;
        Ok(!stream.hung && self.reached(stream.ready_ns))
    }

    fn memset_wide(
        &self,
        stream: &mut SimStream,
        dst: DevicePtr,
        value: u32,
        elem_bytes: u8,
        count: u64,
    ) -> DeviceResult<()> {
        let len = count
            .checked_mul(elem_bytes as u64)
            .ok_or_else(|| DeviceError::InvalidArgument("memset too large".into()))?;
        let n = usize::try_from(len).map_err(|_| DeviceError::OutOfMemory)?;
        let element = &value.to_le_bytes()[..elem_bytes as usize];
        let bytes: Vec<u8> = element.iter().copied().cycle().take(n).collect();
        let cost = self.options.cost.memset_ns(len);
        self.run_on(stream, cost, |m| m.write(dst, &bytes))
    }

    fn copy_htod_staged(
        &self,
        stream: &mut SimStream,
        src: ArenaSlice<'_>,
        dst: DevicePtr,
    ) -> DeviceResult<()> {
        // Copies run when accepted here: the arena is read before this returns. Not a
        // synchronization: the copy goes behind the stream's work, as on a GPU.
        self.copy_htod(stream, src, dst)
    }

    fn copy_dtoh_staged(
        &self,
        stream: &mut SimStream,
        src: DevicePtr,
        dst: ArenaSlice<'_>,
    ) -> DeviceResult<()> {
        self.copy_dtoh(stream, src, dst)?;
        self.see_faults()
    }

    fn register_host(&self, region: ArenaSlice<'_>) -> DeviceResult<u64> {
        let mut st = self.state();
        // SAFETY: a client's shared region stays mapped until it is unregistered (the session
        // unregisters it before letting go of it).
        unsafe { st.memory.register_host(region.as_ptr(), region.len()) }
    }

    fn unregister_host(&self, region: ArenaSlice<'_>) {
        self.state().memory.unregister_host(region.as_ptr() as u64);
    }

    fn memory_info(&self) -> DeviceResult<(u64, u64)> {
        let used = self.state().memory.used();
        Ok((
            self.options.memory.saturating_sub(used),
            self.options.memory,
        ))
    }
}

#[cfg(test)]
mod tests;

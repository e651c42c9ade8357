//! [`Backend`]: one GPU as a backend drives it, an operation a method. The cuda and sim
//! backends implement it; [`super::executor::Executor`] is its only caller, running each
//! [`super::call::Call`] against it, in a device worker or in gpushared's own process.

use std::os::fd::{BorrowedFd, OwnedFd};
use std::time::Duration;

use gpushare_protocol::command::{LaunchAttributes, ModuleLaunch};
use gpushare_protocol::control::{DeviceInfo, ModuleFormat};
use gpushare_protocol::{DevicePtr, Kernel, PriorityClass};

use super::graph::{Node, Step};
use super::{DeviceError, DeviceResult, FunctionShape, Occupancy};
use crate::shm::ArenaSlice;

/// What a backend that cannot run client modules says about them.
fn no_modules<T>(backend: &'static str, what: &str) -> DeviceResult<T> {
    Err(DeviceError::NotSupported {
        backend: backend.into(),
        what: what.into(),
    })
}

/// One GPU as the broker drives it. Pointers and ranges passed in have already been checked
/// against the calling client's allocations by its session.
pub trait Backend: Send + Sync + 'static {
    type Stream: Send;
    type Event: Send;
    type Module: Send + Sync;
    type Function: Send + Sync;
    /// An instantiated CUDA graph.
    type Graph: Send + Sync;

    /// `"sim"` or `"cuda"`.
    fn backend(&self) -> &'static str;
    fn info(&self) -> &DeviceInfo;

    /// Plain device memory of this context (gpushared's own warm-up and benchmarks; clients'
    /// memory is chunks, below).
    fn alloc(&self, bytes: u64) -> DeviceResult<DevicePtr>;
    fn free(&self, ptr: DevicePtr) -> DeviceResult<()>;

    // ---- memory that outlives the context: chunks -------------------------------------
    //
    // Clients' device memory is physical memory with a shareable handle (a descriptor),
    // made in one context and mapped, at the same address, into every context that serves the
    // same clients (a device worker and its spare): a fault that poisons one context leaves
    // it intact. Addresses come from a range reserved at the same place in each.

    /// The size and alignment chunks come in.
    fn granularity(&self) -> DeviceResult<u64> {
        Err(DeviceError::NotSupported {
            backend: self.backend().into(),
            what: "memory that outlives its context".into(),
        })
    }
    /// Reserves `size` bytes of device address space at `hint` (0: where the device likes),
    /// for chunks to be mapped into; returns where. Fails with
    /// [`DeviceError::AddressUnavailable`] when `hint` is not free.
    fn reserve(&self, hint: u64, size: u64) -> DeviceResult<u64> {
        let _ = (hint, size);
        self.granularity().map(|_| 0)
    }
    /// Makes `size` bytes of physical memory, maps them at `at` (inside the reservation)
    /// and returns a descriptor that another context can map the same memory by.
    fn create_chunk(&self, at: u64, size: u64) -> DeviceResult<OwnedFd> {
        let _ = (at, size);
        self.granularity()
            .and_then(|_| Err(DeviceError::Failed("no chunks".into())))
    }
    /// Makes `size` bytes of physical memory mapped nowhere (a program's `cuMemCreate`), and
    /// returns its descriptor: the memory lives while the descriptor or a mapping does.
    fn make_memory(&self, size: u64) -> DeviceResult<OwnedFd> {
        let _ = size;
        self.granularity()
            .and_then(|_| Err(DeviceError::Failed("no physical memory".into())))
    }
    /// Maps memory another context made (`fd` from [`Backend::create_chunk`]) at `at`.
    fn import_chunk(&self, at: u64, size: u64, fd: BorrowedFd<'_>) -> DeviceResult<()> {
        let _ = (at, size, fd);
        self.granularity().map(drop)
    }
    /// Unmaps the chunk at `at` from this context (the memory lives on while another context
    /// or a descriptor holds it).
    fn release_chunk(&self, at: u64, size: u64) -> DeviceResult<()> {
        let _ = (at, size);
        self.granularity().map(drop)
    }
    /// Reserves another device's address range (`size` bytes at `base`, its reservation) for
    /// its chunks to be mapped into at their own addresses: peer access.
    fn reserve_peer(&self, base: u64, size: u64) -> DeviceResult<()> {
        let _ = (base, size);
        self.granularity().map(drop)
    }
    /// Maps another device's chunk (`fd`) at its own address `at`, inside a range
    /// [`Backend::reserve_peer`] reserved, for this device to read and write.
    fn import_peer_chunk(&self, at: u64, size: u64, fd: BorrowedFd<'_>) -> DeviceResult<()> {
        self.import_chunk(at, size, fd)
    }

    /// Makes a client's arena usable for direct DMA (a no-op where that means nothing).
    fn register_arena(&self, arena: ArenaSlice<'_>) -> DeviceResult<()>;
    fn unregister_arena(&self, arena: ArenaSlice<'_>);

    fn create_stream(&self, class: PriorityClass) -> DeviceResult<Self::Stream>;
    /// Waits for the stream's work, then releases it.
    fn destroy_stream(&self, stream: Self::Stream);

    fn copy_htod(
        &self,
        stream: &mut Self::Stream,
        src: ArenaSlice<'_>,
        dst: DevicePtr,
    ) -> DeviceResult<()>;
    fn copy_dtoh(
        &self,
        stream: &mut Self::Stream,
        src: DevicePtr,
        dst: ArenaSlice<'_>,
    ) -> DeviceResult<()>;
    fn copy_dtod(
        &self,
        stream: &mut Self::Stream,
        src: DevicePtr,
        dst: DevicePtr,
        len: u64,
    ) -> DeviceResult<()>;
    fn memset(
        &self,
        stream: &mut Self::Stream,
        dst: DevicePtr,
        value: u8,
        len: u64,
    ) -> DeviceResult<()>;
    fn launch(&self, stream: &mut Self::Stream, kernel: &Kernel) -> DeviceResult<()>;
    /// Whether [`Backend::limit_sms`] partitions SMs (without, the scheduler paces partitioned
    /// clients instead).
    fn sm_partitions(&self) -> bool {
        false
    }
    /// Runs the stream's next kernels on at most `sms` SMs (`None`: on the whole device), in
    /// order with everything queued on it before. A device without SM partitions ignores it.
    fn limit_sms(&self, _stream: &mut Self::Stream, _sms: Option<u32>) -> DeviceResult<()> {
        Ok(())
    }
    /// Launches a module function with its packed parameters (`params`, without the
    /// attributes) and the launch's attributes (clusters, cooperative, programmatic launch).
    fn launch_module(
        &self,
        stream: &mut Self::Stream,
        function: &Self::Function,
        launch: &ModuleLaunch,
        attributes: &LaunchAttributes,
        params: &[u8],
    ) -> DeviceResult<()>;
    /// Makes and instantiates a graph of `nodes` (each depends only on nodes before it).
    fn make_graph(&self, nodes: Vec<Node<Self::Function>>) -> DeviceResult<Self::Graph>;
    /// Gives nodes of an instantiated graph new parameters (each of the same kind as before),
    /// for its launches queued after this. A backend that cannot says so; the graph is then
    /// made again.
    fn update_graph(
        &self,
        _graph: &Self::Graph,
        _changes: Vec<(u32, Step<Self::Function>)>,
    ) -> DeviceResult<()> {
        Err(DeviceError::NotSupported {
            backend: self.backend().into(),
            what: "changing an instantiated graph's nodes".into(),
        })
    }
    /// Launches an instantiated graph on the stream, as one unit.
    fn launch_graph(&self, stream: &mut Self::Stream, graph: &Self::Graph) -> DeviceResult<()>;
    /// Waits for all work on the stream; reports the first error it met.
    fn sync_stream(&self, stream: &mut Self::Stream) -> DeviceResult<()>;
    /// Queues, on `stream`, a write of `value` at `done` when its earlier work is done, then a
    /// wait until the 32 bits at `go` are at least `value` (both host memory the device
    /// reaches): a client's host function runs between the two.
    fn host_point(
        &self,
        _stream: &mut Self::Stream,
        _done: DevicePtr,
        _go: DevicePtr,
        _value: u32,
    ) -> DeviceResult<()> {
        Err(DeviceError::NotSupported {
            backend: self.backend().into(),
            what: "host functions in stream order".into(),
        })
    }
    /// Queues, on `stream`, a write of `value` into the 32-bit slot `slot` of `page` (host
    /// memory shared with gpushared), done once everything queued before has finished: a
    /// mark that the work before it finished (the sim, whose work runs when accepted, writes
    /// it at the work's modelled end).
    fn write_done_mark(
        &self,
        stream: &mut Self::Stream,
        page: ArenaSlice<'_>,
        slot: u32,
        value: u32,
    ) -> DeviceResult<()>;
    /// Queues, on `stream`, a wait until the 32-bit slot `slot` of `page` (gpushared's progress
    /// page) lets it pass ([`super::gate::passes`]): the priority gate ([`super::gate::Gate`]).
    /// A backend without it runs the work ungated, as before the gate.
    fn wait_gate(
        &self,
        _stream: &mut Self::Stream,
        _page: ArenaSlice<'_>,
        _slot: u32,
    ) -> DeviceResult<()> {
        Ok(())
    }
    /// Where a backend whose driver calls can wait for work held at the gate, holding up the
    /// other calls meanwhile, holds the gate open around them ([`super::gate::GateHold`]);
    /// the executor tells it the gate's word.
    fn gate_hold(&self) -> Option<&super::gate::GateHold> {
        None
    }
    /// The session finished a batch of commands that queued work on this stream; `idle`
    /// says the client has gone quiet. A point where the backend may close a measurement.
    fn end_batch(&self, _stream: &mut Self::Stream, _idle: bool) {}
    /// Device time of this stream's work measured since the last call (modelled on `sim`,
    /// from CUDA events on `cuda`), in ns. Work still running is counted by a later call.
    fn take_busy_ns(&self, stream: &mut Self::Stream) -> u64;
    /// Whether measurements of finished work are still to be read (the session then wakes
    /// up to read them rather than sleeping indefinitely).
    fn measuring(&self, _stream: &Self::Stream) -> bool {
        false
    }

    fn create_event(&self) -> DeviceResult<Self::Event>;
    /// An event only for knowing when work is done (cheaper to record on a GPU; it cannot
    /// time anything).
    fn create_marker(&self) -> DeviceResult<Self::Event> {
        self.create_event()
    }
    fn record_event(&self, event: &mut Self::Event, stream: &mut Self::Stream) -> DeviceResult<()>;
    /// Records an event that marks where the stream's next work starts (for timing it).
    fn record_start(&self, event: &mut Self::Event, stream: &mut Self::Stream) -> DeviceResult<()> {
        self.record_event(event, stream)
    }
    fn event_done(&self, event: &Self::Event) -> DeviceResult<bool>;
    fn sync_event(&self, event: &Self::Event) -> DeviceResult<()>;
    fn elapsed_ns(&self, start: &Self::Event, end: &Self::Event) -> DeviceResult<u64>;

    /// Whether work queued on the stream has not finished yet (for the hang watchdog and for
    /// telling which clients had work in flight at a fault).
    fn stream_busy(&self, _stream: &Self::Stream) -> bool {
        false
    }
    /// Cuts short every wait on the device (they fail with [`DeviceError::Cancelled`]) until
    /// [`Backend::reset`] finishes: the first step of recovering from a fault.
    fn interrupt(&self) {}
    /// Whether the context is poisoned by a sticky error (an illegal address …), and which.
    /// Cheap: the guardian asks every few milliseconds.
    fn fault(&self) -> Option<String> {
        None
    }
    /// Recreates the device context after a fault or a hang. Every allocation, stream, event
    /// and module made before is gone; their handles become inert (dropping them is safe and
    /// touches nothing).
    fn reset(&self) -> DeviceResult<()>;
    /// Whether [`Backend::reset`] can recover the device within this process; when not, the
    /// broker restarts itself after a fault.
    fn resets_in_place(&self) -> bool {
        true
    }
    /// How long [`Backend::reset`] may take before the broker takes the device for stuck and
    /// restarts (a kernel that never ends can keep a reset in place waiting forever).
    fn reset_deadline(&self) -> Duration {
        Duration::from_secs(1)
    }

    fn load_module(&self, format: ModuleFormat, image: &[u8]) -> DeviceResult<Self::Module>;
    fn get_function(&self, module: &Self::Module, name: &str) -> DeviceResult<Self::Function>;

    // ---- what consolidated clients (a client-side CUDA driver) need besides -----------

    /// Work queued on `stream` after this waits until `event`'s recorded work is done.
    fn stream_wait_event(&self, stream: &mut Self::Stream, event: &Self::Event)
    -> DeviceResult<()>;
    /// Whether all work queued on the stream has finished.
    fn stream_done(&self, stream: &Self::Stream) -> DeviceResult<bool>;
    /// An event with `cuEventCreate`'s flags (timing disabled makes a marker).
    fn create_event_flags(&self, flags: u32) -> DeviceResult<Self::Event> {
        const DISABLE_TIMING: u32 = 0x2;
        if flags & DISABLE_TIMING != 0 {
            self.create_marker()
        } else {
            self.create_program_timer()
        }
    }
    /// A timing event a consolidated program made for itself (`cuEventCreate`), as against
    /// gpushared's own and a library client's (`create_event`): a backend may keep its own
    /// measurements out of what such an event times.
    fn create_program_timer(&self) -> DeviceResult<Self::Event> {
        self.create_event()
    }
    /// Sets `count` elements of `elem_bytes` (2 or 4) at `dst` to `value`.
    fn memset_wide(
        &self,
        stream: &mut Self::Stream,
        dst: DevicePtr,
        value: u32,
        elem_bytes: u8,
        count: u64,
    ) -> DeviceResult<()>;
    /// Copies arena bytes to the device, ordered on the stream; the device is done reading
    /// `src` when this returns (the client reuses it).
    fn copy_htod_staged(
        &self,
        stream: &mut Self::Stream,
        src: ArenaSlice<'_>,
        dst: DevicePtr,
    ) -> DeviceResult<()>;
    /// Copies device bytes into the arena after the stream's earlier work; they are there
    /// when this returns.
    fn copy_dtoh_staged(
        &self,
        stream: &mut Self::Stream,
        src: DevicePtr,
        dst: ArenaSlice<'_>,
    ) -> DeviceResult<()>;
    /// Page-locks a client's shared host region for DMA; returns where device code reaches
    /// it. Copies to and from it through `copy_htod`/`copy_dtoh` are then DMA.
    fn register_host(&self, region: ArenaSlice<'_>) -> DeviceResult<u64>;
    fn unregister_host(&self, region: ArenaSlice<'_>);
    /// Free and total device memory.
    fn memory_info(&self) -> DeviceResult<(u64, u64)>;
    /// A TMA tensor map's bytes, as the GPU's driver makes them.
    fn encode_tensor_map(
        &self,
        args: &gpushare_protocol::control::TensorMapArgs,
    ) -> DeviceResult<Vec<u8>> {
        let _ = args;
        Err(DeviceError::NotSupported {
            backend: self.backend().into(),
            what: "tensor maps".into(),
        })
    }
    /// A function's parameter layout and attributes.
    fn function_shape(&self, function: &Self::Function) -> DeviceResult<FunctionShape> {
        let _ = function;
        no_modules(self.backend(), "describing functions")
    }
    fn set_function_attribute(
        &self,
        function: &Self::Function,
        attribute: u32,
        value: i32,
    ) -> DeviceResult<()> {
        let _ = (function, attribute, value);
        no_modules(self.backend(), "setting function attributes")
    }
    fn occupancy(&self, function: &Self::Function, question: &Occupancy) -> DeviceResult<u64> {
        let _ = (function, question);
        no_modules(self.backend(), "occupancy queries")
    }
    /// A module's global variable: its device address and size.
    fn module_global(&self, module: &Self::Module, name: &str) -> DeviceResult<(u64, u64)> {
        let _ = (module, name);
        no_modules(self.backend(), "module globals")
    }
    /// The names of a module's functions (kernels), in the module's order.
    fn function_names(&self, module: &Self::Module) -> DeviceResult<Vec<String>> {
        let _ = module;
        no_modules(self.backend(), "listing a module's functions")
    }
}

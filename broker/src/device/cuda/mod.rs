//! `cuda`: a real NVIDIA GPU through the CUDA driver API (cudarc, loaded dynamically, so the
//! broker builds and runs where CUDA is absent and says so).
//!
//! One primary context per GPU, held by the broker; one CUDA stream per client stream, with
//! the priority of the client's class; each client's arena is page-locked with
//! `cuMemHostRegister` so host↔device copies are asynchronous DMA straight from shared memory.
//! Device time per stream is measured with CUDA events bracketing spans of continuous work.
//!
//! This file maps [`Backend`] onto the files that do the work: `open` (opening the device),
//! `context`
//! (binding, interruptible waits), `memory` (allocations, page-locked arenas), `chunks`
//! (clients' memory, which outlives the context), `copy`, `stream` and `timing` (client streams and their device time), `event`, `module`
//! (client modules and launches), `builtins` and `gemm` (built-in kernels, cuBLAS),
//! `partition` (SM partitions), `injection` (fault kernels), `holder` (restart helper) and
//! `error` (driver statuses as device errors).

mod builtins;
mod chunks;
mod context;
mod copy;
mod error;
mod event;
mod gemm;
mod graph;
mod holder;
mod info;
mod injection;
mod memory;
mod module;
mod open;
mod partition;
pub mod peer;
mod progress;
mod span_clock;
mod stream;
mod sync_words;
mod tensor_map;
mod timing;

use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::result as cu;
use cudarc::driver::sys::{self, CUcontext, CUdevice};
use gpushare_protocol::command::{LaunchAttributes, ModuleLaunch};
use gpushare_protocol::control::{DeviceInfo, ModuleFormat};
use gpushare_protocol::{DevicePtr, Kernel, PriorityClass};

use self::builtins::Builtins;
/// The pre-built PTX of the built-in kernels (also holds `gpushare_empty`, for benchmarks).
pub use self::builtins::PREBUILT_PTX as BUILTIN_PTX;
/// Hands the compiled built-in kernels to the next image of a restarting gpushared.
pub use self::builtins::{HANDOVER_ENV as BUILTINS_HANDOVER_ENV, hand_over as hand_over_builtins};
/// The built-in kernels this process compiled, and adopting another process's.
pub use self::builtins::{
    adopt as adopt_builtins, compile_anyway as compile_builtins_anyway,
    compiled as compiled_builtins,
};
use self::chunks::Chunks;
pub use self::event::CudaEvent;
use self::gemm::Gemm;
/// The helper process that keeps the driver initialised across a restart.
pub use self::holder::{
    HOLDER_ENV, HOLDER_FLAG, hand_over as hand_over_holder, keep_driver_warm, run_holder,
};
use self::injection::FaultKernels;
use self::memory::PinnedArenas;
pub use self::module::{CudaFunction, CudaModule, ModuleRef};
pub use self::open::{ProbeError, device_count};
use self::partition::Partitions;
pub use self::stream::CudaStream;
use super::graph::{Node, Step};
use super::{Backend, DeviceError, DeviceResult, FunctionShape, Occupancy};
use crate::device::gate::GateHold;
use crate::shm::ArenaSlice;

/// One GPU, with the broker's primary context on it.
pub struct CudaDevice {
    ordinal: i32,
    device: CUdevice,
    ctx: CUcontext,
    /// Set once the context is given up after a fault (the broker restarts): waits give up.
    interrupted: AtomicBool,
    info: DeviceInfo,
    builtins: Builtins,
    faults: Mutex<Option<FaultKernels>>,
    /// (least, greatest) stream priority; numerically smaller is more important.
    priorities: (i32, i32),
    /// Client arenas that copies can DMA from.
    pinned: PinnedArenas,
    /// gpushared's progress pages, registered here.
    progress: progress::ProgressPages,
    /// The words streams write when their work is done, for waits that read host memory.
    sync_words: sync_words::SyncWords,
    /// Clients' memory: chunks that outlive this context.
    chunks: Chunks,
    /// SM partitions for clients the scheduler keeps off part of the GPU.
    partitions: Partitions,
    /// Held around the driver calls that wait for work held at the priority gate, and
    /// meanwhile hold up every other thread's calls (`device::gate`).
    gate_hold: GateHold,
}

// SAFETY: the driver API is thread-safe; the raw handles are only used with the context made
// current on the calling thread (`bind`), and mutable state is behind a mutex.
unsafe impl Send for CudaDevice {}
// SAFETY: as above.
unsafe impl Sync for CudaDevice {}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        let _ = self.bind();
        // SAFETY: the module was loaded by us and nothing uses it after the device is gone.
        let _ = unsafe { cu::module::unload(self.builtins.module) };
        // SAFETY: balances the retain in `open`.
        let _ = unsafe { cu::primary_ctx::release(self.device) };
    }
}

impl Backend for CudaDevice {
    type Stream = CudaStream;
    type Event = CudaEvent;
    type Module = Arc<ModuleRef>;
    type Function = CudaFunction;
    type Graph = graph::CudaGraph;

    fn backend(&self) -> &'static str {
        "cuda"
    }

    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn alloc(&self, bytes: u64) -> DeviceResult<DevicePtr> {
        self.bind()?;
        memory::alloc(bytes)
    }

    fn free(&self, ptr: DevicePtr) -> DeviceResult<()> {
        self.bind()?;
        // `cuMemFree` waits for work held at the gate (`device::gate`).
        let _open = self.hold_gate();
        memory::free(ptr)
    }

    fn granularity(&self) -> DeviceResult<u64> {
        self.bind()?;
        chunks::granularity(self.ordinal)
    }

    fn reserve(&self, hint: u64, size: u64) -> DeviceResult<u64> {
        self.bind()?;
        self.chunks.reserve(hint, size)
    }

    fn create_chunk(&self, at: u64, size: u64) -> DeviceResult<OwnedFd> {
        self.bind()?;
        self.chunks.create(self.ordinal, at, size)
    }

    fn encode_tensor_map(
        &self,
        args: &gpushare_protocol::control::TensorMapArgs,
    ) -> DeviceResult<Vec<u8>> {
        self.bind()?;
        tensor_map::encode(args)
    }

    fn make_memory(&self, size: u64) -> DeviceResult<OwnedFd> {
        self.bind()?;
        chunks::make(self.ordinal, size)
    }

    fn import_chunk(&self, at: u64, size: u64, fd: BorrowedFd<'_>) -> DeviceResult<()> {
        self.bind()?;
        self.chunks.import(self.ordinal, at, size, fd)
    }

    fn release_chunk(&self, at: u64, _size: u64) -> DeviceResult<()> {
        self.bind()?;
        self.chunks.release(at)
    }

    fn reserve_peer(&self, base: u64, size: u64) -> DeviceResult<()> {
        self.bind()?;
        self.chunks.reserve_peer(base, size)
    }

    fn register_arena(&self, arena: ArenaSlice<'_>) -> DeviceResult<()> {
        self.bind()?;
        self.pinned.register(arena);
        Ok(())
    }

    fn unregister_arena(&self, arena: ArenaSlice<'_>) {
        if self.pinned.forget(arena.as_ptr() as usize) && self.bind().is_ok() {
            // `cuMemHostUnregister` waits for work held at the gate.
            let _open = self.hold_gate();
            memory::unpin(arena);
        }
    }

    fn create_stream(&self, class: PriorityClass) -> DeviceResult<CudaStream> {
        CudaStream::create(self, class)
    }

    fn destroy_stream(&self, stream: CudaStream) {
        stream.destroy(self)
    }

    fn copy_htod(
        &self,
        stream: &mut CudaStream,
        src: ArenaSlice<'_>,
        dst: DevicePtr,
    ) -> DeviceResult<()> {
        copy::htod(self, stream, src, dst)
    }

    fn copy_dtoh(
        &self,
        stream: &mut CudaStream,
        src: DevicePtr,
        dst: ArenaSlice<'_>,
    ) -> DeviceResult<()> {
        copy::dtoh(self, stream, src, dst)
    }

    fn copy_dtod(
        &self,
        stream: &mut CudaStream,
        src: DevicePtr,
        dst: DevicePtr,
        len: u64,
    ) -> DeviceResult<()> {
        copy::dtod(self, stream, src, dst, len)
    }

    fn memset(
        &self,
        stream: &mut CudaStream,
        dst: DevicePtr,
        value: u8,
        len: u64,
    ) -> DeviceResult<()> {
        copy::memset(self, stream, dst, value, len)
    }

    fn host_point(
        &self,
        stream: &mut CudaStream,
        done: DevicePtr,
        go: DevicePtr,
        value: u32,
    ) -> DeviceResult<()> {
        progress::host_point(self, stream, done, go, value)
    }

    fn write_done_mark(
        &self,
        stream: &mut CudaStream,
        page: ArenaSlice<'_>,
        slot: u32,
        value: u32,
    ) -> DeviceResult<()> {
        progress::write(self, stream, page, slot, value)
    }

    fn wait_gate(
        &self,
        stream: &mut CudaStream,
        page: ArenaSlice<'_>,
        slot: u32,
    ) -> DeviceResult<()> {
        progress::wait_gate(self, stream, page, slot)
    }

    fn launch(&self, stream: &mut CudaStream, kernel: &Kernel) -> DeviceResult<()> {
        stream.begin(self)?;
        match *kernel {
            Kernel::GemmF32 {
                a,
                b,
                c,
                m,
                n,
                k,
                alpha,
                beta,
            } if gemm::cublas_present() && gemm::worth_cublas(m, n, k) => {
                let _open = stream
                    .gemm_shapes
                    .first(Gemm::F32, m, n, k)
                    .then(|| self.hold_gate());
                gemm::run(stream, Gemm::F32, (a, b, c), (m, n, k), alpha, beta)
            }
            Kernel::GemmBf16 {
                a,
                b,
                c,
                m,
                n,
                k,
                alpha,
                beta,
            } if gemm::cublas_present() => {
                let _open = stream
                    .gemm_shapes
                    .first(Gemm::Bf16, m, n, k)
                    .then(|| self.hold_gate());
                gemm::run(stream, Gemm::Bf16, (a, b, c), (m, n, k), alpha, beta)
            }
            Kernel::GemmBf16 { .. } => Err(DeviceError::NotSupported {
                backend: "cuda".into(),
                what: "bf16 GEMM needs cuBLAS (libcublas.so), which was not found".into(),
            }),
            Kernel::Fault { hang } => self.inject_fault(stream, hang),
            _ => self.builtins.launch(stream.raw, kernel),
        }
    }

    fn sm_partitions(&self) -> bool {
        self.partitions.available()
    }

    fn limit_sms(&self, stream: &mut CudaStream, sms: Option<u32>) -> DeviceResult<()> {
        stream.limit_sms(self, sms)
    }

    fn launch_module(
        &self,
        stream: &mut CudaStream,
        function: &CudaFunction,
        launch: &ModuleLaunch,
        attributes: &LaunchAttributes,
        params: &[u8],
    ) -> DeviceResult<()> {
        function.launch(self, stream, launch, attributes, params)
    }

    fn make_graph(&self, nodes: Vec<Node<CudaFunction>>) -> DeviceResult<graph::CudaGraph> {
        graph::make(self, nodes)
    }

    fn update_graph(
        &self,
        graph: &graph::CudaGraph,
        changes: Vec<(u32, Step<CudaFunction>)>,
    ) -> DeviceResult<()> {
        graph::update(self, graph, changes)
    }

    fn launch_graph(&self, stream: &mut CudaStream, graph: &graph::CudaGraph) -> DeviceResult<()> {
        graph::launch(self, stream, graph)
    }

    fn sync_stream(&self, stream: &mut CudaStream) -> DeviceResult<()> {
        stream.sync(self)
    }

    fn end_batch(&self, stream: &mut CudaStream, idle: bool) {
        stream.end_batch(self, idle)
    }

    fn measuring(&self, stream: &CudaStream) -> bool {
        stream.measuring()
    }

    fn stream_busy(&self, stream: &CudaStream) -> bool {
        stream.is_busy(self)
    }

    fn fault(&self) -> Option<String> {
        self.sticky_fault()
    }

    fn interrupt(&self) {
        self.interrupted.store(true, Ordering::Release);
    }

    fn resets_in_place(&self) -> bool {
        false
    }

    fn reset(&self) -> DeviceResult<()> {
        // After a sticky error even cuDevicePrimaryCtxRetain fails once the context is reset,
        // and a reset under a kernel that never ends waits for it forever: only a new process
        // gets a working GPU back, so the broker restarts instead (see `fault`).
        Err(DeviceError::Fault(
            "the CUDA driver keeps a sticky error for the life of the process".into(),
        ))
    }

    fn take_busy_ns(&self, stream: &mut CudaStream) -> u64 {
        stream.take_busy_ns(self)
    }

    fn create_event(&self) -> DeviceResult<CudaEvent> {
        CudaEvent::create(self, sys::CUevent_flags::CU_EVENT_DEFAULT)
    }

    fn create_marker(&self) -> DeviceResult<CudaEvent> {
        CudaEvent::create(self, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
    }

    fn create_program_timer(&self) -> DeviceResult<CudaEvent> {
        CudaEvent::program_timer(self)
    }

    fn record_event(&self, event: &mut CudaEvent, stream: &mut CudaStream) -> DeviceResult<()> {
        event.record(self, stream)
    }

    fn event_done(&self, event: &CudaEvent) -> DeviceResult<bool> {
        event.done(self)
    }

    fn sync_event(&self, event: &CudaEvent) -> DeviceResult<()> {
        self.wait_until(|| event.done(self))
    }

    fn elapsed_ns(&self, start: &CudaEvent, end: &CudaEvent) -> DeviceResult<u64> {
        start.elapsed_ns(self, end)
    }

    fn load_module(&self, format: ModuleFormat, image: &[u8]) -> DeviceResult<Arc<ModuleRef>> {
        // `cuModuleLoadData` waits for work held at the gate.
        let _open = self.hold_gate();
        ModuleRef::load(self, format, image)
    }

    fn get_function(&self, module: &Arc<ModuleRef>, name: &str) -> DeviceResult<CudaFunction> {
        // Under lazy loading the module is loaded here: the next kernels of every stream then
        // wait on the device for work held at the gate.
        let _open = self.hold_gate();
        CudaFunction::get(self, module, name)
    }

    fn stream_wait_event(&self, stream: &mut CudaStream, event: &CudaEvent) -> DeviceResult<()> {
        stream.wait_event(self, event.raw())
    }

    fn stream_done(&self, stream: &CudaStream) -> DeviceResult<bool> {
        stream.done(self)
    }

    fn memset_wide(
        &self,
        stream: &mut CudaStream,
        dst: DevicePtr,
        value: u32,
        elem_bytes: u8,
        count: u64,
    ) -> DeviceResult<()> {
        copy::memset_wide(self, stream, dst, value, elem_bytes, count)
    }

    fn copy_htod_staged(
        &self,
        stream: &mut CudaStream,
        src: ArenaSlice<'_>,
        dst: DevicePtr,
    ) -> DeviceResult<()> {
        copy::htod_staged(self, stream, src, dst)
    }

    fn copy_dtoh_staged(
        &self,
        stream: &mut CudaStream,
        src: DevicePtr,
        dst: ArenaSlice<'_>,
    ) -> DeviceResult<()> {
        copy::dtoh_staged(self, stream, src, dst)
    }

    fn register_host(&self, region: ArenaSlice<'_>) -> DeviceResult<u64> {
        self.bind()?;
        self.pinned.register_host(region)
    }

    fn unregister_host(&self, region: ArenaSlice<'_>) {
        self.unregister_arena(region)
    }

    fn memory_info(&self) -> DeviceResult<(u64, u64)> {
        self.bind()?;
        memory::info()
    }

    fn function_shape(&self, function: &CudaFunction) -> DeviceResult<FunctionShape> {
        function.shape(self)
    }

    fn set_function_attribute(
        &self,
        function: &CudaFunction,
        attribute: u32,
        value: i32,
    ) -> DeviceResult<()> {
        function.set_attribute(self, attribute, value)
    }

    fn occupancy(&self, function: &CudaFunction, question: &Occupancy) -> DeviceResult<u64> {
        function.occupancy(self, question)
    }

    fn module_global(&self, module: &Arc<ModuleRef>, name: &str) -> DeviceResult<(u64, u64)> {
        // As for a function: this may load the module.
        let _open = self.hold_gate();
        module.global(self, name)
    }

    fn function_names(&self, module: &Arc<ModuleRef>) -> DeviceResult<Vec<String>> {
        module.function_names(self)
    }

    fn gate_hold(&self) -> Option<&GateHold> {
        Some(&self.gate_hold)
    }
}

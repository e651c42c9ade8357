//! Typed commands and their encoding into [`SubmissionEntry`]s.
//!
//! Every command is one 64-byte submission entry: an opcode, a stream and six 64-bit
//! argument words. [`Command::decode`] is the only way the broker turns untrusted entries into
//! commands; it rejects unknown opcodes, set reserved flags and impossible values, but cannot
//! know handles or pointers: those the broker checks against the client's own tables.

use crate::ring::SubmissionEntry;
use crate::{DevicePtr, ErrorCode, EventId, StreamId};

/// Opcode numbers (part of the wire format: append only).
pub mod opcode {
    pub const NOP: u16 = 0x00;
    pub const ALLOC: u16 = 0x01;
    pub const FREE: u16 = 0x02;
    pub const COPY_HTOD: u16 = 0x03;
    pub const COPY_DTOH: u16 = 0x04;
    pub const COPY_DTOD: u16 = 0x05;
    pub const MEMSET: u16 = 0x06;
    pub const STREAM_CREATE: u16 = 0x07;
    pub const STREAM_DESTROY: u16 = 0x08;
    pub const STREAM_SYNC: u16 = 0x09;
    pub const EVENT_CREATE: u16 = 0x0a;
    pub const EVENT_RECORD: u16 = 0x0b;
    pub const EVENT_QUERY: u16 = 0x0c;
    pub const EVENT_SYNC: u16 = 0x0d;
    pub const EVENT_ELAPSED: u16 = 0x0e;
    pub const EVENT_DESTROY: u16 = 0x0f;
    pub const CLIENT_SYNC: u16 = 0x10;
    pub const ITERATION_END: u16 = 0x11;
    pub const DECLARE_JOB: u16 = 0x12;
    pub const DECLARE_DEADLINE: u16 = 0x13;
    pub const ALLOC_AT: u16 = 0x14;
    pub const STREAM_CREATE_AS: u16 = 0x15;
    pub const EVENT_CREATE_AS: u16 = 0x16;
    pub const STREAM_WAIT_EVENT: u16 = 0x17;
    pub const STREAM_QUERY: u16 = 0x18;
    pub const MEMSET_WIDE: u16 = 0x19;
    pub const COPY_HTOD_STAGED: u16 = 0x1a;
    pub const COPY_DTOH_STAGED: u16 = 0x1b;
    pub const COPY_HTOD_HOST: u16 = 0x1c;
    pub const COPY_DTOH_HOST: u16 = 0x1d;
    pub const MEM_INFO: u16 = 0x1e;
    pub const LAUNCH_MODULE: u16 = 0x20;
    pub const LAUNCH_EX: u16 = 0x21;
    pub const FUNCTION_SET_ATTRIBUTE: u16 = 0x22;
    pub const OCCUPANCY: u16 = 0x23;
    pub const GOVERNED_RESERVE: u16 = 0x30;
    pub const GOVERNED_RELEASE: u16 = 0x31;
    pub const GOVERNED_TOKENS: u16 = 0x32;
    pub const GOVERNED_IDLE: u16 = 0x33;
    pub const GOVERNED_WEIGHT: u16 = 0x34;
    pub const KERNEL_FILL_F32: u16 = 0x40;
    pub const KERNEL_AXPY_F32: u16 = 0x41;
    pub const KERNEL_VEC_ADD_F32: u16 = 0x42;
    pub const KERNEL_REDUCE_SUM_F32: u16 = 0x43;
    pub const KERNEL_GEMM_F32: u16 = 0x44;
    pub const KERNEL_SPIN: u16 = 0x45;
    pub const KERNEL_GEMM_BF16: u16 = 0x46;
    pub const KERNEL_FAULT: u16 = 0x47;
}

/// Largest parameter block a module launch may carry (CUDA's own limit is 32 KiB).
pub const MAX_LAUNCH_PARAMS: u32 = 32 * 1024;

/// A built-in kernel with its arguments. All vectors are `f32`, `n` counts elements.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Kernel {
    /// `dst[i] = value` for `i < n`.
    FillF32 { dst: DevicePtr, n: u64, value: f32 },
    /// `y[i] = alpha * x[i] + y[i]`.
    AxpyF32 {
        x: DevicePtr,
        y: DevicePtr,
        n: u64,
        alpha: f32,
    },
    /// `c[i] = a[i] + b[i]`.
    VecAddF32 {
        a: DevicePtr,
        b: DevicePtr,
        c: DevicePtr,
        n: u64,
    },
    /// `out[0] = sum(x[0..n])`.
    ReduceSumF32 {
        x: DevicePtr,
        out: DevicePtr,
        n: u64,
    },
    /// `C = alpha * A·B + beta * C`, row-major: A is m×k, B is k×n, C is m×n.
    GemmF32 {
        a: DevicePtr,
        b: DevicePtr,
        c: DevicePtr,
        m: u32,
        n: u32,
        k: u32,
        alpha: f32,
        beta: f32,
    },
    /// Occupies `blocks` thread blocks for `micros` microseconds and does nothing else.
    Spin { micros: u64, blocks: u32 },
    /// `C = alpha * A·B + beta * C` with A (m×k) and B (k×n) in bfloat16 and C (m×n) in f32,
    /// row-major, accumulated in f32 (tensor cores on a GPU).
    GemmBf16 {
        a: DevicePtr,
        b: DevicePtr,
        c: DevicePtr,
        m: u32,
        n: u32,
        k: u32,
        alpha: f32,
        beta: f32,
    },
    /// Deliberately breaks the GPU, to test fault containment: `hang = false` writes to an
    /// illegal address (a sticky error that poisons the shared context), `hang = true` never
    /// finishes. Refused unless the broker runs with `--allow-fault-injection`.
    Fault { hang: bool },
}

/// Whether a kernel reads or writes a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
    ReadWrite,
}

/// One device range a built-in kernel touches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Operand {
    pub ptr: DevicePtr,
    pub bytes: u64,
    pub access: Access,
}

const F32: u64 = 4;

fn bytes_of(n: u64) -> Result<u64, ErrorCode> {
    n.checked_mul(F32).ok_or(ErrorCode::InvalidArgument)
}

impl Kernel {
    /// The device ranges this kernel reads and writes: the broker checks each one against
    /// the caller's allocations before launching.
    pub fn operands(&self) -> Result<Vec<Operand>, ErrorCode> {
        use Access::*;
        let op = |ptr, bytes, access| Operand { ptr, bytes, access };
        Ok(match *self {
            Kernel::FillF32 { dst, n, .. } => vec![op(dst, bytes_of(n)?, Write)],
            Kernel::AxpyF32 { x, y, n, .. } => {
                let b = bytes_of(n)?;
                vec![op(x, b, Read), op(y, b, ReadWrite)]
            }
            Kernel::VecAddF32 { a, b, c, n } => {
                let bytes = bytes_of(n)?;
                vec![op(a, bytes, Read), op(b, bytes, Read), op(c, bytes, Write)]
            }
            Kernel::ReduceSumF32 { x, out, n } => {
                vec![op(x, bytes_of(n)?, Read), op(out, F32, Write)]
            }
            Kernel::GemmF32 {
                a,
                b,
                c,
                m,
                n,
                k,
                beta,
                ..
            } => {
                let (m, n, k) = (m as u64, n as u64, k as u64);
                // Each product of two u32 fits in u64; the byte count (×4) may not.
                let c_access = if beta == 0.0 { Write } else { ReadWrite };
                vec![
                    op(a, bytes_of(m * k)?, Read),
                    op(b, bytes_of(k * n)?, Read),
                    op(c, bytes_of(m * n)?, c_access),
                ]
            }
            Kernel::GemmBf16 {
                a,
                b,
                c,
                m,
                n,
                k,
                beta,
                ..
            } => {
                let (m, n, k) = (m as u64, n as u64, k as u64);
                let half = |elems: u64| elems.checked_mul(2).ok_or(ErrorCode::InvalidArgument);
                let c_access = if beta == 0.0 { Write } else { ReadWrite };
                vec![
                    op(a, half(m * k)?, Read),
                    op(b, half(k * n)?, Read),
                    op(c, bytes_of(m * n)?, c_access),
                ]
            }
            Kernel::Spin { .. } | Kernel::Fault { .. } => vec![],
        })
    }

    /// A short name for logs and statistics.
    pub fn name(&self) -> &'static str {
        match self {
            Kernel::FillF32 { .. } => "fill_f32",
            Kernel::AxpyF32 { .. } => "axpy_f32",
            Kernel::VecAddF32 { .. } => "vec_add_f32",
            Kernel::ReduceSumF32 { .. } => "reduce_sum_f32",
            Kernel::GemmF32 { .. } => "gemm_f32",
            Kernel::Spin { .. } => "spin",
            Kernel::GemmBf16 { .. } => "gemm_bf16",
            Kernel::Fault { .. } => "fault",
        }
    }
}

/// Launch attributes a [`Command::LaunchEx`] carries at the start of its parameter block, in
/// the arena (the kernel's packed parameters follow it).
#[repr(C)]
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    zerocopy::FromBytes,
    zerocopy::IntoBytes,
    zerocopy::Immutable,
    zerocopy::KnownLayout,
)]
pub struct LaunchAttributes {
    /// Thread-block cluster dimensions; all zero for no clusters.
    pub cluster: [u32; 3],
    /// [`LAUNCH_COOPERATIVE`], [`LAUNCH_PROGRAMMATIC_SERIALIZATION`].
    pub flags: u32,
    pub _reserved: [u32; 4],
}

/// The launch is cooperative (its blocks may synchronize grid-wide).
pub const LAUNCH_COOPERATIVE: u32 = 1;
/// Programmatic dependent launch: the kernel may start before the previous one on its stream
/// finishes (it waits where its code says).
pub const LAUNCH_PROGRAMMATIC_SERIALIZATION: u32 = 2;
/// Bytes of [`LaunchAttributes`] before the parameters of a [`Command::LaunchEx`].
pub const LAUNCH_ATTRIBUTES_BYTES: u32 = std::mem::size_of::<LaunchAttributes>() as u32;
const _: () = assert!(LAUNCH_ATTRIBUTES_BYTES == 32);

/// What an [`Command::Occupancy`] asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OccupancyQuery {
    /// `cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags`.
    BlocksPerSm,
    /// `cuOccupancyAvailableDynamicSMemPerBlock` (the block size is `num_blocks` here).
    DynamicSmemPerBlock,
    /// `cuOccupancyMaxActiveClusters` (cluster dimensions are the launch's).
    MaxActiveClusters,
}

impl OccupancyQuery {
    fn code(self) -> u64 {
        match self {
            OccupancyQuery::BlocksPerSm => 0,
            OccupancyQuery::DynamicSmemPerBlock => 1,
            OccupancyQuery::MaxActiveClusters => 2,
        }
    }

    fn from_code(code: u64) -> Option<OccupancyQuery> {
        Some(match code {
            0 => OccupancyQuery::BlocksPerSm,
            1 => OccupancyQuery::DynamicSmemPerBlock,
            2 => OccupancyQuery::MaxActiveClusters,
            _ => return None,
        })
    }
}

/// A launch of a function from a module the client loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModuleLaunch {
    pub function: u64,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem_bytes: u32,
    /// Packed kernel parameters live in the data arena at this offset.
    pub params_offset: u64,
    pub params_len: u32,
}

/// Everything a client can ask of the broker over its submission ring.
///
/// Stream-ordered commands (copies, memset, launches, event records) complete when the broker
/// has accepted them onto the stream; their effect is complete once a later synchronization
/// (stream, event or client) completes. Errors a stream-ordered command meets while executing
/// are reported by that synchronization.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Command {
    /// Does nothing; measures the ring.
    Nop,
    /// Allocates device memory. Result: the device pointer.
    Alloc {
        bytes: u64,
    },
    /// Allocates device memory at exactly `ptr` (a client rebuilding its state after a GPU
    /// reset asks for the addresses its kernels' parameters hold). Result: `ptr`. Fails with
    /// [`ErrorCode::AddressUnavailable`] when any of the range is taken or the device cannot
    /// place memory there.
    AllocAt {
        bytes: u64,
        ptr: DevicePtr,
    },
    /// Frees an allocation (by its base pointer).
    Free {
        ptr: DevicePtr,
    },
    /// Copies `len` bytes from the arena to device memory.
    CopyHtoD {
        stream: StreamId,
        arena_offset: u64,
        dst: DevicePtr,
        len: u64,
    },
    /// Copies `len` bytes from device memory to the arena.
    CopyDtoH {
        stream: StreamId,
        src: DevicePtr,
        arena_offset: u64,
        len: u64,
    },
    /// Copies `len` bytes within device memory.
    CopyDtoD {
        stream: StreamId,
        src: DevicePtr,
        dst: DevicePtr,
        len: u64,
    },
    /// Sets `len` bytes of device memory to `value`.
    Memset {
        stream: StreamId,
        dst: DevicePtr,
        value: u8,
        len: u64,
    },
    /// Creates a stream. Result: its id.
    StreamCreate,
    StreamDestroy {
        stream: StreamId,
    },
    /// Completes when all earlier work on the stream is done; reports its first error.
    StreamSync {
        stream: StreamId,
    },
    /// Creates an event. Result: its id.
    EventCreate,
    /// Records the event at the current end of the stream.
    EventRecord {
        stream: StreamId,
        event: EventId,
    },
    /// Result: 1 when the event's work is done, else 0.
    EventQuery {
        event: EventId,
    },
    /// Completes when the event's work is done.
    EventSync {
        event: EventId,
    },
    /// Result: nanoseconds of device time from `start` to `end`.
    EventElapsed {
        start: EventId,
        end: EventId,
    },
    EventDestroy {
        event: EventId,
    },
    /// Completes when all of the client's work is done; reports its first error.
    ClientSync,
    /// Marks the end of one iteration (a training step, an inference request): the only
    /// point where SRTF/PACK switch jobs, and what deadlines are checked against. Result:
    /// the iteration's latency in ns as the scheduler saw it (0 under FIFO), and 1 in
    /// `result2` when it missed the declared deadline.
    IterationEnd,
    /// Declares the job's profile for SRTF/PACK and memory admission (all 0 withdraws it).
    DeclareJob {
        remaining_ns: u64,
        persistent_bytes: u64,
        ephemeral_bytes: u64,
    },
    /// Declares a periodic deadline per iteration (CudaMon); both 0 withdraw it.
    DeclareDeadline {
        period_ns: u64,
        deadline_ns: u64,
    },
    /// Launches a built-in kernel.
    Launch {
        stream: StreamId,
        kernel: Kernel,
    },
    /// Launches a module function (devices that can load modules only).
    LaunchModule {
        stream: StreamId,
        launch: ModuleLaunch,
    },
    /// A governed program (one that runs on its own CUDA context, under `gpushare run`) is
    /// about to allocate `bytes` of device memory itself: the broker counts them against the
    /// client's memory quota, or refuses with `OutOfQuota` and counts nothing.
    GovernedReserve {
        bytes: u64,
    },
    /// A governed program freed `bytes` it had reserved (never more than it holds).
    GovernedRelease {
        bytes: u64,
    },
    /// A governed program asks for launch tokens, reporting the `launched` kernels (of
    /// `blocks` thread blocks in all) it made since its last request. Completes when the
    /// scheduling policy lets it launch. Result: the tokens granted; result2: how long they
    /// stay valid in µs (low 32 bits), and [`GOVERNED_LEASE`] when the grant holds a place in
    /// the scheduler that the program gives back with `GovernedIdle` once its work is done.
    GovernedTokens {
        launched: u64,
        blocks: u64,
    },
    /// A governed program synchronized: the work of its last grant is done (the scheduler
    /// stops counting it in flight). Reports launches like `GovernedTokens`; grants nothing.
    GovernedIdle {
        launched: u64,
        blocks: u64,
    },
    /// A governed program asks for a fair-share weight below what the policy grants
    /// (`gpushare run --weight`); a larger one fails with `PermissionDenied`.
    GovernedWeight {
        weight: u32,
    },
    /// Creates a stream under an id the client chose (so that it need not wait for the
    /// answer); an id in use fails with `InvalidHandle`. `flags`: 1 = does not synchronize
    /// with stream 0 (CUDA's non-blocking streams); `priority` is the program's hint.
    StreamCreateAs {
        stream: StreamId,
        flags: u32,
        priority: i32,
    },
    /// Creates an event under an id the client chose. `flags` as `cuEventCreate`'s.
    EventCreateAs {
        event: EventId,
        flags: u32,
    },
    /// Work submitted to `stream` after this waits until `event`'s recorded work is done.
    StreamWaitEvent {
        stream: StreamId,
        event: EventId,
    },
    /// Result: 1 when all of the stream's work is done, else 0.
    StreamQuery {
        stream: StreamId,
    },
    /// Sets `count` elements of `elem_bytes` (1, 2 or 4) at `dst` to `value`.
    MemsetWide {
        stream: StreamId,
        dst: DevicePtr,
        value: u32,
        elem_bytes: u8,
        count: u64,
    },
    /// Copies `len` arena bytes to device memory. The broker has read the arena by the time
    /// this completes (the client may reuse the range), while the copy itself stays ordered
    /// on the stream.
    CopyHtoDStaged {
        stream: StreamId,
        arena_offset: u64,
        dst: DevicePtr,
        len: u64,
    },
    /// Copies `len` device bytes into the arena once the stream's earlier work is done, and
    /// completes only when they are there.
    CopyDtoHStaged {
        stream: StreamId,
        src: DevicePtr,
        arena_offset: u64,
        len: u64,
    },
    /// Copies from a shared host region (`ShareHostMemory`) to device memory, by DMA, ordered
    /// on the stream: the host bytes must stay as they are until the stream has done it.
    CopyHtoDHost {
        stream: StreamId,
        region: u32,
        offset: u64,
        dst: DevicePtr,
        len: u64,
    },
    /// Copies device memory into a shared host region, ordered on the stream.
    CopyDtoHHost {
        stream: StreamId,
        src: DevicePtr,
        region: u32,
        offset: u64,
        len: u64,
    },
    /// Result: (free, total) device bytes as this client sees them (its quota, if any).
    MemInfo,
    /// A module function launch whose parameter block starts with [`LaunchAttributes`].
    LaunchEx {
        stream: StreamId,
        launch: ModuleLaunch,
    },
    /// Sets a `CUfunction_attribute` of a function (sizes only grow: a function other
    /// sessions share keeps the largest any asked for).
    FunctionSetAttribute {
        function: u64,
        attribute: u32,
        value: i32,
    },
    /// Result: the answer to an occupancy query about `function`.
    Occupancy {
        function: u64,
        query: OccupancyQuery,
        block_size: u32,
        dynamic_smem: u64,
        flags: u32,
        cluster: [u32; 3],
    },
}

/// The six argument words of a module launch.
fn launch_words(launch: &ModuleLaunch) -> [u64; 6] {
    [
        launch.function,
        pack(launch.grid[0], launch.grid[1]),
        pack(launch.grid[2], launch.block[0]),
        pack(launch.block[1], launch.block[2]),
        pack(launch.shared_mem_bytes, launch.params_len),
        launch.params_offset,
    ]
}

/// A module launch from its argument words; its parameter block holds at least `header`
/// bytes before the kernel's parameters.
fn launch_of(a: &[u64; 6], header: u32) -> Result<ModuleLaunch, ErrorCode> {
    let launch = ModuleLaunch {
        function: a[0],
        grid: [lo(a[1]), hi(a[1]), lo(a[2])],
        block: [hi(a[2]), lo(a[3]), hi(a[3])],
        shared_mem_bytes: lo(a[4]),
        params_len: hi(a[4]),
        params_offset: a[5],
    };
    if launch.params_len > MAX_LAUNCH_PARAMS + header
        || launch.params_len < header
        || launch.grid.contains(&0)
        || launch.block.contains(&0)
    {
        return Err(ErrorCode::InvalidArgument);
    }
    Ok(launch)
}

/// Set in a `GovernedTokens` result2: the grant is a lease to end with `GovernedIdle`.
pub const GOVERNED_LEASE: u64 = 1 << 63;

fn lo(w: u64) -> u32 {
    w as u32
}
fn hi(w: u64) -> u32 {
    (w >> 32) as u32
}
fn pack(lo: u32, hi: u32) -> u64 {
    lo as u64 | (hi as u64) << 32
}
fn f32_of(bits: u32) -> f32 {
    f32::from_bits(bits)
}

impl Command {
    /// Encodes the command into a submission entry carrying `user_tag`.
    pub fn encode(&self, user_tag: u64) -> SubmissionEntry {
        use opcode::*;
        let mut e = SubmissionEntry {
            user_tag,
            ..Default::default()
        };
        let (op, stream, args): (u16, u32, [u64; 6]) = match *self {
            Command::Nop => (NOP, 0, [0; 6]),
            Command::Alloc { bytes } => (ALLOC, 0, [bytes, 0, 0, 0, 0, 0]),
            Command::AllocAt { bytes, ptr } => (ALLOC_AT, 0, [bytes, ptr, 0, 0, 0, 0]),
            Command::Free { ptr } => (FREE, 0, [ptr, 0, 0, 0, 0, 0]),
            Command::CopyHtoD {
                stream,
                arena_offset,
                dst,
                len,
            } => (COPY_HTOD, stream, [arena_offset, dst, len, 0, 0, 0]),
            Command::CopyDtoH {
                stream,
                src,
                arena_offset,
                len,
            } => (COPY_DTOH, stream, [src, arena_offset, len, 0, 0, 0]),
            Command::CopyDtoD {
                stream,
                src,
                dst,
                len,
            } => (COPY_DTOD, stream, [src, dst, len, 0, 0, 0]),
            Command::Memset {
                stream,
                dst,
                value,
                len,
            } => (MEMSET, stream, [dst, value as u64, len, 0, 0, 0]),
            Command::StreamCreate => (STREAM_CREATE, 0, [0; 6]),
            Command::StreamDestroy { stream } => (STREAM_DESTROY, stream, [0; 6]),
            Command::StreamSync { stream } => (STREAM_SYNC, stream, [0; 6]),
            Command::EventCreate => (EVENT_CREATE, 0, [0; 6]),
            Command::EventRecord { stream, event } => {
                (EVENT_RECORD, stream, [event as u64, 0, 0, 0, 0, 0])
            }
            Command::EventQuery { event } => (EVENT_QUERY, 0, [event as u64, 0, 0, 0, 0, 0]),
            Command::EventSync { event } => (EVENT_SYNC, 0, [event as u64, 0, 0, 0, 0, 0]),
            Command::EventElapsed { start, end } => {
                (EVENT_ELAPSED, 0, [start as u64, end as u64, 0, 0, 0, 0])
            }
            Command::EventDestroy { event } => (EVENT_DESTROY, 0, [event as u64, 0, 0, 0, 0, 0]),
            Command::ClientSync => (CLIENT_SYNC, 0, [0; 6]),
            Command::IterationEnd => (ITERATION_END, 0, [0; 6]),
            Command::DeclareJob {
                remaining_ns,
                persistent_bytes,
                ephemeral_bytes,
            } => (
                DECLARE_JOB,
                0,
                [remaining_ns, persistent_bytes, ephemeral_bytes, 0, 0, 0],
            ),
            Command::DeclareDeadline {
                period_ns,
                deadline_ns,
            } => (DECLARE_DEADLINE, 0, [period_ns, deadline_ns, 0, 0, 0, 0]),
            Command::GovernedReserve { bytes } => (GOVERNED_RESERVE, 0, [bytes, 0, 0, 0, 0, 0]),
            Command::GovernedRelease { bytes } => (GOVERNED_RELEASE, 0, [bytes, 0, 0, 0, 0, 0]),
            Command::GovernedTokens { launched, blocks } => {
                (GOVERNED_TOKENS, 0, [launched, blocks, 0, 0, 0, 0])
            }
            Command::GovernedIdle { launched, blocks } => {
                (GOVERNED_IDLE, 0, [launched, blocks, 0, 0, 0, 0])
            }
            Command::GovernedWeight { weight } => {
                (GOVERNED_WEIGHT, 0, [weight as u64, 0, 0, 0, 0, 0])
            }
            Command::LaunchModule { stream, launch } => {
                (LAUNCH_MODULE, stream, launch_words(&launch))
            }
            Command::LaunchEx { stream, launch } => (LAUNCH_EX, stream, launch_words(&launch)),
            Command::StreamCreateAs {
                stream,
                flags,
                priority,
            } => (
                STREAM_CREATE_AS,
                stream,
                [pack(flags, priority as u32), 0, 0, 0, 0, 0],
            ),
            Command::EventCreateAs { event, flags } => {
                (EVENT_CREATE_AS, 0, [event as u64, flags as u64, 0, 0, 0, 0])
            }
            Command::StreamWaitEvent { stream, event } => {
                (STREAM_WAIT_EVENT, stream, [event as u64, 0, 0, 0, 0, 0])
            }
            Command::StreamQuery { stream } => (STREAM_QUERY, stream, [0; 6]),
            Command::MemsetWide {
                stream,
                dst,
                value,
                elem_bytes,
                count,
            } => (
                MEMSET_WIDE,
                stream,
                [dst, value as u64, elem_bytes as u64, count, 0, 0],
            ),
            Command::CopyHtoDStaged {
                stream,
                arena_offset,
                dst,
                len,
            } => (COPY_HTOD_STAGED, stream, [arena_offset, dst, len, 0, 0, 0]),
            Command::CopyDtoHStaged {
                stream,
                src,
                arena_offset,
                len,
            } => (COPY_DTOH_STAGED, stream, [src, arena_offset, len, 0, 0, 0]),
            Command::CopyHtoDHost {
                stream,
                region,
                offset,
                dst,
                len,
            } => (
                COPY_HTOD_HOST,
                stream,
                [region as u64, offset, dst, len, 0, 0],
            ),
            Command::CopyDtoHHost {
                stream,
                src,
                region,
                offset,
                len,
            } => (
                COPY_DTOH_HOST,
                stream,
                [src, region as u64, offset, len, 0, 0],
            ),
            Command::MemInfo => (MEM_INFO, 0, [0; 6]),
            Command::FunctionSetAttribute {
                function,
                attribute,
                value,
            } => (
                FUNCTION_SET_ATTRIBUTE,
                0,
                [function, attribute as u64, value as u32 as u64, 0, 0, 0],
            ),
            Command::Occupancy {
                function,
                query,
                block_size,
                dynamic_smem,
                flags,
                cluster,
            } => (
                OCCUPANCY,
                0,
                [
                    function,
                    query.code(),
                    pack(block_size, flags),
                    dynamic_smem,
                    pack(cluster[0], cluster[1]),
                    cluster[2] as u64,
                ],
            ),
            Command::Launch { stream, kernel } => {
                let (op, args) = match kernel {
                    Kernel::FillF32 { dst, n, value } => {
                        (KERNEL_FILL_F32, [dst, n, value.to_bits() as u64, 0, 0, 0])
                    }
                    Kernel::AxpyF32 { x, y, n, alpha } => {
                        (KERNEL_AXPY_F32, [x, y, n, alpha.to_bits() as u64, 0, 0])
                    }
                    Kernel::VecAddF32 { a, b, c, n } => (KERNEL_VEC_ADD_F32, [a, b, c, n, 0, 0]),
                    Kernel::ReduceSumF32 { x, out, n } => {
                        (KERNEL_REDUCE_SUM_F32, [x, out, n, 0, 0, 0])
                    }
                    Kernel::GemmF32 {
                        a,
                        b,
                        c,
                        m,
                        n,
                        k,
                        alpha,
                        beta,
                    } => (
                        KERNEL_GEMM_F32,
                        [
                            a,
                            b,
                            c,
                            pack(m, n),
                            k as u64,
                            pack(alpha.to_bits(), beta.to_bits()),
                        ],
                    ),
                    Kernel::Spin { micros, blocks } => {
                        (KERNEL_SPIN, [micros, blocks as u64, 0, 0, 0, 0])
                    }
                    Kernel::Fault { hang } => (KERNEL_FAULT, [hang as u64, 0, 0, 0, 0, 0]),
                    Kernel::GemmBf16 {
                        a,
                        b,
                        c,
                        m,
                        n,
                        k,
                        alpha,
                        beta,
                    } => (
                        KERNEL_GEMM_BF16,
                        [
                            a,
                            b,
                            c,
                            pack(m, n),
                            k as u64,
                            pack(alpha.to_bits(), beta.to_bits()),
                        ],
                    ),
                };
                (op, stream, args)
            }
        };
        e.opcode = op;
        e.stream = stream;
        e.args = args;
        e
    }

    /// Decodes an untrusted entry. Fails with [`ErrorCode::InvalidCommand`] for an unknown
    /// opcode or set reserved flags, [`ErrorCode::InvalidArgument`] for impossible values.
    pub fn decode(e: &SubmissionEntry) -> Result<Command, ErrorCode> {
        use opcode::*;
        if e.flags != 0 {
            return Err(ErrorCode::InvalidCommand);
        }
        let a = e.args;
        let s = e.stream;
        let id = |w: u64| u32::try_from(w).map_err(|_| ErrorCode::InvalidHandle);
        let launch = |kernel| Command::Launch { stream: s, kernel };
        Ok(match e.opcode {
            NOP => Command::Nop,
            ALLOC => Command::Alloc { bytes: a[0] },
            ALLOC_AT => Command::AllocAt {
                bytes: a[0],
                ptr: a[1],
            },
            FREE => Command::Free { ptr: a[0] },
            COPY_HTOD => Command::CopyHtoD {
                stream: s,
                arena_offset: a[0],
                dst: a[1],
                len: a[2],
            },
            COPY_DTOH => Command::CopyDtoH {
                stream: s,
                src: a[0],
                arena_offset: a[1],
                len: a[2],
            },
            COPY_DTOD => Command::CopyDtoD {
                stream: s,
                src: a[0],
                dst: a[1],
                len: a[2],
            },
            MEMSET => Command::Memset {
                stream: s,
                dst: a[0],
                value: u8::try_from(a[1]).map_err(|_| ErrorCode::InvalidArgument)?,
                len: a[2],
            },
            STREAM_CREATE => Command::StreamCreate,
            STREAM_DESTROY => Command::StreamDestroy { stream: s },
            STREAM_SYNC => Command::StreamSync { stream: s },
            EVENT_CREATE => Command::EventCreate,
            EVENT_RECORD => Command::EventRecord {
                stream: s,
                event: id(a[0])?,
            },
            EVENT_QUERY => Command::EventQuery { event: id(a[0])? },
            EVENT_SYNC => Command::EventSync { event: id(a[0])? },
            EVENT_ELAPSED => Command::EventElapsed {
                start: id(a[0])?,
                end: id(a[1])?,
            },
            EVENT_DESTROY => Command::EventDestroy { event: id(a[0])? },
            CLIENT_SYNC => Command::ClientSync,
            ITERATION_END => Command::IterationEnd,
            DECLARE_JOB => Command::DeclareJob {
                remaining_ns: a[0],
                persistent_bytes: a[1],
                ephemeral_bytes: a[2],
            },
            DECLARE_DEADLINE => {
                if a[1] > a[0] && a[0] != 0 {
                    return Err(ErrorCode::InvalidArgument); // a deadline past the period
                }
                Command::DeclareDeadline {
                    period_ns: a[0],
                    deadline_ns: a[1],
                }
            }
            LAUNCH_MODULE => Command::LaunchModule {
                stream: s,
                launch: launch_of(&a, 0)?,
            },
            LAUNCH_EX => Command::LaunchEx {
                stream: s,
                launch: launch_of(&a, LAUNCH_ATTRIBUTES_BYTES)?,
            },
            STREAM_CREATE_AS => {
                if a[1..].iter().any(|&w| w != 0) {
                    return Err(ErrorCode::InvalidArgument);
                }
                Command::StreamCreateAs {
                    stream: s,
                    flags: lo(a[0]),
                    priority: hi(a[0]) as i32,
                }
            }
            EVENT_CREATE_AS => Command::EventCreateAs {
                event: id(a[0])?,
                flags: u32::try_from(a[1]).map_err(|_| ErrorCode::InvalidArgument)?,
            },
            STREAM_WAIT_EVENT => Command::StreamWaitEvent {
                stream: s,
                event: id(a[0])?,
            },
            STREAM_QUERY => Command::StreamQuery { stream: s },
            MEMSET_WIDE => Command::MemsetWide {
                stream: s,
                dst: a[0],
                value: u32::try_from(a[1]).map_err(|_| ErrorCode::InvalidArgument)?,
                elem_bytes: match a[2] {
                    1 | 2 | 4 => a[2] as u8,
                    _ => return Err(ErrorCode::InvalidArgument),
                },
                count: a[3],
            },
            COPY_HTOD_STAGED => Command::CopyHtoDStaged {
                stream: s,
                arena_offset: a[0],
                dst: a[1],
                len: a[2],
            },
            COPY_DTOH_STAGED => Command::CopyDtoHStaged {
                stream: s,
                src: a[0],
                arena_offset: a[1],
                len: a[2],
            },
            COPY_HTOD_HOST => Command::CopyHtoDHost {
                stream: s,
                region: id(a[0])?,
                offset: a[1],
                dst: a[2],
                len: a[3],
            },
            COPY_DTOH_HOST => Command::CopyDtoHHost {
                stream: s,
                src: a[0],
                region: id(a[1])?,
                offset: a[2],
                len: a[3],
            },
            MEM_INFO => Command::MemInfo,
            FUNCTION_SET_ATTRIBUTE => Command::FunctionSetAttribute {
                function: a[0],
                attribute: u32::try_from(a[1]).map_err(|_| ErrorCode::InvalidArgument)?,
                value: u32::try_from(a[2]).map_err(|_| ErrorCode::InvalidArgument)? as i32,
            },
            OCCUPANCY => Command::Occupancy {
                function: a[0],
                query: OccupancyQuery::from_code(a[1]).ok_or(ErrorCode::InvalidArgument)?,
                block_size: lo(a[2]),
                flags: hi(a[2]),
                dynamic_smem: a[3],
                cluster: [
                    lo(a[4]),
                    hi(a[4]),
                    u32::try_from(a[5]).map_err(|_| ErrorCode::InvalidArgument)?,
                ],
            },
            GOVERNED_RESERVE => Command::GovernedReserve { bytes: a[0] },
            GOVERNED_RELEASE => Command::GovernedRelease { bytes: a[0] },
            GOVERNED_TOKENS => Command::GovernedTokens {
                launched: a[0],
                blocks: a[1],
            },
            GOVERNED_IDLE => Command::GovernedIdle {
                launched: a[0],
                blocks: a[1],
            },
            GOVERNED_WEIGHT => Command::GovernedWeight {
                weight: u32::try_from(a[0]).map_err(|_| ErrorCode::InvalidArgument)?,
            },
            KERNEL_FILL_F32 => launch(Kernel::FillF32 {
                dst: a[0],
                n: a[1],
                value: f32_of(lo(a[2])),
            }),
            KERNEL_AXPY_F32 => launch(Kernel::AxpyF32 {
                x: a[0],
                y: a[1],
                n: a[2],
                alpha: f32_of(lo(a[3])),
            }),
            KERNEL_VEC_ADD_F32 => launch(Kernel::VecAddF32 {
                a: a[0],
                b: a[1],
                c: a[2],
                n: a[3],
            }),
            KERNEL_REDUCE_SUM_F32 => launch(Kernel::ReduceSumF32 {
                x: a[0],
                out: a[1],
                n: a[2],
            }),
            KERNEL_GEMM_F32 => launch(Kernel::GemmF32 {
                a: a[0],
                b: a[1],
                c: a[2],
                m: lo(a[3]),
                n: hi(a[3]),
                k: u32::try_from(a[4]).map_err(|_| ErrorCode::InvalidArgument)?,
                alpha: f32_of(lo(a[5])),
                beta: f32_of(hi(a[5])),
            }),
            KERNEL_GEMM_BF16 => launch(Kernel::GemmBf16 {
                a: a[0],
                b: a[1],
                c: a[2],
                m: lo(a[3]),
                n: hi(a[3]),
                k: u32::try_from(a[4]).map_err(|_| ErrorCode::InvalidArgument)?,
                alpha: f32_of(lo(a[5])),
                beta: f32_of(hi(a[5])),
            }),
            KERNEL_SPIN => launch(Kernel::Spin {
                micros: a[0],
                blocks: u32::try_from(a[1]).map_err(|_| ErrorCode::InvalidArgument)?,
            }),
            KERNEL_FAULT => launch(Kernel::Fault {
                hang: match a[0] {
                    0 => false,
                    1 => true,
                    _ => return Err(ErrorCode::InvalidArgument),
                },
            }),
            _ => return Err(ErrorCode::InvalidCommand),
        })
    }

    /// Whether the command is ordered on a stream (and so completes when accepted).
    pub fn stream(&self) -> Option<StreamId> {
        match *self {
            Command::CopyHtoD { stream, .. }
            | Command::CopyDtoH { stream, .. }
            | Command::CopyDtoD { stream, .. }
            | Command::Memset { stream, .. }
            | Command::EventRecord { stream, .. }
            | Command::Launch { stream, .. }
            | Command::LaunchModule { stream, .. }
            | Command::LaunchEx { stream, .. }
            | Command::StreamWaitEvent { stream, .. }
            | Command::MemsetWide { stream, .. }
            | Command::CopyHtoDStaged { stream, .. }
            | Command::CopyDtoHStaged { stream, .. }
            | Command::CopyHtoDHost { stream, .. }
            | Command::CopyDtoHHost { stream, .. } => Some(stream),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn samples() -> Vec<Command> {
        crate::fuzzing::commands()
    }

    #[test]
    fn every_command_round_trips_with_its_tag() {
        for (i, cmd) in samples().into_iter().enumerate() {
            let entry = cmd.encode(i as u64 * 31);
            assert_eq!(entry.user_tag, i as u64 * 31);
            assert_eq!(Command::decode(&entry), Ok(cmd), "{cmd:?}");
        }
    }

    #[test]
    fn unknown_opcodes_and_flags_are_rejected() {
        let mut e = Command::Nop.encode(1);
        e.opcode = 0x7fff;
        assert_eq!(Command::decode(&e), Err(ErrorCode::InvalidCommand));
        let mut e = Command::Nop.encode(1);
        e.flags = 1;
        assert_eq!(Command::decode(&e), Err(ErrorCode::InvalidCommand));
    }

    #[test]
    fn operand_sizes_do_not_overflow() {
        let k = Kernel::FillF32 {
            dst: 0,
            n: u64::MAX,
            value: 0.0,
        };
        assert_eq!(k.operands(), Err(ErrorCode::InvalidArgument));
        let g = Kernel::GemmF32 {
            a: 0,
            b: 0,
            c: 0,
            m: u32::MAX,
            n: u32::MAX,
            k: u32::MAX,
            alpha: 1.0,
            beta: 0.0,
        };
        assert_eq!(g.operands(), Err(ErrorCode::InvalidArgument));
        let g = Kernel::GemmF32 {
            a: 0,
            b: 0,
            c: 0,
            m: 64,
            n: 32,
            k: 16,
            alpha: 1.0,
            beta: 0.0,
        };
        let ops = g.operands().expect("small sizes");
        assert_eq!(
            ops.iter().map(|o| o.bytes).collect::<Vec<_>>(),
            [64 * 16 * 4, 16 * 32 * 4, 64 * 32 * 4]
        );
    }

    proptest! {
        /// Decoding arbitrary bytes never panics, and whatever decodes re-encodes to an entry
        /// that decodes to the same command.
        #[test]
        fn decode_is_total(bytes in proptest::collection::vec(any::<u8>(), 64)) {
            use zerocopy::FromBytes;
            let entry = SubmissionEntry::read_from_bytes(&bytes).expect("64 bytes");
            if let Ok(cmd) = Command::decode(&entry) {
                let again = cmd.encode(entry.user_tag);
                let back = Command::decode(&again).expect("re-encoded command decodes");
                // NaN payloads compare unequal; compare encodings instead.
                prop_assert_eq!(back.encode(0), cmd.encode(0));
            }
        }
    }
}

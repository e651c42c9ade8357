//! Typed commands and their encoding into [`SubmissionEntry`](crate::ring::SubmissionEntry)s.
//!
//! Every command is one 64-byte submission entry: an opcode, a stream and six 64-bit
//! argument words. [`Command::decode`] is the only way the broker turns untrusted entries into
//! commands; it rejects unknown opcodes, set reserved flags and impossible values, but cannot
//! know handles or pointers: those the broker checks against the client's own tables.
//!
//! Where each part lives: [`opcode`] (the numbers), `kernel.rs` (the built-in [`Kernel`]s and
//! the device ranges each touches), `launch.rs` (module launches: their argument words, launch
//! attributes, occupancy queries), `encode.rs` ([`Command::encode`]) and `decode.rs`
//! ([`Command::decode`], the untrusted side).

mod decode;
mod encode;
mod kernel;
mod launch;
pub mod opcode;

pub use self::kernel::{Access, Kernel, Operand};
pub use self::launch::{
    LAUNCH_ATTRIBUTES_BYTES, LAUNCH_COOPERATIVE, LAUNCH_PROGRAMMATIC_SERIALIZATION,
    LaunchAttributes, MAX_LAUNCH_PARAMS, ModuleLaunch, OccupancyQuery, shape_is_valid,
};
use crate::{DevicePtr, EventId, GraphId, StreamId};

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
    ///
    /// [`ErrorCode::AddressUnavailable`]: crate::ErrorCode::AddressUnavailable
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
    /// A governed program that connected again (its broker restarted, or it lost it) counts
    /// the `bytes` of device memory it already holds: counted whatever the quota (they are
    /// allocated; only new reservations are refused past it).
    GovernedHeld {
        bytes: u64,
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
    /// Reserves `size` bytes of device address space (whole granules) aligned to `align`
    /// (0: the granule), at `hint` if that is free (`cuMemAddressReserve`). Result: where.
    MemReserve {
        size: u64,
        align: u64,
        hint: DevicePtr,
    },
    /// Gives back a reservation; nothing may be mapped in it (`cuMemAddressFree`).
    MemUnreserve {
        ptr: DevicePtr,
        size: u64,
    },
    /// Makes `size` bytes of physical memory (whole granules), charged to the quota
    /// (`cuMemCreate`). Result: its handle.
    MemCreate {
        size: u64,
    },
    /// Lets go of a physical-memory handle; the memory goes once nothing maps it either.
    MemRelease {
        handle: u64,
    },
    /// Maps `size` bytes of `handle`'s memory at `ptr`, inside a reservation of this
    /// client's, readable and writable by the device (`cuMemMap` with `cuMemSetAccess`).
    MemMap {
        ptr: DevicePtr,
        size: u64,
        handle: u64,
    },
    /// Unmaps `[ptr, ptr + size)`, which whole mappings must make up (`cuMemUnmap`). The
    /// device finishes the client's work first.
    MemUnmap {
        ptr: DevicePtr,
        size: u64,
    },
    /// Shares the allocation holding `ptr` with the user's other processes on this device's
    /// context (`cuIpcGetMemHandle`). Result: a token (low and high words) that
    /// [`Command::IpcOpenMemory`] takes.
    IpcExportMemory {
        ptr: DevicePtr,
    },
    /// Opens memory another process of the same user shared (`cuIpcOpenMemHandle`). Result:
    /// its base address (the same as in the exporter: one context) and size.
    IpcOpenMemory {
        token_lo: u64,
        token_hi: u64,
    },
    /// Closes memory [`Command::IpcOpenMemory`] opened, by its base address.
    IpcCloseMemory {
        ptr: DevicePtr,
    },
    /// Shares an event (`cuIpcGetEventHandle`). Result: a token.
    IpcExportEvent {
        event: EventId,
    },
    /// Opens an event another process of the same user shared, as this client's `event`
    /// (`cuIpcOpenEventHandle`).
    IpcOpenEvent {
        token_lo: u64,
        token_hi: u64,
        event: EventId,
    },
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
    /// Launches an instantiated graph (`ClientMessage::MakeGraph`) on `stream` as one unit.
    LaunchGraph {
        stream: StreamId,
        graph: GraphId,
    },
    /// New parameters for nodes of an instantiated graph, for its launches after this one:
    /// encoded `graph::GraphChange`s in the arena.
    UpdateGraph {
        graph: GraphId,
        params_offset: u64,
        params_len: u32,
    },
    /// A point where the client runs a host function in stream order (`cuLaunchHostFunc`):
    /// the stream writes `value` (32 bits) at `done` when its earlier work is done, then waits
    /// until the 32 bits at `go` are at least `value`. Both are page-locked host memory the
    /// client shares.
    StreamHostPoint {
        stream: StreamId,
        done: DevicePtr,
        go: DevicePtr,
        value: u32,
    },
    /// Destroys an instantiated graph, after the launches of it queued before this.
    DropGraph {
        graph: GraphId,
    },
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

    #[test]
    fn every_command_round_trips_with_its_tag() {
        for (i, cmd) in crate::fuzzing::commands().into_iter().enumerate() {
            let entry = cmd.encode(i as u64 * 31);
            assert_eq!(entry.user_tag, i as u64 * 31);
            assert_eq!(Command::decode(&entry), Ok(cmd), "{cmd:?}");
        }
    }

    #[test]
    fn stream_ordered_commands_name_their_stream_and_others_none() {
        let copy = Command::CopyDtoD {
            stream: 3,
            dst: 0x1000,
            src: 0x2000,
            len: 16,
        };
        assert_eq!(copy.stream(), Some(3));
        let launch = Command::Launch {
            stream: 5,
            kernel: Kernel::Spin {
                micros: 1,
                blocks: 1,
            },
        };
        assert_eq!(launch.stream(), Some(5));
        assert_eq!(Command::Alloc { bytes: 1 }.stream(), None);
        assert_eq!(Command::StreamSync { stream: 2 }.stream(), None);
        assert_eq!(Command::ClientSync.stream(), None);
    }

    #[test]
    fn words_split_and_join_as_the_wire_lays_them_out() {
        let w = pack(0xdead_beef, 0x0123_4567);
        assert_eq!(w, 0x0123_4567_dead_beef);
        assert_eq!((lo(w), hi(w)), (0xdead_beef, 0x0123_4567));
        assert_eq!(f32_of(1.5f32.to_bits()), 1.5);
    }
}

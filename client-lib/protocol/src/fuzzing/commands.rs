//! Sample commands: one of each command and built-in kernel.

use crate::command::{Command, Kernel, ModuleLaunch};

pub(super) fn command_variant(c: &Command) -> &'static str {
    // Exhaustive on purpose: a new command must get a seed here.
    match c {
        Command::Nop => "nop",
        Command::Alloc { .. } => "alloc",
        Command::AllocAt { .. } => "alloc_at",
        Command::Free { .. } => "free",
        Command::CopyHtoD { .. } => "copy_htod",
        Command::CopyDtoH { .. } => "copy_dtoh",
        Command::CopyDtoD { .. } => "copy_dtod",
        Command::Memset { .. } => "memset",
        Command::StreamCreate => "stream_create",
        Command::StreamDestroy { .. } => "stream_destroy",
        Command::StreamSync { .. } => "stream_sync",
        Command::EventCreate => "event_create",
        Command::EventRecord { .. } => "event_record",
        Command::EventQuery { .. } => "event_query",
        Command::EventSync { .. } => "event_sync",
        Command::EventElapsed { .. } => "event_elapsed",
        Command::EventDestroy { .. } => "event_destroy",
        Command::ClientSync => "client_sync",
        Command::IterationEnd => "iteration_end",
        Command::DeclareJob { .. } => "declare_job",
        Command::DeclareDeadline { .. } => "declare_deadline",
        // Named by `Kernel::name`, which is exhaustive like this match.
        Command::Launch { kernel, .. } => kernel.name(),
        Command::LaunchModule { .. } => "launch_module",
        Command::GovernedReserve { .. } => "governed_reserve",
        Command::GovernedRelease { .. } => "governed_release",
        Command::GovernedTokens { .. } => "governed_tokens",
        Command::GovernedIdle { .. } => "governed_idle",
        Command::GovernedWeight { .. } => "governed_weight",
        Command::GovernedHeld { .. } => "governed_held",
        Command::StreamCreateAs { .. } => "stream_create_as",
        Command::EventCreateAs { .. } => "event_create_as",
        Command::StreamWaitEvent { .. } => "stream_wait_event",
        Command::StreamQuery { .. } => "stream_query",
        Command::MemsetWide { .. } => "memset_wide",
        Command::CopyHtoDStaged { .. } => "copy_htod_staged",
        Command::CopyDtoHStaged { .. } => "copy_dtoh_staged",
        Command::CopyHtoDHost { .. } => "copy_htod_host",
        Command::CopyDtoHHost { .. } => "copy_dtoh_host",
        Command::MemInfo => "mem_info",
        Command::LaunchEx { .. } => "launch_ex",
        Command::FunctionSetAttribute { .. } => "function_set_attribute",
        Command::Occupancy { .. } => "occupancy",
    }
}

/// One of each command and built-in kernel.
pub fn commands() -> Vec<Command> {
    let launch = |stream, kernel| Command::Launch { stream, kernel };
    vec![
        Command::Nop,
        Command::Alloc { bytes: 1 << 40 },
        Command::AllocAt {
            bytes: 4096,
            ptr: 0x7000_0000_0100,
        },
        Command::Free { ptr: 0xdead_beef },
        Command::CopyHtoD {
            stream: 3,
            arena_offset: 4096,
            dst: 77,
            len: 5,
        },
        Command::CopyDtoH {
            stream: 1,
            src: 9,
            arena_offset: 8,
            len: 7,
        },
        Command::CopyDtoD {
            stream: 2,
            src: 1,
            dst: 2,
            len: 3,
        },
        Command::Memset {
            stream: 0,
            dst: 5,
            value: 0xab,
            len: 9,
        },
        Command::StreamCreate,
        Command::StreamDestroy { stream: 4 },
        Command::StreamSync { stream: 4 },
        Command::EventCreate,
        Command::EventRecord {
            stream: 1,
            event: 2,
        },
        Command::EventQuery { event: 2 },
        Command::EventSync { event: 2 },
        Command::EventElapsed { start: 1, end: 2 },
        Command::EventDestroy { event: 2 },
        Command::ClientSync,
        Command::IterationEnd,
        Command::DeclareJob {
            remaining_ns: 30_000_000_000,
            persistent_bytes: 1 << 30,
            ephemeral_bytes: 1 << 28,
        },
        Command::DeclareDeadline {
            period_ns: 33_000_000,
            deadline_ns: 20_000_000,
        },
        launch(
            1,
            Kernel::FillF32 {
                dst: 1,
                n: 2,
                value: 1.5,
            },
        ),
        launch(
            1,
            Kernel::AxpyF32 {
                x: 1,
                y: 2,
                n: 3,
                alpha: -2.0,
            },
        ),
        launch(
            1,
            Kernel::VecAddF32 {
                a: 1,
                b: 2,
                c: 3,
                n: 4,
            },
        ),
        launch(1, Kernel::ReduceSumF32 { x: 1, out: 2, n: 3 }),
        launch(
            1,
            Kernel::GemmF32 {
                a: 1,
                b: 2,
                c: 3,
                m: 4,
                n: 5,
                k: 6,
                alpha: 1.0,
                beta: 0.5,
            },
        ),
        launch(
            9,
            Kernel::Spin {
                micros: 100,
                blocks: 132,
            },
        ),
        launch(
            3,
            Kernel::GemmBf16 {
                a: 1,
                b: 2,
                c: 3,
                m: 7,
                n: 8,
                k: 9,
                alpha: 2.0,
                beta: 0.0,
            },
        ),
        launch(0, Kernel::Fault { hang: true }),
        Command::LaunchModule {
            stream: 2,
            launch: ModuleLaunch {
                function: 7,
                grid: [1, 2, 3],
                block: [32, 4, 1],
                shared_mem_bytes: 1024,
                params_offset: 64,
                params_len: 24,
            },
        },
        Command::GovernedReserve { bytes: 3 << 30 },
        Command::GovernedRelease { bytes: 1 << 20 },
        Command::GovernedTokens {
            launched: 64,
            blocks: 8192,
        },
        Command::GovernedIdle {
            launched: 3,
            blocks: 96,
        },
        Command::GovernedWeight { weight: 2 },
        Command::GovernedHeld { bytes: 1 << 20 },
        Command::StreamCreateAs {
            stream: 1 << 20,
            flags: 1,
            priority: -1,
        },
        Command::EventCreateAs {
            event: 1 << 20,
            flags: 2,
        },
        Command::StreamWaitEvent {
            stream: 3,
            event: 4,
        },
        Command::StreamQuery { stream: 3 },
        Command::MemsetWide {
            stream: 0,
            dst: 0x7000_0000_0000,
            value: 0x3f80_0000,
            elem_bytes: 4,
            count: 1 << 20,
        },
        Command::CopyHtoDStaged {
            stream: 1,
            arena_offset: 8192,
            dst: 0x7000_0000_0000,
            len: 4096,
        },
        Command::CopyDtoHStaged {
            stream: 1,
            src: 0x7000_0000_0000,
            arena_offset: 0,
            len: 64,
        },
        Command::CopyHtoDHost {
            stream: 2,
            region: 1,
            offset: 4096,
            dst: 0x7000_0000_1000,
            len: 1 << 20,
        },
        Command::CopyDtoHHost {
            stream: 2,
            src: 0x7000_0000_1000,
            region: 1,
            offset: 0,
            len: 8,
        },
        Command::MemInfo,
        Command::LaunchEx {
            stream: 5,
            launch: ModuleLaunch {
                function: 9,
                grid: [132, 1, 1],
                block: [384, 1, 1],
                shared_mem_bytes: 200 * 1024,
                params_offset: 128,
                params_len: crate::command::LAUNCH_ATTRIBUTES_BYTES + 40,
            },
        },
        Command::FunctionSetAttribute {
            function: 9,
            attribute: 8,
            value: 200 * 1024,
        },
        Command::Occupancy {
            function: 9,
            query: crate::command::OccupancyQuery::MaxActiveClusters,
            block_size: 384,
            dynamic_smem: 0,
            flags: 0,
            cluster: [2, 1, 1],
        },
    ]
}

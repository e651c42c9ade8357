//! An untrusted submission entry into a [`Command`], or the reason it is not one.

use super::launch::launch_of;
use super::{Command, Kernel, LAUNCH_ATTRIBUTES_BYTES, OccupancyQuery, f32_of, hi, lo, opcode};
use crate::ErrorCode;
use crate::ring::SubmissionEntry;

impl Command {
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
            MEM_RESERVE => Command::MemReserve {
                size: a[0],
                align: a[1],
                hint: a[2],
            },
            MEM_UNRESERVE => Command::MemUnreserve {
                ptr: a[0],
                size: a[1],
            },
            MEM_CREATE => Command::MemCreate { size: a[0] },
            MEM_RELEASE => Command::MemRelease { handle: a[0] },
            MEM_MAP => Command::MemMap {
                ptr: a[0],
                size: a[1],
                handle: a[2],
            },
            MEM_UNMAP => Command::MemUnmap {
                ptr: a[0],
                size: a[1],
            },
            IPC_EXPORT_MEMORY => Command::IpcExportMemory { ptr: a[0] },
            IPC_OPEN_MEMORY => Command::IpcOpenMemory {
                token_lo: a[0],
                token_hi: a[1],
            },
            IPC_CLOSE_MEMORY => Command::IpcCloseMemory { ptr: a[0] },
            IPC_EXPORT_EVENT => Command::IpcExportEvent { event: id(a[0])? },
            IPC_OPEN_EVENT => Command::IpcOpenEvent {
                token_lo: a[0],
                token_hi: a[1],
                event: id(a[2])?,
            },
            LAUNCH_GRAPH => Command::LaunchGraph {
                stream: s,
                graph: id(a[0])?,
            },
            DROP_GRAPH => Command::DropGraph { graph: id(a[0])? },
            STREAM_HOST_POINT => Command::StreamHostPoint {
                stream: s,
                done: a[0],
                go: a[1],
                value: u32::try_from(a[2]).map_err(|_| ErrorCode::InvalidArgument)?,
            },
            UPDATE_GRAPH => Command::UpdateGraph {
                graph: id(a[0])?,
                params_offset: a[1],
                params_len: u32::try_from(a[2]).map_err(|_| ErrorCode::InvalidArgument)?,
            },
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
            GOVERNED_HELD => Command::GovernedHeld { bytes: a[0] },
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
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

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
    fn a_handle_word_past_32_bits_is_an_invalid_handle() {
        let mut e = Command::EventSync { event: 1 }.encode(1);
        e.args[0] = 1 << 32;
        assert_eq!(Command::decode(&e), Err(ErrorCode::InvalidHandle));
        let mut e = Command::Occupancy {
            function: 1,
            query: OccupancyQuery::BlocksPerSm,
            block_size: 32,
            dynamic_smem: 0,
            flags: 0,
            cluster: [0; 3],
        }
        .encode(1);
        e.args[1] = 9;
        assert_eq!(Command::decode(&e), Err(ErrorCode::InvalidArgument));
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

//! A [`Command`] into the submission entry that carries it.

use super::launch::launch_words;
use super::{Command, Kernel, opcode, pack};
use crate::ring::SubmissionEntry;

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
            Command::GovernedHeld { bytes } => (GOVERNED_HELD, 0, [bytes, 0, 0, 0, 0, 0]),
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
            Command::MemReserve { size, align, hint } => {
                (MEM_RESERVE, 0, [size, align, hint, 0, 0, 0])
            }
            Command::MemUnreserve { ptr, size } => (MEM_UNRESERVE, 0, [ptr, size, 0, 0, 0, 0]),
            Command::MemCreate { size } => (MEM_CREATE, 0, [size, 0, 0, 0, 0, 0]),
            Command::MemRelease { handle } => (MEM_RELEASE, 0, [handle, 0, 0, 0, 0, 0]),
            Command::MemMap { ptr, size, handle } => (MEM_MAP, 0, [ptr, size, handle, 0, 0, 0]),
            Command::MemUnmap { ptr, size } => (MEM_UNMAP, 0, [ptr, size, 0, 0, 0, 0]),
            Command::IpcExportMemory { ptr } => (IPC_EXPORT_MEMORY, 0, [ptr, 0, 0, 0, 0, 0]),
            Command::IpcOpenMemory { token_lo, token_hi } => {
                (IPC_OPEN_MEMORY, 0, [token_lo, token_hi, 0, 0, 0, 0])
            }
            Command::IpcCloseMemory { ptr } => (IPC_CLOSE_MEMORY, 0, [ptr, 0, 0, 0, 0, 0]),
            Command::IpcExportEvent { event } => {
                (IPC_EXPORT_EVENT, 0, [event as u64, 0, 0, 0, 0, 0])
            }
            Command::IpcOpenEvent {
                token_lo,
                token_hi,
                event,
            } => (
                IPC_OPEN_EVENT,
                0,
                [token_lo, token_hi, event as u64, 0, 0, 0],
            ),
            Command::LaunchGraph { stream, graph } => {
                (LAUNCH_GRAPH, stream, [graph as u64, 0, 0, 0, 0, 0])
            }
            Command::DropGraph { graph } => (DROP_GRAPH, 0, [graph as u64, 0, 0, 0, 0, 0]),
            Command::StreamHostPoint {
                stream,
                done,
                go,
                value,
            } => (
                STREAM_HOST_POINT,
                stream,
                [done, go, u64::from(value), 0, 0, 0],
            ),
            Command::UpdateGraph {
                graph,
                params_offset,
                params_len,
            } => (
                UPDATE_GRAPH,
                0,
                [graph as u64, params_offset, params_len as u64, 0, 0, 0],
            ),
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
}

#[cfg(test)]
mod tests {
    use super::*;

    // The layout is the wire format: a change here breaks every client of another build.
    #[test]
    fn commands_land_in_the_words_the_wire_format_gives_them() {
        let e = Command::CopyHtoD {
            stream: 4,
            arena_offset: 0x80,
            dst: 0xd000,
            len: 512,
        }
        .encode(99);
        assert_eq!((e.opcode, e.stream, e.flags, e.user_tag), (0x03, 4, 0, 99));
        assert_eq!(e.args, [0x80, 0xd000, 512, 0, 0, 0]);

        let e = Command::Launch {
            stream: 1,
            kernel: Kernel::GemmF32 {
                a: 1,
                b: 2,
                c: 3,
                m: 5,
                n: 6,
                k: 7,
                alpha: 1.0,
                beta: 2.0,
            },
        }
        .encode(0);
        assert_eq!((e.opcode, e.stream), (opcode::KERNEL_GEMM_F32, 1));
        assert_eq!(
            e.args,
            [
                1,
                2,
                3,
                pack(5, 6),
                7,
                pack(1.0f32.to_bits(), 2.0f32.to_bits())
            ]
        );
    }
}

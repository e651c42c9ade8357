//! The built-in kernels every device runs, the device ranges each one touches (which the
//! broker checks against the caller's allocations before a launch), and the work each does
//! (what a device's cost model, or a scheduler's prior, starts from).

use crate::{DevicePtr, ErrorCode};

/// Threads per block the built-in kernels use for element-wise work.
pub const BLOCK_THREADS: u64 = 256;
/// Output tile edge of the built-in GEMMs (one block per tile).
pub const GEMM_TILE: u64 = 16;

/// What a built-in kernel does, whatever runs it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Work {
    pub flops: f64,
    /// Bytes it moves to and from device memory.
    pub bytes: f64,
    /// Thread blocks in its grid.
    pub blocks: u64,
}

fn blocks_for(n: u64) -> u64 {
    n.div_ceil(BLOCK_THREADS).max(1)
}

/// A built-in kernel with its arguments. All vectors are `f32`, `n` counts elements.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
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

    /// The FLOPs it computes, the bytes it moves and its grid's blocks.
    pub fn work(&self) -> Work {
        let (flops, bytes, blocks) = match *self {
            Kernel::FillF32 { n, .. } => (0.0, 4.0 * n as f64, blocks_for(n)),
            Kernel::AxpyF32 { n, .. } => (2.0 * n as f64, 12.0 * n as f64, blocks_for(n)),
            Kernel::VecAddF32 { n, .. } => (n as f64, 12.0 * n as f64, blocks_for(n)),
            Kernel::ReduceSumF32 { n, .. } => (n as f64, 4.0 * n as f64, blocks_for(n)),
            Kernel::GemmF32 { m, n, k, beta, .. } => {
                let (mf, nf, kf) = (m as f64, n as f64, k as f64);
                let c_passes = if beta == 0.0 { 1.0 } else { 2.0 };
                let blocks = (m as u64).div_ceil(GEMM_TILE) * (n as u64).div_ceil(GEMM_TILE);
                (
                    2.0 * mf * nf * kf,
                    4.0 * (mf * kf + kf * nf + c_passes * mf * nf),
                    blocks.max(1),
                )
            }
            Kernel::GemmBf16 { m, n, k, beta, .. } => {
                let (mf, nf, kf) = (m as f64, n as f64, k as f64);
                let c_passes = if beta == 0.0 { 1.0 } else { 2.0 };
                let blocks = (m as u64).div_ceil(GEMM_TILE) * (n as u64).div_ceil(GEMM_TILE);
                (
                    2.0 * mf * nf * kf,
                    2.0 * (mf * kf + kf * nf) + 4.0 * c_passes * mf * nf,
                    blocks.max(1),
                )
            }
            Kernel::Spin { blocks, .. } => (0.0, 0.0, blocks as u64),
            Kernel::Fault { .. } => (0.0, 0.0, 1),
        };
        Work {
            flops,
            bytes,
            blocks,
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn gemm(m: u32, n: u32, k: u32, beta: f32) -> Kernel {
        Kernel::GemmF32 {
            a: 0x1000,
            b: 0x2000,
            c: 0x3000,
            m,
            n,
            k,
            alpha: 1.0,
            beta,
        }
    }

    #[test]
    fn operand_sizes_do_not_overflow() {
        let k = Kernel::FillF32 {
            dst: 0,
            n: u64::MAX,
            value: 0.0,
        };
        assert_eq!(k.operands(), Err(ErrorCode::InvalidArgument));
        let g = gemm(u32::MAX, u32::MAX, u32::MAX, 0.0);
        assert_eq!(g.operands(), Err(ErrorCode::InvalidArgument));
        let ops = gemm(64, 32, 16, 0.0).operands().expect("small sizes");
        assert_eq!(
            ops.iter().map(|o| o.bytes).collect::<Vec<_>>(),
            [64 * 16 * 4, 16 * 32 * 4, 64 * 32 * 4]
        );
    }

    #[test]
    fn a_gemm_reads_c_only_when_beta_is_not_zero() {
        let access = |k: Kernel| k.operands().map(|ops| ops[2].access);
        assert_eq!(access(gemm(4, 4, 4, 0.0)), Ok(Access::Write));
        assert_eq!(access(gemm(4, 4, 4, 0.5)), Ok(Access::ReadWrite));
    }

    #[test]
    fn a_bf16_gemm_reads_two_byte_inputs_and_writes_f32() {
        let k = Kernel::GemmBf16 {
            a: 0x1000,
            b: 0x2000,
            c: 0x3000,
            m: 8,
            n: 4,
            k: 2,
            alpha: 1.0,
            beta: 0.0,
        };
        let ops = k.operands().expect("small sizes");
        assert_eq!(
            ops.iter().map(|o| (o.ptr, o.bytes)).collect::<Vec<_>>(),
            [
                (0x1000, 8 * 2 * 2),
                (0x2000, 2 * 4 * 2),
                (0x3000, 8 * 4 * 4)
            ]
        );
        let spin = Kernel::Spin {
            micros: 1,
            blocks: 1,
        };
        assert_eq!(spin.operands(), Ok(vec![]));
        assert_eq!(spin.name(), "spin");
    }
}

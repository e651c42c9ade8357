//! The built-in kernels, executed for real on the CPU.

use gpushare_protocol::Kernel;

use super::memory::SimMemory;
use crate::device::DeviceResult;

/// Runs `kernel` against sim memory. Inputs are copied out before outputs are written, so
/// aliased arguments behave like the in-place GPU versions.
pub fn run(mem: &mut SimMemory, kernel: &Kernel) -> DeviceResult<()> {
    match *kernel {
        Kernel::FillF32 { dst, n, value } => {
            let len = usize::try_from(n).map_err(|_| crate::device::DeviceError::OutOfMemory)?;
            mem.write_f32s(dst, &vec![value; len])
        }
        Kernel::AxpyF32 { x, y, n, alpha } => {
            let xs = mem.read_f32s(x, n)?;
            let mut ys = mem.read_f32s(y, n)?;
            for (y, x) in ys.iter_mut().zip(&xs) {
                *y += alpha * x;
            }
            mem.write_f32s(y, &ys)
        }
        Kernel::VecAddF32 { a, b, c, n } => {
            let av = mem.read_f32s(a, n)?;
            let bv = mem.read_f32s(b, n)?;
            let cv: Vec<f32> = av.iter().zip(&bv).map(|(a, b)| a + b).collect();
            mem.write_f32s(c, &cv)
        }
        Kernel::ReduceSumF32 { x, out, n } => {
            let xs = mem.read_f32s(x, n)?;
            let sum: f64 = xs.iter().map(|&v| v as f64).sum();
            mem.write_f32s(out, &[sum as f32])
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
        } => {
            let (av, bv) = (
                mem.read_f32s(a, m as u64 * k as u64)?,
                mem.read_f32s(b, k as u64 * n as u64)?,
            );
            gemm_in_memory(mem, &av, &bv, c, (m, n, k), alpha, beta)
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
        } => {
            // bf16 inputs widen exactly to f32; the rest is the f32 GEMM.
            let (av, bv) = (
                mem.read_bf16s(a, m as u64 * k as u64)?,
                mem.read_bf16s(b, k as u64 * n as u64)?,
            );
            gemm_in_memory(mem, &av, &bv, c, (m, n, k), alpha, beta)
        }
        // The device itself models faults (it is poisoned or the stream hangs).
        Kernel::Spin { .. } | Kernel::Fault { .. } => Ok(()),
    }
}

/// `C = alpha·A·B + beta·C` with C (f32) in device memory; C is read only when `beta != 0`.
fn gemm_in_memory(
    mem: &mut SimMemory,
    av: &[f32],
    bv: &[f32],
    c: gpushare_protocol::DevicePtr,
    (m, n, k): (u32, u32, u32),
    alpha: f32,
    beta: f32,
) -> DeviceResult<()> {
    let (m, n, k) = (m as usize, n as usize, k as usize);
    let mut cv = if beta == 0.0 {
        vec![0.0; m * n]
    } else {
        mem.read_f32s(c, (m * n) as u64)?
    };
    gemm(av, bv, &mut cv, m, n, k, alpha, beta);
    mem.write_f32s(c, &cv)
}

/// Row-major `C = alpha·A·B + beta·C`, i-k-j order for cache-friendly access.
#[allow(clippy::too_many_arguments)]
pub fn gemm(
    a: &[f32],
    b: &[f32],
    c: &mut [f32],
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    beta: f32,
) {
    let mut acc = vec![0.0f32; n];
    for i in 0..m {
        acc.iter_mut().for_each(|v| *v = 0.0);
        for p in 0..k {
            let aip = a[i * k + p];
            let brow = &b[p * n..(p + 1) * n];
            for (v, bpj) in acc.iter_mut().zip(brow) {
                *v += aip * bpj;
            }
        }
        let crow = &mut c[i * n..(i + 1) * n];
        for (cij, v) in crow.iter_mut().zip(&acc) {
            *cij = alpha * v + if beta == 0.0 { 0.0 } else { beta * *cij };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gemm_matches_the_definition() {
        // A = [[1,2,3],[4,5,6]] (2×3), B = [[7,8],[9,10],[11,12]] (3×2)
        let a = [1., 2., 3., 4., 5., 6.];
        let b = [7., 8., 9., 10., 11., 12.];
        let mut c = [1., 1., 1., 1.];
        gemm(&a, &b, &mut c, 2, 2, 3, 2.0, 0.5);
        assert_eq!(
            c,
            [
                2. * 58. + 0.5,
                2. * 64. + 0.5,
                2. * 139. + 0.5,
                2. * 154. + 0.5
            ]
        );
    }

    #[test]
    fn kernels_compute_on_device_memory() {
        let mut mem = SimMemory::new(1 << 20);
        let x = mem.alloc(16).expect("alloc");
        let y = mem.alloc(16).expect("alloc");
        let out = mem.alloc(4).expect("alloc");
        run(
            &mut mem,
            &Kernel::FillF32 {
                dst: x,
                n: 4,
                value: 2.0,
            },
        )
        .expect("fill");
        run(
            &mut mem,
            &Kernel::FillF32 {
                dst: y,
                n: 4,
                value: 1.0,
            },
        )
        .expect("fill");
        run(
            &mut mem,
            &Kernel::AxpyF32 {
                x,
                y,
                n: 4,
                alpha: 3.0,
            },
        )
        .expect("axpy");
        assert_eq!(mem.read_f32s(y, 4).expect("read"), [7.0; 4]);
        run(
            &mut mem,
            &Kernel::VecAddF32 {
                a: x,
                b: y,
                c: x,
                n: 4,
            },
        )
        .expect("aliased add");
        assert_eq!(mem.read_f32s(x, 4).expect("read"), [9.0; 4]);
        run(&mut mem, &Kernel::ReduceSumF32 { x, out, n: 4 }).expect("reduce");
        assert_eq!(mem.read_f32s(out, 1).expect("read"), [36.0]);
    }
}

//! GEMM through cuBLAS, when `libcublas.so` is present: loaded in the background at start,
//! one handle per client stream, made on the stream's first GEMM.

use std::collections::HashSet;
use std::ffi::c_void;
use std::sync::OnceLock;

use super::CudaStream;
use crate::device::{DeviceError, DeviceResult};

/// f32 GEMMs with at least this many multiply-adds go to cuBLAS when it is present; smaller
/// ones run the built-in kernel.
const CUBLAS_MIN_MACS: u64 = 32 * 32 * 32;

/// Whether cuBLAS can be loaded, once found out.
static CUBLAS: OnceLock<bool> = OnceLock::new();

/// Whether cuBLAS can be loaded (loads it, which is slow the first time).
fn probe_cublas() -> bool {
    // SAFETY: only probes whether the library can be loaded.
    let present = unsafe { cudarc::cublas::sys::is_culib_present() };
    if !present {
        tracing::info!("cuBLAS (libcublas.so) not found: GEMMs use the built-in kernel");
    }
    present
}

/// Starts loading cuBLAS on a thread of its own, once: after the context and the built-in
/// kernels, so that every worker maps its libraries in one order (a worker's module globals
/// land where its earlier mappings leave room). Not later: while a library loads, no thread
/// can start, and serving starts threads.
pub(super) fn start_loading_cublas() {
    static STARTED: std::sync::Once = std::sync::Once::new();
    STARTED.call_once(|| {
        let _ = std::thread::Builder::new()
            .name("cublas-load".into())
            .spawn(|| CUBLAS.get_or_init(probe_cublas));
    });
}

/// Whether cuBLAS is there (waits for the load [`start_loading_cublas`] began).
pub(super) fn cublas_present() -> bool {
    *CUBLAS.get_or_init(probe_cublas)
}

/// Whether an f32 GEMM of these dimensions is big enough for cuBLAS.
pub(super) fn worth_cublas(m: u32, n: u32, k: u32) -> bool {
    u64::from(m)
        .saturating_mul(u64::from(n))
        .saturating_mul(u64::from(k))
        >= CUBLAS_MIN_MACS
}

/// Input type of a cuBLAS GEMM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Gemm {
    F32,
    Bf16,
}

/// Shapes of GEMM a stream has run through cuBLAS. cuBLAS loads a kernel the first time it
/// picks it (lazy loading), and a module load waits for work held at the priority gate,
/// holding up every other call into the driver (`device::gate`; what cuBLAS's own loads do
/// was not probed): the first GEMM of each shape on a stream holds the gate open.
#[derive(Default)]
pub(super) struct Shapes(HashSet<Shape>);

/// A GEMM's input type and `m`, `n`, `k`.
type Shape = (Gemm, u32, u32, u32);

/// Shapes a stream remembers at most; past that it starts again (a program whose shapes keep
/// changing holds the gate open once per new shape, as before it had run any).
const SHAPES_KEPT: usize = 4096;

impl Shapes {
    /// Whether this is the stream's first GEMM of this shape (it is not, from now on).
    pub(super) fn first(&mut self, kind: Gemm, m: u32, n: u32, k: u32) -> bool {
        if self.0.len() >= SHAPES_KEPT {
            self.0.clear();
        }
        self.0.insert((kind, m, n, k))
    }
}

/// The column-major problem cuBLAS is given for a row-major `C[m×n] = A[m×k]·B[k×n]`.
///
/// A row-major matrix read column-major is its transpose, so cuBLAS computes
/// `Cᵀ[n×m] = Bᵀ[n×k]·Aᵀ[k×m]`: B is its first operand, m and n trade places, and every
/// leading dimension is the row length of the row-major matrix.
#[derive(Debug, PartialEq, Eq)]
struct ColumnMajor {
    m: i32,
    n: i32,
    k: i32,
    /// Leading dimension of the first operand (B).
    ld_first: i32,
    /// Leading dimension of the second operand (A).
    ld_second: i32,
    ldc: i32,
}

impl ColumnMajor {
    fn of_row_major(m: u32, n: u32, k: u32) -> DeviceResult<ColumnMajor> {
        let to_i32 = |v: u32| {
            i32::try_from(v).map_err(|_| {
                DeviceError::InvalidArgument("GEMM dimension too large for cuBLAS".into())
            })
        };
        let (m, n, k) = (to_i32(m)?, to_i32(n)?, to_i32(k)?);
        Ok(ColumnMajor {
            m: n,
            n: m,
            k,
            ld_first: n,
            ld_second: k,
            ldc: n,
        })
    }
}

/// Row-major `C = alpha·A·B + beta·C` through cuBLAS, with f32 or bf16 inputs; C is f32 and
/// accumulation is f32 either way.
pub(super) fn run(
    stream: &mut CudaStream,
    kind: Gemm,
    (a, b, c): (u64, u64, u64),
    (m, n, k): (u32, u32, u32),
    alpha: f32,
    beta: f32,
) -> DeviceResult<()> {
    use cudarc::cublas::{result as blas, sys as bsys};
    if m == 0 || n == 0 {
        return Ok(());
    }
    let fail = |what: &str, e: blas::CublasError| DeviceError::Failed(format!("{what}: {e:?}"));
    let handle = match stream.blas {
        Some(h) => h,
        None => {
            let h = blas::create_handle().map_err(|e| fail("cublasCreate", e))?;
            // SAFETY: fresh handle, live stream.
            unsafe { blas::set_stream(h, stream.raw as _) }
                .map_err(|e| fail("cublasSetStream", e))?;
            stream.blas = Some(h);
            h
        }
    };
    let shape = ColumnMajor::of_row_major(m, n, k)?;
    let input = match kind {
        Gemm::F32 => bsys::cudaDataType::CUDA_R_32F,
        Gemm::Bf16 => bsys::cudaDataType::CUDA_R_16BF,
    };
    let nn = bsys::cublasOperation_t::CUBLAS_OP_N;
    // SAFETY: A, B and C were checked against the client's allocations for these
    // dimensions and element sizes; alpha and beta live across the call (host pointer
    // mode); the handle is bound to this stream.
    unsafe {
        blas::gemm_ex(
            handle,
            nn,
            nn,
            shape.m,
            shape.n,
            shape.k,
            &alpha as *const f32 as *const c_void,
            b as *const c_void,
            input,
            shape.ld_first,
            a as *const c_void,
            input,
            shape.ld_second,
            &beta as *const f32 as *const c_void,
            c as *mut c_void,
            bsys::cudaDataType::CUDA_R_32F,
            shape.ldc,
            bsys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            bsys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    }
    .map_err(|e| fail("cublasGemmEx", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What cuBLAS computes without transposes: `C = X·Y`, all column-major with the given
    /// leading dimensions (`X` is m×k, `Y` is k×n).
    fn column_major_gemm(s: &ColumnMajor, x: &[f32], y: &[f32], c: &mut [f32]) {
        let (m, n, k) = (s.m as usize, s.n as usize, s.k as usize);
        let (ldx, ldy, ldc) = (s.ld_first as usize, s.ld_second as usize, s.ldc as usize);
        for j in 0..n {
            for i in 0..m {
                c[i + j * ldc] = (0..k).map(|p| x[i + p * ldx] * y[p + j * ldy]).sum();
            }
        }
    }

    #[test]
    fn the_column_major_call_computes_the_row_major_product() {
        // Every dimension different, so a swapped dimension or leading dimension shows.
        let (m, n, k) = (2usize, 3usize, 4usize);
        let a: Vec<f32> = (0..m * k).map(|v| v as f32 + 1.0).collect();
        let b: Vec<f32> = (0..k * n).map(|v| (v as f32) * 0.5 - 2.0).collect();
        let mut want = vec![0.0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                want[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
            }
        }

        let shape = ColumnMajor::of_row_major(m as u32, n as u32, k as u32).expect("small");
        let mut got = vec![f32::NAN; m * n];
        column_major_gemm(&shape, &b, &a, &mut got);
        assert_eq!(got, want);
    }

    #[test]
    fn dimensions_past_i32_are_refused() {
        let big = i32::MAX as u32 + 1;
        for (m, n, k) in [(big, 1, 1), (1, big, 1), (1, 1, big)] {
            assert!(matches!(
                ColumnMajor::of_row_major(m, n, k),
                Err(DeviceError::InvalidArgument(_))
            ));
        }
        assert!(ColumnMajor::of_row_major(i32::MAX as u32, 1, 1).is_ok());
    }

    #[test]
    fn only_gemms_of_32_cubed_macs_or_more_go_to_cublas() {
        assert!(worth_cublas(32, 32, 32));
        assert!(!worth_cublas(31, 32, 32));
        assert!(worth_cublas(1, 1, 32 * 32 * 32));
        assert!(!worth_cublas(0, u32::MAX, u32::MAX));
        assert!(worth_cublas(u32::MAX, u32::MAX, u32::MAX), "no overflow");
    }
}

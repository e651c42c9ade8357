//! GEMM through cuBLAS, when `libcublas.so` is present: loaded in the background at start,
//! one handle per client stream, made on the stream's first GEMM.

use std::ffi::c_void;
use std::sync::OnceLock;

use super::{CudaDevice, CudaStream};
use crate::device::{DeviceError, DeviceResult};

/// GEMMs with at least this many multiply-adds go to cuBLAS when it is present.
pub(super) const CUBLAS_MIN_MACS: u64 = 32 * 32 * 32;

impl CudaDevice {
    /// Row-major `C = alpha·A·B + beta·C` through cuBLAS (column-major: `Cᵀ = Bᵀ·Aᵀ`), with
    /// f32 or bf16 inputs; C is f32 and accumulation is f32 either way.
    pub(super) fn gemm(
        &self,
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
        let to_i32 = |v: u32| {
            i32::try_from(v).map_err(|_| {
                DeviceError::InvalidArgument("GEMM dimension too large for cuBLAS".into())
            })
        };
        let (m, n, k) = (to_i32(m)?, to_i32(n)?, to_i32(k)?);
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
                n,
                m,
                k,
                &alpha as *const f32 as *const c_void,
                b as *const c_void,
                input,
                n,
                a as *const c_void,
                input,
                k,
                &beta as *const f32 as *const c_void,
                c as *mut c_void,
                bsys::cudaDataType::CUDA_R_32F,
                n,
                bsys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                bsys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| fail("cublasGemmEx", e))
    }
}

/// Whether cuBLAS can be loaded (loads it, which is slow the first time).
fn probe_cublas() -> bool {
    // SAFETY: only probes whether the library can be loaded.
    let present = unsafe { cudarc::cublas::sys::is_culib_present() };
    if !present {
        tracing::info!("cuBLAS (libcublas.so) not found: GEMMs use the built-in kernel");
    }
    present
}

/// Whether cuBLAS can be loaded, once found out.
static CUBLAS: OnceLock<bool> = OnceLock::new();

/// Starts loading cuBLAS on a thread of its own, once: right after `cuInit`, so that loading
/// it overlaps making the CUDA context. (Not earlier: two libraries cannot load at once, so
/// `cuInit` would wait for it. Not later: while a library loads, no thread can start, and
/// serving starts threads.)
pub(super) fn start_loading_cublas() {
    static STARTED: std::sync::Once = std::sync::Once::new();
    STARTED.call_once(|| {
        let _ = std::thread::Builder::new()
            .name("cublas-load".into())
            .spawn(|| CUBLAS.get_or_init(probe_cublas));
    });
}

impl CudaDevice {
    pub(super) fn cublas(&self) -> bool {
        *CUBLAS.get_or_init(probe_cublas)
    }
}

/// Input type of a cuBLAS GEMM.
#[derive(Debug, Clone, Copy)]
pub(super) enum Gemm {
    F32,
    Bf16,
}

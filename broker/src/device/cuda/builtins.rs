//! The built-in kernels on the GPU: source in `broker/kernels/builtin.cu`, compiled with NVRTC
//! at start when it is present, else the pre-built PTX shipped next to the source
//! (`scripts/build-ptx.sh` regenerates it).

use std::ffi::{CString, c_void};
use std::ptr;

use cudarc::driver::sys::{self, CUfunction, CUmodule};
use gpushare_protocol::Kernel;
use gpushare_protocol::text::Printable;

use super::error::check;
use crate::device::{DeviceError, DeviceResult};

pub const SOURCE: &str = include_str!("../../../kernels/builtin.cu");
pub const PREBUILT_PTX: &str = include_str!("../../../kernels/builtin.ptx");

/// Threads per block for element-wise kernels.
const BLOCK: u32 = 256;
/// Threads of the one block that reduces.
const REDUCE_THREADS: u32 = 1024;
/// GEMM tile edge (blockDim is TILE×TILE).
const TILE: u32 = 16;
/// Threads per block of the spin kernel.
const SPIN_THREADS: u32 = 32;

pub struct Builtins {
    pub module: CUmodule,
    fill: CUfunction,
    axpy: CUfunction,
    vec_add: CUfunction,
    reduce: CUfunction,
    gemm: CUfunction,
    spin: CUfunction,
    /// Where the PTX came from: "nvrtc" or "pre-built PTX".
    pub origin: &'static str,
    max_grid: u32,
}

// SAFETY: module and function handles are plain driver handles, usable from any thread with
// the context current; they are never mutated after loading.
unsafe impl Send for Builtins {}
// SAFETY: as above.
unsafe impl Sync for Builtins {}

/// The NVRTC output of this process (compute capability, PTX), handed to the next image
/// when gpushared restarts after a fault, so it need not compile again.
static COMPILED: std::sync::Mutex<Option<((u32, u32), String)>> = std::sync::Mutex::new(None);

/// Environment variable naming a descriptor that holds the previous image's compiled PTX.
pub const HANDOVER_ENV: &str = "GPUSHARE_BUILTIN_PTX_FD";

/// Puts the compiled kernels in a descriptor that survives `exec` (called just before
/// gpushared restarts itself); returns the descriptor, to be named in the next image's
/// environment as [`HANDOVER_ENV`].
pub fn hand_over() -> Option<i32> {
    use std::io::Write;
    let (cc, ptx) = COMPILED.lock().unwrap_or_else(|e| e.into_inner()).clone()?;
    // Not close-on-exec: the next image reads it.
    let fd =
        nix::sys::memfd::memfd_create("gpushare-builtin-ptx", nix::sys::memfd::MFdFlags::empty())
            .ok()?;
    let mut file = std::fs::File::from(fd);
    writeln!(file, "{}.{}", cc.0, cc.1).ok()?;
    file.write_all(ptx.as_bytes()).ok()?;
    Some(std::os::fd::IntoRawFd::into_raw_fd(file))
}

/// The compiled kernels of this process: (compute capability, PTX), once compiled or adopted.
pub fn compiled() -> Option<((u32, u32), String)> {
    COMPILED.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Whether to compile with NVRTC even when given compiled kernels (which are then only the
/// fallback).
static COMPILE_ANYWAY: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Compiles the kernels with NVRTC even when given them: device workers do, so that every
/// worker maps NVRTC and what its compilation maps, in the same order, before any client's
/// module (where the driver puts module globals depends on what was mapped before).
pub fn compile_anyway() {
    COMPILE_ANYWAY.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Takes kernels another process compiled for `cc` (a device worker gets the first worker's,
/// so that a spare need not compile them again).
pub fn adopt(cc: (u32, u32), ptx: String) {
    *COMPILED.lock().unwrap_or_else(|e| e.into_inner()) = Some((cc, ptx));
}

/// The PTX this process was given for `cc` ([`adopt`]), or the previous image compiled and
/// handed over.
fn handed_over(cc: (u32, u32)) -> Option<String> {
    if let Some((have, ptx)) = compiled()
        && have == cc
    {
        return Some(ptx);
    }
    static HANDED: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    let text = HANDED.get_or_init(|| {
        use std::io::{Read, Seek};
        use std::os::fd::FromRawFd;
        let fd: i32 = std::env::var(HANDOVER_ENV).ok()?.parse().ok()?;
        // Only gpushared's own restart names one, and it is a memfd (checked below) that
        // nothing else in this process uses; it is read once, here, and then closed.
        if fd < 3 {
            return None;
        }
        let link = std::fs::read_link(format!("/proc/self/fd/{fd}")).ok()?;
        if !link
            .to_string_lossy()
            .contains("memfd:gpushare-builtin-ptx")
        {
            return None;
        }
        // SAFETY: the descriptor was left open for us by the previous image and is a memfd
        // of ours (checked above); nothing else owns it.
        let mut file = unsafe { std::fs::File::from_raw_fd(fd) };
        file.rewind().ok()?;
        let mut text = String::new();
        file.read_to_string(&mut text).ok()?;
        Some(text)
    });
    let (first, ptx) = text.as_deref()?.split_once('\n')?;
    (first == format!("{}.{}", cc.0, cc.1)).then(|| ptx.to_string())
}

/// Compiles the kernel source for `compute_<major><minor>` with NVRTC.
fn compile_with_nvrtc(cc: (u32, u32)) -> Result<String, String> {
    use cudarc::nvrtc::result as nvrtc;
    // SAFETY: only probes for the library.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err("NVRTC library not found".into());
    }
    let src = CString::new(SOURCE).map_err(|e| e.to_string())?;
    let name = CString::new("builtin.cu").map_err(|e| e.to_string())?;
    let prog = nvrtc::create_program(&src, Some(&name)).map_err(|e| format!("{e:?}"))?;
    let arch = format!("--gpu-architecture=compute_{}{}", cc.0, cc.1);
    // SAFETY: `prog` is a live program; options are valid strings.
    let compiled = unsafe { nvrtc::compile_program(prog, &[arch.as_str(), "--std=c++17"]) };
    let result = match compiled {
        Ok(()) => {
            // SAFETY: compiled successfully above.
            unsafe { nvrtc::get_ptx(prog) }
                .map(|chars| {
                    chars
                        .iter()
                        .take_while(|c| **c != 0)
                        .map(|&c| c as u8 as char)
                        .collect::<String>()
                })
                .map_err(|e| format!("{e:?}"))
        }
        Err(e) => {
            // SAFETY: `prog` is live.
            let log = unsafe { nvrtc::get_program_log(prog) }
                .map(|chars| {
                    chars
                        .iter()
                        .take_while(|c| **c != 0)
                        .map(|&c| c as u8 as char)
                        .collect::<String>()
                })
                .unwrap_or_default();
            Err(format!("{e:?}: {log}"))
        }
    };
    // SAFETY: destroyed once.
    let _ = unsafe { nvrtc::destroy_program(prog) };
    result
}

/// Loads a module from a NUL-terminated PTX string (or a cubin/fatbin image), returning the
/// JIT's error log on failure.
pub fn load_image(image: &[u8]) -> DeviceResult<CUmodule> {
    const LOG: usize = 8192;
    let mut log = vec![0u8; LOG];
    let mut options = [
        sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER,
        sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
    ];
    let mut values = [log.as_mut_ptr() as *mut c_void, LOG as *mut c_void];
    let mut module = ptr::null_mut();
    // SAFETY: `image` outlives the call and is NUL-terminated for PTX (the caller ensures);
    // the option arrays have matching lengths and the log buffer is LOG bytes.
    let r = unsafe {
        sys::cuModuleLoadDataEx(
            &mut module,
            image.as_ptr() as *const c_void,
            2,
            options.as_mut_ptr(),
            values.as_mut_ptr(),
        )
    };
    if let Err(e) = r.result() {
        let text = String::from_utf8_lossy(&log[..log.iter().position(|&b| b == 0).unwrap_or(0)])
            .trim()
            .to_string();
        let mut err = super::error::driver("cannot load module", e);
        if !text.is_empty()
            && let DeviceError::InvalidArgument(m) | DeviceError::Failed(m) = &mut err
        {
            m.push_str(": ");
            m.push_str(&text);
        }
        return Err(err);
    }
    Ok(module)
}

pub fn function(module: CUmodule, name: &str) -> DeviceResult<CUfunction> {
    let cname = CString::new(name)
        .map_err(|_| DeviceError::InvalidArgument("function name contains NUL".into()))?;
    let mut f = ptr::null_mut();
    // SAFETY: `module` is loaded; `cname` is NUL-terminated.
    let status = unsafe { sys::cuModuleGetFunction(&mut f, module, cname.as_ptr()) };
    check(
        &format!("no function `{}` in module", Printable(name)),
        status,
    )?;
    Ok(f)
}

impl Builtins {
    /// Builds (NVRTC) or loads (pre-built PTX) the built-in kernels for a device of compute
    /// capability `cc` with `sm_count` SMs. The context must be current.
    pub fn load(cc: (u32, u32), sm_count: u32) -> DeviceResult<Builtins> {
        let compiled = if COMPILE_ANYWAY.load(std::sync::atomic::Ordering::Relaxed) {
            compile_with_nvrtc(cc).or_else(|why| handed_over(cc).ok_or(why))
        } else {
            match handed_over(cc) {
                Some(ptx) => Ok(ptx),
                None => compile_with_nvrtc(cc),
            }
        };
        let (ptx, origin) = match compiled {
            Ok(ptx) => {
                *COMPILED.lock().unwrap_or_else(|e| e.into_inner()) = Some((cc, ptx.clone()));
                (ptx, "nvrtc")
            }
            Err(why) => {
                tracing::info!(%why, "NVRTC unavailable or failed; using the pre-built PTX");
                if PREBUILT_PTX.trim().is_empty() {
                    return Err(DeviceError::Failed(format!(
                        "cannot build the built-in kernels ({why}) and this build has no pre-built PTX; run scripts/build-ptx.sh"
                    )));
                }
                (PREBUILT_PTX.to_string(), "pre-built PTX")
            }
        };
        let mut image = ptx.into_bytes();
        image.push(0);
        let module = load_image(&image)?;
        Ok(Builtins {
            module,
            fill: function(module, "gpushare_fill_f32")?,
            axpy: function(module, "gpushare_axpy_f32")?,
            vec_add: function(module, "gpushare_vec_add_f32")?,
            reduce: function(module, "gpushare_reduce_sum_f32")?,
            gemm: function(module, "gpushare_gemm_f32")?,
            spin: function(module, "gpushare_spin")?,
            origin,
            max_grid: sm_count.max(1) * 32,
        })
    }

    fn grid_for(&self, n: u64) -> u32 {
        (n.div_ceil(BLOCK as u64)).clamp(1, self.max_grid as u64) as u32
    }

    /// Launches a built-in kernel (the f32 GEMM here is the fallback; the backend prefers
    /// cuBLAS).
    pub fn launch(&self, stream: sys::CUstream, kernel: &Kernel) -> DeviceResult<()> {
        match *kernel {
            Kernel::FillF32 { dst, n, value } => {
                let (mut dst, mut n, mut value) = (dst, n, value);
                launch(
                    self.fill,
                    (self.grid_for(n), 1, 1),
                    (BLOCK, 1, 1),
                    stream,
                    &mut [arg(&mut dst), arg(&mut n), arg(&mut value)],
                )
            }
            Kernel::AxpyF32 { x, y, n, alpha } => {
                let (mut x, mut y, mut n, mut alpha) = (x, y, n, alpha);
                launch(
                    self.axpy,
                    (self.grid_for(n), 1, 1),
                    (BLOCK, 1, 1),
                    stream,
                    &mut [arg(&mut x), arg(&mut y), arg(&mut n), arg(&mut alpha)],
                )
            }
            Kernel::VecAddF32 { a, b, c, n } => {
                let (mut a, mut b, mut c, mut n) = (a, b, c, n);
                launch(
                    self.vec_add,
                    (self.grid_for(n), 1, 1),
                    (BLOCK, 1, 1),
                    stream,
                    &mut [arg(&mut a), arg(&mut b), arg(&mut c), arg(&mut n)],
                )
            }
            Kernel::ReduceSumF32 { x, out, n } => {
                let (mut x, mut out, mut n) = (x, out, n);
                launch(
                    self.reduce,
                    (1, 1, 1),
                    (REDUCE_THREADS, 1, 1),
                    stream,
                    &mut [arg(&mut x), arg(&mut out), arg(&mut n)],
                )
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
                if m == 0 || n == 0 {
                    return Ok(());
                }
                // grid.y is capped by the hardware; the kernel loops over the remaining rows.
                let grid = (n.div_ceil(TILE), m.div_ceil(TILE).min(65535), 1);
                let (mut a, mut b, mut c, mut m, mut n, mut k, mut alpha, mut beta) =
                    (a, b, c, m, n, k, alpha, beta);
                launch(
                    self.gemm,
                    grid,
                    (TILE, TILE, 1),
                    stream,
                    &mut [
                        arg(&mut a),
                        arg(&mut b),
                        arg(&mut c),
                        arg(&mut m),
                        arg(&mut n),
                        arg(&mut k),
                        arg(&mut alpha),
                        arg(&mut beta),
                    ],
                )
            }
            Kernel::GemmBf16 { .. } => Err(DeviceError::NotSupported {
                backend: "cuda".into(),
                what: "bf16 GEMM has no built-in kernel; it needs cuBLAS".into(),
            }),
            Kernel::Fault { .. } => Err(DeviceError::NotSupported {
                backend: "cuda".into(),
                what: "fault injection is not a built-in kernel".into(),
            }),
            Kernel::Spin { micros, blocks } => {
                let mut nanos = micros.saturating_mul(1000);
                launch(
                    self.spin,
                    (blocks.max(1), 1, 1),
                    (SPIN_THREADS, 1, 1),
                    stream,
                    &mut [arg(&mut nanos)],
                )
            }
        }
    }
}

fn arg<T>(v: &mut T) -> *mut c_void {
    v as *mut T as *mut c_void
}

fn launch(
    f: CUfunction,
    grid: (u32, u32, u32),
    block: (u32, u32, u32),
    stream: sys::CUstream,
    params: &mut [*mut c_void],
) -> DeviceResult<()> {
    // SAFETY: `f` comes from the loaded built-in module; `params` point at live locals whose
    // types match the kernel's parameter list (see builtin.cu); the driver copies them at
    // launch.
    check("kernel launch", unsafe {
        sys::cuLaunchKernel(
            f,
            grid.0,
            grid.1,
            grid.2,
            block.0,
            block.1,
            block.2,
            0,
            stream,
            params.as_mut_ptr(),
            ptr::null_mut(),
        )
    })
}

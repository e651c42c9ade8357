//! The real libcuda: opened once with `dlopen` (`$GPUSHARE_REAL_LIBCUDA`, else
//! `libcuda.so.1`), its governed entry points looked up with the real `dlsym`.
//!
//! The real functions are found by handle, not with `RTLD_NEXT`: a program (or the CUDA
//! runtime) that opens libcuda with `dlopen` and looks its functions up by handle never goes
//! through the preloaded library's exports, and the interposer's own lookups must not go
//! through its own `dlsym` either.

use std::ffi::{CStr, c_char, c_void};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Environment variable naming the driver library to wrap (tests point it at a stand-in).
pub use gpushare_conn::env::REAL_LIBCUDA_ENV;

macro_rules! symbols {
    ($($name:ident),* $(,)?) => {
        /// Every libcuda entry point the interposer wraps, by its exported (versioned) name.
        #[allow(non_camel_case_types)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum Sym { $($name),* }

        impl Sym {
            pub const ALL: &'static [Sym] = &[$(Sym::$name),*];
            pub const COUNT: usize = Sym::ALL.len();

            pub fn name(self) -> &'static CStr {
                match self { $(Sym::$name => {
                    const NAME: &CStr = match CStr::from_bytes_with_nul(
                        concat!(stringify!($name), "\0").as_bytes()) {
                        Ok(n) => n,
                        Err(_) => panic!("symbol name with a NUL"),
                    };
                    NAME
                }),* }
            }

            /// The interposer's own export of this entry point.
            pub fn wrapper(self) -> *mut c_void {
                match self { $(Sym::$name => crate::exports::$name as *const () as *mut c_void),* }
            }
        }
    };
}

symbols!(
    cuInit,
    cuGetProcAddress,
    cuGetProcAddress_v2,
    cuMemAlloc_v2,
    cuMemAllocPitch_v2,
    cuMemFree_v2,
    cuMemAllocManaged,
    cuMemAllocAsync,
    cuMemAllocAsync_ptsz,
    cuMemAllocFromPoolAsync,
    cuMemAllocFromPoolAsync_ptsz,
    cuMemFreeAsync,
    cuMemFreeAsync_ptsz,
    cuMemCreate,
    cuMemRelease,
    cuLaunchKernel,
    cuLaunchKernel_ptsz,
    cuLaunchKernelEx,
    cuLaunchKernelEx_ptsz,
    cuLaunchCooperativeKernel,
    cuLaunchCooperativeKernel_ptsz,
    cuGraphLaunch,
    cuGraphLaunch_ptsz,
    cuCtxCreate_v2,
    cuCtxCreate_v3,
    cuCtxCreate_v4,
    cuDevicePrimaryCtxRetain,
    cuCtxSynchronize,
    cuCtxSynchronize_v2,
    cuStreamSynchronize,
    cuStreamSynchronize_ptsz,
    cuEventSynchronize,
);

/// The real library and its entry points (0 where it has none).
pub struct Real {
    fns: Vec<usize>,
}

static REAL: OnceLock<Real> = OnceLock::new();
/// Set while [`lib`] opens the library: `dlsym` calls made meanwhile (by the driver's own
/// start-up code, on this thread) pass straight through.
static OPENING: AtomicBool = AtomicBool::new(false);

/// The real library, opened on first use.
pub fn lib() -> &'static Real {
    REAL.get_or_init(|| {
        OPENING.store(true, Ordering::SeqCst);
        let real = open();
        OPENING.store(false, Ordering::SeqCst);
        real
    })
}

/// Whether [`lib`] is opening the library right now.
pub fn opening() -> bool {
    OPENING.load(Ordering::SeqCst)
}

fn open() -> Real {
    let path = std::env::var_os(REAL_LIBCUDA_ENV)
        .filter(|p| !p.is_empty())
        .map(|p| p.into_encoded_bytes())
        .unwrap_or_else(|| b"libcuda.so.1".to_vec());
    let fns = match std::ffi::CString::new(path) {
        // SAFETY: a NUL-terminated path; dlopen has no other preconditions.
        Ok(path) => match unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) }
        {
            handle if handle.is_null() => vec![0; Sym::ALL.len()],
            handle => Sym::ALL
                .iter()
                .map(|s| real_dlsym(handle, s.name().as_ptr()) as usize)
                .collect(),
        },
        Err(_) => vec![0; Sym::ALL.len()],
    };
    Real { fns }
}

impl Real {
    pub fn get(&self, sym: Sym) -> *mut c_void {
        self.fns.get(sym as usize).copied().unwrap_or(0) as *mut c_void
    }

    /// The entry point whose real function is `f`, if it is one the interposer wraps.
    pub fn which(&self, f: *mut c_void) -> Option<Sym> {
        if f.is_null() {
            return None;
        }
        Sym::ALL.iter().copied().find(|&s| self.get(s) == f)
    }
}

/// Looks a symbol up by a real library handle with the C library's `dlsym` (never the
/// interposer's own).
pub fn real_dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    let f = libc_dlsym();
    if f == 0 {
        return std::ptr::null_mut();
    }
    // SAFETY: `f` is the C library's dlsym, whose signature this is.
    let dlsym: unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void =
        unsafe { std::mem::transmute::<usize, _>(f) };
    // SAFETY: dlsym takes any handle from dlopen and a NUL-terminated name.
    unsafe { dlsym(handle, name) }
}

/// The C library's `dlsym` (the interposer exports its own, see [`crate::lookup`]).
pub(crate) static LIBC_DLSYM: AtomicUsize = AtomicUsize::new(0);

pub(crate) fn libc_dlsym() -> usize {
    let f = LIBC_DLSYM.load(Ordering::Acquire);
    if f != 0 {
        return f;
    }
    // glibc 2.34 moved dlsym into libc under a new version; older ones have only the first.
    for version in [c"GLIBC_2.34", c"GLIBC_2.2.5"] {
        // SAFETY: NUL-terminated strings; dlvsym with RTLD_NEXT looks past this library.
        let f = unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), version.as_ptr()) };
        if !f.is_null() {
            LIBC_DLSYM.store(f as usize, Ordering::Release);
            return f as usize;
        }
    }
    0
}

/// The real `sym`, typed: `real!(cuMemAlloc_v2: fn(*mut u64, usize) -> c_int)`. Each
/// wrapper asks for its real function once per call, first thing: the diagnostics
/// ([`crate::debug`]) count the call here.
macro_rules! real {
    ($sym:ident : $ty:ty) => {{
        $crate::debug::called($crate::real::Sym::$sym);
        let p = $crate::real::lib().get($crate::real::Sym::$sym);
        if p.is_null() {
            None
        } else {
            // SAFETY: `p` is the real libcuda's `$sym`, whose C signature is `$ty`.
            Some(unsafe { std::mem::transmute::<*mut std::ffi::c_void, $ty>(p) })
        }
    }};
}
pub(crate) use real;

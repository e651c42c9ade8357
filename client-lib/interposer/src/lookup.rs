//! How programs find driver functions without linking them: `cuGetProcAddress` (the CUDA
//! runtime's way) and `dlopen` + `dlsym` on libcuda (the runtime's way to find
//! `cuGetProcAddress` itself, and many programs' way to find everything).
//!
//! Both answer with the real function first; when that is one the interposer wraps, the answer
//! becomes the wrapper. Matching by the real function's address rather than by name takes care
//! of versions and default-stream variants exactly: libcuda answers `cuMemAlloc` with
//! `cuMemAlloc_v2`, `cuLaunchKernel` under per-thread default streams with
//! `cuLaunchKernel_ptsz`, `cuCtxCreate` at 12.5+ with `cuCtxCreate_v4`, and each of those
//! addresses is also the one `dlsym` gives for the versioned name (docs/cli.md), which is
//! what [`crate::real`] records.

use std::ffi::{c_char, c_void};

use crate::abi::CUDA_SUCCESS;
use crate::debug::{self, Lookup};
use crate::real;

/// After a successful real lookup (`how`), puts the wrapper in `*pfn` if the real function is
/// one the interposer wraps.
///
/// # Safety
/// `pfn` is null or points to a function pointer the real lookup just wrote.
pub unsafe fn substitute(result: std::ffi::c_int, pfn: *mut *mut c_void, how: Lookup<'_>) {
    if result != CUDA_SUCCESS || pfn.is_null() {
        return;
    }
    // SAFETY: per the contract, `pfn` is valid to read and write.
    let found = unsafe { pfn.read() };
    match real::lib().which(found) {
        Some(sym) => {
            debug::handed_out(sym, how);
            // SAFETY: as above.
            unsafe { pfn.write(sym.wrapper()) };
        }
        None => debug::missed(how, found),
    }
}

/// The part of the interposer's `dlsym` that decides: the wrapper when `name` looked up by
/// `handle` is a real function the interposer wraps, else null (the C library's `dlsym` then
/// answers, as if the interposer were not there).
///
/// Lookups in the global scope (`RTLD_DEFAULT`) already find the interposer's exports first,
/// and `RTLD_NEXT` lookups belong to their caller: both pass through.
extern "C" fn dlsym_hook(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    let none = std::ptr::null_mut();
    // Before anything else: the tail of `dlsym` jumps to what this finds.
    if real::libc_dlsym() == 0
        || name.is_null()
        || handle.is_null()
        || handle == libc::RTLD_NEXT
        || real::opening()
    {
        return none;
    }
    // SAFETY: `dlsym` takes a NUL-terminated name.
    let name_c = unsafe { std::ffi::CStr::from_ptr(name) };
    let bytes = name_c.to_bytes();
    if !bytes.starts_with(b"cu") {
        return none;
    }
    let Some(sym) = real::Sym::ALL
        .iter()
        .copied()
        .find(|s| s.name().to_bytes() == bytes)
    else {
        return none;
    };
    let found = real::real_dlsym(handle, name);
    let how = Lookup::Dlsym { name: name_c };
    if !found.is_null() && found == real::lib().get(sym) {
        debug::handed_out(sym, how);
        sym.wrapper()
    } else {
        if !found.is_null() {
            debug::missed(how, found);
        }
        none
    }
}

/// `dlsym` itself, so that a program (or the CUDA runtime) that opens libcuda with `dlopen`
/// and looks up `cuGetProcAddress_v2` or `cuMemAlloc_v2` by handle gets the wrappers.
///
/// Written in assembly so that the C library's `dlsym` is reached by a tail jump: it finds its
/// caller (for `RTLD_NEXT`) from its return address, which must stay the program's.
///
/// # Safety
/// As the C library's `dlsym`.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[unsafe(no_mangle)]
#[unsafe(naked)]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    std::arch::naked_asm!(
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {hook}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "test rax, rax",
        "jnz 2f",
        "mov rax, qword ptr [rip + {real}@GOTPCREL]",
        "jmp qword ptr [rax]",
        "2:",
        "ret",
        hook = sym dlsym_hook,
        real = sym real::LIBC_DLSYM,
    )
}

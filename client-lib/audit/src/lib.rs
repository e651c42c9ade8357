//! An rtld-audit(7) library for consolidated clients (`gpushare run` puts it in `LD_AUDIT`):
//! every search the dynamic loader makes for libcuda — by soname (`libcuda.so.1`,
//! `libcuda.so`) or by a path to a real driver (`/usr/lib/x86_64-linux-gnu/libcuda.so.1`,
//! `libcuda.so.580.65.06`) — finds gpushare's CUDA driver instead, named by
//! `$GPUSHARE_CUDA_DRIVER`.
//!
//! The `LD_LIBRARY_PATH` shadow that `gpushare run` also sets covers searches by soname only;
//! libraries that link the driver by a path, or `dlopen` one, are covered here. Without the
//! variable the library changes nothing.
//!
//! A search for NVML by its soname (`libnvidia-ml.so.1`, `libnvidia-ml.so`) finds gpushare's
//! NVML beside the driver, where there is one (a container gets no `LD_LIBRARY_PATH` shadow).
//! Not a search by path: gpushare's NVML opens the machine's by its path.
//!
//! It runs inside the loader, in a namespace of its own, before the program's libraries are
//! set up: it only reads the environment once and compares strings, with no allocation
//! after that and nothing that can panic.

use std::ffi::{CStr, CString, c_char, c_uint};
use std::sync::OnceLock;

use gpushare_conn::env::CUDA_DRIVER_ENV;

/// The driver every libcuda search finds, read at `la_version`.
static DRIVER: OnceLock<Option<CString>> = OnceLock::new();
/// gpushare's NVML beside the driver, if it is there.
static NVML: OnceLock<Option<CString>> = OnceLock::new();

/// gpushare's NVML, under NVML's soname, in the driver's directory.
const NVML_SONAME: &str = "libnvidia-ml.so.1";

/// Called first, once: the interface version this library speaks. `la_objsearch` has not
/// changed in any version, so the loader's own is fine (0 would unload the library).
#[unsafe(no_mangle)]
pub extern "C" fn la_version(version: c_uint) -> c_uint {
    let driver = std::env::var_os(CUDA_DRIVER_ENV).filter(|p| !p.is_empty());
    NVML.get_or_init(|| {
        let nvml = std::path::Path::new(driver.as_ref()?)
            .parent()?
            .join(NVML_SONAME);
        nvml.is_file()
            .then(|| CString::new(nvml.into_os_string().into_encoded_bytes()).ok())?
    });
    DRIVER.get_or_init(|| driver.and_then(|p| CString::new(p.into_encoded_bytes()).ok()));
    version
}

/// Called for each name the loader is about to search for (and each path it tries): the
/// name to use instead. Returning `name` changes nothing; NULL would fail the search.
///
/// # Safety
/// `name` is a NUL-terminated string, as the loader passes it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn la_objsearch(
    name: *const c_char,
    _cookie: *mut usize,
    _flag: c_uint,
) -> *mut c_char {
    let Some(Some(driver)) = DRIVER.get() else {
        return name.cast_mut();
    };
    if name.is_null() {
        return name.cast_mut();
    }
    // SAFETY: the loader passes a NUL-terminated name that lives through this call.
    let asked = unsafe { CStr::from_ptr(name) };
    if is_nvml_soname(asked.to_bytes())
        && let Some(Some(nvml)) = NVML.get()
    {
        // The NVML's name lives as long as the process (a static, never changed).
        return nvml.as_ptr().cast_mut();
    }
    if is_libcuda(asked.to_bytes()) && asked != driver.as_c_str() {
        // The driver's name lives as long as the process (a static, never changed).
        driver.as_ptr().cast_mut()
    } else {
        name.cast_mut()
    }
}

/// Whether a name the loader searches for is NVML by its soname (no path).
fn is_nvml_soname(name: &[u8]) -> bool {
    name == b"libnvidia-ml.so.1" || name == b"libnvidia-ml.so"
}

/// Whether a name the loader searches for is the CUDA driver: `libcuda.so`, `libcuda.so.1`,
/// `libcuda.so.<driver version>`, by itself or at the end of a path.
fn is_libcuda(name: &[u8]) -> bool {
    let base = match name.iter().rposition(|&b| b == b'/') {
        Some(slash) => &name[slash + 1..],
        None => name,
    };
    match base.strip_prefix(b"libcuda.so") {
        Some([]) => true,
        Some([b'.', version @ ..]) => {
            !version.is_empty() && version.iter().all(|b| b.is_ascii_digit() || *b == b'.')
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_nvml_by_soname_only() {
        assert!(is_nvml_soname(b"libnvidia-ml.so.1"));
        assert!(is_nvml_soname(b"libnvidia-ml.so"));
        assert!(!is_nvml_soname(
            b"/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
        ));
        assert!(!is_nvml_soname(b"libnvidia-ml.so.580.65.06"));
    }

    #[test]
    fn finds_the_driver_by_soname_and_by_any_path_to_a_real_one() {
        for name in [
            "libcuda.so.1",
            "libcuda.so",
            "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
            "/usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06",
            "/usr/local/cuda/compat/libcuda.so",
            "./libcuda.so.1",
        ] {
            assert!(is_libcuda(name.as_bytes()), "{name}");
        }
        for name in [
            "libcudart.so.12",
            "libcudadebugger.so.1",
            "libcuda.so.1.bak",
            "libcuda.so.",
            "/opt/libcuda.so.1/libnvrtc.so",
            "libnvcuda.so.1",
            "",
        ] {
            assert!(!is_libcuda(name.as_bytes()), "{name}");
        }
    }
}

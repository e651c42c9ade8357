//! Modules, libraries, kernels and functions, loaded lazily: loading a module or library
//! only records where its image is; the image goes to the broker (or is found there by its
//! content hash, when another client loaded the same bytes) the first time one of its
//! functions or globals is needed, and a function's parameter layout and attributes come
//! with its first use. After that, launches and attribute queries ask nobody.
//!
//! A library and a module are one object here, as are a kernel and a function. Handles are
//! pointers to objects that live as long as the process (an unloaded one is only marked so):
//! a stale handle fails cleanly instead of dangling. They are the process's, not one
//! device's (as CUDA's libraries and kernels are): an image is loaded, and a kernel's layout
//! asked, on each device's session at its first use there.

mod enumerate;
mod globals;
mod kernels;
mod loading;

pub mod api;

use std::collections::{HashMap, HashSet};
use std::ffi::{CString, c_void};
use std::sync::atomic::Ordering;
use std::sync::{Mutex, RwLock};

use gpushare_protocol::ErrorCode;

use crate::driver::Driver;
use crate::status::{Cu, from_code, from_error};
use crate::types::{CUresult, result};

pub use kernels::{FunctionInfo, Kernel};
pub use loading::Image;

/// Every image and kernel handle handed out: a handle not here is stale or not one.
pub struct Modules {
    images: RwLock<HashSet<usize>>,
    kernels: RwLock<HashSet<usize>>,
    by_name: Mutex<HashMap<(usize, CString), usize>>,
    /// How many devices the process sees: each image and kernel keeps one slot per device.
    devices: usize,
}

impl Default for Modules {
    fn default() -> Modules {
        Modules::for_devices(1)
    }
}

impl Modules {
    pub fn for_devices(devices: usize) -> Modules {
        Modules {
            images: RwLock::default(),
            kernels: RwLock::default(),
            by_name: Mutex::default(),
            devices: devices.max(1),
        }
    }

    /// The image a module or library handle names.
    pub fn image(&self, h: *mut c_void) -> Cu<&'static Image> {
        let live = self
            .images
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&(h as usize));
        if !live {
            return Err(result::INVALID_HANDLE);
        }
        // SAFETY: a live handle is a leaked `Box<Image>` (never freed).
        let image = unsafe { &*(h as *const Image) };
        if image.unloaded.load(Ordering::Acquire) {
            return Err(result::INVALID_HANDLE);
        }
        Ok(image)
    }

    /// The kernel a kernel or function handle names.
    #[inline]
    pub fn kernel(&self, h: *mut c_void) -> Cu<&'static Kernel> {
        let live = self
            .kernels
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&(h as usize));
        if !live {
            return Err(result::INVALID_HANDLE);
        }
        // SAFETY: a live handle is a leaked `Box<Kernel>` (never freed).
        let kernel = unsafe { &*(h as *const Kernel) };
        if kernel.image.unloaded.load(Ordering::Acquire) {
            return Err(result::INVALID_HANDLE);
        }
        Ok(kernel)
    }
}

impl Driver {
    /// The image a module or library handle names.
    pub fn image(&self, h: *mut c_void) -> Cu<&'static Image> {
        self.modules.image(h)
    }

    /// The kernel a kernel or function handle names.
    #[inline]
    pub fn kernel(&self, h: *mut c_void) -> Cu<&'static Kernel> {
        self.modules.kernel(h)
    }
}

/// A module error as CUDA reports it; a device that runs no kernels says why, once.
fn module_error(w: &gpushare_protocol::error::WireError) -> CUresult {
    match w.code {
        ErrorCode::NotFound => result::NOT_FOUND,
        ErrorCode::InvalidArgument => result::INVALID_IMAGE,
        ErrorCode::NotSupported => {
            crate::log::say_once(&format!("gpushared cannot load kernels: {}", w.message));
            result::NOT_SUPPORTED
        }
        other => from_code(other),
    }
}

fn module_load_error(e: &gpushare_conn::Error) -> CUresult {
    match e {
        gpushare_conn::Error::Request(w) => module_error(w),
        other => from_error(other),
    }
}

#[cfg(test)]
mod tests {
    use gpushare_protocol::control::ModuleFormat;
    use gpushare_protocol::error::WireError;

    use super::loading::Bytes;
    use super::*;

    fn handle<T>(r: &'static T) -> *mut c_void {
        r as *const T as *mut c_void
    }

    #[test]
    fn handles_name_only_live_objects_of_their_kind() {
        let m = Modules::default();
        let image = m.add_image(ModuleFormat::Ptx, Bytes::Owned(b".version 8.0\0".to_vec()));
        let kernel = m.kernel_of(image, c"f");
        assert!(m.image(handle(image)).is_ok());
        assert!(m.kernel(handle(kernel)).is_ok());
        assert_eq!(
            m.kernel(handle(image)).err(),
            Some(result::INVALID_HANDLE),
            "a module is no function"
        );
        assert_eq!(m.image(handle(kernel)).err(), Some(result::INVALID_HANDLE));
        let stranger = Box::leak(Box::new(0u64));
        assert_eq!(
            m.image(handle(stranger)).err(),
            Some(result::INVALID_HANDLE)
        );
        image.unloaded.store(true, Ordering::Release);
        assert_eq!(m.image(handle(image)).err(), Some(result::INVALID_HANDLE));
        assert_eq!(
            m.kernel(handle(kernel)).err(),
            Some(result::INVALID_HANDLE),
            "an unloaded module's functions go with it"
        );
    }

    #[test]
    fn module_errors_read_as_cuda_reports_them() {
        let code = |c| module_error(&WireError::new(c, "why"));
        assert_eq!(code(ErrorCode::NotFound), result::NOT_FOUND);
        assert_eq!(code(ErrorCode::InvalidArgument), result::INVALID_IMAGE);
        assert_eq!(code(ErrorCode::NotSupported), result::NOT_SUPPORTED);
        assert_eq!(
            module_load_error(&gpushare_conn::Error::Request(WireError::new(
                ErrorCode::NotFound,
                "no such function"
            ))),
            result::NOT_FOUND
        );
    }
}

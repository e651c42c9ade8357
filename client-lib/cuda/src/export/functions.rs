//! A module's functions, one by one (table `6e163fbe…`), seen on the H200 (driver 580) from
//! cuFFT 12 and read in that driver's code:
//!
//! - slot 7, `(context, module, callback, user)`: calls `callback(user, function, name)` for
//!   each kernel of the module, in the module's order, and returns how many (an `int`; -1 for
//!   a module that is not one). cuFFT lists the kernels of each module it loads itself (a fat
//!   binary of one LZ4-compressed PTX entry) this way, and fails with `CUFFT_INTERNAL_ERROR`
//!   without it.
//!
//! The names come from gpushared, whose device worker asks the GPU's driver
//! (`cuModuleEnumerateFunctions`) in the context that loaded the module; each function handed
//! to the callback is the one `cuModuleGetFunction` gives for its name. The context names
//! nothing here: a module's functions are the same in every context of the one device.

use std::ffi::{c_char, c_int, c_void};

use crate::driver;
use crate::module::Kernel;
use crate::status::entry;
use crate::types::{CUcontext, CUfunction, CUmodule, result};

/// What slot 7 calls for each function.
pub type EachFunction =
    unsafe extern "C" fn(user: *mut c_void, function: CUfunction, name: *const c_char);

/// Calls `each(user, function, name)` for each function of `module`, in order; returns how
/// many it has, or -1 when it cannot tell (not a module, no broker). A NULL `each` only counts.
pub extern "C" fn module_functions(
    _ctx: CUcontext,
    module: CUmodule,
    each: Option<EachFunction>,
    user: *mut c_void,
) -> c_int {
    let mut kernels: Vec<&'static Kernel> = Vec::new();
    let code = entry("module_functions", || {
        let d = driver::live()?;
        kernels = d.kernels_of(d.image(module)?)?;
        Ok(())
    });
    let count = match c_int::try_from(kernels.len()) {
        Ok(n) if code == result::SUCCESS => n,
        _ => return -1,
    };
    // Called with no lock held: a callback may ask the driver about the function it is given.
    if let Some(each) = each {
        for k in kernels {
            // SAFETY: the caller's callback, called as NVIDIA's driver calls it; the handle is
            // a live kernel's and its name lives as long as the process.
            unsafe { each(user, std::ptr::from_ref(k) as CUfunction, k.name.as_ptr()) };
        }
    }
    count
}

#[cfg(test)]
mod tests {
    use super::*;

    unsafe extern "C" fn never(user: *mut c_void, _f: CUfunction, _name: *const c_char) {
        // SAFETY: the test passes a counter as `user`.
        unsafe { *user.cast::<u32>() += 1 };
    }

    #[test]
    fn the_table_has_the_drivers_shape() {
        let t = &super::super::tables::FUNCTIONS.0;
        // SAFETY: each slot is read as what tables.rs wrote there.
        unsafe {
            assert_eq!(t[0].size, 792, "99 words, as the driver's");
            assert_eq!(t[7].f, module_functions as *const c_void);
            assert!(t[93].f.is_null(), "NULL there, as in the driver's");
            assert!(
                t[1..]
                    .iter()
                    .enumerate()
                    .all(|(i, s)| i + 1 == 93 || !s.f.is_null())
            );
        }
    }

    #[test]
    fn without_a_driver_there_is_nothing_to_list() {
        let mut calls = 0u32;
        let user = (&raw mut calls).cast();
        let not_a_module = (&raw mut calls).cast();
        assert_eq!(
            module_functions(std::ptr::null_mut(), not_a_module, Some(never), user),
            -1
        );
        assert_eq!(
            module_functions(std::ptr::null_mut(), std::ptr::null_mut(), None, user),
            -1
        );
        assert_eq!(calls, 0, "no callback on failure");
    }
}

//! The export tables this driver hands out, slot by slot. A table with a size header holds its
//! size in bytes first, as the driver's do; context-local storage's table has none and ends
//! with a NULL. The one slot whose answer covers the tables' own addresses, the integrity
//! check, is here too: the slots of `cudart.rs` never name the tables.

use std::ffi::c_void;

use super::integrity::{DeviceFacts, Facts, digest};
use super::{Known, Slot, Table, compile_cache, cudart, functions, streams, unknown_slot, uuid};
use crate::driver;
use crate::status::{entry, out};
use crate::types::{CUDA_VERSION, CUresult, device_attr};

/// The tables' names in the "not implemented" message (by the `T` of `stub`).
const NAMES: [&str; 11] = [
    "6bd5fb6c", "42d85a81", "a094798c", "c693336e", "263e8860", "d4082055", "f8cff951", "21318c60",
    "1734dc26", "da9151d3", "6e163fbe",
];

/// A slot whose use was never seen.
extern "C" fn stub<const T: usize, const S: usize>() -> CUresult {
    unknown_slot(NAMES[T], S)
}

const fn f(p: *const c_void) -> Slot {
    Slot { f: p }
}

const fn size(n: usize) -> Slot {
    Slot { size: n * 8 }
}

const NULL: Slot = Slot {
    f: std::ptr::null(),
};

pub static CUDART: Table<13> = Table([
    size(13),
    f(cudart::module_from_wrapper as *const c_void),
    f(cudart::primary_context as *const c_void),
    f(stub::<0, 3> as *const c_void),
    f(stub::<0, 4> as *const c_void),
    f(stub::<0, 5> as *const c_void),
    f(cudart::module_from_wrapper_ext as *const c_void),
    f(cudart::ignore_word as *const c_void),
    f(cudart::module_from_fatbin_ext as *const c_void),
    f(stub::<0, 9> as *const c_void),
    NULL,
    f(stub::<0, 11> as *const c_void),
    f(cudart::load_compilers as *const c_void),
]);

pub static TOOLS_TLS: Table<3> = Table([
    size(3),
    f(stub::<1, 1> as *const c_void),
    f(cudart::current_context as *const c_void),
]);

pub static TOOLS_HOOKS: Table<7> = Table([
    size(7),
    f(stub::<2, 1> as *const c_void),
    f(cudart::hooks_buffer_a as *const c_void),
    f(stub::<2, 3> as *const c_void),
    f(stub::<2, 4> as *const c_void),
    f(stub::<2, 5> as *const c_void),
    f(cudart::hooks_buffer_b as *const c_void),
]);

pub static CONTEXT_STORAGE: Table<4> = Table([
    f(cudart::storage_put as *const c_void),
    f(cudart::storage_delete as *const c_void),
    f(cudart::storage_get as *const c_void),
    NULL,
]);

pub static CONTEXT_CHECKS: Table<15> = Table([
    size(15),
    f(stub::<4, 1> as *const c_void),
    f(cudart::context_check as *const c_void),
    f(cudart::flag_off as *const c_void),
    f(stub::<4, 4> as *const c_void),
    f(stub::<4, 5> as *const c_void),
    f(stub::<4, 6> as *const c_void),
    f(stub::<4, 7> as *const c_void),
    f(stub::<4, 8> as *const c_void),
    f(stub::<4, 9> as *const c_void),
    f(stub::<4, 10> as *const c_void),
    f(stub::<4, 11> as *const c_void),
    f(stub::<4, 12> as *const c_void),
    f(stub::<4, 13> as *const c_void),
    f(stub::<4, 14> as *const c_void),
]);

pub static INTEGRITY: Table<3> = Table([
    size(3),
    f(integrity_check as *const c_void),
    f(cudart::integrity_flag as *const c_void),
]);

pub static RUNTIME_F8: Table<3> = Table([
    size(3),
    f(stub::<6, 1> as *const c_void),
    f(stub::<6, 2> as *const c_void),
]);

pub static CUBLASLT_A: Table<93> = Table([
    size(93),
    f(stub::<7, 1> as *const c_void),
    f(stub::<7, 2> as *const c_void),
    f(stub::<7, 3> as *const c_void),
    f(streams::context_id as *const c_void),
    f(stub::<7, 5> as *const c_void),
    f(stub::<7, 6> as *const c_void),
    f(stub::<7, 7> as *const c_void),
    f(stub::<7, 8> as *const c_void),
    f(stub::<7, 9> as *const c_void),
    f(stub::<7, 10> as *const c_void),
    f(stub::<7, 11> as *const c_void),
    f(stub::<7, 12> as *const c_void),
    f(stub::<7, 13> as *const c_void),
    f(stub::<7, 14> as *const c_void),
    f(stub::<7, 15> as *const c_void),
    f(stub::<7, 16> as *const c_void),
    f(stub::<7, 17> as *const c_void),
    f(stub::<7, 18> as *const c_void),
    f(stub::<7, 19> as *const c_void),
    f(stub::<7, 20> as *const c_void),
    f(stub::<7, 21> as *const c_void),
    f(stub::<7, 22> as *const c_void),
    f(stub::<7, 23> as *const c_void),
    f(stub::<7, 24> as *const c_void),
    f(stub::<7, 25> as *const c_void),
    f(stub::<7, 26> as *const c_void),
    f(stub::<7, 27> as *const c_void),
    f(stub::<7, 28> as *const c_void),
    f(stub::<7, 29> as *const c_void),
    f(stub::<7, 30> as *const c_void),
    f(stub::<7, 31> as *const c_void),
    f(stub::<7, 32> as *const c_void),
    f(stub::<7, 33> as *const c_void),
    f(stub::<7, 34> as *const c_void),
    f(stub::<7, 35> as *const c_void),
    f(stub::<7, 36> as *const c_void),
    f(stub::<7, 37> as *const c_void),
    f(stub::<7, 38> as *const c_void),
    f(streams::private_stream_id as *const c_void),
    f(stub::<7, 40> as *const c_void),
    f(stub::<7, 41> as *const c_void),
    f(stub::<7, 42> as *const c_void),
    f(stub::<7, 43> as *const c_void),
    f(stub::<7, 44> as *const c_void),
    f(stub::<7, 45> as *const c_void),
    f(stub::<7, 46> as *const c_void),
    f(stub::<7, 47> as *const c_void),
    f(stub::<7, 48> as *const c_void),
    f(stub::<7, 49> as *const c_void),
    f(stub::<7, 50> as *const c_void),
    f(streams::private_stream as *const c_void),
    f(stub::<7, 52> as *const c_void),
    f(stub::<7, 53> as *const c_void),
    f(stub::<7, 54> as *const c_void),
    f(stub::<7, 55> as *const c_void),
    f(stub::<7, 56> as *const c_void),
    f(stub::<7, 57> as *const c_void),
    f(stub::<7, 58> as *const c_void),
    f(stub::<7, 59> as *const c_void),
    f(stub::<7, 60> as *const c_void),
    f(stub::<7, 61> as *const c_void),
    f(stub::<7, 62> as *const c_void),
    f(stub::<7, 63> as *const c_void),
    f(stub::<7, 64> as *const c_void),
    f(stub::<7, 65> as *const c_void),
    f(stub::<7, 66> as *const c_void),
    f(stub::<7, 67> as *const c_void),
    f(stub::<7, 68> as *const c_void),
    f(stub::<7, 69> as *const c_void),
    f(stub::<7, 70> as *const c_void),
    f(stub::<7, 71> as *const c_void),
    f(stub::<7, 72> as *const c_void),
    f(stub::<7, 73> as *const c_void),
    f(stub::<7, 74> as *const c_void),
    f(stub::<7, 75> as *const c_void),
    f(stub::<7, 76> as *const c_void),
    f(stub::<7, 77> as *const c_void),
    f(stub::<7, 78> as *const c_void),
    f(stub::<7, 79> as *const c_void),
    f(stub::<7, 80> as *const c_void),
    f(stub::<7, 81> as *const c_void),
    f(stub::<7, 82> as *const c_void),
    f(stub::<7, 83> as *const c_void),
    f(stub::<7, 84> as *const c_void),
    f(stub::<7, 85> as *const c_void),
    f(stub::<7, 86> as *const c_void),
    f(stub::<7, 87> as *const c_void),
    f(stub::<7, 88> as *const c_void),
    f(stub::<7, 89> as *const c_void),
    f(stub::<7, 90> as *const c_void),
    f(stub::<7, 91> as *const c_void),
    f(stub::<7, 92> as *const c_void),
]);

pub static CUBLASLT_B: Table<17> = Table([
    size(17),
    f(stub::<8, 1> as *const c_void),
    f(stub::<8, 2> as *const c_void),
    f(stub::<8, 3> as *const c_void),
    f(cudart::no_device_data as *const c_void),
    f(stub::<8, 5> as *const c_void),
    f(stub::<8, 6> as *const c_void),
    f(stub::<8, 7> as *const c_void),
    f(stub::<8, 8> as *const c_void),
    f(stub::<8, 9> as *const c_void),
    f(stub::<8, 10> as *const c_void),
    f(stub::<8, 11> as *const c_void),
    f(stub::<8, 12> as *const c_void),
    f(cudart::free_device_data as *const c_void),
    f(stub::<8, 14> as *const c_void),
    f(stub::<8, 15> as *const c_void),
    f(stub::<8, 16> as *const c_void),
]);

pub static NVRTC: Table<7> = Table([
    size(7),
    f(compile_cache::make_key as *const c_void),
    f(compile_cache::drop_key as *const c_void),
    f(compile_cache::get as *const c_void),
    f(compile_cache::put as *const c_void),
    f(stub::<9, 5> as *const c_void),
    f(compile_cache::free_data as *const c_void),
]);

/// cuFFT's: 99 words as the driver's (792 bytes), slot 93 NULL as there.
pub static FUNCTIONS: Table<99> = Table([
    size(99),
    f(stub::<10, 1> as *const c_void),
    f(stub::<10, 2> as *const c_void),
    f(stub::<10, 3> as *const c_void),
    f(stub::<10, 4> as *const c_void),
    f(stub::<10, 5> as *const c_void),
    f(stub::<10, 6> as *const c_void),
    f(functions::module_functions as *const c_void),
    f(stub::<10, 8> as *const c_void),
    f(stub::<10, 9> as *const c_void),
    f(stub::<10, 10> as *const c_void),
    f(stub::<10, 11> as *const c_void),
    f(stub::<10, 12> as *const c_void),
    f(stub::<10, 13> as *const c_void),
    f(stub::<10, 14> as *const c_void),
    f(stub::<10, 15> as *const c_void),
    f(stub::<10, 16> as *const c_void),
    f(stub::<10, 17> as *const c_void),
    f(stub::<10, 18> as *const c_void),
    f(stub::<10, 19> as *const c_void),
    f(stub::<10, 20> as *const c_void),
    f(stub::<10, 21> as *const c_void),
    f(stub::<10, 22> as *const c_void),
    f(stub::<10, 23> as *const c_void),
    f(stub::<10, 24> as *const c_void),
    f(stub::<10, 25> as *const c_void),
    f(stub::<10, 26> as *const c_void),
    f(stub::<10, 27> as *const c_void),
    f(stub::<10, 28> as *const c_void),
    f(stub::<10, 29> as *const c_void),
    f(stub::<10, 30> as *const c_void),
    f(stub::<10, 31> as *const c_void),
    f(stub::<10, 32> as *const c_void),
    f(stub::<10, 33> as *const c_void),
    f(stub::<10, 34> as *const c_void),
    f(stub::<10, 35> as *const c_void),
    f(stub::<10, 36> as *const c_void),
    f(stub::<10, 37> as *const c_void),
    f(stub::<10, 38> as *const c_void),
    f(stub::<10, 39> as *const c_void),
    f(stub::<10, 40> as *const c_void),
    f(stub::<10, 41> as *const c_void),
    f(stub::<10, 42> as *const c_void),
    f(stub::<10, 43> as *const c_void),
    f(stub::<10, 44> as *const c_void),
    f(stub::<10, 45> as *const c_void),
    f(stub::<10, 46> as *const c_void),
    f(stub::<10, 47> as *const c_void),
    f(stub::<10, 48> as *const c_void),
    f(stub::<10, 49> as *const c_void),
    f(stub::<10, 50> as *const c_void),
    f(stub::<10, 51> as *const c_void),
    f(stub::<10, 52> as *const c_void),
    f(stub::<10, 53> as *const c_void),
    f(stub::<10, 54> as *const c_void),
    f(stub::<10, 55> as *const c_void),
    f(stub::<10, 56> as *const c_void),
    f(stub::<10, 57> as *const c_void),
    f(stub::<10, 58> as *const c_void),
    f(stub::<10, 59> as *const c_void),
    f(stub::<10, 60> as *const c_void),
    f(stub::<10, 61> as *const c_void),
    f(stub::<10, 62> as *const c_void),
    f(stub::<10, 63> as *const c_void),
    f(stub::<10, 64> as *const c_void),
    f(stub::<10, 65> as *const c_void),
    f(stub::<10, 66> as *const c_void),
    f(stub::<10, 67> as *const c_void),
    f(stub::<10, 68> as *const c_void),
    f(stub::<10, 69> as *const c_void),
    f(stub::<10, 70> as *const c_void),
    f(stub::<10, 71> as *const c_void),
    f(stub::<10, 72> as *const c_void),
    f(stub::<10, 73> as *const c_void),
    f(stub::<10, 74> as *const c_void),
    f(stub::<10, 75> as *const c_void),
    f(stub::<10, 76> as *const c_void),
    f(stub::<10, 77> as *const c_void),
    f(stub::<10, 78> as *const c_void),
    f(stub::<10, 79> as *const c_void),
    f(stub::<10, 80> as *const c_void),
    f(stub::<10, 81> as *const c_void),
    f(stub::<10, 82> as *const c_void),
    f(stub::<10, 83> as *const c_void),
    f(stub::<10, 84> as *const c_void),
    f(stub::<10, 85> as *const c_void),
    f(stub::<10, 86> as *const c_void),
    f(stub::<10, 87> as *const c_void),
    f(stub::<10, 88> as *const c_void),
    f(stub::<10, 89> as *const c_void),
    f(stub::<10, 90> as *const c_void),
    f(stub::<10, 91> as *const c_void),
    f(stub::<10, 92> as *const c_void),
    NULL,
    f(stub::<10, 94> as *const c_void),
    f(stub::<10, 95> as *const c_void),
    f(stub::<10, 96> as *const c_void),
    f(stub::<10, 97> as *const c_void),
    f(stub::<10, 98> as *const c_void),
]);

/// Every table by UUID.
pub static ALL: [Known; 11] = [
    (uuid("6bd5fb6c5bf4e74a8987d93912fd9df9"), || CUDART.ptr()),
    (uuid("42d85a8123f6cb478298f6e78a3aecdc"), || TOOLS_TLS.ptr()),
    (uuid("a094798c2e742e7493f20800200c0a66"), || {
        TOOLS_HOOKS.ptr()
    }),
    (uuid("c693336e1121df11a8c368f355d89593"), || {
        CONTEXT_STORAGE.ptr()
    }),
    (uuid("263e88607cd2614392f6bbd5006dfa7e"), || {
        CONTEXT_CHECKS.ptr()
    }),
    (uuid("d4082055bde6704b8d34ba123c66e1f2"), || INTEGRITY.ptr()),
    (uuid("f8cff95121468b4eb9e2fb469e7c0dd9"), || {
        RUNTIME_F8.ptr()
    }),
    (uuid("21318c60971432488ca641ff7324c8f2"), || {
        CUBLASLT_A.ptr()
    }),
    (uuid("1734dc26800d47458726c0f1e7dd8bca"), || {
        CUBLASLT_B.ptr()
    }),
    (uuid("da9151d33ae6cc41a5c04f26d533e328"), || NVRTC.ptr()),
    (uuid("6e163fbeb958444d835ce182aff1991e"), || FUNCTIONS.ptr()),
];

// ---- the integrity check -------------------------------------------------------------

/// The digest of this process, thread, driver and device that the runtime checks.
pub extern "C" fn integrity_check(
    version: u32,
    unix_seconds: u64,
    digest_out: *mut [u64; 2],
) -> CUresult {
    entry("integrity_check", || {
        let d = driver::get()?;
        let driver_version = match d.gpus.bound_device().driver_version {
            v if v > 0 => v as u32,
            _ => CUDA_VERSION as u32,
        };
        let facts = Facts {
            driver_version,
            version,
            process: std::process::id(),
            // SAFETY: pthread_self has no preconditions.
            thread: unsafe { libc::pthread_self() } as u32,
            cudart_table: CUDART.ptr() as usize,
            integrity_table: INTEGRITY.ptr() as usize,
            check_fn: integrity_check as *const () as usize,
            unix_seconds,
        };
        // Every device the program sees, in order, as the runtime counts them.
        let devices: Vec<DeviceFacts> = d
            .gpus
            .visible
            .iter()
            .map(|info| {
                let attr = |a| d.attribute_of(info, a).unwrap_or(0);
                DeviceFacts {
                    uuid: info.uuid,
                    pci_domain: attr(device_attr::PCI_DOMAIN_ID),
                    pci_bus: attr(device_attr::PCI_BUS_ID),
                    pci_device: attr(device_attr::PCI_DEVICE_ID),
                }
            })
            .collect();
        // SAFETY: the caller passes a writable out-parameter.
        unsafe { out(digest_out, digest(&facts, &devices)) }
    })
}

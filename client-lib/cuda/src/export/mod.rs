//! `cuGetExportTable`: the undocumented tables of driver functions the CUDA runtime and some
//! libraries ask for by UUID. Each is implemented here, slot by slot, from what each slot was
//! seen to do (see docs/consolidated.md); a slot whose use was never seen is a stub that says
//! so on stderr, once, and answers CUDA_ERROR_NOT_SUPPORTED. A table nobody here knows is
//! refused with CUDA_ERROR_NOT_FOUND, as a driver without it would.

use std::ffi::c_void;

use crate::status::entry;
use crate::types::{CUresult, CUuuid, result};

mod compile_cache;
mod cudart;
mod functions;
pub mod integrity;
mod streams;
mod tables;

/// One entry of a table: its size in bytes (the first entry of most tables), or a function.
#[repr(C)]
#[derive(Clone, Copy)]
pub union Slot {
    pub size: usize,
    pub f: *const c_void,
}

/// A table of slots, as handed out.
#[repr(transparent)]
pub struct Table<const N: usize>(pub [Slot; N]);

// SAFETY: the tables are immutable statics of sizes and function addresses.
unsafe impl<const N: usize> Sync for Table<N> {}

impl<const N: usize> Table<N> {
    pub fn ptr(&'static self) -> *const c_void {
        self.0.as_ptr().cast()
    }
}

/// A table's UUID from its usual text (`6bd5fb6c5bf4e74a8987d93912fd9df9`).
pub const fn uuid(hex: &str) -> CUuuid {
    let h = hex.as_bytes();
    let mut bytes = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        bytes[i] = nibble(h[2 * i]) << 4 | nibble(h[2 * i + 1]);
        i += 1;
    }
    CUuuid { bytes }
}

const fn nibble(c: u8) -> u8 {
    match c {
        b'0'..=b'9' => c - b'0',
        b'a'..=b'f' => c - b'a' + 10,
        _ => panic!("not a lowercase hex digit"),
    }
}

/// A table's UUID and where it is.
pub type Known = (CUuuid, fn() -> *const c_void);

/// The table with `id`, if this driver has it.
pub fn table(id: &CUuuid) -> Option<*const c_void> {
    tables::ALL
        .iter()
        .find(|(uuid, _)| uuid == id)
        .map(|(_, t)| t())
}

/// # Safety
/// `out` is NULL or valid for writing; `id` is NULL or a valid UUID.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetExportTable(out: *mut *const c_void, id: *const CUuuid) -> CUresult {
    entry("cuGetExportTable", || {
        if out.is_null() || id.is_null() {
            return Err(result::INVALID_VALUE);
        }
        // SAFETY: non-NULL, per the contract.
        let id = unsafe { *id };
        let t = table(&id).ok_or_else(|| not_served(&id))?;
        // SAFETY: non-NULL and writable, per the contract.
        unsafe { out.write(t) };
        Ok(())
    })
}

/// Tables a library was seen to need that this driver does not serve, and what for: asking
/// for one says so once (other unknown tables, NVML's among them, are refused quietly: the
/// runtime does without them). None at present: cuFFT's `6e163fbe` is served now.
const NOT_SERVED: [(CUuuid, &str); 0] = [];

/// CUDA_ERROR_NOT_FOUND for a table this driver does not have, said once if a library needs it.
fn not_served(id: &CUuuid) -> CUresult {
    if let Some((_, what)) = NOT_SERVED.iter().find(|(uuid, _)| uuid == id) {
        crate::log::say_once(&format!(
            "a library asked for driver export table {what}, which gpushare's CUDA driver does not serve (CUDA_ERROR_NOT_FOUND)"
        ));
    }
    result::NOT_FOUND
}

/// A slot whose use was never seen: says so once and refuses.
pub fn unknown_slot(table: &str, slot: usize) -> CUresult {
    crate::log::say_once(&format!(
        "the CUDA runtime or a library called driver export table {table} slot {slot}, which gpushare's CUDA driver does not implement (CUDA_ERROR_NOT_SUPPORTED)"
    ));
    result::NOT_SUPPORTED
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_read_as_their_bytes() {
        let u = uuid("6bd5fb6c5bf4e74a8987d93912fd9df9");
        assert_eq!(u.bytes[..4], [0x6b, 0xd5, 0xfb, 0x6c]);
        assert_eq!(u.bytes[15], 0xf9);
    }

    #[test]
    fn known_tables_are_found_and_others_are_not() {
        assert!(table(&uuid("6bd5fb6c5bf4e74a8987d93912fd9df9")).is_some());
        assert!(table(&uuid("d4082055bde6704b8d34ba123c66e1f2")).is_some());
        assert!(table(&uuid("6e163fbeb958444d835ce182aff1991e")).is_some());
        assert!(table(&uuid("00000000000000000000000000000000")).is_none());
    }
}

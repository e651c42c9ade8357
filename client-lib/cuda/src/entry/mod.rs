//! Every driver entry point, and how programs find them: by symbol (the exports) or by name,
//! CUDA version and stream semantics (`cuGetProcAddress`, which the CUDA runtime uses for
//! everything). `table.rs` is generated from the CUDA headers (client-lib/cuda/gen).

use std::ffi::{CStr, c_char, c_int, c_void};

use crate::status::entry;
use crate::types::{CUresult, proc_address, result};

mod table;

/// One form of an entry point.
pub struct Entry {
    pub name: &'static str,
    /// The CUDA version that introduced this form.
    pub version: u32,
    /// The per-thread-default-stream form (`_ptsz`, `_ptds`).
    pub per_thread: bool,
    pub func: *const c_void,
}

// SAFETY: an immutable table of names, numbers and function addresses.
unsafe impl Sync for Entry {}

impl Entry {
    pub const fn new(
        name: &'static str,
        version: u32,
        per_thread: bool,
        func: *const c_void,
    ) -> Entry {
        Entry {
            name,
            version,
            per_thread,
            func,
        }
    }
}

/// Stubs for the entry points this driver does not implement.
macro_rules! stubs {
    ($($name:ident,)*) => {$(
        #[unsafe(no_mangle)]
        pub extern "C" fn $name() -> crate::types::CUresult {
            crate::entry::unsupported(stringify!($name))
        }
    )*};
}
pub(crate) use stubs;

/// What an unsupported entry point does: one line on stderr (once), and the error a driver
/// without the feature gives.
pub fn unsupported(name: &str) -> CUresult {
    say_unsupported(name);
    result::NOT_SUPPORTED
}

/// One line on stderr, once, naming a call (or a use of one) this driver does not support.
pub fn say_unsupported(what: &str) {
    say_refused(what, result::NOT_SUPPORTED);
}

/// As [`say_unsupported`], for a call that fails with `code`, the error a driver without the
/// feature gives for it.
pub fn say_refused(what: &str, code: CUresult) {
    let name = crate::status::name(code).unwrap_or("an error\0");
    let name = name.trim_end_matches('\0');
    crate::log::say_once(&format!(
        "{what} is not supported by gpushare's CUDA driver ({name}); see `gpushare run --help` for what consolidated programs can use"
    ));
}

/// The form of `name` a program built for CUDA `version` wants, and its status.
pub fn lookup(name: &str, version: u32, per_thread: bool) -> Result<*const c_void, i32> {
    let forms = {
        let first = table::ENTRIES.partition_point(|e| e.name < name);
        let last = table::ENTRIES.partition_point(|e| e.name <= name);
        &table::ENTRIES[first..last]
    };
    if forms.is_empty() {
        return Err(proc_address::SYMBOL_NOT_FOUND);
    }
    let best = |pt: bool| {
        forms
            .iter()
            .filter(|e| e.per_thread == pt && e.version <= version)
            .max_by_key(|e| e.version)
    };
    let found = if per_thread {
        best(true).or_else(|| best(false))
    } else {
        best(false)
    };
    found
        .map(|e| e.func)
        .ok_or(proc_address::VERSION_NOT_SUFFICIENT)
}

/// # Safety
/// `symbol` is NULL or NUL-terminated; `pfn` and `status` are NULL or valid for writing.
unsafe fn get_proc_address(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CUresult {
    entry("cuGetProcAddress", || {
        if symbol.is_null() || pfn.is_null() {
            return Err(result::INVALID_VALUE);
        }
        // SAFETY: the caller's contract.
        let name = unsafe { CStr::from_ptr(symbol) }.to_str().unwrap_or("");
        let per_thread = flags & proc_address::PER_THREAD_DEFAULT_STREAM != 0;
        // A version of 0 or less asks for the newest form.
        let version = u32::try_from(version)
            .ok()
            .filter(|&v| v > 0)
            .unwrap_or(u32::MAX);
        let found = lookup(name, version, per_thread);
        if found.is_err() && crate::status::trace::level() >= crate::status::trace::ERRORS {
            crate::log::say(&format!(
                "cuGetProcAddress: no {name} for version {version}"
            ));
        }
        // SAFETY: the caller's contract.
        unsafe {
            if !status.is_null() {
                *status = found.err().unwrap_or(proc_address::SYMBOL_SUCCESS);
            }
            *pfn = found.map_or(std::ptr::null_mut(), |f| f as *mut c_void);
        }
        found.map(drop).map_err(|_| result::NOT_FOUND)
    })
}

/// # Safety
/// As `cuGetProcAddress_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
) -> CUresult {
    // SAFETY: the same contract.
    unsafe { get_proc_address(symbol, pfn, version, flags, std::ptr::null_mut()) }
}

/// # Safety
/// `symbol` is NULL or NUL-terminated; `pfn` and `status` are NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CUresult {
    // SAFETY: the same contract.
    unsafe { get_proc_address(symbol, pfn, version, flags, status) }
}

/// # Safety
/// As `cuGetProcAddress_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress_v2_ptsz(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CUresult {
    // SAFETY: the same contract.
    unsafe { get_proc_address(symbol, pfn, version, flags, status) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_sorted_so_lookups_find_every_form() {
        assert!(
            table::ENTRIES
                .windows(2)
                .all(|w| (w[0].name, w[0].per_thread, w[0].version)
                    <= (w[1].name, w[1].per_thread, w[1].version)),
            "sorted"
        );
        for e in &table::ENTRIES {
            assert_eq!(
                lookup(e.name, e.version, e.per_thread),
                Ok(e.func),
                "{}",
                e.name
            );
        }
    }

    #[test]
    fn versions_pick_the_form_a_program_was_built_for() {
        let newest = lookup("cuCtxGetDevice", 13000, false).expect("found");
        let oldest = lookup("cuCtxGetDevice", 12080, false).expect("found");
        assert_ne!(newest, oldest, "CUDA 13 programs get cuCtxGetDevice_v2");
        assert_eq!(oldest, crate::context::api::cuCtxGetDevice as *const c_void);
        assert_eq!(
            newest,
            crate::context::api::cuCtxGetDevice_v2 as *const c_void
        );
        assert_eq!(
            lookup("cuMemAlloc", 13000, false),
            Ok(crate::memory::api::cuMemAlloc_v2 as *const c_void)
        );
        assert_eq!(
            lookup("cuLaunchKernel", 13000, true),
            Ok(crate::launch::cuLaunchKernel_ptsz as *const c_void),
            "per-thread default stream"
        );
        assert_eq!(
            lookup("cuMemAlloc", 13000, true),
            Ok(crate::memory::api::cuMemAlloc_v2 as *const c_void),
            "no per-thread form: the plain one"
        );
        assert_eq!(
            lookup("cuNoSuchThing", 13000, false),
            Err(proc_address::SYMBOL_NOT_FOUND)
        );
        assert_eq!(
            lookup("cuMemAlloc", 1000, false),
            Err(proc_address::VERSION_NOT_SUFFICIENT)
        );
    }

    #[test]
    fn the_table_knows_every_symbol_this_crate_implements() {
        // Catches a new entry point without a regenerated table (gen/entries.py).
        let src = concat!(env!("CARGO_MANIFEST_DIR"), "/src");
        let mut found = Vec::new();
        let mut dirs = vec![std::path::PathBuf::from(src)];
        while let Some(dir) = dirs.pop() {
            for f in std::fs::read_dir(&dir).expect("src") {
                let path = f.expect("entry").path();
                if path.is_dir() {
                    dirs.push(path);
                } else if path.extension().is_some_and(|e| e == "rs")
                    && !path.ends_with("entry/table.rs")
                {
                    let text = std::fs::read_to_string(&path).expect("read");
                    // `stream_forms!` lines (copy.rs): `cuX / cuX_ptds (`.
                    for line in text.lines() {
                        let t = line.trim_start();
                        if let Some((a, b)) = t.split_once(" / ")
                            && a.starts_with("cu")
                            && a.chars().all(|c| c.is_alphanumeric() || c == '_')
                            && let Some(b) = b.split(" (").next()
                        {
                            found.push(a.to_string());
                            found.push(b.to_string());
                        }
                    }
                    let mut rest = text.as_str();
                    while let Some(i) = rest.find("#[unsafe(no_mangle)]") {
                        rest = &rest[i + 20..];
                        let head: String = rest.chars().take(200).collect();
                        if let Some(j) = head.find("extern \"C\" fn cu") {
                            let name: String = head[j + 14..]
                                .chars()
                                .take_while(|c| c.is_alphanumeric() || *c == '_')
                                .collect();
                            found.push(name);
                        }
                    }
                }
            }
        }
        found.sort();
        let mut listed: Vec<String> = table::IMPLEMENTED.iter().map(|s| s.to_string()).collect();
        listed.sort();
        assert_eq!(
            found, listed,
            "regenerate with client-lib/cuda/gen/entries.py"
        );
        assert!(table::SYMBOLS.len() > 600);
    }
}

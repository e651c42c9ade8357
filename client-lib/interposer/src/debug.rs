//! `GPUSHARE_INTERPOSE_DEBUG=1`: the interposer tells on stderr how the program reaches it,
//! for finding out why a program's launches or allocations are not governed.
//!
//! Lines start with `gpushare-debug:`:
//! - the first call of each wrapped entry point, with the thread that made it and how the
//!   program obtained the wrapper: `dlsym` on libcuda's handle, `cuGetProcAddress` (which
//!   version of it, and the symbol, CUDA version and flags asked for), or neither (the program
//!   links libcuda, or looked the name up in the global scope);
//! - every distinct lookup of a governed function (`cuGetProcAddress` or `dlsym` by handle)
//!   whose answer the interposer could not wrap, with what the answer is (`dladdr`): calls
//!   through it bypass the broker;
//! - the connection to the broker and the first grant of launch tokens;
//! - at exit, a summary: whether the program was governed, calls per entry point, and what
//!   was asked of the broker.
//!
//! Off (the default) it costs one relaxed load per call.

use std::ffi::{CStr, c_int, c_void};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use crate::real::Sym;

/// The environment variable that turns the diagnostics on (any value but empty or `0`).
pub use gpushare_conn::env::INTERPOSE_DEBUG_ENV as DEBUG_ENV;

static ENABLED: OnceLock<bool> = OnceLock::new();

/// Whether diagnostics are on (read from the environment once).
pub fn enabled() -> bool {
    *ENABLED.get_or_init(|| {
        let on = std::env::var_os(DEBUG_ENV).is_some_and(|v| !v.is_empty() && v != "0");
        if on {
            // SAFETY: registers a plain function without arguments, which stays loaded (a
            // preloaded library is never unloaded).
            unsafe { libc::atexit(at_exit) };
        }
        on
    })
}

/// How a program asked for a function.
#[derive(Debug, Clone, Copy)]
pub enum Lookup<'a> {
    /// `dlsym` with a handle of libcuda.
    Dlsym { name: &'a CStr },
    /// `cuGetProcAddress` (`v2`: the CUDA 12 one).
    ProcAddress {
        symbol: &'a CStr,
        version: c_int,
        flags: u64,
        v2: bool,
    },
}

impl fmt::Display for Lookup<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Lookup::Dlsym { name } => write!(f, "dlsym(libcuda, {name:?})"),
            Lookup::ProcAddress {
                symbol,
                version,
                flags,
                v2,
            } => write!(
                f,
                "cuGetProcAddress{}({symbol:?}, version {version}, flags {flags:#x})",
                if v2 { "_v2" } else { "" }
            ),
        }
    }
}

const VIA_DLSYM: u8 = 1;
const VIA_PROC_ADDRESS: u8 = 2;

/// What the diagnostics know of one entry point.
struct Record {
    /// How the program obtained its wrapper (`VIA_*` bits).
    via: AtomicU8,
    /// The first lookup that handed the wrapper out, by path.
    first_dlsym: Mutex<Option<String>>,
    first_proc_address: Mutex<Option<String>>,
    calls: AtomicU64,
}

impl Record {
    const fn new() -> Record {
        Record {
            via: AtomicU8::new(0),
            first_dlsym: Mutex::new(None),
            first_proc_address: Mutex::new(None),
            calls: AtomicU64::new(0),
        }
    }
}

static RECORDS: [Record; Sym::COUNT] = [const { Record::new() }; Sym::COUNT];
/// Lookups already reported as not wrapped, so that each is told once.
static MISSED: Mutex<Vec<String>> = Mutex::new(Vec::new());
static FIRST_TOKENS: AtomicBool = AtomicBool::new(false);

fn record(sym: Sym) -> &'static Record {
    &RECORDS[sym as usize]
}

/// One diagnostic line.
pub fn say(message: fmt::Arguments<'_>) {
    if enabled() {
        eprintln!("gpushare-debug: {message}");
    }
}

/// A lookup handed out the wrapper of `sym`.
pub fn handed_out(sym: Sym, how: Lookup<'_>) {
    if !enabled() {
        return;
    }
    let r = record(sym);
    let (bit, first) = match how {
        Lookup::Dlsym { .. } => (VIA_DLSYM, &r.first_dlsym),
        Lookup::ProcAddress { .. } => (VIA_PROC_ADDRESS, &r.first_proc_address),
    };
    if r.via.fetch_or(bit, Ordering::Relaxed) & bit == 0 {
        let mut first = first.lock().unwrap_or_else(|p| p.into_inner());
        first.get_or_insert_with(|| how.to_string());
    }
}

/// The base name of a driver function: without `_v2`…`_v9` and the default-stream suffixes.
fn base(name: &[u8]) -> &[u8] {
    let mut n = name;
    loop {
        let stripped = [b"_ptsz".as_slice(), b"_ptds"]
            .iter()
            .find_map(|s| n.strip_suffix(*s))
            .or_else(|| match n {
                [rest @ .., b'_', b'v', d] if d.is_ascii_digit() => Some(rest),
                _ => None,
            });
        match stripped {
            Some(rest) => n = rest,
            None => return n,
        }
    }
}

/// Whether `name` (as asked for) is a function the interposer means to govern.
fn is_governed_name(name: &[u8]) -> bool {
    let b = base(name);
    Sym::ALL.iter().any(|s| base(s.name().to_bytes()) == b)
}

/// A lookup of a governed function answered with something the interposer does not wrap.
pub fn missed(how: Lookup<'_>, found: *mut c_void) {
    if !enabled() {
        return;
    }
    let name = match how {
        Lookup::Dlsym { name } => name,
        Lookup::ProcAddress { symbol, .. } => symbol,
    };
    if !is_governed_name(name.to_bytes()) {
        return;
    }
    let line = format!(
        "{how} -> {} is not a libcuda function the interposer wraps: calls through it are NOT governed",
        describe(found)
    );
    let mut missed = MISSED.lock().unwrap_or_else(|p| p.into_inner());
    if !missed.contains(&line) {
        eprintln!("gpushare-debug: {line}");
        missed.push(line);
    }
}

/// An address as `dladdr` names it: `0x…` (`SYMBOL+OFFSET` in `FILE`).
fn describe(f: *mut c_void) -> String {
    if f.is_null() {
        return "null".into();
    }
    // SAFETY: dladdr only reads the address, and fills `info` (zeroed: a valid Dl_info).
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::dladdr(f, &mut info) } == 0 {
        return format!("{f:p} (in no loaded object)");
    }
    let text = |p: *const libc::c_char| {
        if p.is_null() {
            "?".to_string()
        } else {
            // SAFETY: dladdr's strings are NUL-terminated and live as long as the object.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        }
    };
    let offset = (f as usize).wrapping_sub(info.dli_saddr as usize);
    format!(
        "{f:p} ({}+{offset:#x} in {})",
        text(info.dli_sname),
        text(info.dli_fname)
    )
}

/// A wrapper was called.
pub fn called(sym: Sym) {
    if !enabled() {
        return;
    }
    let r = record(sym);
    if r.calls.fetch_add(1, Ordering::Relaxed) > 0 {
        return;
    }
    let via = r.via.load(Ordering::Relaxed);
    let mut paths = Vec::new();
    let first = |m: &Mutex<Option<String>>| {
        m.lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .unwrap_or_default()
    };
    if via & VIA_PROC_ADDRESS != 0 {
        paths.push(first(&r.first_proc_address));
    }
    if via & VIA_DLSYM != 0 {
        paths.push(first(&r.first_dlsym));
    }
    let how = if paths.is_empty() {
        "linked directly (or found with a global-scope dlsym)".to_string()
    } else {
        format!("obtained via {}", paths.join(" and via "))
    };
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    eprintln!(
        "gpushare-debug: first call of {} (thread {tid}), {how}",
        sym.name().to_string_lossy()
    );
}

/// The first grant of launch tokens (later ones are counted in the summary).
pub fn first_tokens(tokens: u64, valid_us: u64, lease: bool, waited_ns: u64) {
    if enabled() && !FIRST_TOKENS.swap(true, Ordering::Relaxed) {
        say(format_args!(
            "first launch tokens: {tokens}, valid {valid_us} µs{}, after waiting {:.3} ms",
            if lease {
                " (a lease: scheduled against others)"
            } else {
                " (not gated)"
            },
            waited_ns as f64 / 1e6
        ));
    }
}

extern "C" fn at_exit() {
    let calls: Vec<String> = Sym::ALL
        .iter()
        .filter_map(|&s| {
            let n = record(s).calls.load(Ordering::Relaxed);
            (n > 0).then(|| format!("{} {n}", s.name().to_string_lossy()))
        })
        .collect();
    eprintln!(
        "gpushare-debug: at exit (pid {}): {}; calls: {}",
        std::process::id(),
        crate::governor::summary(),
        if calls.is_empty() {
            "none".to_string()
        } else {
            calls.join(", ")
        }
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_names_drop_versions_and_stream_suffixes() {
        assert_eq!(base(b"cuLaunchKernel_ptsz"), b"cuLaunchKernel");
        assert_eq!(base(b"cuMemAlloc_v2"), b"cuMemAlloc");
        assert_eq!(base(b"cuMemcpyHtoDAsync_v2_ptds"), b"cuMemcpyHtoDAsync");
        assert_eq!(base(b"cuCtxCreate_v4"), b"cuCtxCreate");
        assert_eq!(base(b"cuInit"), b"cuInit");
        assert!(is_governed_name(b"cuLaunchKernelEx"));
        assert!(is_governed_name(b"cuGetProcAddress"));
        assert!(!is_governed_name(b"cuDeviceGetCount"));
        assert!(!is_governed_name(b"cuMemcpyHtoD_v2"));
    }
}

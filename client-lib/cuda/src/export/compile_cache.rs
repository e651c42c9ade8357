//! The compile cache NVRTC asks the driver for (table `da9151d3…`). Before it compiles, NVRTC
//! makes a key of everything the result depends on (its NVVM input, the options, its own build,
//! the target) and looks it up; on a miss it compiles and stores the PTX under that key. A real
//! driver keeps these results in its compute cache; this one keeps them in the process, at most
//! [`CAPACITY`] bytes of keys and results, dropping the oldest first. A miss costs NVRTC only the
//! compile it would have done anyway.
//!
//! The slots, as driver 580's code has them and as NVRTC 13.0 was seen calling them (CuPy's
//! kernels, cuSOLVER's and cuSPARSE's, on the H200):
//!
//! | slot | call | answer |
//! |---|---|---|
//! | 1 | `(key *out, u32 kind, input, u32 len, options, host, build, int arch, int flag)` | a key |
//! | 2 | `(key)` | frees it |
//! | 3 | `(key, u32 tag, void **data, u32 *len)` | the stored bytes, or CUDA_ERROR_NOT_FOUND |
//! | 4 | `(key, u32 tag, data, u32 len)` | stores a copy |
//! | 6 | `(data)` | frees what slot 3 gave |
//!
//! `kind` is 1, 2 or 3 (NVRTC passes 2, with LLVM bitcode); `host` and `build` are strings
//! (`"HOST64"`, NVRTC's build date); `tag` only labels the call for the driver's tools. Keys and
//! the data slot 3 hands out are remembered, so a value this driver did not make is refused
//! instead of freed. With `CUDA_CACHE_DISABLE=1` slots 1, 3 and 4 answer
//! CUDA_ERROR_NOT_INITIALIZED, as the driver's do (seen on the H200); NVRTC then compiles
//! without a cache, as it does where the driver has no such table.

use std::collections::{HashMap, HashSet, VecDeque};
use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::{Arc, LazyLock, Mutex};

use crate::driver;
use crate::status::{Cu, entry, out};
use crate::types::{CUresult, result};

/// The most bytes of keys and results kept.
pub const CAPACITY: usize = 64 << 20;

/// What a key stands for, serialised: equal keys mean equal compiles.
type KeyBytes = Arc<[u8]>;

/// The results, oldest first in `order`.
#[derive(Default)]
struct Store {
    entries: HashMap<KeyBytes, Vec<u8>>,
    order: VecDeque<KeyBytes>,
    bytes: usize,
}

impl Store {
    fn get(&self, key: &[u8]) -> Option<&[u8]> {
        self.entries.get(key).map(Vec::as_slice)
    }

    /// Keeps `value` under `key`, dropping the oldest results to make room; a result larger
    /// than the whole cache is not kept.
    fn put(&mut self, key: &KeyBytes, value: &[u8]) {
        let size = key.len() + value.len();
        if size > CAPACITY {
            return;
        }
        if let Some(old) = self.entries.get_mut(key) {
            self.bytes = self.bytes - old.len() + value.len();
            old.clear();
            old.extend_from_slice(value);
        } else {
            self.entries.insert(key.clone(), value.to_vec());
            self.order.push_back(key.clone());
            self.bytes += size;
        }
        while self.bytes > CAPACITY {
            let Some(oldest) = self.order.pop_front() else {
                break;
            };
            if let Some(v) = self.entries.remove(&oldest) {
                self.bytes -= oldest.len() + v.len();
            }
        }
    }
}

/// The cache, the keys handed out (by address), and the data handed out (by address).
#[derive(Default)]
struct State {
    store: Store,
    keys: HashMap<usize, KeyBytes>,
    given: HashSet<usize>,
}

static STATE: LazyLock<Mutex<State>> = LazyLock::new(Mutex::default);

fn state() -> std::sync::MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|p| p.into_inner())
}

/// `CUDA_CACHE_DISABLE`'s value turns the cache off when it is `1`.
fn disabled_by(value: Option<&str>) -> bool {
    value.is_some_and(|v| v.trim() == "1")
}

/// The cache is on unless the program's environment turned it off (read once).
fn check_enabled() -> Cu<()> {
    static DISABLED: LazyLock<bool> =
        LazyLock::new(|| disabled_by(std::env::var("CUDA_CACHE_DISABLE").ok().as_deref()));
    if *DISABLED {
        return Err(result::NOT_INITIALIZED);
    }
    Ok(())
}

/// The key's handle: an address of this driver's, never read through.
#[repr(C)]
pub struct Key {
    _private: u8,
}

/// Appends a length and the bytes.
fn field(key: &mut Vec<u8>, bytes: &[u8]) {
    key.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
    key.extend_from_slice(bytes);
}

/// What a key stands for, from slot 1's arguments (already checked non-NULL).
fn serialise(kind: u32, input: &[u8], strings: [&CStr; 3], arch: c_int, flag: c_int) -> KeyBytes {
    let mut key = Vec::with_capacity(input.len() + 256);
    key.extend_from_slice(&kind.to_le_bytes());
    key.extend_from_slice(&arch.to_le_bytes());
    key.extend_from_slice(&flag.to_le_bytes());
    field(&mut key, input);
    for s in strings {
        field(&mut key, s.to_bytes());
    }
    key.into()
}

/// Slot 1: a key for a compile of `input` with `options`, by NVRTC build `build` on `host`,
/// for `arch`.
#[allow(clippy::too_many_arguments)] // the slot's own signature
pub extern "C" fn make_key(
    key: *mut *mut Key,
    kind: u32,
    input: *const u8,
    len: u32,
    options: *const c_char,
    host: *const c_char,
    build: *const c_char,
    arch: c_int,
    flag: c_int,
) -> CUresult {
    entry("compile_cache_make_key", || {
        if key.is_null()
            || input.is_null()
            || len == 0
            || options.is_null()
            || host.is_null()
            || build.is_null()
            || arch <= 0
            || !(1..=3).contains(&kind)
        {
            return Err(result::INVALID_VALUE);
        }
        driver::get()?;
        check_enabled()?;
        // SAFETY: non-NULL; the caller passes `len` bytes of input and three C strings, as
        // the driver requires of it too.
        let bytes = unsafe {
            serialise(
                kind,
                std::slice::from_raw_parts(input, len as usize),
                [
                    CStr::from_ptr(options),
                    CStr::from_ptr(host),
                    CStr::from_ptr(build),
                ],
                arch,
                flag,
            )
        };
        let handle = Box::into_raw(Box::new(Key { _private: 0 }));
        state().keys.insert(handle as usize, bytes);
        // SAFETY: non-NULL; the caller passes a writable out-parameter.
        unsafe { out(key, handle) }
    })
}

/// What a handle stands for, if this driver made it and it is not freed.
fn key_bytes(key: *mut Key) -> Cu<KeyBytes> {
    if key.is_null() {
        return Err(result::INVALID_VALUE);
    }
    state()
        .keys
        .get(&(key as usize))
        .cloned()
        .ok_or(result::INVALID_HANDLE)
}

/// Slot 2: frees a key.
pub extern "C" fn drop_key(key: *mut Key) -> CUresult {
    entry("compile_cache_drop_key", || {
        if key.is_null() {
            return Err(result::INVALID_VALUE);
        }
        driver::get()?;
        state()
            .keys
            .remove(&(key as usize))
            .ok_or(result::INVALID_HANDLE)?;
        // SAFETY: the address was made by `Box::into_raw` in `make_key` and, being in `keys`
        // until just now, was not freed before.
        drop(unsafe { Box::from_raw(key) });
        Ok(())
    })
}

/// Slot 3: the result stored under a key, in memory the caller gives back through slot 6.
pub extern "C" fn get(key: *mut Key, _tag: u32, data: *mut *mut c_void, len: *mut u32) -> CUresult {
    entry("compile_cache_get", || {
        if data.is_null() || len.is_null() {
            return Err(result::INVALID_VALUE);
        }
        let bytes = key_bytes(key)?;
        driver::get()?;
        check_enabled()?;
        let mut s = state();
        let value = s.store.get(&bytes).ok_or(result::NOT_FOUND)?;
        let size = u32::try_from(value.len()).map_err(|_| result::NOT_FOUND)?;
        // SAFETY: malloc has no preconditions; the copy below stays within both buffers.
        let copy = unsafe { libc::malloc(value.len().max(1)) }.cast::<u8>();
        if copy.is_null() {
            return Err(result::OUT_OF_MEMORY);
        }
        // SAFETY: `copy` holds `value.len()` bytes, freshly allocated, so no overlap.
        unsafe { std::ptr::copy_nonoverlapping(value.as_ptr(), copy, value.len()) };
        s.given.insert(copy as usize);
        // SAFETY: both non-NULL; the caller passes writable out-parameters.
        unsafe {
            out(data, copy.cast())?;
            out(len, size)
        }
    })
}

/// Slot 4: stores a copy of `len` bytes of `data` under a key.
pub extern "C" fn put(key: *mut Key, _tag: u32, data: *const u8, len: u32) -> CUresult {
    entry("compile_cache_put", || {
        if data.is_null() || len == 0 {
            return Err(result::INVALID_VALUE);
        }
        let bytes = key_bytes(key)?;
        driver::get()?;
        check_enabled()?;
        // SAFETY: non-NULL; the caller passes `len` readable bytes.
        let value = unsafe { std::slice::from_raw_parts(data, len as usize) };
        state().store.put(&bytes, value);
        Ok(())
    })
}

/// Slot 6: frees what slot 3 gave.
pub extern "C" fn free_data(data: *mut c_void) -> CUresult {
    entry("compile_cache_free_data", || {
        if data.is_null() || !state().given.remove(&(data as usize)) {
            return Err(result::INVALID_VALUE);
        }
        // SAFETY: slot 3 allocated it with malloc and it was not freed since (it was in
        // `given` until just now).
        unsafe { libc::free(data) };
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(input: &[u8], options: &CStr) -> KeyBytes {
        serialise(
            2,
            input,
            [options, c"HOST64", c"Aug 20 202514:13:52"],
            90,
            0,
        )
    }

    #[test]
    fn keys_differ_in_whatever_the_result_depends_on() {
        let a = key(b"BC\xc0\xde1", c"-arch=compute_90");
        assert_eq!(a, key(b"BC\xc0\xde1", c"-arch=compute_90"));
        assert_ne!(a, key(b"BC\xc0\xde2", c"-arch=compute_90"));
        assert_ne!(a, key(b"BC\xc0\xde1", c"-arch=compute_80"));
        assert_ne!(
            a,
            serialise(
                2,
                b"BC\xc0\xde1",
                [c"-arch=compute_90", c"HOST64", c"b"],
                90,
                0
            )
        );
        assert_ne!(
            a,
            serialise(
                2,
                b"BC\xc0\xde1",
                [c"-arch=compute_90", c"HOST64", c"Aug 20 202514:13:52"],
                80,
                0
            )
        );
        // A field's end is not the next one's start.
        assert_ne!(
            serialise(2, b"ab", [c"c", c"", c""], 90, 0),
            serialise(2, b"a", [c"bc", c"", c""], 90, 0)
        );
    }

    #[test]
    fn cuda_cache_disable_1_turns_it_off() {
        assert!(disabled_by(Some("1")));
        assert!(!disabled_by(Some("0")));
        assert!(!disabled_by(Some("")));
        assert!(!disabled_by(None));
    }

    #[test]
    fn the_store_keeps_results_and_drops_the_oldest_past_its_capacity() {
        let mut s = Store::default();
        let (a, b) = (key(b"a", c""), key(b"b", c""));
        assert!(s.get(&a).is_none());
        s.put(&a, b"ptx a");
        assert_eq!(s.get(&a), Some(&b"ptx a"[..]));
        s.put(&a, b"ptx a2");
        assert_eq!(s.get(&a), Some(&b"ptx a2"[..]));
        assert_eq!(s.bytes, a.len() + 6);
        let big = vec![7u8; CAPACITY / 2];
        s.put(&b, &big);
        let c = key(b"c", c"");
        s.put(&c, &big);
        assert!(s.get(&a).is_none(), "the oldest went first");
        assert!(s.get(&b).is_none());
        assert_eq!(s.get(&c).map(<[u8]>::len), Some(CAPACITY / 2));
        assert!(s.bytes <= CAPACITY);
        s.put(&a, &vec![0u8; CAPACITY]);
        assert!(s.get(&a).is_none(), "larger than the cache: not kept");
    }

    #[test]
    fn without_a_driver_or_with_bad_arguments_the_slots_refuse() {
        let mut k = std::ptr::null_mut();
        let input = b"BC\xc0\xde";
        let build = c"x".as_ptr();
        assert_eq!(
            make_key(&mut k, 2, input.as_ptr(), 4, build, build, build, 90, 0),
            result::NOT_INITIALIZED
        );
        assert_eq!(
            make_key(&mut k, 2, input.as_ptr(), 0, build, build, build, 90, 0),
            result::INVALID_VALUE
        );
        assert_eq!(
            make_key(&mut k, 4, input.as_ptr(), 4, build, build, build, 90, 0),
            result::INVALID_VALUE
        );
        assert_eq!(
            make_key(
                &mut k,
                2,
                input.as_ptr(),
                4,
                std::ptr::null(),
                build,
                build,
                90,
                0
            ),
            result::INVALID_VALUE
        );
        let mut data = std::ptr::null_mut();
        let mut len = 0u32;
        let forged: *mut Key = std::ptr::without_provenance_mut(0x1000);
        assert_eq!(get(forged, 0, &mut data, &mut len), result::INVALID_HANDLE);
        assert_eq!(put(forged, 0, input.as_ptr(), 4), result::INVALID_HANDLE);
        assert_eq!(drop_key(std::ptr::null_mut()), result::INVALID_VALUE);
        let mut not_ours = 0u8;
        assert_eq!(
            free_data((&raw mut not_ours).cast()),
            result::INVALID_VALUE,
            "only what slot 3 gave is freed"
        );
    }
}

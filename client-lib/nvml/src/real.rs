//! NVIDIA's NVML, the library the shim forwards to: found, opened once, its functions looked
//! up by name.
//!
//! `$GPUSHARE_REAL_NVML` names it; a name that does not load means no real NVML (no search).
//! Without the variable the shim looks where the loader would have: the folders of
//! `LD_LIBRARY_PATH`, the paths `/etc/ld.so.cache` lists, then the usual driver folders
//! ([`DIRS`]), skipping its own file (and any other copy of the shim). It opens the library
//! by its absolute path: the loader matches a path against the loaded objects by file, not by
//! soname, so NVIDIA's loads beside the shim. Never by the bare soname, which finds the shim.
//!
//! The library is opened `RTLD_DEEPBIND`: if the program linked the shim (nvidia-smi links
//! `libnvidia-ml.so.1`), NVIDIA's library would otherwise bind its own calls of its exported
//! functions to the shim's, and see the filtered device list itself.

use std::ffi::{CStr, CString, OsStr, c_void};
use std::fmt;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Environment variable naming the real NVML library.
pub const REAL_NVML_ENV: &str = "GPUSHARE_REAL_NVML";

/// The file name NVIDIA's NVML is found by.
const SONAME: &str = "libnvidia-ml.so.1";

/// Where drivers install NVML, searched after `LD_LIBRARY_PATH` and the loader's cache.
pub const DIRS: [&str; 8] = [
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib64",
    "/lib/x86_64-linux-gnu",
    "/lib64",
    "/usr/lib",
    "/usr/local/nvidia/lib64",
    "/usr/local/nvidia/lib",
    "/usr/lib/wsl/lib",
];

/// The loader's cache of library paths (ldconfig(8)).
const LD_SO_CACHE: &str = "/etc/ld.so.cache";

/// A symbol only the shim exports (lib.rs): a library that has it is a copy of the shim.
const SHIM_MARKER: &CStr = c"gpushare_nvml_shim";

/// The real library, open for the life of the process.
pub struct Library {
    /// The `dlopen` handle.
    handle: usize,
}

impl Library {
    /// The address of the real library's `name`, 0 if it has none.
    pub fn symbol(&self, name: &CStr) -> usize {
        // SAFETY: a handle from dlopen, never closed, and a NUL-terminated name.
        unsafe { libc::dlsym(self.handle as *mut c_void, name.as_ptr()) as usize }
    }
}

static LIBRARY: OnceLock<Option<Library>> = OnceLock::new();

/// The real library, opened on first use; `None`, said once on stderr, when there is none.
pub fn library() -> Option<&'static Library> {
    LIBRARY
        .get_or_init(|| {
            open()
                .map_err(|why| {
                    crate::note(&format!(
                        "no NVIDIA NVML to forward to ({why}): every NVML call fails with NVML_ERROR_LIBRARY_NOT_FOUND"
                    ));
                })
                .ok()
        })
        .as_ref()
}

/// Why one candidate path was not the real library.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No such file (or it cannot be looked at).
    Absent(String),
    /// It is the shim's own file.
    Itself,
    /// It is a copy of the shim.
    Shim,
    /// `dlopen` failed; its message.
    Load(String),
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Absent(why) => write!(f, "{why}"),
            Refusal::Itself => write!(f, "it is this shim"),
            Refusal::Shim => write!(f, "it is a copy of gpushare's NVML shim, not NVIDIA's NVML"),
            Refusal::Load(why) => write!(f, "cannot load it: {why}"),
        }
    }
}

fn open() -> Result<Library, String> {
    let own = own_file();
    if let Some(named) = std::env::var_os(REAL_NVML_ENV).filter(|v| !v.is_empty()) {
        let path = std::path::absolute(&named).unwrap_or_else(|_| PathBuf::from(&named));
        return try_open(&path, own)
            .map_err(|why| format!("{REAL_NVML_ENV}={}: {why}", path.display()));
    }
    let cache = read_cache();
    let ld_library_path = std::env::var_os("LD_LIBRARY_PATH");
    let mut refused = Vec::new();
    for path in search_list(ld_library_path.as_deref(), &cache) {
        match try_open(&path, own) {
            Ok(library) => return Ok(library),
            Err(Refusal::Absent(_) | Refusal::Itself) => {}
            Err(why) => refused.push(format!("{}: {why}", path.display())),
        }
    }
    let mut why = format!(
        "no NVIDIA {SONAME} in LD_LIBRARY_PATH, {LD_SO_CACHE}, {}",
        DIRS.join(", ")
    );
    if !refused.is_empty() {
        why.push_str(&format!(" (passed over: {})", refused.join("; ")));
    }
    why.push_str(&format!(
        "; is the NVIDIA driver installed? {REAL_NVML_ENV} names the library"
    ));
    Err(why)
}

/// Opens `path` if it is a real NVML: not the file `own` (the shim's device and inode).
fn try_open(path: &Path, own: Option<(u64, u64)>) -> Result<Library, Refusal> {
    let meta = std::fs::metadata(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Refusal::Absent("no such file".into()),
        _ => Refusal::Absent(e.to_string()),
    })?;
    if own == Some((meta.dev(), meta.ino())) {
        return Err(Refusal::Itself);
    }
    let name = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| Refusal::Absent("a path with a NUL byte".into()))?;
    let flags = libc::RTLD_NOW | libc::RTLD_LOCAL | libc::RTLD_DEEPBIND;
    // SAFETY: a NUL-terminated absolute path; dlopen has no other preconditions.
    let handle = unsafe { libc::dlopen(name.as_ptr(), flags) };
    if handle.is_null() {
        return Err(Refusal::Load(dlerror()));
    }
    // SAFETY: a handle dlopen just returned, and a NUL-terminated name.
    if !unsafe { libc::dlsym(handle, SHIM_MARKER.as_ptr()) }.is_null() {
        // SAFETY: the handle from dlopen above, not used after this.
        unsafe { libc::dlclose(handle) };
        return Err(Refusal::Shim);
    }
    Ok(Library {
        handle: handle as usize,
    })
}

/// The last dlopen error of this thread, in words.
fn dlerror() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated message, valid until the next dl call
    // on this thread; it is copied at once.
    let message = unsafe { libc::dlerror() };
    if message.is_null() {
        return "unknown error".into();
    }
    // SAFETY: non-NULL: a NUL-terminated string (above).
    unsafe { CStr::from_ptr(message) }
        .to_string_lossy()
        .into_owned()
}

/// The device and inode of the file the shim was loaded from.
fn own_file() -> Option<(u64, u64)> {
    // SAFETY: Dl_info is plain data (pointers and integers) for which zeroes are valid.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: an address of this library's code, and a Dl_info to fill.
    if unsafe { libc::dladdr(crate::table::own_address(), &mut info) } == 0
        || info.dli_fname.is_null()
    {
        return None;
    }
    // SAFETY: dladdr set dli_fname to a NUL-terminated path owned by the loader.
    let path = OsStr::from_bytes(unsafe { CStr::from_ptr(info.dli_fname) }.to_bytes());
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.dev(), meta.ino()))
}

/// The loader's cache, empty if there is none (at most 64 MiB of it: it is a few kB).
fn read_cache() -> Vec<u8> {
    let mut bytes = Vec::new();
    if let Ok(file) = std::fs::File::open(LD_SO_CACHE) {
        let _ = file.take(64 << 20).read_to_end(&mut bytes);
    }
    bytes
}

/// The paths of NVML that the loader's cache lists: its strings are NUL-terminated, and a
/// library's path is one of them; no need to read the format's tables.
pub fn cache_paths(cache: &[u8]) -> Vec<PathBuf> {
    let suffix = format!("/{SONAME}");
    cache
        .split(|&b| b == 0)
        .filter(|s| s.starts_with(b"/") && s.ends_with(suffix.as_bytes()))
        .map(|s| PathBuf::from(OsStr::from_bytes(s)))
        .collect()
}

/// Where to look for the real library, in order, each path once: the absolute folders of
/// `ld_library_path`, the cache's paths, then [`DIRS`].
pub fn search_list(ld_library_path: Option<&OsStr>, cache: &[u8]) -> Vec<PathBuf> {
    let from_env = ld_library_path
        .into_iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b':' || b == b';'))
        .filter(|dir| dir.starts_with(b"/"))
        .map(|dir| Path::new(OsStr::from_bytes(dir)).join(SONAME));
    let from_dirs = DIRS.iter().map(|dir| Path::new(dir).join(SONAME));
    let mut list: Vec<PathBuf> = Vec::new();
    for path in from_env.chain(cache_paths(cache)).chain(from_dirs) {
        if !list.contains(&path) {
            list.push(path);
        }
    }
    list
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_gives_its_nvml_paths() {
        let cache = b"glibc-ld.so.cache1.1\0\0\0libnvidia-ml.so.1\0/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1\0libc.so.6\0/lib/x86_64-linux-gnu/libc.so.6\0/opt/libnvidia-ml.so.1.bak\0/x/libnvidia-ml.so.1";
        assert_eq!(
            cache_paths(cache),
            [
                PathBuf::from("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"),
                PathBuf::from("/x/libnvidia-ml.so.1"),
            ]
        );
        assert!(cache_paths(b"").is_empty());
        assert!(cache_paths(&[0xff; 100]).is_empty());
    }

    #[test]
    fn the_search_goes_library_path_cache_then_usual_folders_each_once() {
        let cache = b"\0/opt/nv/libnvidia-ml.so.1\0/usr/lib64/libnvidia-ml.so.1\0";
        let list = search_list(
            Some(OsStr::new("/shim::relative/dir;/opt/nv")),
            cache.as_slice(),
        );
        let expected_head = [
            "/shim/libnvidia-ml.so.1",
            "/opt/nv/libnvidia-ml.so.1",
            "/usr/lib64/libnvidia-ml.so.1",
            "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
            "/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
        ];
        let head: Vec<_> = list.iter().take(5).map(|p| p.to_str()).collect();
        assert_eq!(head, expected_head.map(Some));
        // /opt/nv and /usr/lib64 come once each: everything of DIRS but /usr/lib64 follows.
        assert_eq!(list.len(), 2 + DIRS.len());
        assert_eq!(
            list.last().map(PathBuf::as_path),
            Some(Path::new("/usr/lib/wsl/lib/libnvidia-ml.so.1"))
        );
    }

    #[test]
    fn without_library_path_or_cache_the_usual_folders_remain() {
        let list = search_list(None, &[]);
        let dirs: Vec<PathBuf> = DIRS.iter().map(|d| Path::new(d).join(SONAME)).collect();
        assert_eq!(list, dirs);
    }

    #[test]
    fn a_missing_file_is_absent_and_the_shim_is_refused() {
        let missing = try_open(Path::new("/nonexistent/gpushare/libnvidia-ml.so.1"), None);
        assert_eq!(missing.err(), Some(Refusal::Absent("no such file".into())));
        let dir = std::env::temp_dir();
        let meta = std::fs::metadata(&dir).map(|m| (m.dev(), m.ino())).ok();
        assert_eq!(try_open(&dir, meta).err(), Some(Refusal::Itself));
    }
}

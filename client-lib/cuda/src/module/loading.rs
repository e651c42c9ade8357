//! Loading images: recorded when the program hands them over, sent to the broker (or found
//! there by their content hash) the first time they are needed, unloaded in order with the
//! work that uses them.

use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char, c_void};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use gpushare_protocol::ErrorCode;
use gpushare_protocol::control::{BrokerMessage, ClientMessage, ModuleFormat, image_hash};

use super::{Modules, module_error, module_load_error};
use crate::driver::Driver;
use crate::status::Cu;
use crate::types::{CUdevice, result};

/// Where an image's bytes are.
pub(super) enum Bytes {
    /// The program keeps them (the CUDA runtime's fat binaries, `CU_LIBRARY_BINARY_IS_PRESERVED`).
    Borrowed(*const u8, usize),
    Owned(Vec<u8>),
}

/// A loaded module or library. The handle a program holds is the address of one of these, so
/// it lives on after an unload (a stale handle must still be told apart); its bytes do not.
pub struct Image {
    pub format: ModuleFormat,
    /// The bytes, until unloaded; and the broker's module id on each device it is loaded on.
    loaded: Mutex<Loaded>,
    pub(super) unloaded: AtomicBool,
    /// Globals' addresses and sizes, by device and name.
    pub(super) globals: Mutex<HashMap<(CUdevice, CString), (u64, u64)>>,
}

// SAFETY: a borrowed image is immutable program data that outlives the library (CUDA's own
// contract for preserved binaries); everything else is owned and behind locks.
unsafe impl Send for Image {}
// SAFETY: as above.
unsafe impl Sync for Image {}

/// An image's bytes and its module at the broker.
struct Loaded {
    bytes: Bytes,
    /// By device ordinal.
    modules: Box<[Option<u64>]>,
}

impl Loaded {
    fn bytes(&self) -> &[u8] {
        match &self.bytes {
            // SAFETY: see the `Send` impl: the program keeps these bytes.
            Bytes::Borrowed(p, len) => unsafe { std::slice::from_raw_parts(*p, *len) },
            Bytes::Owned(v) => v,
        }
    }
}

impl Modules {
    pub(super) fn add_image(&self, format: ModuleFormat, bytes: Bytes) -> &'static Image {
        let image: &'static Image = Box::leak(Box::new(Image {
            format,
            loaded: Mutex::new(Loaded {
                bytes,
                modules: vec![None; self.devices].into_boxed_slice(),
            }),
            unloaded: AtomicBool::new(false),
            globals: Mutex::new(HashMap::new()),
        }));
        self.images
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(image as *const Image as usize);
        image
    }
}

impl Driver {
    /// Records an image the program handed over. `preserved`: the program keeps the bytes for
    /// as long as the module is loaded, so they need no copy.
    ///
    /// # Safety
    /// `p` points to a module image (see [`crate::image::locate`]).
    pub unsafe fn load_image(&self, p: *const c_void, preserved: bool) -> Cu<&'static Image> {
        // SAFETY: the caller's contract.
        let (format, start, len) =
            unsafe { crate::image::locate(p.cast()) }.ok_or(result::INVALID_IMAGE)?;
        let bytes = if preserved {
            Bytes::Borrowed(start, len)
        } else {
            // SAFETY: `locate` found `len` bytes of image at `start`.
            Bytes::Owned(unsafe { std::slice::from_raw_parts(start, len) }.to_vec())
        };
        Ok(self.modules.add_image(format, bytes))
    }

    /// The broker's module for an image: loaded now if it is not yet (found by its hash when
    /// the broker holds the same bytes, else sent).
    pub fn ensure_loaded(&self, image: &Image) -> Cu<u64> {
        let mut loaded = image.loaded.lock().unwrap_or_else(|p| p.into_inner());
        let dev = self.device as usize;
        match loaded.modules.get(dev) {
            Some(Some(id)) => return Ok(*id),
            Some(None) => {}
            None => return Err(result::INVALID_DEVICE),
        }
        if image.unloaded.load(Ordering::Acquire) {
            return Err(result::INVALID_HANDLE);
        }
        let session = &self.transport.session;
        let bytes = loaded.bytes();
        let hash = image_hash(bytes);
        let cached = session.request(
            |request| ClientMessage::LoadCachedModule {
                request,
                format: image.format,
                hash,
            },
            &[],
        );
        let id = match cached {
            Ok(BrokerMessage::ModuleLoaded { result: Ok(id), .. }) => id,
            Ok(BrokerMessage::ModuleLoaded { result: Err(w), .. })
                if w.code == ErrorCode::NotFound =>
            {
                session
                    .load_module(image.format, bytes)
                    .map_err(|e| module_load_error(&e))?
            }
            Ok(BrokerMessage::ModuleLoaded { result: Err(w), .. }) => {
                return Err(module_error(&w));
            }
            Ok(_) => return Err(result::UNKNOWN),
            Err(e) => return Err(module_load_error(&e)),
        };
        loaded.modules[dev] = Some(id);
        Ok(id)
    }

    pub(super) fn unload(&self, h: *mut c_void) -> Cu<()> {
        let image = self.image(h)?;
        image.unloaded.store(true, Ordering::Release);
        let modules = {
            let mut loaded = image.loaded.lock().unwrap_or_else(|p| p.into_inner());
            // The bytes go now (a program that loads and unloads in a loop must not grow).
            loaded.bytes = Bytes::Owned(Vec::new());
            std::mem::take(&mut loaded.modules)
        };
        image
            .globals
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        let first = crate::driver::first()?;
        for d in crate::route::opened(first) {
            if let Some(Some(module)) = modules.get(d.device as usize) {
                // Launches already sent run first: the broker unloads in order with them
                // only after the client's work is done.
                d.synchronize()?;
                let _ = d.transport.session.unload_module(*module);
            }
        }
        Ok(())
    }
}

/// Reads a NUL-terminated name the program passed.
///
/// # Safety
/// `name` is NULL or a NUL-terminated string.
pub(super) unsafe fn name_arg<'a>(name: *const c_char) -> Cu<&'a CStr> {
    if name.is_null() {
        return Err(result::INVALID_VALUE);
    }
    // SAFETY: the caller's contract.
    Ok(unsafe { CStr::from_ptr(name) })
}

/// A module file's format and bytes (PTX with its NUL).
///
/// # Safety
/// `path` is NULL or NUL-terminated.
pub(super) unsafe fn read_file(path: *const c_char) -> Cu<(ModuleFormat, Vec<u8>)> {
    // SAFETY: the caller's contract.
    let path = unsafe { name_arg(path) }?;
    let path = std::path::Path::new(
        <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(path.to_bytes()),
    );
    let mut bytes = std::fs::read(path).map_err(|_| result::FILE_NOT_FOUND)?;
    let format = crate::image::format_of(&bytes).ok_or(result::INVALID_IMAGE)?;
    if format == ModuleFormat::Ptx && bytes.last() != Some(&0) {
        bytes.push(0);
    }
    Ok((format, bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file in the temporary folder, removed when dropped.
    struct TempFile(CString);

    impl TempFile {
        fn new(name: &str, bytes: &[u8]) -> TempFile {
            let path = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
            std::fs::write(&path, bytes).expect("write");
            TempFile(CString::new(path.into_os_string().into_encoded_bytes()).expect("path"))
        }
    }

    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(self.0.to_str().unwrap_or_default());
        }
    }

    #[test]
    fn a_ptx_file_is_read_as_a_string_with_its_nul() {
        let f = TempFile::new("gpushare-cuda-ptx", b".version 8.0\n.target sm_90\n");
        // SAFETY: a NUL-terminated path.
        let (format, bytes) = unsafe { read_file(f.0.as_ptr()) }.expect("read");
        assert_eq!(format, ModuleFormat::Ptx);
        assert_eq!(
            bytes.last(),
            Some(&0),
            "NUL-terminated, as PTX is handed over"
        );
        assert_eq!(&bytes[..bytes.len() - 1], b".version 8.0\n.target sm_90\n");
    }

    #[test]
    fn files_that_are_no_image_are_refused() {
        let f = TempFile::new("gpushare-cuda-junk", b"ab");
        // SAFETY: NUL-terminated paths, and NULL.
        let (junk, missing, null) = unsafe {
            (
                read_file(f.0.as_ptr()).err(),
                read_file(c"/nonexistent/gpushare/module.ptx".as_ptr()).err(),
                read_file(std::ptr::null()).err(),
            )
        };
        assert_eq!(junk, Some(result::INVALID_IMAGE));
        assert_eq!(missing, Some(result::FILE_NOT_FOUND));
        assert_eq!(null, Some(result::INVALID_VALUE));
    }
}

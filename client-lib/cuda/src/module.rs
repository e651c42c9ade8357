//! Modules, libraries, kernels and functions, loaded lazily: loading a module or library
//! only records where its image is; the image goes to the broker (or is found there by its
//! content hash, when another client loaded the same bytes) the first time one of its
//! functions or globals is needed, and a function's parameter layout and attributes come
//! with its first use. After that, launches and attribute queries ask nobody.
//!
//! A library and a module are one object here, as are a kernel and a function. Handles are
//! pointers to objects that live as long as the process (an unloaded one is only marked so):
//! a stale handle fails cleanly instead of dangling.

use std::collections::{HashMap, HashSet};
use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_void};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use gpushare_protocol::Command;
use gpushare_protocol::ErrorCode;
use gpushare_protocol::control::{
    BrokerMessage, ClientMessage, FunctionDetails, ModuleFormat, image_hash,
};

use crate::driver::{self, Driver};
use crate::status::{Cu, entry, from_code, from_error, out};
use crate::types::{
    CUdevice, CUdeviceptr, CUfunction, CUkernel, CUlibrary, CUmodule, CUresult,
    MODULE_LAZY_LOADING, func_attr, result,
};

/// Where an image's bytes are.
enum Bytes {
    /// The program keeps them (the CUDA runtime's fat binaries, `CU_LIBRARY_BINARY_IS_PRESERVED`).
    Borrowed(*const u8, usize),
    Owned(Vec<u8>),
}

/// A loaded module or library.
pub struct Image {
    pub format: ModuleFormat,
    bytes: Bytes,
    /// The broker's module id once the image is there.
    module: Mutex<Option<u64>>,
    unloaded: AtomicBool,
    globals: Mutex<HashMap<CString, (u64, u64)>>,
}

// SAFETY: a borrowed image is immutable program data that outlives the library (CUDA's own
// contract for preserved binaries); everything else is owned and behind locks.
unsafe impl Send for Image {}
// SAFETY: as above.
unsafe impl Sync for Image {}

impl Image {
    fn bytes(&self) -> &[u8] {
        match &self.bytes {
            // SAFETY: see the `Send` impl: the program keeps these bytes.
            Bytes::Borrowed(p, len) => unsafe { std::slice::from_raw_parts(*p, *len) },
            Bytes::Owned(v) => v,
        }
    }
}

/// A function's layout and attributes, from the broker.
#[derive(Debug)]
pub struct FunctionInfo {
    pub id: u64,
    pub params: Vec<(u32, u32)>,
    /// Bytes of the packed parameter buffer.
    pub params_size: usize,
    pub attributes: Vec<i32>,
}

impl From<FunctionDetails> for FunctionInfo {
    fn from(d: FunctionDetails) -> FunctionInfo {
        let params_size = d
            .params
            .iter()
            .map(|&(o, s)| o as usize + s as usize)
            .max()
            .unwrap_or(0);
        FunctionInfo {
            id: d.id,
            params: d.params,
            params_size,
            attributes: d.attributes,
        }
    }
}

/// A kernel (or function) of an image, by name.
pub struct Kernel {
    pub image: &'static Image,
    pub name: CString,
    info: OnceLock<Arc<FunctionInfo>>,
    resolving: Mutex<()>,
    /// Attributes the program set, as it set them.
    set: Mutex<HashMap<i32, i32>>,
}

#[derive(Default)]
pub struct Modules {
    images: RwLock<HashSet<usize>>,
    kernels: RwLock<HashSet<usize>>,
    by_name: Mutex<HashMap<(usize, CString), usize>>,
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
        Ok(self.add_image(format, bytes))
    }

    fn add_image(&self, format: ModuleFormat, bytes: Bytes) -> &'static Image {
        let image: &'static Image = Box::leak(Box::new(Image {
            format,
            bytes,
            module: Mutex::new(None),
            unloaded: AtomicBool::new(false),
            globals: Mutex::new(HashMap::new()),
        }));
        self.modules
            .images
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(image as *const Image as usize);
        image
    }

    /// The image a module or library handle names.
    pub fn image(&self, h: *mut c_void) -> Cu<&'static Image> {
        let live = self
            .modules
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
            .modules
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

    /// The kernel `name` of `image` (one object per name, made without asking the broker).
    pub fn kernel_of(&self, image: &'static Image, name: &CStr) -> &'static Kernel {
        let key = (image as *const Image as usize, name.to_owned());
        let mut by_name = self
            .modules
            .by_name
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(&k) = by_name.get(&key) {
            // SAFETY: recorded below from a leaked `Box<Kernel>`.
            return unsafe { &*(k as *const Kernel) };
        }
        let kernel: &'static Kernel = Box::leak(Box::new(Kernel {
            image,
            name: key.1.clone(),
            info: OnceLock::new(),
            resolving: Mutex::new(()),
            set: Mutex::new(HashMap::new()),
        }));
        by_name.insert(key, kernel as *const Kernel as usize);
        self.modules
            .kernels
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(kernel as *const Kernel as usize);
        kernel
    }

    /// The broker's module for an image: loaded now if it is not yet (found by its hash when
    /// the broker holds the same bytes, else sent).
    pub fn ensure_loaded(&self, image: &Image) -> Cu<u64> {
        let mut module = image.module.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(id) = *module {
            return Ok(id);
        }
        let session = &self.transport.session;
        let bytes = image.bytes();
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
        *module = Some(id);
        Ok(id)
    }

    /// A kernel's layout and attributes, asked of the broker the first time.
    #[inline]
    pub fn info(&self, k: &Kernel) -> Cu<Arc<FunctionInfo>> {
        if let Some(info) = k.info.get() {
            return Ok(info.clone());
        }
        let _one = k.resolving.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(info) = k.info.get() {
            return Ok(info.clone());
        }
        let module = self.ensure_loaded(k.image)?;
        let name = k.name.to_string_lossy().into_owned();
        let reply = self
            .transport
            .session
            .request(
                |request| ClientMessage::GetFunctionInfo {
                    request,
                    module,
                    name,
                },
                &[],
            )
            .map_err(|e| module_load_error(&e))?;
        let details = match reply {
            BrokerMessage::FunctionInfo { result: Ok(d), .. } => d,
            BrokerMessage::FunctionInfo { result: Err(w), .. } => return Err(module_error(&w)),
            _ => return Err(result::UNKNOWN),
        };
        let info = Arc::new(FunctionInfo::from(details));
        let _ = k.info.set(info.clone());
        Ok(info)
    }

    /// A module global's device address and size.
    pub fn global(&self, image: &Image, name: &CStr) -> Cu<(u64, u64)> {
        if let Some(&g) = image
            .globals
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
        {
            return Ok(g);
        }
        let module = self.ensure_loaded(image)?;
        let n = name.to_string_lossy().into_owned();
        let reply = self
            .transport
            .session
            .request(
                |request| ClientMessage::GetGlobal {
                    request,
                    module,
                    name: n,
                },
                &[],
            )
            .map_err(|e| from_error(&e))?;
        let (ptr, bytes) = match reply {
            BrokerMessage::Global { result: Ok(g), .. } => g,
            BrokerMessage::Global { result: Err(w), .. } => return Err(module_error(&w)),
            _ => return Err(result::UNKNOWN),
        };
        self.note_global(ptr, bytes);
        image
            .globals
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.to_owned(), (ptr, bytes));
        Ok((ptr, bytes))
    }

    fn unload(&self, h: *mut c_void) -> Cu<()> {
        let image = self.image(h)?;
        image.unloaded.store(true, Ordering::Release);
        let module = image
            .module
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(module) = module {
            // Launches already sent run first: the broker unloads in order with them only
            // after the client's work is done.
            self.synchronize()?;
            let _ = self.transport.session.unload_module(module);
        }
        Ok(())
    }

    /// A function attribute: what the program set, else what the broker said.
    pub fn function_attribute(&self, k: &Kernel, attr: c_int) -> Cu<i32> {
        if !(0..func_attr::MAX).contains(&attr) {
            return Err(result::INVALID_VALUE);
        }
        if let Some(&v) = k.set.lock().unwrap_or_else(|p| p.into_inner()).get(&attr) {
            return Ok(v);
        }
        let info = self.info(k)?;
        info.attributes
            .get(attr as usize)
            .copied()
            .ok_or(result::INVALID_VALUE)
    }

    /// Sets a function attribute in the broker (without waiting; not again when unchanged).
    pub fn set_function_attribute(&self, k: &Kernel, attr: c_int, value: c_int) -> Cu<()> {
        if !(0..func_attr::MAX).contains(&attr) {
            return Err(result::INVALID_VALUE);
        }
        let mut set = k.set.lock().unwrap_or_else(|p| p.into_inner());
        if set.get(&attr) == Some(&value) {
            return Ok(());
        }
        let info = self.info(k)?;
        self.transport.post(Command::FunctionSetAttribute {
            function: info.id,
            attribute: attr as u32,
            value,
        })?;
        set.insert(attr, value);
        Ok(())
    }
}

/// A module error as CUDA reports it; a device that runs no kernels says why, once.
fn module_error(w: &gpushare_protocol::error::WireError) -> CUresult {
    match w.code {
        ErrorCode::NotFound => result::NOT_FOUND,
        ErrorCode::InvalidArgument => result::INVALID_IMAGE,
        ErrorCode::NotSupported => {
            crate::driver::say_once(&format!("gpushared cannot load kernels: {}", w.message));
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

/// Reads a NUL-terminated name the program passed.
///
/// # Safety
/// `name` is NULL or a NUL-terminated string.
unsafe fn name_arg<'a>(name: *const c_char) -> Cu<&'a CStr> {
    if name.is_null() {
        return Err(result::INVALID_VALUE);
    }
    // SAFETY: the caller's contract.
    Ok(unsafe { CStr::from_ptr(name) })
}

fn read_file(path: *const c_char) -> Cu<(ModuleFormat, Vec<u8>)> {
    // SAFETY: a NUL-terminated path, by CUDA's contract.
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

// ---- modules ---------------------------------------------------------------------------

/// # Safety
/// `module` is NULL or valid for writing; `image` points to a module image.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleLoadData(module: *mut CUmodule, image: *const c_void) -> CUresult {
    entry("cuModuleLoadData", || {
        let d = driver::live()?;
        // SAFETY: the caller's contract.
        let img = unsafe { d.load_image(image, false) }?;
        // SAFETY: the caller's contract.
        unsafe { out(module, img as *const Image as CUmodule) }
    })
}

/// JIT options only tune or report on compiling PTX, which the broker's driver does.
///
/// # Safety
/// As `cuModuleLoadData`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleLoadDataEx(
    module: *mut CUmodule,
    image: *const c_void,
    _num_options: c_uint,
    _options: *mut c_int,
    _values: *mut *mut c_void,
) -> CUresult {
    // SAFETY: the same contract.
    unsafe { cuModuleLoadData(module, image) }
}

/// # Safety
/// As `cuModuleLoadData`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleLoadFatBinary(
    module: *mut CUmodule,
    fat: *const c_void,
) -> CUresult {
    // SAFETY: the same contract.
    unsafe { cuModuleLoadData(module, fat) }
}

/// # Safety
/// `module` is NULL or valid for writing; `path` is a NUL-terminated path.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleLoad(module: *mut CUmodule, path: *const c_char) -> CUresult {
    entry("cuModuleLoad", || {
        let d = driver::live()?;
        let (format, bytes) = read_file(path)?;
        let img = d.add_image(format, Bytes::Owned(bytes));
        // SAFETY: the caller's contract.
        unsafe { out(module, img as *const Image as CUmodule) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuModuleUnload(module: CUmodule) -> CUresult {
    entry("cuModuleUnload", || driver::live()?.unload(module))
}

/// # Safety
/// `func` is NULL or valid for writing; `name` is NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleGetFunction(
    func: *mut CUfunction,
    module: CUmodule,
    name: *const c_char,
) -> CUresult {
    entry("cuModuleGetFunction", || {
        let d = driver::live()?;
        let image = d.image(module)?;
        // SAFETY: the caller's contract.
        let name = unsafe { name_arg(name) }?;
        let k = d.kernel_of(image, name);
        // CUDA answers a missing name here: ask now (programs load and look up together).
        d.info(k)?;
        // SAFETY: the caller's contract.
        unsafe { out(func, k as *const Kernel as CUfunction) }
    })
}

/// # Safety
/// `dptr` and `bytes` are NULL or valid for writing; `name` is NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleGetGlobal_v2(
    dptr: *mut CUdeviceptr,
    bytes: *mut usize,
    module: CUmodule,
    name: *const c_char,
) -> CUresult {
    entry("cuModuleGetGlobal_v2", || {
        let d = driver::live()?;
        let image = d.image(module)?;
        // SAFETY: the caller's contract.
        let (ptr, len) = d.global(image, unsafe { name_arg(name) }?)?;
        // SAFETY: each is NULL (allowed) or writable.
        unsafe {
            if !dptr.is_null() {
                out(dptr, ptr)?;
            }
            if !bytes.is_null() {
                out(bytes, len as usize)?;
            }
        }
        Ok(())
    })
}

/// # Safety
/// `mode` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleGetLoadingMode(mode: *mut c_int) -> CUresult {
    entry("cuModuleGetLoadingMode", || {
        driver::get()?;
        // SAFETY: the caller's contract.
        unsafe { out(mode, MODULE_LAZY_LOADING) }
    })
}

// ---- libraries -------------------------------------------------------------------------

/// `CU_LIBRARY_BINARY_IS_PRESERVED`.
const LIBRARY_BINARY_IS_PRESERVED: c_int = 1;

/// # Safety
/// `library` is NULL or valid for writing; `code` points to a module image; the option
/// arrays hold `n` entries each.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLibraryLoadData(
    library: *mut CUlibrary,
    code: *const c_void,
    _jit_options: *mut c_int,
    _jit_values: *mut *mut c_void,
    _num_jit: c_uint,
    lib_options: *mut c_int,
    lib_values: *mut *mut c_void,
    num_lib: c_uint,
) -> CUresult {
    entry("cuLibraryLoadData", || {
        let d = driver::live()?;
        let mut preserved = false;
        if !lib_options.is_null() && !lib_values.is_null() {
            for i in 0..num_lib as usize {
                // SAFETY: `i < num_lib`, inside both arrays.
                let (opt, value) = unsafe { (*lib_options.add(i), *lib_values.add(i)) };
                if opt == LIBRARY_BINARY_IS_PRESERVED && value as usize != 0 {
                    preserved = true;
                }
            }
        }
        // SAFETY: the caller's contract.
        let img = unsafe { d.load_image(code, preserved) }?;
        // SAFETY: the caller's contract.
        unsafe { out(library, img as *const Image as CUlibrary) }
    })
}

/// # Safety
/// `library` is NULL or valid for writing; `path` is a NUL-terminated path.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLibraryLoadFromFile(
    library: *mut CUlibrary,
    path: *const c_char,
    _jit_options: *mut c_int,
    _jit_values: *mut *mut c_void,
    _num_jit: c_uint,
    _lib_options: *mut c_int,
    _lib_values: *mut *mut c_void,
    _num_lib: c_uint,
) -> CUresult {
    entry("cuLibraryLoadFromFile", || {
        let d = driver::live()?;
        let (format, bytes) = read_file(path)?;
        let img = d.add_image(format, Bytes::Owned(bytes));
        // SAFETY: the caller's contract.
        unsafe { out(library, img as *const Image as CUlibrary) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuLibraryUnload(library: CUlibrary) -> CUresult {
    entry("cuLibraryUnload", || driver::live()?.unload(library))
}

/// # Safety
/// `kernel` is NULL or valid for writing; `name` is NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLibraryGetKernel(
    kernel: *mut CUkernel,
    library: CUlibrary,
    name: *const c_char,
) -> CUresult {
    entry("cuLibraryGetKernel", || {
        let d = driver::live()?;
        let image = d.image(library)?;
        // SAFETY: the caller's contract.
        let k = d.kernel_of(image, unsafe { name_arg(name) }?);
        // SAFETY: the caller's contract.
        unsafe { out(kernel, k as *const Kernel as CUkernel) }
    })
}

/// # Safety
/// `module` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLibraryGetModule(module: *mut CUmodule, library: CUlibrary) -> CUresult {
    entry("cuLibraryGetModule", || {
        let d = driver::live()?;
        let image = d.image(library)?;
        // SAFETY: the caller's contract.
        unsafe { out(module, image as *const Image as CUmodule) }
    })
}

/// # Safety
/// `dptr` and `bytes` are NULL or valid for writing; `name` is NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLibraryGetGlobal(
    dptr: *mut CUdeviceptr,
    bytes: *mut usize,
    library: CUlibrary,
    name: *const c_char,
) -> CUresult {
    // SAFETY: the same contract (a library is a module here).
    unsafe { cuModuleGetGlobal_v2(dptr, bytes, library, name) }
}

/// # Safety
/// `func` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuKernelGetFunction(func: *mut CUfunction, kernel: CUkernel) -> CUresult {
    entry("cuKernelGetFunction", || {
        let d = driver::live()?;
        let k = d.kernel(kernel)?;
        // SAFETY: the caller's contract.
        unsafe { out(func, k as *const Kernel as CUfunction) }
    })
}

/// # Safety
/// `library` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuKernelGetLibrary(library: *mut CUlibrary, kernel: CUkernel) -> CUresult {
    entry("cuKernelGetLibrary", || {
        let d = driver::live()?;
        let k = d.kernel(kernel)?;
        // SAFETY: the caller's contract.
        unsafe { out(library, k.image as *const Image as CUlibrary) }
    })
}

/// # Safety
/// `module` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuFuncGetModule(module: *mut CUmodule, func: CUfunction) -> CUresult {
    // SAFETY: the same contract.
    unsafe { cuKernelGetLibrary(module, func) }
}

fn get_name(name: *mut *const c_char, h: *mut c_void) -> Cu<()> {
    let d = driver::live()?;
    let k = d.kernel(h)?;
    // SAFETY: the caller's contract; the name lives as long as the process.
    unsafe { out(name, k.name.as_ptr()) }
}

/// # Safety
/// `name` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuFuncGetName(name: *mut *const c_char, func: CUfunction) -> CUresult {
    entry("cuFuncGetName", || get_name(name, func))
}

/// # Safety
/// `name` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuKernelGetName(name: *mut *const c_char, kernel: CUkernel) -> CUresult {
    entry("cuKernelGetName", || get_name(name, kernel))
}

fn param_info(h: *mut c_void, index: usize, offset: *mut usize, size: *mut usize) -> Cu<()> {
    let d = driver::live()?;
    let info = d.info(d.kernel(h)?)?;
    let &(o, s) = info.params.get(index).ok_or(result::INVALID_VALUE)?;
    // SAFETY: each is NULL (allowed) or writable.
    unsafe {
        if !offset.is_null() {
            out(offset, o as usize)?;
        }
        if !size.is_null() {
            out(size, s as usize)?;
        }
    }
    Ok(())
}

/// # Safety
/// `offset` and `size` are NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuFuncGetParamInfo(
    func: CUfunction,
    index: usize,
    offset: *mut usize,
    size: *mut usize,
) -> CUresult {
    entry("cuFuncGetParamInfo", || {
        param_info(func, index, offset, size)
    })
}

/// # Safety
/// `offset` and `size` are NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuKernelGetParamInfo(
    kernel: CUkernel,
    index: usize,
    offset: *mut usize,
    size: *mut usize,
) -> CUresult {
    entry("cuKernelGetParamInfo", || {
        param_info(kernel, index, offset, size)
    })
}

/// # Safety
/// `value` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuFuncGetAttribute(
    value: *mut c_int,
    attr: c_int,
    func: CUfunction,
) -> CUresult {
    entry("cuFuncGetAttribute", || {
        let d = driver::live()?;
        let v = d.function_attribute(d.kernel(func)?, attr)?;
        // SAFETY: the caller's contract.
        unsafe { out(value, v) }
    })
}

/// # Safety
/// `value` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuKernelGetAttribute(
    value: *mut c_int,
    attr: c_int,
    kernel: CUkernel,
    dev: CUdevice,
) -> CUresult {
    entry("cuKernelGetAttribute", || {
        let d = driver::live()?;
        crate::device::check(dev)?;
        let v = d.function_attribute(d.kernel(kernel)?, attr)?;
        // SAFETY: the caller's contract.
        unsafe { out(value, v) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuFuncSetAttribute(func: CUfunction, attr: c_int, value: c_int) -> CUresult {
    entry("cuFuncSetAttribute", || {
        let d = driver::live()?;
        d.set_function_attribute(d.kernel(func)?, attr, value)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuKernelSetAttribute(
    attr: c_int,
    value: c_int,
    kernel: CUkernel,
    dev: CUdevice,
) -> CUresult {
    entry("cuKernelSetAttribute", || {
        let d = driver::live()?;
        crate::device::check(dev)?;
        d.set_function_attribute(d.kernel(kernel)?, attr, value)
    })
}

/// A cache preference: accepted, not applied (the broker's context keeps its own).
#[unsafe(no_mangle)]
pub extern "C" fn cuFuncSetCacheConfig(func: CUfunction, _config: c_int) -> CUresult {
    entry("cuFuncSetCacheConfig", || {
        driver::live()?.kernel(func).map(drop)
    })
}

/// As `cuFuncSetCacheConfig`.
#[unsafe(no_mangle)]
pub extern "C" fn cuKernelSetCacheConfig(
    kernel: CUkernel,
    _config: c_int,
    dev: CUdevice,
) -> CUresult {
    entry("cuKernelSetCacheConfig", || {
        crate::device::check(dev)?;
        driver::live()?.kernel(kernel).map(drop)
    })
}

/// # Safety
/// `state` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuFuncIsLoaded(state: *mut c_int, func: CUfunction) -> CUresult {
    entry("cuFuncIsLoaded", || {
        let d = driver::live()?;
        let k = d.kernel(func)?;
        // CU_FUNCTION_LOADING_STATE_UNLOADED = 0, _LOADED = 1.
        // SAFETY: the caller's contract.
        unsafe { out(state, k.info.get().is_some() as c_int) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuFuncLoad(func: CUfunction) -> CUresult {
    entry("cuFuncLoad", || {
        let d = driver::live()?;
        d.info(d.kernel(func)?).map(drop)
    })
}

//! The NVML functions the shim implements itself: those that enumerate devices or hand out
//! device handles. With `$GPUSHARE_GPU_UUIDS` set they show only those GPUs, indexed in its
//! order; without it each calls the real function and returns what it did.
//!
//! Each first calls the real function (or, for an index, the real count), so that NVML's own
//! errors (not initialized, bad argument, GPU lost) come back as they are; only a success is
//! filtered. A MIG device handle counts as visible when its GPU is.

use std::ffi::{CString, c_char, c_uint, c_void};
use std::ptr::null_mut;
use std::sync::{Mutex, PoisonError};

use crate::ret::{self, INSUFFICIENT_SIZE, INVALID_ARGUMENT, NOT_FOUND, SUCCESS, UNINITIALIZED};
use crate::table::real;
use crate::visible::{self, Answer, CountRule, Handle, requested};

/// `nvmlDevice_t` (and `nvmlUnit_t`): an opaque pointer.
type Device = *mut c_void;

type InitFn = unsafe extern "C" fn() -> u32;
type InitWithFlagsFn = unsafe extern "C" fn(c_uint) -> u32;
type CountFn = unsafe extern "C" fn(*mut c_uint) -> u32;
type ByIndexFn = unsafe extern "C" fn(c_uint, *mut Device) -> u32;
type ByNameFn = unsafe extern "C" fn(*const c_char, *mut Device) -> u32;
type ByUuidStructFn = unsafe extern "C" fn(*const c_void, *mut Device) -> u32;
type IndexFn = unsafe extern "C" fn(Device, *mut c_uint) -> u32;
type IsMigFn = unsafe extern "C" fn(Device, *mut c_uint) -> u32;
type MigParentFn = unsafe extern "C" fn(Device, *mut Device) -> u32;
type NearestFn = unsafe extern "C" fn(Device, c_uint, *mut c_uint, *mut Device) -> u32;
type GpuSetFn = unsafe extern "C" fn(c_uint, *mut c_uint, *mut Device) -> u32;
type UnitDevicesFn = unsafe extern "C" fn(Device, *mut c_uint, *mut Device) -> u32;

/// The real function, or return the error a call to it would have.
macro_rules! real_or_return {
    ($name:ident : $ty:ty) => {
        match real!($name: $ty) {
            Ok(f) => f,
            Err(code) => return code,
        }
    };
}

/// `nvmlInit` (NVML 1-era): forwarded; on success the visible GPUs are looked up.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlInit() -> u32 {
    let init = real_or_return!(nvmlInit: InitFn);
    // SAFETY: NVML's nvmlInit takes nothing.
    after_init(unsafe { init() })
}

/// `nvmlInit_v2`: forwarded; on success the visible GPUs are looked up.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlInit_v2() -> u32 {
    let init = real_or_return!(nvmlInit_v2: InitFn);
    // SAFETY: NVML's nvmlInit_v2 takes nothing.
    after_init(unsafe { init() })
}

/// `nvmlInitWithFlags`: forwarded; on success the visible GPUs are looked up.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlInitWithFlags(flags: c_uint) -> u32 {
    let init = real_or_return!(nvmlInitWithFlags: InitWithFlagsFn);
    // SAFETY: NVML's nvmlInitWithFlags takes the flags by value.
    after_init(unsafe { init(flags) })
}

fn after_init(result: u32) -> u32 {
    if result == SUCCESS && requested().is_some() {
        // An error here (a UUID lookup failing as a whole) shows at the next filtered call.
        let _ = resolve();
    }
    result
}

/// Looks the requested UUIDs up in the real NVML and records the handles, in order.
fn resolve() -> Result<Vec<Handle>, u32> {
    let Some(uuids) = requested() else {
        return Ok(Vec::new());
    };
    let by_uuid = real!(nvmlDeviceGetHandleByUUID: ByNameFn)?;
    let mut handles = Vec::new();
    for uuid in uuids {
        let Ok(name) = CString::new(uuid.as_str()) else {
            continue;
        };
        let mut device: Device = null_mut();
        // SAFETY: a NUL-terminated UUID and a handle to fill, as NVML takes them.
        match unsafe { by_uuid(name.as_ptr(), &mut device) } {
            UNINITIALIZED => return Err(UNINITIALIZED),
            SUCCESS if !device.is_null() => {
                if !handles.contains(&(device as Handle)) {
                    handles.push(device as Handle);
                }
            }
            code => note_unknown(uuid, code),
        }
    }
    visible::set_resolved(handles.clone());
    Ok(handles)
}

/// Says on stderr, once per UUID, that NVML does not know it.
fn note_unknown(uuid: &str, code: u32) {
    static NOTED: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let mut noted = NOTED.lock().unwrap_or_else(PoisonError::into_inner);
    if !noted.iter().any(|u| u == uuid) {
        noted.push(uuid.to_string());
        crate::note(&format!(
            "{} names {uuid}, which NVML does not know ({}): the program does not see it",
            visible::GPU_UUIDS_ENV,
            ret::describe(code).to_string_lossy()
        ));
    }
}

/// The visible GPUs' handles, resolving them if no `nvmlInit` has yet.
fn visible() -> Result<Vec<Handle>, u32> {
    match visible::resolved() {
        Some(handles) => Ok(handles),
        None => resolve(),
    }
}

/// Whether `device` is visible: one of the GPUs, or a MIG device of one.
fn admitted(device: Device, handles: &[Handle]) -> bool {
    handles.contains(&(device as Handle))
        || mig_parent(device).is_some_and(|p| handles.contains(&p))
}

/// The GPU of a MIG device handle; `None` for a GPU's handle (or any error).
fn mig_parent(device: Device) -> Option<Handle> {
    let is_mig = real!(nvmlDeviceIsMigDeviceHandle: IsMigFn).ok()?;
    let parent_of = real!(nvmlDeviceGetDeviceHandleFromMigDeviceHandle: MigParentFn).ok()?;
    let mut mig: c_uint = 0;
    // SAFETY: a handle (NVML checks it) and a flag to fill.
    if unsafe { is_mig(device, &mut mig) } != SUCCESS || mig == 0 {
        return None;
    }
    let mut parent: Device = null_mut();
    // SAFETY: a MIG device handle and a handle to fill.
    let found = unsafe { parent_of(device, &mut parent) } == SUCCESS && !parent.is_null();
    found.then_some(parent as Handle)
}

/// `nvmlDeviceGetCount` (NVML 1-era): the number of visible GPUs.
///
/// # Safety
/// As NVML's: `count` is NULL or points to writable memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount(count: *mut c_uint) -> u32 {
    let real_count = real_or_return!(nvmlDeviceGetCount: CountFn);
    // SAFETY: the caller's argument, as NVML takes it.
    unsafe { count_visible(real_count, count) }
}

/// `nvmlDeviceGetCount_v2`: the number of visible GPUs.
///
/// # Safety
/// As NVML's: `count` is NULL or points to writable memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> u32 {
    let real_count = real_or_return!(nvmlDeviceGetCount_v2: CountFn);
    // SAFETY: the caller's argument, as NVML takes it.
    unsafe { count_visible(real_count, count) }
}

/// # Safety
/// `count` is NULL or points to writable memory.
unsafe fn count_visible(real_count: CountFn, count: *mut c_uint) -> u32 {
    // SAFETY: the caller's pointer, as NVML takes it.
    let result = unsafe { real_count(count) };
    if result != SUCCESS || requested().is_none() {
        return result;
    }
    match visible() {
        Ok(handles) => {
            // SAFETY: the real function succeeded, so `count` is a valid place for it.
            unsafe { count.write(visible::count(handles.len())) };
            SUCCESS
        }
        Err(code) => code,
    }
}

/// `nvmlDeviceGetHandleByIndex` (NVML 1-era): the visible GPU at `index`.
///
/// # Safety
/// As NVML's: `device` is NULL or points to writable memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex(index: c_uint, device: *mut Device) -> u32 {
    let real_count = real_or_return!(nvmlDeviceGetCount: CountFn);
    let real_by_index = real_or_return!(nvmlDeviceGetHandleByIndex: ByIndexFn);
    // SAFETY: the caller's arguments, as NVML takes them.
    unsafe { by_index(real_count, real_by_index, index, device) }
}

/// `nvmlDeviceGetHandleByIndex_v2`: the visible GPU at `index`.
///
/// # Safety
/// As NVML's: `device` is NULL or points to writable memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(index: c_uint, device: *mut Device) -> u32 {
    let real_count = real_or_return!(nvmlDeviceGetCount_v2: CountFn);
    let real_by_index = real_or_return!(nvmlDeviceGetHandleByIndex_v2: ByIndexFn);
    // SAFETY: the caller's arguments, as NVML takes them.
    unsafe { by_index(real_count, real_by_index, index, device) }
}

/// # Safety
/// `device` is NULL or points to writable memory.
unsafe fn by_index(
    real_count: CountFn,
    real_by_index: ByIndexFn,
    index: c_uint,
    device: *mut Device,
) -> u32 {
    if requested().is_none() || device.is_null() {
        // SAFETY: the caller's arguments, as NVML takes them.
        return unsafe { real_by_index(index, device) };
    }
    let mut real_total: c_uint = 0;
    // SAFETY: a count to fill; this is how the real NVML says whether it is initialized.
    let result = unsafe { real_count(&mut real_total) };
    if result != SUCCESS {
        return result;
    }
    let handles = match visible() {
        Ok(handles) => handles,
        Err(code) => return code,
    };
    match usize::try_from(index).ok().and_then(|i| handles.get(i)) {
        Some(&handle) => {
            // SAFETY: non-NULL (above), and NVML's contract makes it writable.
            unsafe { device.write(handle as Device) };
            SUCCESS
        }
        None => INVALID_ARGUMENT,
    }
}

/// # Safety
/// `device` is NULL or points to writable memory; `find` is the real lookup into it.
unsafe fn lookup(device: *mut Device, find: impl FnOnce() -> u32) -> u32 {
    let result = find();
    if result != SUCCESS || requested().is_none() || device.is_null() {
        return result;
    }
    // SAFETY: the real lookup succeeded, so it wrote a handle there.
    let found = unsafe { device.read() };
    match visible() {
        Ok(handles) if admitted(found, &handles) => SUCCESS,
        Ok(_) => {
            // SAFETY: as above; the caller must not keep a GPU it may not see.
            unsafe { device.write(null_mut()) };
            NOT_FOUND
        }
        Err(code) => code,
    }
}

/// `nvmlDeviceGetHandleByUUID`: forwarded; a GPU not visible is not found.
///
/// # Safety
/// As NVML's: `uuid` is NULL or a NUL-terminated string; `device` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    device: *mut Device,
) -> u32 {
    let real_find = real_or_return!(nvmlDeviceGetHandleByUUID: ByNameFn);
    // SAFETY: the caller's arguments, passed on as they came.
    unsafe { lookup(device, || real_find(uuid, device)) }
}

/// `nvmlDeviceGetHandleByUUIDV` (a UUID struct, ASCII or binary): as by UUID.
///
/// # Safety
/// As NVML's: `uuid` is NULL or an `nvmlUUID_t`; `device` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUIDV(
    uuid: *const c_void,
    device: *mut Device,
) -> u32 {
    let real_find = real_or_return!(nvmlDeviceGetHandleByUUIDV: ByUuidStructFn);
    // SAFETY: the caller's arguments, passed on as they came.
    unsafe { lookup(device, || real_find(uuid, device)) }
}

/// `nvmlDeviceGetHandleByPciBusId` (NVML 1-era): as by UUID.
///
/// # Safety
/// As NVML's: `bus_id` is NULL or a NUL-terminated string; `device` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId(
    bus_id: *const c_char,
    device: *mut Device,
) -> u32 {
    let real_find = real_or_return!(nvmlDeviceGetHandleByPciBusId: ByNameFn);
    // SAFETY: the caller's arguments, passed on as they came.
    unsafe { lookup(device, || real_find(bus_id, device)) }
}

/// `nvmlDeviceGetHandleByPciBusId_v2`: as by UUID.
///
/// # Safety
/// As NVML's: `bus_id` is NULL or a NUL-terminated string; `device` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId_v2(
    bus_id: *const c_char,
    device: *mut Device,
) -> u32 {
    let real_find = real_or_return!(nvmlDeviceGetHandleByPciBusId_v2: ByNameFn);
    // SAFETY: the caller's arguments, passed on as they came.
    unsafe { lookup(device, || real_find(bus_id, device)) }
}

/// `nvmlDeviceGetHandleBySerial`: as by UUID.
///
/// # Safety
/// As NVML's: `serial` is NULL or a NUL-terminated string; `device` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleBySerial(
    serial: *const c_char,
    device: *mut Device,
) -> u32 {
    let real_find = real_or_return!(nvmlDeviceGetHandleBySerial: ByNameFn);
    // SAFETY: the caller's arguments, passed on as they came.
    unsafe { lookup(device, || real_find(serial, device)) }
}

/// `nvmlDeviceGetIndex`: a GPU's position among the visible ones (a MIG device's index
/// within its GPU, as NVML gives it); not found for a GPU not visible.
///
/// # Safety
/// As NVML's: `index` is NULL or points to writable memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetIndex(device: Device, index: *mut c_uint) -> u32 {
    let real_index = real_or_return!(nvmlDeviceGetIndex: IndexFn);
    if requested().is_none() || index.is_null() {
        // SAFETY: the caller's arguments, as NVML takes them.
        return unsafe { real_index(device, index) };
    }
    let mut real_position: c_uint = 0;
    // SAFETY: the caller's handle (NVML checks it) and an index to fill.
    let result = unsafe { real_index(device, &mut real_position) };
    if result != SUCCESS {
        return result;
    }
    let handles = match visible() {
        Ok(handles) => handles,
        Err(code) => return code,
    };
    let position = match handles.iter().position(|&h| h == device as Handle) {
        Some(position) => visible::count(position),
        None if admitted(device, &handles) => real_position,
        None => return NOT_FOUND,
    };
    // SAFETY: non-NULL (above), and NVML's contract makes it writable.
    unsafe { index.write(position) };
    SUCCESS
}

/// `nvmlDeviceGetTopologyNearestGpus`: the real answer, less the GPUs not visible.
///
/// # Safety
/// As NVML's: `count` is NULL or writable; `array` has room for `*count` handles when that
/// is not 0.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTopologyNearestGpus(
    device: Device,
    level: c_uint,
    count: *mut c_uint,
    array: *mut Device,
) -> u32 {
    let real_nearest = real_or_return!(nvmlDeviceGetTopologyNearestGpus: NearestFn);
    // SAFETY: the caller's arguments; the real function is called with them or with a count
    // and an array of the shim's own that has room for that count.
    unsafe {
        filtered_set(CountRule::ZeroAsksSize, count, array, |n, buf| {
            real_nearest(device, level, n, buf)
        })
    }
}

/// `nvmlSystemGetTopologyGpuSet`: the real answer, less the GPUs not visible.
///
/// # Safety
/// As NVML's: `count` is NULL or writable; `array` has room for `*count` handles when that
/// is not 0.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetTopologyGpuSet(
    cpu: c_uint,
    count: *mut c_uint,
    array: *mut Device,
) -> u32 {
    let real_set = real_or_return!(nvmlSystemGetTopologyGpuSet: GpuSetFn);
    // SAFETY: as in nvmlDeviceGetTopologyNearestGpus.
    unsafe {
        filtered_set(CountRule::ZeroAsksSize, count, array, |n, buf| {
            real_set(cpu, n, buf)
        })
    }
}

/// `nvmlUnitGetDevices`: the real answer, less the GPUs not visible.
///
/// # Safety
/// As NVML's: `count` is NULL or writable; `devices` NULL or with room for `*count` handles.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlUnitGetDevices(
    unit: Device,
    count: *mut c_uint,
    devices: *mut Device,
) -> u32 {
    let real_devices = real_or_return!(nvmlUnitGetDevices: UnitDevicesFn);
    // SAFETY: as in nvmlDeviceGetTopologyNearestGpus.
    unsafe {
        filtered_set(CountRule::RoomOrTooSmall, count, devices, |n, buf| {
            real_devices(unit, n, buf)
        })
    }
}

/// Calls `call` (a real function returning a set of handles: count in/out, then array) for
/// the whole set, keeps the visible handles and answers the caller's `count` and `array`
/// under `rule`. Without filtering, or with arguments NVML refuses, the caller's go to `call`.
///
/// # Safety
/// `count` is NULL or writable; `array` NULL or with room for `*count` handles; `call` may
/// be given them, or a count and an array with room for that count.
unsafe fn filtered_set(
    rule: CountRule,
    count: *mut c_uint,
    array: *mut Device,
    mut call: impl FnMut(*mut c_uint, *mut Device) -> u32,
) -> u32 {
    let room = if count.is_null() {
        0
    } else {
        // SAFETY: not NULL, so the caller's count, readable by NVML's contract.
        unsafe { count.read() }
    };
    let refused =
        count.is_null() || (array.is_null() && (room != 0 || rule == CountRule::RoomOrTooSmall));
    if requested().is_none() || refused {
        return call(count, array);
    }
    let found = match whole_set(rule, &mut call) {
        Ok(found) => found,
        Err(code) => return code,
    };
    let kept = match visible() {
        Ok(handles) => visible::keep_visible(&found, &handles),
        Err(code) => return code,
    };
    let (n, result) = match visible::answer(rule, kept.len(), room) {
        Answer::Size(n) => (n, SUCCESS),
        Answer::TooSmall(n) => (n, INSUFFICIENT_SIZE),
        Answer::Fill(n) => {
            for (i, &handle) in kept.iter().take(n).enumerate() {
                // SAFETY: i < n <= room, and the caller's array has room for `room` handles.
                unsafe { array.add(i).write(handle as Device) };
            }
            (n, SUCCESS)
        }
    };
    // SAFETY: non-NULL (above), writable by NVML's contract.
    unsafe { count.write(visible::count(n)) };
    result
}

/// The whole set `call` returns: asked for its size first where a count of 0 does that,
/// else with room for 64 then as much as it says it needs; a set that keeps growing is
/// asked again, up to 4 times.
fn whole_set(
    rule: CountRule,
    call: &mut impl FnMut(*mut c_uint, *mut Device) -> u32,
) -> Result<Vec<Handle>, u32> {
    let mut room: c_uint = 64;
    if rule == CountRule::ZeroAsksSize {
        room = 0;
        match call(&mut room, null_mut()) {
            SUCCESS => {}
            code => return Err(code),
        }
    }
    for _ in 0..4 {
        if room == 0 {
            return Ok(Vec::new());
        }
        let mut buf: Vec<Device> = vec![null_mut(); usize::try_from(room).unwrap_or(0)];
        let mut filled = room;
        match call(&mut filled, buf.as_mut_ptr()) {
            SUCCESS => {
                buf.truncate(usize::try_from(filled.min(room)).unwrap_or(0));
                return Ok(buf.into_iter().map(|d| d as Handle).collect());
            }
            INSUFFICIENT_SIZE => room = filled.max(room.saturating_mul(2)),
            code => return Err(code),
        }
    }
    Err(INSUFFICIENT_SIZE)
}

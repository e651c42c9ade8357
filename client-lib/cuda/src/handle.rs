//! Opaque handles for streams and events: the device whose session made it and the id that
//! session's broker side knows, in a pointer-sized value the program stores. They are never
//! pointers to memory, so a stale or forged one can only name an id the broker does not know
//! (it answers `InvalidHandle`), never touch memory.

use std::ffi::c_void;

use crate::types::CUdevice;

/// The low byte of every stream handle.
const STREAM_TAG: usize = 0x5a;
/// The low byte of every event handle.
const EVENT_TAG: usize = 0xe7;

/// Devices a handle can name (`gpushare run --gpus` gives at most this many).
pub const MAX_DEVICES: usize = 256;

/// Tag, device and id in one value: `id << 16 | device << 8 | tag`.
fn make(tag: usize, dev: CUdevice, id: u32) -> *mut c_void {
    let dev = (dev as usize) & (MAX_DEVICES - 1);
    (((id as usize) << 16) | (dev << 8) | tag) as *mut c_void
}

fn read(tag: usize, handle: *mut c_void) -> Option<(CUdevice, u32)> {
    let v = handle as usize;
    (v & 0xff == tag && v >> 16 <= u32::MAX as usize)
        .then_some((((v >> 8) & 0xff) as CUdevice, (v >> 16) as u32))
}

pub fn stream_handle(dev: CUdevice, id: u32) -> *mut c_void {
    make(STREAM_TAG, dev, id)
}

/// The device and stream id in a handle this driver made; `None` for anything else.
pub fn stream_id(handle: *mut c_void) -> Option<(CUdevice, u32)> {
    read(STREAM_TAG, handle)
}

pub fn event_handle(dev: CUdevice, id: u32) -> *mut c_void {
    make(EVENT_TAG, dev, id)
}

/// The device and event id in a handle this driver made; `None` for anything else.
pub fn event_id(handle: *mut c_void) -> Option<(CUdevice, u32)> {
    read(EVENT_TAG, handle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip_and_never_look_like_the_special_streams() {
        for dev in [0, 1, 7, 255] {
            for id in [0, 1, 2, 255, 1 << 20, u32::MAX] {
                let s = stream_handle(dev, id);
                assert_eq!(stream_id(s), Some((dev, id)));
                assert_eq!(event_id(s), None, "a stream is not an event");
                assert!(
                    s as usize > 2,
                    "never NULL, CU_STREAM_LEGACY or CU_STREAM_PER_THREAD"
                );
                assert_eq!(event_id(event_handle(dev, id)), Some((dev, id)));
            }
        }
        assert_eq!(stream_id(std::ptr::null_mut()), None);
        assert_eq!(stream_id(std::ptr::without_provenance_mut(1)), None);
        assert_eq!(stream_id(std::ptr::without_provenance_mut(2)), None);
    }
}

//! Opaque handles for streams and events: the id the broker knows, in a pointer-sized value
//! the program stores. They are never pointers to memory, so a stale or forged one can only
//! name an id the broker does not know (it answers `InvalidHandle`), never touch memory.

use std::ffi::c_void;

/// The low byte of every stream handle.
const STREAM_TAG: usize = 0x5a;
/// The low byte of every event handle.
const EVENT_TAG: usize = 0xe7;

pub fn stream_handle(id: u32) -> *mut c_void {
    (((id as usize) << 8) | STREAM_TAG) as *mut c_void
}

/// The stream id in a handle this driver made; `None` for anything else.
pub fn stream_id(handle: *mut c_void) -> Option<u32> {
    let v = handle as usize;
    (v & 0xff == STREAM_TAG && v >> 8 <= u32::MAX as usize).then_some((v >> 8) as u32)
}

pub fn event_handle(id: u32) -> *mut c_void {
    (((id as usize) << 8) | EVENT_TAG) as *mut c_void
}

/// The event id in a handle this driver made; `None` for anything else.
pub fn event_id(handle: *mut c_void) -> Option<u32> {
    let v = handle as usize;
    (v & 0xff == EVENT_TAG && v >> 8 <= u32::MAX as usize).then_some((v >> 8) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip_and_never_look_like_the_special_streams() {
        for id in [1, 2, 255, 1 << 20, u32::MAX] {
            let s = stream_handle(id);
            assert_eq!(stream_id(s), Some(id));
            assert_eq!(event_id(s), None, "a stream is not an event");
            assert!(
                s as usize > 2,
                "never NULL, CU_STREAM_LEGACY or CU_STREAM_PER_THREAD"
            );
            assert_eq!(event_id(event_handle(id)), Some(id));
        }
        assert_eq!(stream_id(std::ptr::null_mut()), None);
        assert_eq!(stream_id(std::ptr::without_provenance_mut(1)), None);
        assert_eq!(stream_id(std::ptr::without_provenance_mut(2)), None);
    }
}

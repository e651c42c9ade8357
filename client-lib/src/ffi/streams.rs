//! Streams and events from C: their handles are the broker's ids, as `uint32_t`.

use std::ffi::c_int;

use gpushare_protocol::{Command, EventId, StreamId};

use super::guard::{Failure, FfiResult, client_ref, guard, non_null, put};
use super::session::gpushare_client;
use crate::Error;
use crate::client::Client;

/// Submits `cmd`, waits for it, and returns its first result word.
fn wait_for(client: &Client, cmd: Command) -> FfiResult<u64> {
    Ok(client.submit_wait(cmd)?.0)
}

/// A handle id the broker returned, which must fit the C type.
fn id32(id: u64, what: &str) -> FfiResult<u32> {
    u32::try_from(id).map_err(|_| {
        Failure::Client(Error::Protocol(format!(
            "the broker returned {what} id {id}, which does not fit in 32 bits"
        )))
    })
}

/// Creates a stream; `*out` gets its id.
///
/// # Safety
/// `client` is NULL or a live handle; `out` is NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gpushare_stream_create(
    client: *const gpushare_client,
    out: *mut u32,
) -> c_int {
    guard("gpushare_stream_create", || {
        // SAFETY: the caller's contract.
        let client = unsafe { client_ref(client) }?;
        non_null(out, "out")?;
        let id: StreamId = id32(wait_for(client, Command::StreamCreate)?, "stream")?;
        // SAFETY: checked non-NULL; writable by the contract.
        unsafe { put(out, id) };
        Ok(())
    })
}

/// Destroys a stream (waits for the broker's answer). Stream 0 cannot be destroyed.
///
/// # Safety
/// `client` is NULL or a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gpushare_stream_destroy(
    client: *const gpushare_client,
    stream: u32,
) -> c_int {
    guard("gpushare_stream_destroy", || {
        // SAFETY: the caller's contract.
        let client = unsafe { client_ref(client) }?;
        wait_for(client, Command::StreamDestroy { stream }).map(drop)
    })
}

/// Waits for the stream's work and reports the first error an asynchronous command met.
///
/// # Safety
/// `client` is NULL or a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gpushare_stream_synchronize(
    client: *const gpushare_client,
    stream: u32,
) -> c_int {
    guard("gpushare_stream_synchronize", || {
        // SAFETY: the caller's contract.
        let client = unsafe { client_ref(client) }?;
        Ok(client.sync_stream(stream)?)
    })
}

/// Creates an event; `*out` gets its id.
///
/// # Safety
/// `client` is NULL or a live handle; `out` is NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gpushare_event_create(
    client: *const gpushare_client,
    out: *mut u32,
) -> c_int {
    guard("gpushare_event_create", || {
        // SAFETY: the caller's contract.
        let client = unsafe { client_ref(client) }?;
        non_null(out, "out")?;
        let id: EventId = id32(wait_for(client, Command::EventCreate)?, "event")?;
        // SAFETY: checked non-NULL; writable by the contract.
        unsafe { put(out, id) };
        Ok(())
    })
}

/// Destroys an event (waits for the broker's answer).
///
/// # Safety
/// `client` is NULL or a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gpushare_event_destroy(
    client: *const gpushare_client,
    event: u32,
) -> c_int {
    guard("gpushare_event_destroy", || {
        // SAFETY: the caller's contract.
        let client = unsafe { client_ref(client) }?;
        wait_for(client, Command::EventDestroy { event }).map(drop)
    })
}

/// Records `event` at the current end of `stream` (asynchronous).
///
/// # Safety
/// `client` is NULL or a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gpushare_event_record(
    client: *const gpushare_client,
    event: u32,
    stream: u32,
) -> c_int {
    guard("gpushare_event_record", || {
        // SAFETY: the caller's contract.
        let client = unsafe { client_ref(client) }?;
        Ok(client.submit_async(Command::EventRecord { stream, event })?)
    })
}

/// `*done` = 1 when the work before the event is complete, else 0.
///
/// # Safety
/// `client` is NULL or a live handle; `done` is NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gpushare_event_query(
    client: *const gpushare_client,
    event: u32,
    done: *mut c_int,
) -> c_int {
    guard("gpushare_event_query", || {
        // SAFETY: the caller's contract.
        let client = unsafe { client_ref(client) }?;
        non_null(done, "done")?;
        let result = wait_for(client, Command::EventQuery { event })?;
        // SAFETY: checked non-NULL; writable by the contract.
        unsafe { put(done, c_int::from(result == 1)) };
        Ok(())
    })
}

/// Waits until the work before the event is complete.
///
/// # Safety
/// `client` is NULL or a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gpushare_event_synchronize(
    client: *const gpushare_client,
    event: u32,
) -> c_int {
    guard("gpushare_event_synchronize", || {
        // SAFETY: the caller's contract.
        let client = unsafe { client_ref(client) }?;
        wait_for(client, Command::EventSync { event }).map(drop)
    })
}

/// `*ns` = device time in nanoseconds from `start` to `end` (both recorded and complete).
///
/// # Safety
/// `client` is NULL or a live handle; `ns` is NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gpushare_event_elapsed_ns(
    client: *const gpushare_client,
    start: u32,
    end: u32,
    ns: *mut u64,
) -> c_int {
    guard("gpushare_event_elapsed_ns", || {
        // SAFETY: the caller's contract.
        let client = unsafe { client_ref(client) }?;
        non_null(ns, "ns")?;
        let elapsed = wait_for(client, Command::EventElapsed { start, end })?;
        // SAFETY: checked non-NULL; writable by the contract.
        unsafe { put(ns, elapsed) };
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffi::GPUSHARE_E_NULL;
    use crate::ffi::guard::last_error;

    #[test]
    fn a_broker_id_must_fit_the_c_handle() {
        assert!(matches!(id32(u64::from(u32::MAX), "stream"), Ok(u32::MAX)));
        let Err(Failure::Client(Error::Protocol(why))) = id32(1 << 32, "event") else {
            panic!("an id past 32 bits is the broker's protocol error");
        };
        assert!(why.contains("event id 4294967296"), "{why}");
    }

    #[test]
    fn a_null_out_pointer_is_refused_before_anything_is_created() {
        let mut id = 0u32;
        // SAFETY: NULL client, checked first.
        let rc = unsafe { gpushare_stream_create(std::ptr::null(), &mut id) };
        assert_eq!(rc, GPUSHARE_E_NULL);
        assert_eq!(
            last_error(),
            "gpushare_stream_create: `client` must not be NULL"
        );
        // SAFETY: NULL client, checked first.
        let rc = unsafe { gpushare_event_query(std::ptr::null(), 1, std::ptr::null_mut()) };
        assert_eq!(rc, GPUSHARE_E_NULL);
    }
}

//! A client with rebuild on makes its device state again after a GPU reset: in the same
//! session when the broker reset the device in place, or in a new session when gpushared
//! restarted after the fault (the session is then replaced under the user's handles).

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gpushare_conn::{DeviceReset, op_name};
use gpushare_protocol::{Command, ErrorCode, EventId, StreamId};

use super::conn::Conn;
use super::{Client, lock};
use crate::rebuild::{Lost, RebuildError, Registry, Waited};
use crate::{Error, Result};

/// How long a command that failed with `DeviceReset` waits for the broker's notice of what
/// the reset took (it comes on the control socket, possibly just after the completion).
const NOTICE_WAIT: Duration = Duration::from_secs(5);

impl Client {
    /// Runs `op` on the session now. With rebuild on: first makes again what a reset took
    /// (failing this call once with [`Error::Rebuilt`]), and when `op` itself meets a reset,
    /// rebuilds and fails with [`Error::Rebuilt`] instead of the reset's error.
    pub(super) fn run<T>(&self, op: impl FnOnce(&Conn) -> Result<T>) -> Result<T> {
        let Some(registry) = &self.inner.registry else {
            return op(&self.conn());
        };
        let conn = self.conn();
        // Notices so far: one arriving while `op` runs means a reset it may have met, even
        // when another thread takes the notice and rebuilds first.
        let seen = self.inner.notices.count.load(Ordering::Acquire);
        let outcome = if self.inner.failed.load(Ordering::Acquire)
            || self.inner.notices.pending.load(Ordering::Acquire)
            || conn.restarted().is_some()
        {
            Err(self.rebuild(registry, &conn))
        } else {
            match op(&conn) {
                Err(e) if self.lost_to_fault(&conn, &e, seen) => Err(self.rebuild(registry, &conn)),
                other => other,
            }
        };
        if let Err(Error::Rebuilt(_)) = &outcome {
            // This thread now knows that what it submitted before was lost.
            lock(registry).told_this_thread();
        }
        outcome
    }

    /// After a call that waited for `waited`'s work (rebuild on): if a rebuild found some of
    /// that work not yet waited for, the reset took it, and this call says so (`Rebuilt`),
    /// rather than let the caller read results that were never computed.
    pub(super) fn check_waited(&self, waited: Waited, outcome: Result<()>) -> Result<()> {
        let Some(registry) = &self.inner.registry else {
            return outcome;
        };
        outcome?;
        let mut reg = lock(registry);
        if reg.waited(waited) {
            reg.told_this_thread();
            return Err(Error::Rebuilt(reg.last_reason.clone()));
        }
        Ok(())
    }

    /// Whether `e` means a reset took this client's device state (the notice of what it
    /// took, or the end of the session, has arrived by the time this answers). `seen`: the
    /// notices counted when the call began.
    fn lost_to_fault(&self, conn: &Conn, e: &Error, seen: u64) -> bool {
        match e {
            Error::BrokerRestarting(_) => true,
            e if e.code() == Some(ErrorCode::DeviceReset) => {
                conn.wait_for_notice(NOTICE_WAIT, seen);
                let notices = &self.inner.notices;
                notices.pending.load(Ordering::Acquire)
                    || notices.count.load(Ordering::Acquire) != seen
                    || conn.restarted().is_some()
            }
            _ => false,
        }
    }

    /// Makes again what resets took, once (other threads that met the same reset wait, then
    /// get the same answer). Returns the error for the call that met it.
    fn rebuild(&self, registry: &Mutex<Registry>, seen: &Arc<Conn>) -> Error {
        let mut reg = lock(registry);
        if let Some(failed) = &reg.failed {
            return Error::RebuildFailed(failed.clone());
        }
        let current = self.conn();
        let started = Instant::now();
        let mut waited = Duration::ZERO;
        let mut rebuilt_here = true;
        let outcome = if !Arc::ptr_eq(&current, seen) {
            // Another thread reconnected and rebuilt meanwhile.
            rebuilt_here = false;
            Ok("gpushared restarted".to_string())
        } else if let Some(reason) = current.restarted() {
            self.rebuild_after_restart(&mut reg, &current)
                .map(|reconnecting| {
                    waited = reconnecting;
                    reason
                })
        } else {
            let resets: Vec<DeviceReset> = {
                let mut unrebuilt = lock(&self.inner.notices.unrebuilt);
                self.inner.notices.pending.store(false, Ordering::Release);
                std::mem::take(&mut *unrebuilt)
            };
            let reason = resets
                .last()
                .map_or_else(|| "the GPU was reset".to_string(), |r| r.reason.clone());
            if resets.is_empty() {
                rebuilt_here = false; // another thread rebuilt meanwhile
                Ok(reason)
            } else {
                let lost = Lost::listed(resets.into_iter().map(|r| r.lost));
                self.rebuild_in_place(&mut reg, &current, &lost)
                    .map(|()| reason)
            }
        };
        match outcome {
            Ok(reason) if !rebuilt_here => Error::Rebuilt(reason),
            Ok(reason) => {
                reg.rebuilds += 1;
                reg.lose_unsynced();
                reg.last_reason = reason.clone();
                tracing_free_log(&format!(
                    "gpushare: device state rebuilt in {:.1} ms ({:.1} ms of it waiting for gpushared to come back) after: {reason}",
                    started.elapsed().as_secs_f64() * 1e3,
                    waited.as_secs_f64() * 1e3
                ));
                Error::Rebuilt(reason)
            }
            Err(e) => {
                reg.failed = Some(e.clone());
                self.inner.failed.store(true, Ordering::Release);
                Error::RebuildFailed(e)
            }
        }
    }

    /// In the same session (the broker reset the device in place): makes again what the
    /// broker's notices list.
    fn rebuild_in_place(
        &self,
        reg: &mut Registry,
        conn: &Conn,
        lost: &Lost,
    ) -> Result<(), RebuildError> {
        // Completions of work the reset took carry `DeviceReset`: not news any more. So does
        // the first sync covering work the reset took before it ran.
        let _ = conn.drain_in_flight();
        let _ = conn.take_async_error();
        let _ = conn.synchronize();
        remake(reg, conn, lost)
    }

    /// gpushared restarted: a new session (waiting for the broker to come back), the host
    /// buffers' bytes carried into its arena, then everything made again. Returns how long
    /// it waited for the broker.
    fn rebuild_after_restart(
        &self,
        reg: &mut Registry,
        old: &Arc<Conn>,
    ) -> Result<Duration, RebuildError> {
        let started = Instant::now();
        let conn = Arc::new(self.reconnect_after_restart()?);
        let waited = started.elapsed();
        if conn.arena_size() != old.arena_size() || conn.staging_size != old.staging_size {
            return Err(RebuildError::Step {
                what: "keeping the host buffers".into(),
                cause: format!(
                    "the new session's arena is {} bytes, the old one's {}",
                    conn.arena_size(),
                    old.arena_size()
                ),
            });
        }
        let host_bytes = old.arena_size() - old.staging_size;
        // SAFETY: both arenas are mapped, equally laid out (checked), and the host-buffer part
        // starts at `staging_size` in each; the old session is over, so nothing writes it.
        unsafe {
            std::ptr::copy_nonoverlapping(
                old.arena_ptr(old.staging_size),
                conn.arena_ptr(conn.staging_size),
                host_bytes,
            )
        };
        *self.inner.conn.write().unwrap_or_else(|p| p.into_inner()) = conn.clone();
        lock(&self.inner.retired).push(old.clone());
        {
            // What an in-place reset listed is gone with the old session anyway.
            let mut unrebuilt = lock(&self.inner.notices.unrebuilt);
            unrebuilt.clear();
            self.inner.notices.pending.store(false, Ordering::Release);
        }
        remake(reg, &conn, &Lost::Everything)?;
        Ok(waited)
    }

    /// Connects again after a restart, retrying for up to `rebuild_timeout`.
    fn reconnect_after_restart(&self) -> Result<Conn, RebuildError> {
        let opts = &self.inner.options;
        let started = Instant::now();
        Conn::open_retrying(opts, self.inner.notices.clone(), opts.rebuild_timeout).map_err(|e| {
            match e {
                Error::Rejected(w) => RebuildError::Refused(w.to_string()),
                e @ (Error::InvalidArgument(_) | Error::Protocol(_)) => RebuildError::Step {
                    what: "connecting again".into(),
                    cause: e.to_string(),
                },
                e => RebuildError::BrokerNotBack {
                    waited_ms: started.elapsed().as_millis() as u64,
                    last: e.to_string(),
                },
            }
        })
    }
}

/// Makes again what `lost` names of the record, in `conn`: allocations at their old
/// addresses with their shadows uploaded, streams, events, modules and their functions.
fn remake(reg: &mut Registry, conn: &Conn, lost: &Lost) -> Result<(), RebuildError> {
    let step = |what: String| {
        move |e: Error| RebuildError::Step {
            what,
            cause: e.to_string(),
        }
    };
    for (&ptr, buffer) in &reg.buffers {
        if !lost.buffer(ptr) {
            continue;
        }
        let bytes = buffer.bytes;
        if buffer.shadow_lost {
            return Err(RebuildError::Step {
                what: format!("restoring the {bytes} bytes uploaded to {ptr:#x}"),
                cause: "there was no host memory to keep a copy of them".into(),
            });
        }
        conn.call(Command::AllocAt { bytes, ptr }, "allocate at an address")
            .map_err(|e| match e.code() {
                Some(ErrorCode::AddressUnavailable) => RebuildError::AddressUnavailable {
                    ptr,
                    bytes,
                    cause: e.to_string(),
                },
                _ => step(format!("allocating {bytes} bytes at {ptr:#x} again"))(e),
            })?;
        if let Some(shadow) = &buffer.shadow {
            conn.copy_to_device(0, ptr, shadow)
                .map_err(step(format!("uploading {bytes} bytes to {ptr:#x} again")))?;
        }
    }
    for broker in reg.streams.values_mut() {
        if lost.stream(*broker) {
            let id = conn
                .call(Command::StreamCreate, "create stream")
                .map_err(step("creating a stream again".into()))?
                .result;
            *broker = id as StreamId;
        }
    }
    for broker in reg.events.values_mut() {
        if lost.event(*broker) {
            let id = conn
                .call(Command::EventCreate, "create event")
                .map_err(step("creating an event again".into()))?
                .result;
            *broker = id as EventId;
        }
    }
    let mut reloaded = HashSet::new();
    for (&id, module) in reg.modules.iter_mut() {
        if lost.module(module.broker) {
            module.broker = conn
                .load_module(module.format, &module.image)
                .map_err(step(format!("loading a {:?} module again", module.format)))?;
            reloaded.insert(id);
        }
    }
    for function in reg.functions.values_mut() {
        if reloaded.contains(&function.module) {
            let module = reg
                .modules
                .get(&function.module)
                .map_or(u64::MAX, |m| m.broker);
            function.broker = conn
                .get_function(module, &function.name)
                .map_err(step(format!("looking up {} again", function.name)))?;
        }
    }
    // The scheduler forgot the job profile and deadline with the rest.
    for cmd in reg.declarations.clone() {
        conn.submit_wait(cmd).map_err(step(format!(
            "declaring {} again",
            op_name(cmd.encode(0).opcode)
        )))?;
    }
    conn.synchronize()
        .map_err(step("waiting for the rebuilt state".into()))
}

/// One line on stderr when `GPUSHARE_LOG_REBUILD` is set (the library has no logger).
fn tracing_free_log(line: &str) {
    if std::env::var_os("GPUSHARE_LOG_REBUILD").is_some() {
        let _ = std::io::Write::write_all(&mut std::io::stderr(), format!("{line}\n").as_bytes());
    }
}

//! The program's standing with the broker: governed (connected) or unmanaged, its memory
//! reservations and its local budget of launch tokens.
//!
//! The connection is made once, at the program's first `cuInit` (or first governed call). If
//! the broker cannot be reached, one warning line goes to stderr and every call passes
//! straight through from then on; the same happens, with its own line, if the broker goes
//! away while the program runs. A forked child is unmanaged (CUDA does not work across fork,
//! and the ring belongs to the parent).
//!
//! A launch takes a token from an atomic counter; only when the budget is spent or has expired
//! does one thread ask the broker for more (`GovernedTokens`), while others wait on the same
//! lock. A synchronization ends the lease of a gated grant (`GovernedIdle`) and drops what is
//! left of its budget, so the program's next burst of work asks again.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU8, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, Once};

use gpushare_protocol::command::GOVERNED_LEASE;
use gpushare_protocol::{Command, ErrorCode, PriorityClass};

use crate::broker::{CallError, Connection, Introduction};
use crate::debug;

use gpushare_conn::env::{CLASS_ENV, GPU_ENV, NAME_ENV, WEIGHT_ENV};

const UNKNOWN: u8 = 0;
const GOVERNED: u8 = 1;
const UNMANAGED: u8 = 2;

static STATE: AtomicU8 = AtomicU8::new(UNKNOWN);
static CONNECT: Once = Once::new();
static CONNECTION: Mutex<Option<Connection>> = Mutex::new(None);

/// Launch tokens left; may go negative while a refill is under way.
static TOKENS: AtomicI64 = AtomicI64::new(0);
/// CLOCK_MONOTONIC ns until which the tokens are valid.
static VALID_UNTIL: AtomicU64 = AtomicU64::new(0);
/// Launches (and their thread blocks) not yet reported to the broker.
static LAUNCHED: AtomicU64 = AtomicU64::new(0);
static BLOCKS: AtomicU64 = AtomicU64::new(0);
/// The last grant holds a place in the scheduler until the program synchronizes.
static LEASE: AtomicBool = AtomicBool::new(false);
/// What the program asked of the broker, for the diagnostics' summary ([`summary`]).
static CLIENT_ID: AtomicU64 = AtomicU64::new(0);
static RESERVATIONS: AtomicU64 = AtomicU64::new(0);
static REFUSALS: AtomicU64 = AtomicU64::new(0);
static TOKEN_REQUESTS: AtomicU64 = AtomicU64::new(0);
static TOKEN_WAIT_NS: AtomicU64 = AtomicU64::new(0);
static LAUNCHES_REPORTED: AtomicU64 = AtomicU64::new(0);

/// What the broker said to a reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    Reserved,
    /// Past the quota: the program gets CUDA_ERROR_OUT_OF_MEMORY.
    Refused,
    /// No broker: the call passes through uncounted.
    Unmanaged,
}

/// Connects on the first call; whether the program is governed now.
pub fn governed() -> bool {
    match STATE.load(Ordering::Acquire) {
        GOVERNED => true,
        UNMANAGED => false,
        _ => {
            CONNECT.call_once(connect);
            STATE.load(Ordering::Acquire) == GOVERNED
        }
    }
}

fn socket_path() -> PathBuf {
    gpushare_protocol::socket_path_from_env()
}

fn connect() {
    let path = socket_path();
    let name = std::env::var(NAME_ENV)
        .ok()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| {
            std::fs::read_to_string("/proc/self/comm")
                .map(|s| s.trim().to_string())
                .unwrap_or_else(|_| "governed".into())
        });
    let class = std::env::var(CLASS_ENV)
        .ok()
        .and_then(|c| c.parse::<PriorityClass>().ok());
    let gpu = std::env::var(GPU_ENV).ok().and_then(|g| g.parse().ok());
    let who = Introduction {
        name: &name,
        class,
        gpu,
    };
    match Connection::connect(&path, &who) {
        Ok((mut connection, welcome)) => {
            CLIENT_ID.store(welcome.client_id, Ordering::Relaxed);
            debug::say(format_args!(
                "pid {} connected to the broker at {} as client {} (class {}, weight {}, counted on the broker's GPU {}: {})",
                std::process::id(),
                path.display(),
                welcome.client_id,
                welcome.class,
                welcome.weight,
                welcome.device.index,
                welcome.device.name,
            ));
            if let Some(asked) = class
                && asked != welcome.class
            {
                eprintln!("{}", downgraded(asked, welcome.class));
            }
            if let Some(weight) = std::env::var(WEIGHT_ENV).ok().and_then(|w| w.parse().ok())
                && let Err(e) = connection.call(Command::GovernedWeight { weight })
            {
                eprintln!(
                    "gpushare: weight {weight} refused ({e:?}): the policy grants this program weight {}, and a program may only ask for less",
                    welcome.weight
                );
            }
            *lock() = Some(connection);
            // SAFETY: registers a plain function as the fork child handler; it only stores an
            // atomic, which is async-signal-safe.
            unsafe { libc::pthread_atfork(None, None, Some(forked_child)) };
            STATE.store(GOVERNED, Ordering::Release);
        }
        Err(why) => {
            eprintln!(
                "gpushare: broker not running at {} ({why}); this program runs unmanaged",
                path.display()
            );
            STATE.store(UNMANAGED, Ordering::Release);
        }
    }
}

/// The warning for a program that asked for a more important class than the policy grants (a
/// program may only ask for a less important one).
fn downgraded(asked: PriorityClass, granted: PriorityClass) -> String {
    format!(
        "gpushare: asked for class {asked}, but the broker's policy grants this user at most {granted}; this program runs as {granted} (an administrator can raise the grant in the policy file)"
    )
}

extern "C" fn forked_child() {
    STATE.store(UNMANAGED, Ordering::Release);
}

fn lock() -> MutexGuard<'static, Option<Connection>> {
    CONNECTION.lock().unwrap_or_else(|p| p.into_inner())
}

/// The broker went away: say so once and run unmanaged from now on.
fn lose(connection: &mut Option<Connection>, why: &str) {
    if connection.take().is_some() {
        STATE.store(UNMANAGED, Ordering::Release);
        eprintln!(
            "gpushare: lost the broker at {} ({why}); this program runs unmanaged from now on",
            socket_path().display()
        );
    }
}

/// Asks the broker to count `bytes` against the quota before the program allocates them.
pub fn reserve(bytes: u64) -> Admission {
    if bytes == 0 || !governed() {
        return Admission::Unmanaged;
    }
    let mut guard = lock();
    let Some(connection) = guard.as_mut() else {
        return Admission::Unmanaged;
    };
    RESERVATIONS.fetch_add(1, Ordering::Relaxed);
    match connection.call(Command::GovernedReserve { bytes }) {
        Ok(_) => Admission::Reserved,
        Err(CallError::Refused(ErrorCode::OutOfQuota)) => {
            REFUSALS.fetch_add(1, Ordering::Relaxed);
            Admission::Refused
        }
        Err(CallError::Refused(code)) => {
            lose(&mut guard, &format!("a reservation failed: {code}"));
            Admission::Unmanaged
        }
        Err(CallError::Lost(why)) => {
            lose(&mut guard, &why);
            Admission::Unmanaged
        }
    }
}

/// Gives back `bytes` the program freed (or failed to allocate after reserving).
pub fn release(bytes: u64) {
    if bytes == 0 || STATE.load(Ordering::Acquire) != GOVERNED {
        return;
    }
    let mut guard = lock();
    if let Some(connection) = guard.as_mut()
        && let Err(CallError::Lost(why)) = connection.post(Command::GovernedRelease { bytes })
    {
        lose(&mut guard, &why);
    }
}

fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// Admits one kernel launch of `blocks` thread blocks: at once from the local budget, or after
/// the broker grants more. Unmanaged programs launch freely.
pub fn admit_launch(blocks: u64) {
    if !governed() {
        return;
    }
    LAUNCHED.fetch_add(1, Ordering::Relaxed);
    BLOCKS.fetch_add(blocks, Ordering::Relaxed);
    if TOKENS.fetch_sub(1, Ordering::AcqRel) > 0 && now_ns() < VALID_UNTIL.load(Ordering::Acquire) {
        return;
    }
    refill();
}

fn refill() {
    let mut guard = lock();
    // Another thread may have refilled while this one waited for the lock.
    if TOKENS.fetch_sub(1, Ordering::AcqRel) > 0 && now_ns() < VALID_UNTIL.load(Ordering::Acquire) {
        return;
    }
    let Some(connection) = guard.as_mut() else {
        return;
    };
    let launched = LAUNCHED.swap(0, Ordering::Relaxed);
    let blocks = BLOCKS.swap(0, Ordering::Relaxed);
    LAUNCHES_REPORTED.fetch_add(launched, Ordering::Relaxed);
    TOKEN_REQUESTS.fetch_add(1, Ordering::Relaxed);
    let asked = now_ns();
    let answer = connection.call(Command::GovernedTokens { launched, blocks });
    let waited = now_ns().saturating_sub(asked);
    TOKEN_WAIT_NS.fetch_add(waited, Ordering::Relaxed);
    match answer {
        Ok((tokens, answer)) => {
            let valid_us = answer & 0xffff_ffff;
            debug::first_tokens(tokens, valid_us, answer & GOVERNED_LEASE != 0, waited);
            VALID_UNTIL.store(
                now_ns().saturating_add(valid_us.saturating_mul(1000)),
                Ordering::Release,
            );
            LEASE.store(answer & GOVERNED_LEASE != 0, Ordering::Release);
            // This launch takes the first token.
            TOKENS.store(
                i64::try_from(tokens).unwrap_or(i64::MAX) - 1,
                Ordering::Release,
            );
        }
        Err(CallError::Refused(code)) => {
            lose(&mut guard, &format!("launch tokens refused: {code}"))
        }
        Err(CallError::Lost(why)) => lose(&mut guard, &why),
    }
}

/// The program synchronized: its work so far is done. Reports the launches made since the
/// last report and ends the lease of a gated grant, dropping what is left of its budget.
pub fn synchronized() {
    if STATE.load(Ordering::Acquire) != GOVERNED {
        return;
    }
    let lease = LEASE.swap(false, Ordering::AcqRel);
    if lease {
        TOKENS.store(0, Ordering::Release);
    } else if LAUNCHED.load(Ordering::Relaxed) == 0 {
        return;
    }
    // A thread waiting for tokens holds the lock; its request reports and ends the lease.
    let Ok(mut guard) = CONNECTION.try_lock() else {
        return;
    };
    let launched = LAUNCHED.swap(0, Ordering::Relaxed);
    let blocks = BLOCKS.swap(0, Ordering::Relaxed);
    LAUNCHES_REPORTED.fetch_add(launched, Ordering::Relaxed);
    if let Some(connection) = guard.as_mut()
        && let Err(CallError::Lost(why)) =
            connection.post(Command::GovernedIdle { launched, blocks })
    {
        lose(&mut guard, &why);
    }
}

/// The program's standing and what it asked of the broker, in one line (for the diagnostics).
pub fn summary() -> String {
    let state = match STATE.load(Ordering::Acquire) {
        GOVERNED => format!("governed as client {}", CLIENT_ID.load(Ordering::Relaxed)),
        UNMANAGED if CLIENT_ID.load(Ordering::Relaxed) != 0 => format!(
            "unmanaged (was client {} until the broker was lost, or this is a forked child)",
            CLIENT_ID.load(Ordering::Relaxed)
        ),
        UNMANAGED => "unmanaged (no broker)".into(),
        _ => "never initialised CUDA through the interposer".into(),
    };
    format!(
        "{state}; reservations {} ({} refused); launch token requests {} (waited {:.3} ms in all); launches reported {} (+{} not yet)",
        RESERVATIONS.load(Ordering::Relaxed),
        REFUSALS.load(Ordering::Relaxed),
        TOKEN_REQUESTS.load(Ordering::Relaxed),
        TOKEN_WAIT_NS.load(Ordering::Relaxed) as f64 / 1e6,
        LAUNCHES_REPORTED.load(Ordering::Relaxed),
        LAUNCHED.load(Ordering::Relaxed),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_downgrade_warning_names_both_classes() {
        assert_eq!(
            downgraded(PriorityClass::High, PriorityClass::Normal),
            "gpushare: asked for class high, but the broker's policy grants this user at most normal; this program runs as normal (an administrator can raise the grant in the policy file)"
        );
    }
}

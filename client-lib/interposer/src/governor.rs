//! The program's admission by the broker: its memory reservations and its local budget of
//! launch tokens. Its standing with the broker (connected, away, unmanaged) is `standing`'s.
//!
//! A launch takes a token from an atomic counter; only when the budget is spent or has expired
//! does one thread ask the broker for more (`GovernedTokens`), while others wait on the same
//! lock. A synchronization ends the lease of a gated grant (`GovernedIdle`) and drops what is
//! left of its budget, so the program's next burst of work asks again.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};

use gpushare_protocol::command::GOVERNED_LEASE;
use gpushare_protocol::{Command, ErrorCode};

use crate::abi::{CUDA_ERROR_NO_DEVICE, CUDA_ERROR_SYSTEM_NOT_READY, CUDA_SUCCESS, CUresult};
use crate::debug;
use crate::standing::{self, Asked};

pub use crate::standing::governed;

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
static RESERVATIONS: AtomicU64 = AtomicU64::new(0);
static REFUSALS: AtomicU64 = AtomicU64::new(0);
static FAILED: AtomicU64 = AtomicU64::new(0);
static TOKEN_REQUESTS: AtomicU64 = AtomicU64::new(0);
static TOKEN_WAIT_NS: AtomicU64 = AtomicU64::new(0);
static LAUNCHES_REPORTED: AtomicU64 = AtomicU64::new(0);

/// What the broker said to a reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    Reserved,
    /// Past the quota: the program gets CUDA_ERROR_OUT_OF_MEMORY.
    Refused,
    /// No broker, and the program runs without one: the call passes through uncounted.
    Unmanaged,
    /// No broker, and the program may not run without one: the call fails with this.
    Failed(CUresult),
}

/// The broker that granted the tokens left is gone: they are void.
pub(crate) fn forget_tokens() {
    TOKENS.store(0, Ordering::Release);
    LEASE.store(false, Ordering::Release);
}

/// Whether CUDA is there for the program: `CUDA_SUCCESS`, or the error its `cuInit` (and
/// context creation) must return because there is no broker and no fallback.
pub fn init() -> CUresult {
    if standing::refused() {
        CUDA_ERROR_NO_DEVICE
    } else {
        CUDA_SUCCESS
    }
}

/// A call that cannot be admitted: no broker now, or an answer that is not one.
fn failed(what: &str, why: &str) -> CUresult {
    if FAILED.fetch_add(1, Ordering::Relaxed) == 0 {
        eprintln!("gpushare: {what} failed: {why}");
    }
    CUDA_ERROR_SYSTEM_NOT_READY
}

/// Asks the broker to count `bytes` against the quota before the program allocates them.
pub fn reserve(bytes: u64) -> Admission {
    if standing::unmanaged() {
        return Admission::Unmanaged;
    }
    if !governed() {
        return Admission::Failed(CUDA_ERROR_SYSTEM_NOT_READY);
    }
    if bytes == 0 {
        return Admission::Reserved;
    }
    RESERVATIONS.fetch_add(1, Ordering::Relaxed);
    match standing::link().call(Command::GovernedReserve { bytes }) {
        Asked::Answered(..) => Admission::Reserved,
        Asked::Refused(ErrorCode::OutOfQuota) => {
            REFUSALS.fetch_add(1, Ordering::Relaxed);
            Admission::Refused
        }
        Asked::Refused(code) => Admission::Failed(failed(
            "a memory reservation",
            &format!("the broker answered {code}"),
        )),
        Asked::Unmanaged => Admission::Unmanaged,
        Asked::Unavailable => Admission::Failed(failed(
            "a memory reservation",
            "the broker is away (see above)",
        )),
    }
}

/// Gives back `bytes` the program freed (or failed to allocate after reserving). While the
/// broker is away nothing is sent: the program's next session counts what it holds then.
pub fn release(bytes: u64) {
    if bytes == 0 || !standing::governed_now() {
        return;
    }
    standing::link().post(Command::GovernedRelease { bytes });
}

fn now_ns() -> u64 {
    gpushare_protocol::wake::monotonic_ns()
}

/// Admits one kernel launch of `blocks` thread blocks: at once from the local budget, or after
/// the broker grants more. Unmanaged programs launch freely; a governed program without a
/// broker does not launch at all (the launch fails with the error given).
pub fn admit_launch(blocks: u64) -> Result<(), CUresult> {
    if standing::unmanaged() {
        return Ok(());
    }
    if !governed() {
        return Err(CUDA_ERROR_SYSTEM_NOT_READY);
    }
    LAUNCHED.fetch_add(1, Ordering::Relaxed);
    BLOCKS.fetch_add(blocks, Ordering::Relaxed);
    if TOKENS.fetch_sub(1, Ordering::AcqRel) > 0 && now_ns() < VALID_UNTIL.load(Ordering::Acquire) {
        return Ok(());
    }
    refill()
}

fn refill() -> Result<(), CUresult> {
    let mut link = standing::link();
    // Another thread may have refilled while this one waited for the lock.
    if TOKENS.fetch_sub(1, Ordering::AcqRel) > 0 && now_ns() < VALID_UNTIL.load(Ordering::Acquire) {
        return Ok(());
    }
    let launched = LAUNCHED.swap(0, Ordering::Relaxed);
    let blocks = BLOCKS.swap(0, Ordering::Relaxed);
    LAUNCHES_REPORTED.fetch_add(launched, Ordering::Relaxed);
    TOKEN_REQUESTS.fetch_add(1, Ordering::Relaxed);
    let asked = now_ns();
    let answer = link.call(Command::GovernedTokens { launched, blocks });
    let waited = now_ns().saturating_sub(asked);
    TOKEN_WAIT_NS.fetch_add(waited, Ordering::Relaxed);
    match answer {
        Asked::Answered(tokens, answer) => {
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
            Ok(())
        }
        Asked::Unmanaged => Ok(()),
        Asked::Refused(code) => Err(failed(
            "a kernel launch",
            &format!("the broker refused launch tokens: {code}"),
        )),
        Asked::Unavailable => {
            TOKENS.store(0, Ordering::Release);
            Err(failed("a kernel launch", "the broker is away (see above)"))
        }
    }
}

/// The program synchronized: its work so far is done. Reports the launches made since the
/// last report and ends the lease of a gated grant, dropping what is left of its budget.
pub fn synchronized() {
    if !standing::governed_now() {
        return;
    }
    let lease = LEASE.swap(false, Ordering::AcqRel);
    if lease {
        TOKENS.store(0, Ordering::Release);
    } else if LAUNCHED.load(Ordering::Relaxed) == 0 {
        return;
    }
    // A thread waiting for tokens holds the link; its request reports and ends the lease.
    let Some(mut link) = standing::try_link() else {
        return;
    };
    let launched = LAUNCHED.swap(0, Ordering::Relaxed);
    let blocks = BLOCKS.swap(0, Ordering::Relaxed);
    LAUNCHES_REPORTED.fetch_add(launched, Ordering::Relaxed);
    link.post(Command::GovernedIdle { launched, blocks });
}

/// The program's standing and what it asked of the broker, in one line (for the diagnostics).
pub fn summary() -> String {
    let client = standing::CLIENT_ID.load(Ordering::Relaxed);
    let state = match standing::current() {
        "governed" => format!(
            "governed as client {client} (connected again {} times)",
            standing::RECONNECTS.load(Ordering::Relaxed)
        ),
        "unmanaged" if standing::was_connected() => format!(
            "unmanaged (was client {client} until the broker was lost with --fallback direct, or this is a forked child)"
        ),
        "unmanaged" => "unmanaged (no broker, --fallback direct)".into(),
        "refused" => "refused (no broker, and no --fallback direct)".into(),
        _ => "never initialised CUDA through the interposer".into(),
    };
    format!(
        "{state}; reservations {} ({} refused); launch token requests {} (waited {:.3} ms in all); launches reported {} (+{} not yet); calls failed without a broker {}",
        RESERVATIONS.load(Ordering::Relaxed),
        REFUSALS.load(Ordering::Relaxed),
        TOKEN_REQUESTS.load(Ordering::Relaxed),
        TOKEN_WAIT_NS.load(Ordering::Relaxed) as f64 / 1e6,
        LAUNCHES_REPORTED.load(Ordering::Relaxed),
        LAUNCHED.load(Ordering::Relaxed),
        FAILED.load(Ordering::Relaxed),
    )
}

//! The program's standing with the broker, and what happens when the broker is not there.
//!
//! The connection is made once, at the program's first `cuInit` (or first governed call). A
//! program never runs unmanaged unless it was started to (`gpushare run --fallback direct`,
//! which sets `GPUSHARE_FALLBACK=direct`):
//! - without a broker at the start, its `cuInit` fails (`CUDA_ERROR_NO_DEVICE`, one line on
//!   stderr naming the socket and the way out);
//! - when it loses the broker (a restart, a crash, no answer within `GPUSHARE_TIMEOUT`), the
//!   next call that needs it connects again, waiting for the broker up to
//!   `GPUSHARE_RECONNECT_TIMEOUT` seconds after the loss, and registers again what the
//!   program holds (its device memory; its class and weight come with the new session).
//!   Meanwhile its launches and allocations wait; once the bound has passed they fail
//!   (`CUDA_ERROR_SYSTEM_NOT_READY`) until the broker is back, each trying once more.
//!
//! With `--fallback direct` a program runs unmanaged from the moment it finds no broker, with
//! one line saying so. A forked child is unmanaged (CUDA does not work across fork, and the
//! ring belongs to the parent).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, Once};
use std::time::{Duration, Instant};

use gpushare_conn::env::{
    CLASS_ENV, DEFAULT_TIMEOUT, GPU_ENV, NAME_ENV, RECONNECT_ENV, WEIGHT_ENV, fallback_direct,
    seconds,
};
use gpushare_protocol::control::Welcome;
use gpushare_protocol::{Command, ErrorCode, PriorityClass};

use crate::broker::{CallError, Connection, Introduction};
use crate::debug;

const UNKNOWN: u8 = 0;
/// Governed: connected, or waiting for a broker it lost.
const GOVERNED: u8 = 1;
/// Runs without the broker: started with `--fallback direct`, or a forked child.
const UNMANAGED: u8 = 2;
/// No broker at the start, and no fallback: CUDA fails.
const REFUSED: u8 = 3;

static STATE: AtomicU8 = AtomicU8::new(UNKNOWN);
static CONNECT: Once = Once::new();
static LINK: Mutex<Link> = Mutex::new(Link {
    connection: None,
    who: None,
    lost: None,
    gave_up: false,
});
/// The client id the broker gave the program last (for the diagnostics' summary).
pub static CLIENT_ID: AtomicU64 = AtomicU64::new(0);
/// How many times the program connected again after losing the broker.
pub static RECONNECTS: AtomicU64 = AtomicU64::new(0);

/// Longest pause between two attempts to reach a broker that went away.
const RETRY_PAUSE: Duration = Duration::from_millis(50);

/// What became of a request to the broker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Asked {
    /// Its `(result, result2)`.
    Answered(u64, u64),
    /// The broker answered with this error.
    Refused(ErrorCode),
    /// No broker, and the program may run without one: go ahead.
    Unmanaged,
    /// No broker, and the program may not run without one: the call fails.
    Unavailable,
}

/// Who the program is, kept to introduce it again after a loss.
struct Who {
    name: String,
    class: Option<PriorityClass>,
    gpu: Option<u32>,
    weight: Option<u32>,
}

/// The session with the broker, if there is one.
pub struct Link {
    connection: Option<Connection>,
    who: Option<Who>,
    /// When the broker was lost, while it is away.
    lost: Option<Instant>,
    /// Said that calls fail until the broker is back (once per loss).
    gave_up: bool,
}

fn socket_path() -> PathBuf {
    gpushare_protocol::socket_path_from_env()
}

/// Connects on the first call; whether the program is governed (connected, or waiting for
/// a broker it lost).
pub fn governed() -> bool {
    state() == GOVERNED
}

/// Whether the program is governed already (without connecting if it has not tried yet).
pub fn governed_now() -> bool {
    STATE.load(Ordering::Acquire) == GOVERNED
}

/// Whether the program runs without the broker (it was started to).
pub fn unmanaged() -> bool {
    state() == UNMANAGED
}

/// Whether CUDA must fail for the program: no broker at the start, and no fallback.
pub fn refused() -> bool {
    state() == REFUSED
}

/// Whether the program ever connected (for the diagnostics).
pub fn was_connected() -> bool {
    CLIENT_ID.load(Ordering::Relaxed) != 0
}

fn state() -> u8 {
    match STATE.load(Ordering::Acquire) {
        UNKNOWN => {
            CONNECT.call_once(connect);
            STATE.load(Ordering::Acquire)
        }
        s => s,
    }
}

/// The state as it is, without connecting.
pub fn current() -> &'static str {
    match STATE.load(Ordering::Acquire) {
        GOVERNED => "governed",
        UNMANAGED => "unmanaged",
        REFUSED => "refused",
        _ => "unknown",
    }
}

pub fn link() -> MutexGuard<'static, Link> {
    LINK.lock().unwrap_or_else(|p| p.into_inner())
}

/// Tries the link without waiting (a synchronization must not wait behind a request).
pub fn try_link() -> Option<MutexGuard<'static, Link>> {
    LINK.try_lock().ok()
}

fn connect() {
    let who = Who {
        name: std::env::var(NAME_ENV)
            .ok()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| {
                std::fs::read_to_string("/proc/self/comm")
                    .map(|s| s.trim().to_string())
                    .unwrap_or_else(|_| "governed".into())
            }),
        class: std::env::var(CLASS_ENV)
            .ok()
            .and_then(|c| c.parse::<PriorityClass>().ok()),
        gpu: std::env::var(GPU_ENV).ok().and_then(|g| g.parse().ok()),
        weight: std::env::var(WEIGHT_ENV).ok().and_then(|w| w.parse().ok()),
    };
    let path = socket_path();
    let mut link = link();
    match open(&who) {
        Ok((connection, welcome)) => {
            if let Some(asked) = who.class
                && asked != welcome.class
            {
                eprintln!("{}", downgraded(asked, welcome.class));
            }
            link.connection = Some(connection);
            link.who = Some(who);
            // SAFETY: registers a plain function as the fork child handler; it only stores
            // an atomic, which is async-signal-safe.
            unsafe { libc::pthread_atfork(None, None, Some(forked_child)) };
            STATE.store(GOVERNED, Ordering::Release);
        }
        Err(why) if fallback_direct() => {
            eprintln!(
                "gpushare: broker not running at {} ({why}); this program runs unmanaged (--fallback direct)",
                path.display()
            );
            STATE.store(UNMANAGED, Ordering::Release);
        }
        Err(why) => {
            eprintln!(
                "gpushare: broker not running at {} ({why}); CUDA has no device for this governed program (start gpushared, or run it with `gpushare run --mode governed --fallback direct` to run it outside gpushare)",
                path.display()
            );
            STATE.store(REFUSED, Ordering::Release);
        }
    }
}

/// Opens a session as `who`, asks for its weight, and says so for the diagnostics.
fn open(who: &Who) -> Result<(Connection, Welcome), String> {
    let path = socket_path();
    let intro = Introduction {
        name: &who.name,
        class: who.class,
        gpu: who.gpu,
    };
    let (mut connection, welcome) = Connection::connect(&path, &intro)?;
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
    if let Some(weight) = who.weight
        && let Err(e) = connection.call(Command::GovernedWeight { weight })
    {
        eprintln!(
            "gpushare: weight {weight} refused ({e:?}): the policy grants this program weight {}, and a program may only ask for less",
            welcome.weight
        );
    }
    Ok((connection, welcome))
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

/// How long a program waits for a broker it lost.
fn reconnect_bound() -> Duration {
    seconds(RECONNECT_ENV, DEFAULT_TIMEOUT)
}

impl Link {
    /// Sends `cmd` and waits for its answer, connecting again first if the broker was lost
    /// (and once more if the session turns out to be over).
    pub fn call(&mut self, cmd: Command) -> Asked {
        for _ in 0..2 {
            let Some(connection) = self.connection() else {
                return self.away();
            };
            match connection.call(cmd) {
                Ok((a, b)) => return Asked::Answered(a, b),
                // The broker is going away: as good as lost.
                Err(CallError::Refused(ErrorCode::ShuttingDown)) => {
                    self.lost("gpushared is shutting down")
                }
                Err(CallError::Refused(code)) => return Asked::Refused(code),
                Err(CallError::Lost(why)) => self.lost(&why),
            }
        }
        self.away()
    }

    /// Sends `cmd` without waiting for it, if connected; a loss is noted, not waited out (a
    /// free or a synchronization goes on without the broker).
    pub fn post(&mut self, cmd: Command) {
        if let Some(connection) = self.connection.as_mut()
            && let Err(CallError::Lost(why)) = connection.post(cmd)
        {
            self.lost(&why);
        }
    }

    /// What a call gets while the broker is away.
    fn away(&self) -> Asked {
        if STATE.load(Ordering::Acquire) == UNMANAGED {
            Asked::Unmanaged
        } else {
            Asked::Unavailable
        }
    }

    /// The broker went away (`why`): with `--fallback direct` the program runs unmanaged
    /// from now on; otherwise it waits for the broker to come back.
    pub fn lost(&mut self, why: &str) {
        if self.connection.take().is_none() {
            return;
        }
        crate::governor::forget_tokens();
        let path = socket_path();
        if fallback_direct() {
            STATE.store(UNMANAGED, Ordering::Release);
            eprintln!(
                "gpushare: lost the broker at {} ({why}); this program runs unmanaged from now on (--fallback direct)",
                path.display()
            );
            return;
        }
        self.lost = Some(Instant::now());
        self.gave_up = false;
        eprintln!(
            "gpushare: lost the broker at {} ({why}); waiting up to {:.1} s for it to come back (launches and allocations wait meanwhile)",
            path.display(),
            reconnect_bound().as_secs_f64()
        );
    }

    /// The connection; if the broker was lost, connects again first: waiting for it until
    /// the reconnect bound (counted from the loss) has passed, and trying once after that.
    /// `None` while there is no broker (or the program is not governed).
    fn connection(&mut self) -> Option<&mut Connection> {
        if self.connection.is_none() && STATE.load(Ordering::Acquire) == GOVERNED {
            self.reconnect();
        }
        self.connection.as_mut()
    }

    fn reconnect(&mut self) {
        let Some(who) = self.who.as_ref() else {
            return;
        };
        let lost = *self.lost.get_or_insert_with(Instant::now);
        let deadline = lost + reconnect_bound();
        let mut pause = Duration::from_millis(5);
        let why = loop {
            match open(who) {
                Ok((connection, _)) => return self.registered(connection),
                Err(why) if Instant::now() >= deadline => break why,
                Err(_) => {
                    std::thread::sleep(
                        pause.min(deadline.saturating_duration_since(Instant::now())),
                    );
                    pause = (pause * 2).min(RETRY_PAUSE);
                }
            }
        };
        if !self.gave_up {
            self.gave_up = true;
            eprintln!(
                "gpushare: the broker at {} is still away {:.1} s after it was lost ({why}); launches and allocations fail (CUDA_ERROR_SYSTEM_NOT_READY) until it is back",
                socket_path().display(),
                lost.elapsed().as_secs_f64()
            );
        }
    }

    /// A new session: registers what the program holds, and takes it.
    fn registered(&mut self, mut connection: Connection) {
        let held = crate::sizes::held();
        if held > 0
            && let Err(e) = connection.call(Command::GovernedHeld { bytes: held })
        {
            // The session works; only its count of the program's memory is short.
            eprintln!(
                "gpushare: could not register the {held} bytes this program holds with the broker ({e:?})"
            );
        }
        let away = self.lost.take().map_or(0.0, |t| t.elapsed().as_secs_f64());
        RECONNECTS.fetch_add(1, Ordering::Relaxed);
        eprintln!(
            "gpushare: connected to the broker at {} again after {away:.2} s, as client {}; registered {held} bytes of device memory this program holds",
            socket_path().display(),
            CLIENT_ID.load(Ordering::Relaxed)
        );
        self.gave_up = false;
        self.connection = Some(connection);
    }
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

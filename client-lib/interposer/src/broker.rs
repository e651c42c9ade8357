//! A governed session with `gpushared`: the connection core's session (`Role::Governed`),
//! used one request at a time.
//!
//! The interposer asks for admission (a memory reservation, a batch of launch tokens) and
//! waits for the answer, or posts a notice (a release, an idle report) whose completion
//! nobody waits for. It never copies through the arena.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use gpushare_conn::{Error, Notices, Session, SessionOptions};
use gpushare_protocol::control::{Role, Welcome};
use gpushare_protocol::{Command, ErrorCode, PriorityClass};

/// Submission entries asked for: one request and a few notices are ever in flight.
const SQ_ENTRIES: u32 = 64;
/// How long to spin for a completion before sleeping on the eventfd.
const SPIN: Duration = Duration::from_micros(20);

/// Why a request got no answer from the broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallError {
    /// The broker answered with this error.
    Refused(ErrorCode),
    /// The session is over (broker gone, shut down, eviction, broken ring); a sentence.
    Lost(String),
}

impl From<Error> for CallError {
    fn from(e: Error) -> CallError {
        match e {
            Error::Command { code, .. } => CallError::Refused(code),
            other => CallError::Lost(other.to_string()),
        }
    }
}

pub struct Connection {
    session: Session,
}

/// Who the program is, as it introduces itself.
pub struct Introduction<'a> {
    pub name: &'a str,
    pub class: Option<PriorityClass>,
    pub gpu: Option<u32>,
}

impl Connection {
    /// Connects and says hello as a governed client.
    pub fn connect(path: &Path, who: &Introduction<'_>) -> Result<(Connection, Welcome), String> {
        let opts = SessionOptions {
            socket: path.to_path_buf(),
            name: who.name.to_string(),
            role: Role::Governed,
            class: who.class,
            sq_entries: SQ_ENTRIES,
            arena_size: 0,
            gpu: who.gpu,
            spin: SPIN,
            timeout: gpushare_conn::env::broker_timeout(),
        };
        // The caller names the socket itself: only the cause, not the library's hints.
        let session = Session::open(&opts, Arc::new(Notices::new(false))).map_err(|e| match e {
            Error::Rejected(w) => format!("refused: {}", w.message),
            Error::Connect { cause, .. } => cause.to_string(),
            other => other.to_string(),
        })?;
        let welcome = session.welcome().clone();
        Ok((Connection { session }, welcome))
    }

    /// Submits `cmd` and waits for its completion: `(result, result2)`.
    pub fn call(&mut self, cmd: Command) -> Result<(u64, u64), CallError> {
        Ok(self.session.submit_wait(cmd)?)
    }

    /// Submits `cmd` without waiting; an error it meets is dropped (nothing synchronizes).
    pub fn post(&mut self, cmd: Command) -> Result<(), CallError> {
        self.session.submit(cmd, false)?;
        let _ = self.session.take_async_error();
        Ok(())
    }
}

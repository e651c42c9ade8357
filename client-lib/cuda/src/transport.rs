//! The driver's side of its session: commands that need no answer go without waiting, and
//! the arena is the connection core's ring of payloads (launch parameters, staged copies),
//! each free again once the broker has consumed its command.

use gpushare_conn::{Payload, Payloads, Session, command_name};
use gpushare_protocol::Command;

use crate::status::{Cu, from_error};

/// The session and its payload ring.
pub struct Transport {
    pub session: Session,
    payloads: Payloads,
}

impl Transport {
    pub fn new(session: Session) -> Transport {
        let capacity = session.layout().arena_size as usize;
        Transport {
            session,
            payloads: Payloads::new(capacity),
        }
    }

    /// The largest piece of a copy staged through the arena: several fit at once.
    pub fn piece(&self) -> usize {
        self.payloads.piece()
    }

    /// Sends a command without waiting; an error it meets comes with the next sync.
    pub fn post(&self, cmd: Command) -> Cu<()> {
        self.session
            .submit(cmd, false)
            .map(drop)
            .map_err(|e| from_error(&e))
    }

    /// Sends a command and waits for its answer.
    pub fn call(&self, cmd: Command) -> Cu<(u64, u64)> {
        self.session
            .call(cmd, command_name(&cmd))
            .map(|c| (c.result, c.result2))
            .map_err(|e| from_error(&e))
    }

    /// Reports (and clears) the first error of work sent without waiting.
    pub fn deferred_error(&self) -> Cu<()> {
        self.session.take_async_error().map_err(|e| from_error(&e))
    }

    /// Sends a command that carries `len` bytes of arena payload, which `fill` writes; waits
    /// for the answer when `wait`, and then lets `read` see the payload (the broker may have
    /// written it). See [`Payloads::send`].
    pub fn send_with_payload<R>(
        &self,
        len: usize,
        wait: bool,
        fill: impl FnOnce(Payload),
        make: impl Fn(u64) -> Command,
        read: impl FnOnce(Payload) -> R,
    ) -> Cu<((u64, u64), R)> {
        self.payloads
            .send(&self.session, len, wait, fill, make, read)
            .map_err(|e| from_error(&e))
    }
}

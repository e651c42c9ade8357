//! Sessions of a user that are ending: their memory is about to come back to the user's
//! quota. A charge the quota refuses meanwhile waits for them, so that a program started
//! again the moment the last one exited finds its memory free, as it would with CUDA.

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use super::UserAccount;

/// The longest a refused charge waits for the user's ending sessions: they sync the work
/// their program left queued, then free its memory.
pub const LEAVING_WAIT: Duration = Duration::from_secs(5);
/// How long a refused charge of a user with other sessions waits for one of them to start
/// ending: a program that has just exited may not have been noticed yet.
pub const NOTICE_WAIT: Duration = Duration::from_millis(100);

#[derive(Debug, Default)]
pub(super) struct Leavers {
    state: Mutex<State>,
    gone: Condvar,
}

#[derive(Debug, Default)]
struct State {
    /// Sessions ending.
    ending: u32,
    /// Charges waiting for them.
    waiting: u32,
}

impl Leavers {
    /// Waits (at most [`LEAVING_WAIT`]) until no session of the user is ending; whether any
    /// was. With `others` (the user has other sessions) it first waits up to
    /// [`NOTICE_WAIT`] for one to start ending.
    pub(super) fn wait(&self, others: bool) -> bool {
        let mut state = self.lock();
        if state.ending == 0 && !others {
            return false;
        }
        state.waiting += 1;
        let (mut state, _) = self
            .gone
            .wait_timeout_while(state, NOTICE_WAIT, |s| s.ending == 0)
            .unwrap_or_else(|p| p.into_inner());
        let any = state.ending > 0;
        if any {
            state = self
                .gone
                .wait_timeout_while(state, LEAVING_WAIT, |s| s.ending > 0)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        state.waiting -= 1;
        any
    }

    /// Charges waiting now.
    #[cfg(test)]
    pub(super) fn waiting(&self) -> u32 {
        self.lock().waiting
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One session's end, from when it starts giving back what it held until it has.
#[derive(Debug)]
pub struct Leaving(Arc<UserAccount>);

impl Leaving {
    pub(super) fn new(account: Arc<UserAccount>) -> Leaving {
        account.leavers.lock().ending += 1;
        account.leavers.gone.notify_all();
        Leaving(account)
    }
}

impl Drop for Leaving {
    fn drop(&mut self) {
        let leavers = &self.0.leavers;
        let mut state = leavers.lock();
        state.ending = state.ending.saturating_sub(1);
        leavers.gone.notify_all();
    }
}

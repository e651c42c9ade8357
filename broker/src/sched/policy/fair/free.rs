//! FAIR running free (`free_lead_ns`, side by side only): while no active account leads the
//! least served active one by more than that much virtual time, nobody needs holding, so the
//! GPU's launches skip the scheduler as FIFO's do ([`crate::gpu::scheduler::GpuScheduler`]
//! stops gating them), and the policy only keeps the accounts' virtual times from the device
//! time measured for their work, all of it (gated, a client owes at most the lag however
//! late its time comes; running free nothing would then bound its lead). Once a lead passes
//! it, launches are gated again and the policy holds whoever leads, as without it, until it
//! has held nobody for `QUIET_NS` and, with every account that lags by more than a quantum
//! raised to that (it bound nobody, or it would have been held for), no lead passes half the
//! free lead; then the raise is made and launches go free.
//! With every program asking for more than its share, as with unequal weights and programs
//! that keep the GPU busy, someone is always held and launches stay gated.
//!
//! Why: on the H200, 16 PyTorch programs of four users of equal weights held nobody with
//! shares by user and a lead of 500 ms, yet did 0.81-0.90 x FIFO's work, the gated path's own
//! cost (a grant per kernel, its marks and timings; docs/benchmarks.md, runs K1-K5). Their
//! users' device time stayed within 1 % of equal under FIFO itself. Running free by user with
//! a 1 s lead (500 ms quantum, 2 s lag) they did 0.95-1.07 x FIFO with users' shares within
//! 1.4 %; at 2 : 1 : 3 : 2 shares by weight exactly, gated as before (runs L1-L5). Leads of
//! 10-50 ms gained nothing, by program (programs of different kinds take different device time
//! under FIFO) or by user with a 5 ms quantum (which holds someone nearly always): launches go
//! free only after the policy has held nobody for a while.
//!
//! An account is active while device time was charged to it within `ACTIVE_NS`, or one of its
//! clients was seen with work on the device since (`on_busy`): work that waits behind others'
//! on the device is charged nothing until it runs, and an account starved so must still bound
//! the others' lead, or running free would leave it starved (on the sim device, whose queue
//! takes work in arrival order, one program flooding it kept another user's at 4 ms of GPU
//! time in 3 s). One that comes back (or a newcomer) is owed at most the lag, as one newly
//! backlogged is: its virtual time is raised to the least active account's minus `lag_ns`
//! over its weight when its first device time or work since comes. With `per_user`, a
//! client's account is learned then too, since a client running free never submits.

use super::Fair;
use crate::sched::{ClientId, View};

/// An account charged device time (or seen with work on the device) within this long is
/// active; the programs it runs may be between steps, but not gone.
pub(super) const ACTIVE_NS: u64 = 100_000_000;
/// Gated, launches go free again once the policy has held nobody for this long.
const QUIET_NS: u64 = 50_000_000;

impl Fair {
    /// Whether the GPU's launches may skip the scheduler now (see the module docs), remembered
    /// for `pick`.
    pub(super) fn decide_free(&mut self, now: u64) -> bool {
        if !self.cfg.may_run_free() {
            self.free = false;
            return false;
        }
        let lead = self.cfg.free_lead_ns as f64;
        let (least, most) = self.active_range(now);
        if self.free {
            if most - least > lead {
                self.free = false;
                self.gated_since = now;
            }
            return self.free;
        }
        // Gated: free again once the policy has held nobody for a while and no lead passes half
        // the free lead. Side by side holds nobody within a quantum (over its weight) of the
        // least served backlogged account, so one that lags the leader by more than a quantum
        // while nobody was held was not asking for its share beside it (its own loop holds it
        // back, or it is idle between steps): it is raised to a quantum behind, or its lag
        // would gate everyone again at once, for nothing. Only when that frees the launches:
        // raised while gated, a laggard would never let the leader be held, and the weights
        // would leak (as would raising it further).
        let quiet = now.saturating_sub(self.held_at.max(self.gated_since)) >= QUIET_NS;
        let floor = most - self.cfg.quantum_ns as f64;
        if !quiet || most - least.max(floor) > lead / 2.0 {
            return false;
        }
        let lagging: Vec<u64> = self
            .active(now)
            .filter(|&(_, v)| v < floor)
            .map(|(a, _)| a)
            .collect();
        for account in lagging {
            self.vtime.insert(account, floor);
        }
        self.free = true;
        true
    }

    /// The least and the greatest virtual time of the active accounts (equal with fewer than
    /// two).
    fn active_range(&self, now: u64) -> (f64, f64) {
        self.active(now)
            .map(|(_, v)| (v, v))
            .reduce(|(l, m), (v, _)| (l.min(v), m.max(v)))
            .unwrap_or((0.0, 0.0))
    }

    /// The active accounts, each with its virtual time.
    fn active(&self, now: u64) -> impl Iterator<Item = (u64, f64)> + '_ {
        self.active_at
            .iter()
            .filter(move |&(_, &at)| now.saturating_sub(at) <= ACTIVE_NS)
            .map(|(&a, _)| (a, self.vtime.get(&a).copied().unwrap_or(0.0)))
    }

    /// Before `client`'s device time is charged, or while it has work on the device: with
    /// `per_user` its account is learned, and an account coming back to activity is owed at
    /// most the lag (see the module docs).
    pub(super) fn note_active(&mut self, view: &View<'_>, client: ClientId, now: u64) {
        if !self.cfg.may_run_free() {
            return;
        }
        let Some(c) = view.client(client) else { return };
        if self.cfg.per_user {
            self.accounts.insert(client, c.spec().account);
        }
        let account = self.account(client);
        let back = self
            .active_at
            .get(&account)
            .is_none_or(|&at| now.saturating_sub(at) > ACTIVE_NS);
        if back {
            let least = self
                .active(now)
                .filter(|&(a, _)| a != account)
                .map(|(_, v)| v)
                .min_by(f64::total_cmp);
            if let Some(least) = least {
                let floor = least - self.cfg.lag_ns as f64 / f64::from(c.weight());
                let v = self.vtime.entry(account).or_insert(0.0);
                *v = v.max(floor);
            }
        }
        self.active_at.insert(account, now);
    }
}

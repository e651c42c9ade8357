//! FAIR's hunger: whether holding others back can give a client more of the GPU
//! (`hungry_ns`, `waited_ns`), and what a client is owed once it is hungry (`bank_unused`).
//!
//! A client that is not hungry gets what it asks for at once, and it bounds nobody of its
//! weight or less. Its virtual time still grows only by what it uses, so a program held back by
//! its own CPU loop falls behind those with work waiting on the device. When such a program
//! turns hungry (a burst of work), it is owed all of that, and it bounds the others while it is
//! hungry, however far ahead they are. On the H200, 16 PyTorch programs of equal weights held
//! the transformer trainers 12–14 % of the window whatever the quantum (docs/benchmarks.md,
//! runs H20–H22), which this would explain. Without banking (run H23) the transformers got part
//! of that back, but the other programs lost more, and with weights a fifth of the work was
//! lost: their kernels run beside the trainers' on a GPU rather than behind them. So banking
//! stays the default.
//!
//! Without `bank_unused`, a client is owed nothing for a phase of not being hungry, as weighted
//! fair queueing owes nothing to a flow that was not backlogged. When it asks for `hungry_ns` of
//! work or more (queued and in flight) after at least a quantum of asking for less, its virtual
//! time is raised to the least of the hungry clients of its weight, so it starts level with its
//! peers and holds nobody back for its past. A shorter lull, such as a trainer's last kernels
//! of a step and the round trip to its next, keeps what it is owed: levelled at every step, a
//! user of one trainer lost a sixth of its share beside one whose several programs kept it
//! hungry (`tests/hunger.rs`). With `per_user` it is the user that asks, all its programs
//! together. A new client is still owed up to the lag; one back from idleness starts level. The
//! bound that a client of a greater weight puts on lighter ones, whatever it has waiting, uses
//! its virtual time as before, until it turns hungry.

use super::Fair;
use crate::sched::{ClientView, View};

impl Fair {
    /// Whether holding others back can give `c` more of the GPU at `now`: with `hungry_ns`,
    /// only while that much estimated GPU time of its work is in flight or at its queue's head,
    /// or (`waited_ns`) its oldest kernel in flight has waited that long on the device past
    /// when it would have been done. A program held back by its own CPU loop (a step of tiny
    /// kernels, each done before the next comes) gains nothing from the others' waiting; a
    /// program with work waiting on the device does.
    pub(super) fn hungry(&self, c: &ClientView<'_>, now: u64) -> bool {
        let h = self.cfg.hungry_ns;
        h == 0
            || c.inflight_est_ns() + c.head().map_or(0, |h| h.profile.est_ns) >= h
            || self.waited(c.overdue_ns(now))
            || (self.cfg.waited_ns > 0 && self.waited_last.contains_key(&c.id()))
    }

    /// Whether work `overdue_ns` past when it would have been done waited long enough on the
    /// device behind others' to make its client hungry (`waited_ns`).
    pub(super) fn waited(&self, overdue_ns: u64) -> bool {
        self.cfg.waited_ns > 0 && overdue_ns >= self.cfg.waited_ns
    }

    /// Without `bank_unused`: raises each account (a client, or with `per_user` a user) that
    /// asks for `hungry_ns` of work or more (queued and in flight, all its clients together)
    /// after at least a quantum of asking for less (work in flight, or gone idle so) to the
    /// least virtual time of the other accounts' hungry clients of its weight; notes since when
    /// each account asks for less.
    pub(super) fn level_the_fed(&mut self, view: &View<'_>, now: u64) {
        let mut peers = std::mem::take(&mut self.hungry_peers);
        let mut demands = std::mem::take(&mut self.demands);
        peers.clear();
        demands.clear();
        for c in view.clients().filter(|c| c.backlogged()) {
            let account = self.account(c.id());
            if self.hungry(&c, now) {
                peers.push((c.weight(), account, self.vt(c.id())));
            }
            // All it asks for, not its head alone: a client held with a step's kernels queued
            // is not fed.
            let asks = c.inflight_est_ns() + c.queued_est_ns();
            match demands.iter_mut().find(|d| d.0 == account) {
                Some(d) => d.2 += asks,
                None => demands.push((account, c.weight(), asks)),
            }
        }
        for &(account, weight, asks) in &demands {
            if asks < self.cfg.hungry_ns {
                self.fed.entry(account).or_insert(now);
                continue;
            }
            // A lull shorter than a quantum (a trainer's last kernels of a step and the round
            // trip to its next) is no phase of not being hungry.
            let turned = self
                .fed
                .remove(&account)
                .is_some_and(|since| now.saturating_sub(since) >= self.cfg.quantum_ns);
            if !turned {
                continue;
            }
            let least = peers
                .iter()
                .filter(|&&(w, a, _)| w == weight && a != account)
                .map(|&(_, _, vt)| vt)
                .min_by(f64::total_cmp);
            if let Some(least) = least {
                let v = self.vtime.entry(account).or_insert(0.0);
                *v = v.max(least);
            }
        }
        self.hungry_peers = peers;
        self.demands = demands;
    }
}

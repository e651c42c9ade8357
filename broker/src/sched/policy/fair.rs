//! FAIR (Salus): weighted fair share of measured GPU time.
//!
//! Each client carries a virtual time: GPU time charged divided by its weight (the estimate
//! at grant, corrected to the measured time at completion). The next grant goes to the
//! candidate with the least virtual time, so over any backlogged interval GPU time divides
//! in proportion to the weights. A client that becomes backlogged (new, or back from idle)
//! has its virtual time raised to at least the least backlogged one's minus `lag_ns ÷ weight`:
//! it is owed at most `lag_ns` of GPU time and cannot monopolise the device to "catch up".
//! Measured times of overlapping kernels would double-count the GPU, so by default one
//! request is in flight at a time (`max_concurrent`).
//!
//! With a `quantum_ns`, the client whose turn it is (the least virtual time when the GPU
//! drained) may queue more kernels behind its first, up to `max_run` in flight, while its
//! virtual time stays within a quantum of the next backlogged client's; nobody else is granted
//! until its kernels drain. Kernels queued on one stream run one after another, so their
//! measured times still do not overlap, and the GPU no longer idles for a round trip between
//! every two kernels of a program made of many short ones (a PyTorch training step). Shares
//! then hold to within about a quantum of GPU time. In turns a client's own kernels no longer
//! wait in gpushared's queue, so a client whose data thread is briefly off the CPU looks idle
//! between two of them; one back within `IDLE_GRACE_NS` keeps what it is owed instead of being
//! held to the lag bound like a client back from real idleness.
//!
//! A program that waits for each step (a CUDA graph, then its loss read) has nothing queued
//! while it thinks, so whoever does would get every other turn and the weights would not
//! show. A client owed GPU time (less virtual time than the one to be granted) whose last work
//! completed less than `anticipate_ns` ago is waited for that long instead: the GPU idles for
//! at most its think time per step, and only while it is owed.
//!
//! With `side_by_side`, the quantum bounds a client's lead without making turns exclusive:
//! every client whose virtual time is within a quantum (over its weight) of the least served
//! backlogged client's may have kernels in flight, whoever else does, and one further ahead
//! waits until the others catch up. Programs that each leave most of the GPU idle run at once,
//! as under FIFO; while all are backlogged, the ones ahead of their share are held, so GPU
//! time still follows the weights. Each client is charged the device time measured for its
//! work (all of its streams', what `gpushare status` shows): a kernel's estimate at grant,
//! replaced by the measured time once that comes ([`Policy::on_device_time`]), since a kernel
//! that shares the GPU takes longer than its solo time, and unevenly so. Measured time can come
//! long after its work (work queued while the client was alone on the GPU, ungated), so a
//! client never owes more than `lag_ns` to the least served other backlogged client. A client
//! with nothing in flight whose kernel fits in the SMs that the kernels in flight leave goes
//! whatever its lead: with kernels that never fill the GPU, device time then follows the work
//! each client has, not the weights (work-conserving: holding it back would leave SMs idle
//! and give nobody anything). A client whose work completed within `anticipate_ns` still
//! counts as backlogged, so a round trip between its steps does not let others run ahead. A
//! client keeps at most a quantum of estimated time (or two kernels) granted ahead on the GPU:
//! granted kernels cannot be taken back, and a stream's full depth of them would run on for
//! tens of milliseconds after a newcomer joined or a weight changed.
//!
//! With `hungry_ns`, a client bounds the lead of those of its weight or more only while
//! holding them can help it: while at least that much estimated GPU time of its work is in
//! flight or at its queue's head (or, waited for after its work completed, if its last request
//! was that long). A program whose step is a CPU loop of tiny kernels, each done before the
//! next is launched, is owed GPU time it cannot use: holding the others to its pace leaves the
//! GPU to nobody. It still gets what it asks for at once, and the rest divides among those with
//! work waiting on the device. The lead of lighter clients it bounds whatever it has waiting:
//! unequal weights ask for the GPU to be divided so, even at a cost in work done. The cost: a
//! program that waits for each small step, its kernels queued on the device behind the others'
//! work, is short of the GPU too, yet never hungry by its estimates, so nobody is held for it.
//! With `waited_ns` too, a client whose oldest kernel in flight is that long past when it would
//! have been done (its estimate, after its own kernels granted before it) is hungry as well:
//! its work waits on the device behind the others'. So is one whose latest kernel seen done
//! had waited that long, until one of its kernels is done without such a wait: a program that
//! waits for each small step is held for while the others' work would queue ahead of it.
//! Without `bank_unused`, a client that turns hungry is owed nothing for the time it was not
//! (`hunger.rs`).
//!
//! With `per_user`, shares belong to users rather than programs: every client of one Unix
//! user (its `account`) draws on one virtual time, charged each client's work over its own
//! weight (give a user's programs one weight, as the policy file does), so a user running four
//! programs gets the same share as one running one, and among themselves they go as they come.
//!
//! With `share_sms` (experimental), several clients' kernels run at once while their SMs fit
//! the GPU, and each is charged its share of the SMs for its time (SM·time) instead of the
//! whole GPU: the least charged client's kernel goes next if it fits beside what is in flight
//! (a client's kernels in flight run one after another on its stream, so it holds the widest
//! of them), else another's that fits while it is within `lag_ns` of SM·time of the least
//! charged, else the GPU drains for the least charged. Exclusive turns cannot run programs'
//! small kernels side by side, which FIFO does (docs/benchmarks.md, the scheduler's model).

use crate::sched::id_hash::IdMap;

pub use self::config::FairConfig;
use super::{Pick, Policy};
use crate::sched::{ClientId, Inflight, View};

/// With turns: a client idle for less than this is not "newly backlogged" (see the docs).
const IDLE_GRACE_NS: u64 = 50_000_000;

#[derive(Debug, Clone)]
pub struct Fair {
    cfg: FairConfig,
    /// Virtual times by account: the client's own id, or with `per_user` its user's.
    vtime: IdMap<u64, f64>,
    /// With `per_user`: each client's account, as it said when it first submitted.
    accounts: IdMap<ClientId, u64>,
    /// With turns: when each idle client's last request completed.
    idle_since: IdMap<ClientId, u64>,
    /// When each client with nothing queued or in flight had its last request complete, and
    /// whether that request alone made it hungry (`hungry_ns`).
    done_at: IdMap<ClientId, (u64, bool)>,
    /// When a wait for an owed client ends.
    wake: Option<u64>,
    /// With `waited_ns`: the clients whose latest kernel seen done had waited on the device
    /// that long (hungry until one of theirs is seen done without such a wait).
    waited_last: IdMap<ClientId, ()>,
    /// Without `bank_unused`: the accounts last seen asking for less than `hungry_ns`, and
    /// since when (`hunger.rs`).
    fed: IdMap<u64, u64>,
    /// Without `bank_unused`, each pick's scratch: the hungry clients' weights, accounts and
    /// virtual times, and each account's weight and work asked for.
    hungry_peers: Vec<(u32, u64, f64)>,
    demands: Vec<(u64, u32, u64)>,
    /// Side by side: estimates of completed kernels still charged, until the measured
    /// device time that covers them replaces them.
    unmeasured: IdMap<ClientId, f64>,
    /// Side by side, each pick's scratch: the least virtual time of the backlogged clients that
    /// are not hungry, by weight (kept to spare an allocation under the scheduler's lock).
    idle_by_weight: Vec<(u32, f64)>,
    /// With `free_lead_ns`: when each account was last charged device time or seen with work
    /// on the device, and whether launches skip the scheduler now (`free.rs`).
    active_at: IdMap<u64, u64>,
    free: bool,
    /// Side by side: when a pick last held a client with work waiting, and since when
    /// launches are gated again after running free (`free.rs`).
    held_at: u64,
    gated_since: u64,
}

/// Who bounds the lead of the clients a pick weighs: the least virtual time of a hungry
/// backlogged client, and of the others by weight. A hungry client bounds everyone; one that
/// is not, only the clients of a lesser weight. Unequal weights ask for the GPU to be divided
/// so, even at a cost in work done; between equals, holding a program for one that its own
/// CPU loop holds back gives nobody anything (docs/benchmarks.md, runs H8-H13).
struct Bounds<'a> {
    hungry: f64,
    idle_by_weight: &'a [(u32, f64)],
}

impl Bounds<'_> {
    /// The least virtual time that bounds the lead of a client of weight `weight`.
    fn of(&self, weight: u32) -> f64 {
        self.idle_by_weight
            .iter()
            .filter(|&&(w, _)| w > weight)
            .fold(self.hungry, |least, &(_, vt)| least.min(vt))
    }
}

impl Fair {
    pub fn new(cfg: FairConfig) -> Fair {
        Fair {
            cfg,
            vtime: IdMap::default(),
            accounts: IdMap::default(),
            idle_since: IdMap::default(),
            done_at: IdMap::default(),
            waited_last: IdMap::default(),
            fed: IdMap::default(),
            hungry_peers: Vec::new(),
            demands: Vec::new(),
            wake: None,
            unmeasured: IdMap::default(),
            idle_by_weight: Vec::new(),
            active_at: IdMap::default(),
            free: false,
            held_at: 0,
            gated_since: 0,
        }
    }

    /// Until when to wait for an owed client rather than grant `next` now: one with less
    /// virtual time than `next`'s, nothing queued, and its last work done within
    /// `anticipate_ns` of `now`.
    fn owed_back_soon(&self, view: &View<'_>, next: ClientId, now: u64) -> Option<u64> {
        let v = self.vt(next);
        self.returning(now)
            .filter(|&(id, _, _)| id != next && self.vt(id) < v)
            .filter(|&(id, _, _)| {
                view.client(id)
                    .is_some_and(|c| !c.backlogged() && c.inflight().is_empty())
            })
            .map(|(_, until, _)| until)
            .min()
    }

    /// Clients whose last work completed within `anticipate_ns` of `now`, each with when
    /// that wait for it ends and whether its last request made it hungry.
    fn returning(&self, now: u64) -> impl Iterator<Item = (ClientId, u64, bool)> + '_ {
        self.done_at
            .iter()
            .map(|(&id, &(at, hungry))| (id, at.saturating_add(self.cfg.anticipate_ns), hungry))
            .filter(move |&(_, until, _)| until > now)
    }

    /// Who goes first: the least virtual time, then the oldest head.
    fn owed_first(
        &self,
        a: &crate::sched::ClientView<'_>,
        b: &crate::sched::ClientView<'_>,
    ) -> std::cmp::Ordering {
        self.vt(a.id())
            .total_cmp(&self.vt(b.id()))
            .then(a.head().map(|h| h.id).cmp(&b.head().map(|h| h.id)))
    }

    /// A client's virtual time: GPU time charged over its weight (its user's, with `per_user`).
    pub(super) fn vt(&self, id: ClientId) -> f64 {
        self.vtime.get(&self.account(id)).copied().unwrap_or(0.0)
    }

    /// Whose virtual time `id`'s work is charged to.
    fn account(&self, id: ClientId) -> u64 {
        match self.cfg.per_user {
            true => self.accounts.get(&id).copied().unwrap_or(id),
            false => id,
        }
    }

    /// Adds `delta` to the virtual time `id`'s work is charged to.
    fn charge(&mut self, id: ClientId, delta: f64) {
        *self.vtime.entry(self.account(id)).or_insert(0.0) += delta;
    }

    /// Whether `a` and `b` draw on different shares.
    fn apart(&self, a: ClientId, b: ClientId) -> bool {
        self.account(a) != self.account(b)
    }

    /// The part of the GPU a request is charged for: its share of the SMs when they are
    /// shared, else all of it.
    fn sm_share(&self, view: &View<'_>, request: &Inflight) -> f64 {
        if !self.cfg.share_sms {
            return 1.0;
        }
        let sms = f64::from(view.device().sms.max(1));
        (f64::from(request.profile.sm_need.max(1)) / sms).min(1.0)
    }

    /// With `share_sms`: the least charged candidate if its kernel fits beside what is in
    /// flight; else another's that fits while within `lag_ns` of it; else nothing (the GPU
    /// drains for it, so a wide kernel is never starved).
    fn pick_sharing_sms(&self, view: &View<'_>) -> Pick {
        let sms = SmsInFlight::of(view);
        let fits = |c: &crate::sched::ClientView<'_>| {
            sms.used == 0
                || sms.used + c.head().map_or(sms.total, |h| sms.width(h.profile.sm_need))
                    <= sms.total
        };
        let mut order: Vec<_> = view.candidates().collect();
        order.sort_by(|a, b| self.owed_first(a, b));
        let Some(first) = order.first() else {
            return Pick::Hold;
        };
        if fits(first) {
            return Pick::Grant(first.id());
        }
        let bound = self.vt(first.id()) + self.cfg.lag_ns as f64 / f64::from(first.weight());
        match order.iter().skip(1).find(|c| fits(c)) {
            Some(c) if self.vt(c.id()) <= bound => Pick::Grant(c.id()),
            _ => Pick::Hold,
        }
    }

    /// Side by side: the least served candidate among those within a quantum of the least
    /// served backlogged client (which is always within it). A client whose work completed
    /// within `anticipate_ns` counts as backlogged, so that the round trip between two of its
    /// steps does not let the others run ahead.
    fn pick_side_by_side(&mut self, view: &View<'_>, now: u64) -> Pick {
        if !self.cfg.bank_unused {
            self.level_the_fed(view, now);
        }
        // Who bounds the others' lead (`Bounds`); with nobody, nobody is held.
        let mut idle_by_weight = std::mem::take(&mut self.idle_by_weight);
        idle_by_weight.clear();
        let mut hungry_least = f64::INFINITY;
        let mut note = |weight: u32, hungry: bool, vt: f64| {
            if hungry {
                hungry_least = hungry_least.min(vt);
            } else if let Some(e) = idle_by_weight.iter_mut().find(|e| e.0 == weight) {
                e.1 = e.1.min(vt);
            } else {
                idle_by_weight.push((weight, vt));
            }
        };
        for c in view.clients().filter(|c| c.backlogged()) {
            note(c.weight(), self.hungry(&c, now), self.vt(c.id()));
        }
        for (id, _, hungry) in self.returning(now) {
            note(
                view.client(id).map_or(1, |c| c.weight()),
                hungry,
                self.vt(id),
            );
        }
        let bounds = Bounds {
            hungry: hungry_least,
            idle_by_weight: &idle_by_weight,
        };
        let quantum = self.cfg.quantum_ns as f64;
        let sms = SmsInFlight::of(view);
        // A client with nothing in flight whose kernel fits in the SMs left idle takes nothing
        // from anyone: it goes whatever its lead (and is charged for it).
        let idle_fits = |c: &crate::sched::ClientView<'_>| {
            c.inflight().is_empty()
                && c.head()
                    .is_some_and(|h| sms.used + sms.width(h.profile.sm_need) <= sms.total)
        };
        // Kernels granted cannot be taken back: a client keeps at most a quantum of estimated
        // time queued on the GPU (and two kernels whatever their length, so that its stream
        // does not drain between them), or a newcomer, a weight change or a client falling
        // behind would wait for a whole stream's depth of others' work.
        let shallow = |c: &crate::sched::ClientView<'_>| {
            c.inflight().len() < 2 || c.inflight_est_ns() < self.cfg.quantum_ns
        };
        let pick = view
            .candidates()
            .filter(|c| {
                let least = bounds.of(c.weight());
                (self.vt(c.id()) <= least + quantum / f64::from(c.weight()) || idle_fits(c))
                    && shallow(c)
            })
            .min_by(|a, b| self.owed_first(a, b))
            .map_or(Pick::Hold, |c| Pick::Grant(c.id()));
        self.idle_by_weight = idle_by_weight;
        if pick == Pick::Hold {
            self.wake = self.returning(now).map(|(_, until, _)| until).min();
            if view.candidates().next().is_some() {
                self.held_at = now;
            }
        }
        pick
    }

    /// While a client's kernels are in flight: another of its kernels, if its turn lasts.
    fn continue_turn(&self, view: &View<'_>) -> Pick {
        let mut running = view.clients().filter(|c| !c.inflight().is_empty());
        let (Some(owner), None) = (running.next(), running.next()) else {
            return Pick::Hold; // several in flight (a policy switch): let them drain
        };
        if !owner.eligible() || owner.inflight().len() >= self.cfg.max_run.max(1) as usize {
            return Pick::Hold;
        }
        let next = view
            .clients()
            .filter(|c| c.id() != owner.id() && c.backlogged())
            .map(|c| self.vt(c.id()))
            .min_by(f64::total_cmp);
        let ahead = self.cfg.quantum_ns as f64 / f64::from(owner.weight());
        match next {
            Some(v) if self.vt(owner.id()) > v + ahead => Pick::Hold,
            _ => Pick::Grant(owner.id()),
        }
    }
}

/// The GPU's SMs, and those the kernels in flight hold (a client's kernels in flight run one
/// after another on its stream, so it holds the widest of them).
struct SmsInFlight {
    total: u64,
    used: u64,
}

impl SmsInFlight {
    fn of(view: &View<'_>) -> SmsInFlight {
        let total = u64::from(view.device().sms.max(1));
        let mut sms = SmsInFlight { total, used: 0 };
        sms.used = view
            .clients()
            .filter(|c| !c.inflight().is_empty())
            .map(|c| sms.width(c.inflight_widest()))
            .sum();
        sms
    }

    /// The SMs a kernel that wants `sm_need` holds.
    fn width(&self, sm_need: u32) -> u64 {
        u64::from(sm_need.max(1)).min(self.total)
    }
}

impl Policy for Fair {
    fn name(&self) -> &'static str {
        "fair"
    }

    fn pick(&mut self, view: &View<'_>, now: u64) -> Pick {
        self.wake = None;
        if self.free {
            // Running free: what was queued before is granted as it came (`free.rs`).
            return super::earliest(view.candidates()).map_or(Pick::Hold, |c| Pick::Grant(c.id()));
        }
        if self.cfg.share_sms {
            return self.pick_sharing_sms(view);
        }
        if self.cfg.side_by_side {
            return self.pick_side_by_side(view, now);
        }
        if self.cfg.quantum_ns > 0 && view.inflight_total() > 0 {
            return self.continue_turn(view);
        }
        if view.inflight_total() >= self.cfg.max_concurrent.max(1) as usize {
            return Pick::Hold;
        }
        let Some(next) = view.candidates().min_by(|a, b| self.owed_first(a, b)) else {
            return Pick::Hold;
        };
        if self.cfg.anticipate_ns > 0
            && let Some(until) = self.owed_back_soon(view, next.id(), now)
        {
            self.wake = Some(until);
            return Pick::Hold;
        }
        Pick::Grant(next.id())
    }

    fn next_wakeup(&self) -> Option<u64> {
        self.wake
    }

    fn free_running(&mut self, _view: &View<'_>, now: u64) -> bool {
        self.decide_free(now)
    }

    fn on_busy(&mut self, view: &View<'_>, client: ClientId, now: u64) {
        self.note_active(view, client, now);
    }

    fn on_submit(&mut self, view: &View<'_>, client: ClientId, now: u64) {
        self.done_at.remove(&client);
        let Some(c) = view.client(client) else { return };
        if self.cfg.per_user {
            self.accounts.insert(client, c.spec().account);
        }
        if c.queued() != 1 || !c.inflight().is_empty() {
            return; // was backlogged already
        }
        let sibling_busy = self.cfg.per_user
            && view.clients().any(|o| {
                o.id() != client
                    && !self.apart(o.id(), client)
                    && (o.backlogged() || !o.inflight().is_empty())
            });
        if sibling_busy {
            return; // its account was backlogged already
        }
        if let Some(since) = self.idle_since.remove(&client)
            && now.saturating_sub(since) < IDLE_GRACE_NS
        {
            return; // a hiccup between two kernels of a turn, not idleness
        }
        let vmin = view
            .clients()
            .filter(|o| self.apart(o.id(), client) && o.backlogged())
            .map(|o| self.vt(o.id()))
            .min_by(f64::total_cmp);
        let floor = vmin.map(|v| v - self.cfg.lag_ns as f64 / f64::from(c.weight()));
        let v = self.vtime.entry(self.account(client)).or_insert(0.0);
        if let Some(floor) = floor {
            *v = v.max(floor);
        }
    }

    fn on_grant(&mut self, view: &View<'_>, client: ClientId, request: &Inflight, _now: u64) {
        let w = view.client(client).map_or(1, |c| c.weight());
        let share = self.sm_share(view, request);
        self.charge(client, request.profile.est_ns as f64 * share / f64::from(w));
    }

    fn on_complete(
        &mut self,
        view: &View<'_>,
        client: ClientId,
        request: &Inflight,
        gpu_ns: u64,
        now: u64,
    ) {
        let c = view.client(client);
        let w = c.map_or(1, |c| c.weight());
        if self.cfg.side_by_side {
            // Charged its estimate until the device time that covers it is measured (a
            // kernel's own time, when it shared the GPU, is not its share of it).
            *self.unmeasured.entry(client).or_insert(0.0) +=
                request.profile.est_ns as f64 * self.sm_share(view, request);
        } else {
            let correction =
                (gpu_ns as f64 - request.profile.est_ns as f64) * self.sm_share(view, request);
            self.charge(client, correction / f64::from(w));
        }
        if (self.cfg.quantum_ns > 0 || self.cfg.side_by_side) && c.is_some_and(|c| !c.backlogged())
        {
            self.idle_since.insert(client, now);
        }
        let waited = self.waited(now.saturating_sub(request.due_at));
        if waited {
            self.waited_last.insert(client, ());
        } else if self.cfg.waited_ns > 0 {
            self.waited_last.remove(&client);
        }
        if c.is_some_and(|c| !c.backlogged() && c.inflight().is_empty()) {
            let hungry = request.profile.est_ns >= self.cfg.hungry_ns || waited;
            self.done_at.insert(client, (now, hungry));
            if !self.cfg.bank_unused {
                // Gone idle, it asks for nothing (its account may still, `level_the_fed`).
                self.fed.entry(self.account(client)).or_insert(now);
            }
        }
    }

    fn charges_device_time(&self) -> bool {
        self.cfg.side_by_side
    }

    fn on_device_time(&mut self, view: &View<'_>, client: ClientId, ns: u64, now: u64) {
        if !self.cfg.side_by_side {
            return;
        }
        self.note_active(view, client, now);
        let weight = view.client(client).map_or(1, |c| c.weight());
        let w = f64::from(weight);
        let estimated = self.unmeasured.remove(&client).unwrap_or(0.0);
        let was = self.vt(client);
        let v = was + (ns as f64 - estimated) / w;
        // Device time can come long after its work (work queued while the client was alone
        // on the GPU, not gated): as a newcomer is owed at most `lag_ns`, a client owes at
        // most that to the least served other backlogged one, however late its time comes.
        // (Owed only by those that bound its lead when picking, `Bounds`.) Running free, its
        // time is what the leads are read from, so all of it is charged (`free.rs`).
        if self.cfg.may_run_free() {
            self.vtime.insert(self.account(client), v);
            return;
        }
        let bound = view
            .clients()
            .filter(|o| {
                self.apart(o.id(), client)
                    && o.backlogged()
                    && (self.hungry(o, now) || o.weight() > weight)
            })
            .map(|o| self.vt(o.id()))
            .min_by(f64::total_cmp)
            .map(|least| least + self.cfg.lag_ns as f64 / w);
        let v = bound.map_or(v, |b| v.min(b.max(was)));
        self.vtime.insert(self.account(client), v);
    }

    fn on_remove(&mut self, client: ClientId) {
        self.unmeasured.remove(&client);
        let account = self.account(client);
        self.accounts.remove(&client);
        if !self.accounts.values().any(|&a| a == account) {
            self.vtime.remove(&account);
            self.fed.remove(&account);
            self.active_at.remove(&account);
        }
        self.idle_since.remove(&client);
        self.done_at.remove(&client);
        self.waited_last.remove(&client);
    }
}

mod config;
mod free;
mod hunger;
#[cfg(test)]
mod tests;

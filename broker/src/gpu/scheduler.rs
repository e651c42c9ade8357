//! One GPU's dispatcher as the sessions meet it: [`sched::Dispatcher`] behind a lock, and the
//! sessions' data threads waiting for their kernels' turn.
//!
//! Each client's submission ring is its software queue. Before a kernel launch the client's
//! data thread hands the kernel's profile to [`GpuScheduler::acquire`], which queues it with
//! the dispatcher and waits until the policy grants it. The decision takes the lock for
//! microseconds and never across a GPU call: the launch happens after the lock is released.
//! The thread then has the stream mark the kernel done in gpushared's progress page, and once
//! the mark has landed reports the request done, with its next launch (in the same lock) or
//! through [`GpuScheduler::complete`], which may grant others. A thread the policy holds parks
//! until its own grant (or its next look at its finished work).
//!
//! Under FIFO nothing is gated: launches go straight to the stream, at no cost. Nor are
//! high-priority kernels under the priority policy when the lower classes run on a hardware
//! SM partition (`lower_sm_share`, on a GPU with green contexts): the partition already keeps
//! them off the rest of the SMs, and scheduling each high-priority kernel would only add its
//! cost to every request (docs/benchmarks.md has the figure).

use crate::sched::id_hash::IdMap;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use gpushare_protocol::PriorityClass;

use self::gate::GateState;
pub use self::gate::GateSwitch;
pub use self::profiles::Profiles;
use super::health::Member;

use crate::sched::{
    ClientId, ClientSchedStats, ClientSpec, DeadlineSpec, DeviceShape, Dispatcher, Grant,
    JobProfile, KernelProfile, PolicyKind, PriorityConfig, RequestId, SchedConfig, SchedError,
    Tunables,
};

/// How long a waiting data thread with work of its own on the GPU sleeps before looking at
/// its finished work again (its completions may be what holds its next kernel back).
const WAIT_SLICE: Duration = Duration::from_micros(25);
/// How long a waiting data thread with nothing on the GPU sleeps unless a grant wakes it: only
/// the policy's timers (a grace period, a rate's next tokens) need it to look sooner. With
/// many clients waiting, polling every 25 µs would make the lock busy for the one running.
const IDLE_WAIT_SLICE: Duration = Duration::from_micros(500);
/// Granted kernels one client may have on the GPU at once.
const MAX_INFLIGHT_PER_CLIENT: u32 = 64;

/// What [`GpuScheduler::acquire`] asks of the waiting session.
pub enum Waiting<'a> {
    /// You are held: say which of your granted kernels have finished, however it is
    /// learned (into the list, which the scheduler then reports).
    Held(&'a mut Vec<Finished>),
    /// You are about to wait for others: stop charging yourself device time meanwhile.
    Begins,
}

/// A granted kernel, as its data thread takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Turn {
    pub request: RequestId,
    /// Run it on a partition of this many SMs, if set.
    pub sm_limit: Option<u32>,
    /// It waits at the device's priority gate before it starts.
    pub gated: bool,
    /// How long the launch waited with none of the client's kernels on the GPU: the time the
    /// policy kept it off the device (waiting behind its own kernels is not counted).
    pub held_ns: u64,
    /// About one in how many of the client's kernels like it to time (`ProfileTable::time_every`).
    pub time_every: u32,
}

struct State {
    dispatcher: Dispatcher,
    /// Requests granted whose data thread has not taken the grant yet, with their partition
    /// and whether they wait at the priority gate.
    granted: IdMap<RequestId, (Option<u32>, bool)>,
    /// The threads waiting for their requests' grants: a grant wakes only its own thread
    /// (waking every waiter, each to take the lock again, was what held clients queued for).
    waiters: IdMap<RequestId, std::thread::Thread>,
    grants: Vec<Grant>,
    /// Governed clients (their programs' own CUDA contexts, which no SM partition holds).
    governed: std::collections::HashSet<ClientId>,
    /// The scheduler's tag of each trust domain's GPU context (the default domain's is 0).
    contexts: HashMap<String, u64>,
    /// Each session's stamps of its work on the device ([`GpuScheduler::watch`]).
    watches: IdMap<ClientId, Arc<dyn Member>>,
    /// When the policy was last told which sessions have work on the device.
    busy_told_at: u64,
    /// When launches last went free, and how long they ran free before (`status`).
    free_since: u64,
    free_ns: u64,
    /// The device's priority gate, once the device has one ([`GpuScheduler::set_gate`]).
    gate: Option<GateState>,
}

/// While launches may run free, the policy hears this often which sessions have work on the
/// device (FAIR's `free_lead_ns`: work that waits behind others' is charged nothing yet).
const BUSY_TELL_NS: u64 = 10_000_000;

pub struct GpuScheduler {
    state: Mutex<State>,
    /// Wakes the gate's keeper, asleep until the gate closes ([`GpuScheduler::keep_gate`]).
    gate_closed: Condvar,
    /// The word of the gate it steers ([`GpuScheduler::steers`]).
    gate_word: OnceLock<crate::device::GateWord>,
    /// False under FIFO: launches are not gated at all.
    gated: AtomicBool,
    /// The policy charges measured device time: sessions report it.
    device_time: AtomicBool,
    /// The policy needs nobody held for now: launches are not gated (FAIR's `free_lead_ns`),
    /// until the device time that sessions report shows a lead again.
    free: AtomicBool,
    /// High-priority kernels are not gated (the lower classes are on a hardware partition).
    high_free: AtomicBool,
    /// Governed clients registered: while there is one, high-priority kernels are gated
    /// whatever the partition (it does not hold a governed program).
    governed: AtomicUsize,
    /// The device can partition SMs.
    sm_partitions: bool,
    /// Clients registered: a client alone on the GPU is not gated either (there is nobody
    /// to order it against).
    clients: AtomicUsize,
    /// How soon a data thread gone idle with granted kernels looks again whether they
    /// finished, when sooner than usual ([`GpuScheduler::granted_recheck`]; 0: as usual).
    granted_recheck_ns: AtomicU64,
    origin: Instant,
}

/// How soon an idle data thread looks again whether its granted kernels finished, when the
/// policy needs it sooner than usual (0: as usual): the scheduler counts them in flight until
/// it hears. Under FAIR's `waited_us`, soon enough that a kernel done while its client thinks
/// is not taken for one that waited on the device.
fn granted_recheck_ns(tunables: Tunables) -> u64 {
    match tunables.fair.waited_ns {
        0 => 0,
        w => (w / 4).max(100_000),
    }
}

impl GpuScheduler {
    /// A dispatcher for a GPU of this shape. Kernel profiles start from a neutral prior and
    /// learn what the GPU measures.
    pub fn new(kind: PolicyKind, tunables: Tunables, device: DeviceShape) -> GpuScheduler {
        let dispatcher = Dispatcher::with_config(
            kind,
            device,
            SchedConfig {
                // A client's asynchronous launches queue on its stream as they would
                // without a scheduler; the policies' own limits still apply.
                max_inflight_per_client: MAX_INFLIGHT_PER_CLIENT,
                priority: tunables.priority,
                fair: tunables.fair,
                ..SchedConfig::default()
            },
        );
        GpuScheduler {
            gate_closed: Condvar::new(),
            gate_word: OnceLock::new(),
            device_time: AtomicBool::new(dispatcher.charges_device_time()),
            free: AtomicBool::new(false),
            state: Mutex::new(State {
                dispatcher,
                granted: IdMap::default(),
                waiters: IdMap::default(),
                grants: Vec::new(),
                governed: std::collections::HashSet::new(),
                contexts: HashMap::new(),
                watches: IdMap::default(),
                busy_told_at: 0,
                free_since: 0,
                free_ns: 0,
                gate: None,
            }),
            gated: AtomicBool::new(kind != PolicyKind::Fifo),
            high_free: AtomicBool::new(high_free(kind, tunables.priority, device.sm_partitions)),
            sm_partitions: device.sm_partitions,
            governed: AtomicUsize::new(0),
            clients: AtomicUsize::new(0),
            granted_recheck_ns: AtomicU64::new(granted_recheck_ns(tunables)),
            origin: Instant::now(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn now(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64
    }

    /// Whether launches wait for the policy: anything but FIFO, with another client on the
    /// GPU, unless the policy needs nobody held now. (A lone client's kernels go straight to
    /// its stream; once a second client comes, its new kernels are scheduled.)
    pub fn gated(&self) -> bool {
        self.gated.load(Ordering::Relaxed)
            && self.clients.load(Ordering::Relaxed) > 1
            && !self.free.load(Ordering::Relaxed)
    }

    /// How soon a data thread gone idle with granted kernels not yet seen finished looks at
    /// them again, when the policy needs it sooner than the session's usual look.
    pub fn granted_recheck(&self) -> Option<Duration> {
        match self.granted_recheck_ns.load(Ordering::Relaxed) {
            0 => None,
            ns => Some(Duration::from_nanos(ns)),
        }
    }

    /// Whether a kernel of a client of this class waits for the policy (see [`gated`]).
    ///
    /// [`gated`]: GpuScheduler::gated
    pub fn schedules(&self, class: PriorityClass) -> bool {
        self.gated()
            && !(class == PriorityClass::High
                && self.high_free.load(Ordering::Relaxed)
                && self.governed.load(Ordering::Relaxed) == 0)
    }

    pub fn policy_name(&self) -> &'static str {
        self.lock().dispatcher.policy_name()
    }

    /// Switches the policy at run time; queued work stays queued.
    pub fn set_policy(&self, kind: PolicyKind, tunables: Tunables) {
        let mut st = self.lock();
        if st.dispatcher.policy_kind() == kind && st.dispatcher.tunables() == tunables {
            return;
        }
        st.dispatcher.set_tunables(tunables);
        st.dispatcher.set_policy(kind);
        self.gated
            .store(kind != PolicyKind::Fifo, Ordering::Relaxed);
        self.device_time
            .store(st.dispatcher.charges_device_time(), Ordering::Relaxed);
        self.set_free(&mut st, false);
        self.high_free.store(
            high_free(kind, tunables.priority, self.sm_partitions),
            Ordering::Relaxed,
        );
        self.granted_recheck_ns
            .store(granted_recheck_ns(tunables), Ordering::Relaxed);
        self.pump(&mut st);
        tracing::info!(policy = kind.as_str(), "scheduling policy switched");
    }

    /// Registers a client; `governed`: a program in its own CUDA context (the interposer),
    /// else its kernels run in the context of its trust domain.
    pub fn add_client(
        &self,
        id: ClientId,
        class: PriorityClass,
        weight: u32,
        account: u64,
        governed: bool,
        trust_domain: &str,
    ) {
        let mut st = self.lock();
        let context = if governed {
            GOVERNED_CONTEXT | id
        } else if trust_domain == crate::access::TrustDomain::DEFAULT {
            0
        } else {
            let next = st.contexts.len() as u64 + 1;
            *st.contexts.entry(trust_domain.to_owned()).or_insert(next)
        };
        match st.dispatcher.add_client(ClientSpec {
            context,
            account,
            ..ClientSpec::new(id, class, weight.max(1))
        }) {
            Ok(()) => {
                self.clients.fetch_add(1, Ordering::Relaxed);
                if governed && st.governed.insert(id) {
                    self.governed.fetch_add(1, Ordering::Relaxed);
                }
            }
            Err(e) => tracing::warn!(client = id, error = %e, "scheduler refused the client"),
        }
    }

    /// Forgets the client (its queued and in-flight work); others may be granted at once.
    /// Lets the policy see whether the client has work on the device (its session's stamps,
    /// which the guardian reads too).
    pub fn watch(&self, id: ClientId, member: Arc<dyn Member>) {
        self.lock().watches.insert(id, member);
    }

    pub fn remove_client(&self, id: ClientId) {
        let mut st = self.lock();
        st.watches.remove(&id);
        if st.dispatcher.remove_client(id).is_ok() {
            self.clients.fetch_sub(1, Ordering::Relaxed);
        }
        if st.governed.remove(&id) {
            self.governed.fetch_sub(1, Ordering::Relaxed);
        }
        self.pump(&mut st);
    }

    pub fn update_client(&self, id: ClientId, class: PriorityClass, weight: u32) {
        let mut st = self.lock();
        let _ = st.dispatcher.update_client(id, class, weight.max(1));
        self.pump(&mut st);
    }

    /// Queues a kernel (of the profile `profile` reads) and waits for the policy to grant it;
    /// `finished`, the client's granted work seen finished since it last said, is reported
    /// in the same step (one lock per launch: with many clients, the lock is what they
    /// queue for). `session` is asked to report finished work between waits, and told once
    /// when a wait begins. `None` (run it anyway) when the client is unknown to the
    /// scheduler or `give_up` says the session is ending.
    pub fn acquire(
        &self,
        id: ClientId,
        profile: impl FnOnce(&mut Profiles<'_>) -> KernelProfile,
        finished: &[Finished],
        mut session: impl FnMut(Waiting<'_>),
        give_up: impl Fn() -> bool,
    ) -> Option<Turn> {
        let mut st = self.lock();
        let now = self.now();
        let profile = profile(&mut Profiles(&mut st.dispatcher));
        let high = st
            .dispatcher
            .spec(id)
            .is_some_and(|s| s.class == PriorityClass::High);
        let time_every = st.dispatcher.profiles().time_every(profile.key, high);
        let submitted = st.dispatcher.submit(id, profile, now);
        // Then the finished work (which may be what holds this kernel back): with the new
        // request already queued, the policy weighs this client as waiting, as it is.
        report_finished(&mut st.dispatcher, id, finished, now);
        self.pump_at(&mut st, now);
        let request = submitted.ok()?;
        let mut waited = false;
        let mut finished = Vec::new();
        let mut held_ns = 0u64;
        loop {
            if let Some((sm_limit, gated)) = st.granted.remove(&request) {
                return Some(Turn {
                    request,
                    sm_limit,
                    gated,
                    held_ns,
                    time_every,
                });
            }
            if give_up() {
                return None;
            }
            if !waited {
                waited = true;
                drop(st);
                session(Waiting::Begins);
                st = self.lock();
                self.pump(&mut st);
                continue;
            }
            let off_the_gpu = st.dispatcher.inflight_of(id) == 0;
            let mut slice = if off_the_gpu {
                IDLE_WAIT_SLICE
            } else {
                WAIT_SLICE
            };
            // A hold that ends with time alone (FAIR waiting for an owed client) ends on time.
            if let Some(at) = st.dispatcher.next_wakeup() {
                slice = slice.min(Duration::from_nanos(
                    at.saturating_sub(self.now()).max(1_000),
                ));
            }
            st.waiters.insert(request, std::thread::current());
            drop(st);
            let parked = off_the_gpu.then(Instant::now);
            std::thread::park_timeout(slice);
            if let Some(at) = parked {
                held_ns = held_ns.saturating_add(at.elapsed().as_nanos() as u64);
            }
            st = self.lock();
            st.waiters.remove(&request);
            if let Some((sm_limit, gated)) = st.granted.remove(&request) {
                return Some(Turn {
                    request,
                    sm_limit,
                    gated,
                    held_ns,
                    time_every,
                });
            }
            // Held still: what finished is reported in the same step as the policy's next look.
            drop(st);
            finished.clear();
            session(Waiting::Held(&mut finished));
            st = self.lock();
            report_finished(&mut st.dispatcher, id, &finished, self.now());
            self.pump(&mut st);
        }
    }

    /// The granted kernels have finished (with the device time each took, when known).
    pub fn complete(&self, id: ClientId, finished: &[Finished]) {
        let mut st = self.lock();
        let now = self.now();
        report_finished(&mut st.dispatcher, id, finished, now);
        self.pump(&mut st);
    }

    /// Device time measured for the client's work (what `status` shows it), for a policy
    /// that charges it (FAIR side by side); a hold it lifts is granted at once. Nothing under
    /// any other policy.
    pub fn device_time(&self, id: ClientId, ns: u64) {
        if ns == 0 || !self.device_time.load(Ordering::Relaxed) {
            return;
        }
        let mut st = self.lock();
        let now = self.now();
        let _ = st.dispatcher.device_time(id, ns, now);
        tell_busy(&mut st, now);
        // Before the pump: work held until now is granted at once when nobody needs holding.
        let free = st.dispatcher.free_running(now);
        if self.set_free(&mut st, free) {
            tracing::debug!(
                free,
                "launches skip the scheduler while nobody needs holding"
            );
        }
        self.pump(&mut st);
    }

    /// Launches skip the scheduler (`free`) or not from now on, with the time they did
    /// counted; whether that changed (under the lock, so that the changes come in order).
    fn set_free(&self, st: &mut State, free: bool) -> bool {
        if self.free.swap(free, Ordering::Relaxed) == free {
            return false;
        }
        let now = self.now();
        if free {
            st.free_since = now;
        } else {
            st.free_ns = st.free_ns.saturating_add(now.saturating_sub(st.free_since));
        }
        true
    }

    /// FAIR running free (`[fair] free_lead_us`): whether launches skip the scheduler now,
    /// and for how long they have in all; `None` while the policy cannot run free.
    pub fn free_running(&self) -> Option<(bool, u64)> {
        let st = self.lock();
        let may = st.dispatcher.policy_kind() == PolicyKind::Fair
            && st.dispatcher.tunables().fair.may_run_free();
        let now = self.free.load(Ordering::Relaxed);
        let mut total = st.free_ns;
        if now {
            total = total.saturating_add(self.now().saturating_sub(st.free_since));
        }
        (may || total > 0).then_some((now, total))
    }

    /// The client ended an iteration: (latency ns, deadline missed).
    pub fn iteration_boundary(&self, id: ClientId) -> (u64, bool) {
        let mut st = self.lock();
        let report = st.dispatcher.iteration_boundary(id, self.now());
        self.pump(&mut st);
        match report {
            Ok(Some(r)) => (r.latency_ns, r.deadline_missed),
            _ => (0, false),
        }
    }

    /// Declares (or, with `None`, withdraws) the client's job profile.
    pub fn set_job(&self, id: ClientId, job: Option<JobProfile>) -> Result<(), SchedError> {
        let mut st = self.lock();
        let r = st.dispatcher.set_job(id, job);
        self.pump(&mut st);
        r
    }

    /// Declares (or withdraws) the client's deadline. The scheduler learns it as part of the
    /// client's spec, so the client is registered again (its queue is empty: its data thread
    /// is here, not waiting for a grant).
    pub fn set_deadline(
        &self,
        spec: (ClientId, PriorityClass, u32),
        job: Option<JobProfile>,
        deadline: Option<DeadlineSpec>,
    ) -> Result<(), SchedError> {
        let (id, class, weight) = spec;
        let mut st = self.lock();
        // Everything else it was registered with (its GPU context, its account) stays.
        let spec = ClientSpec {
            class,
            weight: weight.max(1),
            job,
            deadline,
            ..st.dispatcher
                .spec(id)
                .unwrap_or_else(|| ClientSpec::new(id, class, weight))
        };
        let _ = st.dispatcher.remove_client(id);
        let r = st.dispatcher.add_client(spec);
        self.pump(&mut st);
        r
    }

    pub fn stats(&self, id: ClientId) -> Option<ClientSchedStats> {
        self.lock().dispatcher.stats(id)
    }

    /// Lets the policy grant what it will now, and wakes the threads granted.
    fn pump(&self, st: &mut State) {
        self.pump_at(st, self.now());
    }

    /// [`Self::pump`] at `now`, read under the same lock (a clock read is a tenth of the
    /// policy's time per launch on a VM).
    fn pump_at(&self, st: &mut State, now: u64) {
        let State {
            dispatcher,
            granted,
            waiters,
            grants,
            gate,
            ..
        } = st;
        grants.clear();
        dispatcher.poll_into(now, grants);
        // Closed before a high-priority kernel granted here reaches its stream.
        if let Some(gate) = gate {
            gate.steer(dispatcher, now);
            if gate.wake_keeper() {
                self.gate_closed.notify_one();
            }
        }
        for g in grants.iter() {
            granted.insert(g.request, (g.sm_limit, g.gated));
            if let Some(thread) = waiters.get(&g.request) {
                thread.unpark();
            }
        }
    }
}

fn report_finished(dispatcher: &mut Dispatcher, id: ClientId, finished: &[Finished], now: u64) {
    for &(request, measured) in finished {
        let _ = dispatcher.complete(id, request, measured, now);
    }
}

/// A granted kernel seen finished, and the device time it took when measured.
pub type Finished = (RequestId, Option<u64>);

/// Marks a governed client's context tag (its program's own context) apart from the trust
/// domains' tags.
const GOVERNED_CONTEXT: u64 = 1 << 63;

/// Tells the policy, at most every [`BUSY_TELL_NS`] and only while it may run free, which
/// sessions have work on the device.
fn tell_busy(st: &mut State, now: u64) {
    if !st.dispatcher.tunables().fair.may_run_free()
        || now.saturating_sub(st.busy_told_at) < BUSY_TELL_NS
    {
        return;
    }
    st.busy_told_at = now;
    let State {
        watches,
        dispatcher,
        ..
    } = st;
    for (&id, member) in watches.iter() {
        if member.watch().busy() {
            let _ = dispatcher.busy(id, now);
        }
    }
}

/// Whether high-priority kernels go straight to their stream: under the priority policy with
/// the lower classes on a hardware SM partition.
fn high_free(kind: PolicyKind, priority: PriorityConfig, sm_partitions: bool) -> bool {
    kind == PolicyKind::Priority
        && sm_partitions
        && priority.lower_sm_share.is_some_and(|s| s < 1.0)
}

mod gate;
mod profiles;
#[cfg(test)]
mod tests;

//! One GPU context's health, shared by its sessions and its guardian: who is on it (each
//! session a [`Member`]), the reset epoch, a fault reported and not yet handled, sessions
//! parked for a reset and the verdict each gets, and the suspects on probation, whose work
//! runs one at a time. The guardian that acts on it is `guardian`.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::restart::Stuck;

/// Fault-containment settings (`gpushared --kernel-timeout`, `--fault-probation`,
/// `--allow-fault-injection`).
#[derive(Debug, Clone, Copy)]
pub struct FaultConfig {
    /// Queued work that makes no progress for this long counts as a hang.
    pub kernel_timeout: Duration,
    /// How long suspects of an unattributed fault run one at a time.
    pub probation: Duration,
    /// Whether clients may launch the fault-injection kernel (for testing containment).
    pub allow_injection: bool,
}

impl Default for FaultConfig {
    fn default() -> Self {
        FaultConfig {
            kernel_timeout: Duration::from_secs(10),
            probation: Duration::from_secs(60),
            allow_injection: false,
        }
    }
}

/// What a session learns when a reset it took part in is over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Its work caused the fault: it is evicted with this reason.
    Culprit(String),
    /// It lost its device state through no fault of its own.
    Lost(String),
    /// Its memory and handles were kept; only work on the GPU at the fault (named here) may
    /// be lost.
    Survived(String),
}

#[derive(Default)]
pub(super) struct HealthState {
    /// Sessions on this GPU, for waking and counting them.
    pub(super) sessions: HashMap<u64, Arc<dyn Member>>,
    /// A fault reported and not yet handled: (reporter, the reset epoch it reported in, what).
    pub(super) fault: Option<(u64, u64, String)>,
    pub(super) parked: HashSet<u64>,
    pub(super) verdicts: HashMap<u64, Verdict>,
    /// Suspects of an unattributed fault, and when their probation ends.
    pub(super) probation: HashMap<u64, Instant>,
    /// The suspects' users, and when their probation ends: a program of theirs that starts
    /// meanwhile is a suspect too (a program that faults and exits, then another of the
    /// same user, is then named by its second fault).
    pub(super) probation_users: HashMap<u32, Instant>,
    /// The suspect whose work runs now (others on probation wait for it).
    pub(super) serial_holder: Option<u64>,
    /// Suspects waiting for the turn, in order: a release hands it to the first, so a busy
    /// suspect that takes the turn again at once cannot starve the others.
    pub(super) turn_queue: VecDeque<u64>,
    /// Whether the last reset kept clients' memory and handles.
    pub(super) kept: bool,
}

/// What the guardian sees of a session on its GPU context.
pub trait Member: Send + Sync {
    fn id(&self) -> u64;
    fn pid(&self) -> i32;
    fn uid(&self) -> u32;
    /// Its in-flight stamps.
    fn watch(&self) -> &FaultWatch;
    /// Wakes its data thread (so that it parks for a reset).
    fn wake(&self);
}

/// One GPU's health, shared by its sessions and its guardian.
pub struct DeviceHealth {
    pub config: FaultConfig,
    pub(super) stuck: Arc<Stuck>,
    /// Bumped when a reset starts; a session that sees it move parks, then rebuilds.
    pub(super) epoch: AtomicU64,
    pub(super) resetting: AtomicBool,
    /// Time origin for the sessions' busy/progress stamps.
    origin: Instant,
    state: Mutex<HealthState>,
    pub(super) changed: Condvar,
    /// The guardian looks for faults and hangs only now and then while no session has work
    /// on the device (it sets this); the first session that queues work clears it and wakes
    /// the guardian ([`DeviceHealth::mark_busy`]).
    pub(super) dozing: AtomicBool,
}

impl DeviceHealth {
    pub fn new(config: FaultConfig, stuck: Arc<Stuck>) -> Arc<DeviceHealth> {
        Arc::new(DeviceHealth {
            config,
            stuck,
            epoch: AtomicU64::new(0),
            resetting: AtomicBool::new(false),
            origin: Instant::now(),
            state: Mutex::default(),
            changed: Condvar::new(),
            dozing: AtomicBool::new(false),
        })
    }

    /// A session's work went on the device: its stamp for the watchdog, and the guardian
    /// roused if it dozes.
    pub fn mark_busy(&self, watch: &FaultWatch) {
        // SeqCst with the guardian's own pair (set `dozing`, then look at every stamp): one of
        // the two sees the other.
        watch.busy_since.store(self.now_ns(), Ordering::SeqCst);
        self.rouse();
    }

    /// Wakes the guardian if it dozes.
    fn rouse(&self) {
        if self.dozing.load(Ordering::SeqCst) && self.dozing.swap(false, Ordering::SeqCst) {
            let _st = self.lock();
            self.changed.notify_all();
        }
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, HealthState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Nanoseconds since this GPU's guardian started, never 0 (0 means "not busy").
    pub fn now_ns(&self) -> u64 {
        (self.origin.elapsed().as_nanos() as u64).max(1)
    }

    pub fn register(&self, info: Arc<dyn Member>) {
        self.lock().sessions.insert(info.id(), info);
        self.dozing.store(false, Ordering::SeqCst);
        self.changed.notify_all();
    }

    /// The session's data thread has ended: it no longer takes part in resets.
    pub fn unregister(&self, id: u64) {
        let mut st = self.lock();
        st.sessions.remove(&id);
        st.parked.remove(&id);
        st.probation.remove(&id);
        st.turn_queue.retain(|&w| w != id);
        if st.serial_holder == Some(id) {
            st.serial_holder = st.turn_queue.pop_front();
        }
        drop(st);
        self.changed.notify_all();
    }

    /// A session met a sticky device error: the context must be recreated. `epoch` is the
    /// reset epoch the session was in when it met the error: if a reset has come since, that
    /// reset already dealt with it, and a late report must not reset the device again.
    pub fn report_fault(&self, reporter: u64, epoch: u64, what: String) {
        let mut st = self.lock();
        if st.fault.is_none() && !self.resetting.load(Ordering::Acquire) && self.epoch() == epoch {
            st.fault = Some((reporter, epoch, what));
        }
        drop(st);
        self.changed.notify_all();
    }

    /// Waits until a recovery has started after `epoch` (true), or `timeout` passes.
    pub fn wait_for_recovery_start(&self, epoch: u64, timeout: Duration) -> bool {
        let st = self.lock();
        let (_st, waited) = self
            .changed
            .wait_timeout_while(st, timeout, |_| self.epoch() == epoch)
            .unwrap_or_else(|e| e.into_inner());
        !waited.timed_out()
    }

    /// Waits (called by a session that saw the epoch move) until the reset is over; returns
    /// what happened to this session.
    pub fn park(&self, id: u64) -> Verdict {
        let mut st = self.lock();
        st.parked.insert(id);
        self.changed.notify_all();
        while self.resetting.load(Ordering::Acquire) {
            st = self
                .changed
                .wait_timeout(st, Duration::from_millis(50))
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
        st.parked.remove(&id);
        st.verdicts.remove(&id).unwrap_or_else(|| {
            if st.kept {
                Verdict::Survived("a GPU fault".into())
            } else {
                Verdict::Lost("the GPU was reset after a fault".into())
            }
        })
    }

    /// Waits until no other suspect's work runs, then takes the turn. Gives up (returning
    /// false) when a reset starts.
    pub fn acquire_turn(&self, id: u64) -> bool {
        let mut st = self.lock();
        loop {
            if self.resetting.load(Ordering::Acquire) {
                st.turn_queue.retain(|&w| w != id);
                return false;
            }
            match st.serial_holder {
                Some(h) if h == id => return true,
                // Free, and nobody waited longer.
                None if st.turn_queue.front().is_none_or(|&w| w == id) => {
                    st.turn_queue.retain(|&w| w != id);
                    st.serial_holder = Some(id);
                    return true;
                }
                _ => {
                    if !st.turn_queue.contains(&id) {
                        st.turn_queue.push_back(id);
                    }
                    st = self
                        .changed
                        .wait_timeout(st, Duration::from_millis(10))
                        .map(|(g, _)| g)
                        .unwrap_or_else(|e| e.into_inner().0);
                }
            }
        }
    }

    /// Puts a session on probation until `until` (a suspect carried over a restart).
    pub fn set_probation(&self, id: u64, until: Instant) {
        self.lock().probation.insert(id, until);
    }

    /// Until when the session is a suspect on probation, if it is.
    pub fn probation_until(&self, id: u64) -> Option<Instant> {
        self.lock().probation.get(&id).copied()
    }

    /// Until when a new session of user `uid` is on probation (its user's), if it is.
    pub fn probation_for(&self, id: u64, uid: u32) -> Option<Instant> {
        let mut st = self.lock();
        let now = Instant::now();
        st.probation_users.retain(|_, &mut until| until > now);
        if let Some(&until) = st.probation_users.get(&uid) {
            let until = st.probation.get(&id).map_or(until, |&u| u.max(until));
            st.probation.insert(id, until);
        }
        st.probation.get(&id).copied()
    }

    /// Ends the turn; the suspect that has waited longest gets it.
    pub fn release_turn(&self, id: u64) {
        let mut st = self.lock();
        if st.serial_holder == Some(id) {
            st.serial_holder = st.turn_queue.pop_front();
            drop(st);
            self.changed.notify_all();
        }
    }
}

/// A session's in-flight stamps, read by the watchdog.
#[derive(Default)]
pub struct FaultWatch {
    /// When the session's oldest unfinished device work was queued ([`DeviceHealth::now_ns`]);
    /// 0 when it has none.
    pub busy_since: AtomicU64,
    /// When its work was last seen making progress.
    pub progress: AtomicU64,
    /// Where its streams' unfinished work begins, by stream: a progress slot and the value
    /// the stream writes there when it gets to that work (`device::progress`). A session
    /// none of whose marks was reached ran nothing of that work: no suspect of a fault.
    pub marks: std::sync::Mutex<std::collections::HashMap<u64, (u32, u32)>>,
}

impl FaultWatch {
    /// Forgets the marks: the session has no work in flight.
    pub fn clear_marks(&self) {
        self.marks.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    /// Whether the session has unfinished device work (a suspect of a fault if the device
    /// [`got_to`](Self::got_to) it).
    pub fn busy(&self) -> bool {
        self.busy_since.load(std::sync::atomic::Ordering::Acquire) != 0
    }

    /// Whether the device got to some of the session's unfinished work: one of its marks
    /// reached (`reached`), or none known.
    pub fn got_to(&self, reached: impl Fn((u32, u32)) -> bool) -> bool {
        let marks = self.marks.lock().unwrap_or_else(|e| e.into_inner());
        marks.is_empty() || marks.values().any(|&m| reached(m))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A busy session is a suspect unless the GPU got to none of its work; an idle one never.
    #[test]
    fn only_a_session_whose_work_the_gpu_got_to_may_have_run() {
        // As the guardian judges a suspect: busy, and the device got to some of its work.
        let suspect =
            |w: &FaultWatch, reached: &dyn Fn((u32, u32)) -> bool| w.busy() && w.got_to(reached);
        let watch = FaultWatch::default();
        assert!(!suspect(&watch, &|_| true), "idle");
        watch.busy_since.store(5, Ordering::Release);
        assert!(
            suspect(&watch, &|_| false),
            "busy, nothing known: a suspect"
        );
        watch
            .marks
            .lock()
            .expect("marks")
            .extend([(1, (10, 7)), (2, (11, 8))]);
        assert!(!suspect(&watch, &|_| false), "no stream got to its work");
        assert!(suspect(&watch, &|(slot, _)| slot == 11), "one did");
        watch.clear_marks();
        assert!(suspect(&watch, &|_| false));
    }

    /// On probation, a busy suspect that gives the turn up and asks again at once does not
    /// get it back before a suspect that was already waiting.
    #[test]
    fn the_probation_turn_goes_to_the_suspect_that_waited_longest() {
        let health = DeviceHealth::new(FaultConfig::default(), Arc::new(Stuck::default()));
        assert!(health.acquire_turn(1));
        let waiter = {
            let health = health.clone();
            std::thread::spawn(move || {
                assert!(health.acquire_turn(2));
                let got = Instant::now();
                std::thread::sleep(Duration::from_millis(50));
                health.release_turn(2);
                got
            })
        };
        // Let suspect 2 queue up, then 1 releases and asks again straight away.
        while health.lock().turn_queue.is_empty() {
            std::thread::sleep(Duration::from_millis(1));
        }
        health.release_turn(1);
        assert!(health.acquire_turn(1));
        let back = Instant::now();
        let got = waiter.join().expect("waiter");
        assert!(
            got < back,
            "suspect 1 took the turn back before suspect 2 had it"
        );
        health.release_turn(1);
    }
}

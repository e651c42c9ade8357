//! GPU fault containment: one client's faulting or never-ending kernel must not take the
//! broker, or the other clients' sessions, down with it.
//!
//! All clients of a GPU share one CUDA context, and an illegal address (or any other sticky
//! error) poisons that context for everyone. The only way out is to recreate it, which loses
//! every client's device state. So, per GPU, a guardian thread:
//!
//! 1. notices the fault: a session reports a sticky error ([`DeviceHealth::report_fault`]), or
//!    the watchdog sees a session whose queued work has made no progress for
//!    `--kernel-timeout`;
//! 2. names the suspects: the sessions that had work in flight at that moment (one suspect is
//!    the culprit; several go on probation, below);
//! 3. stops everyone: interrupts every wait on the device, wakes every session, and waits
//!    until each has parked ([`DeviceHealth::park`]);
//! 4. recreates the context ([`Device::reset`]);
//! 5. evicts the culprit and lets the others go on: each drops its (now inert) handles, gets a
//!    fresh default stream, and tells its client exactly what it lost.
//!
//! Probation: when several clients had work in flight, none is evicted; instead their work
//! runs one client at a time for `--fault-probation`, so that a second fault has exactly one
//! suspect, who is then evicted.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::device::Device;
use crate::session::SessionInfo;

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

/// How long the guardian waits for every session to park before resetting anyway.
const PARK_TIMEOUT: Duration = Duration::from_secs(2);
/// How often the watchdog looks for hangs.
const WATCH_TICK: Duration = Duration::from_millis(20);

/// What a session learns when a reset it took part in is over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Its work caused the fault: it is evicted with this reason.
    Culprit(String),
    /// It lost its device state through no fault of its own.
    Lost(String),
}

#[derive(Default)]
struct HealthState {
    /// Sessions on this GPU, for waking and counting them.
    sessions: HashMap<u64, Arc<SessionInfo>>,
    /// A fault reported and not yet handled: (reporter, the reset epoch it reported in, what).
    fault: Option<(u64, u64, String)>,
    parked: HashSet<u64>,
    verdicts: HashMap<u64, Verdict>,
    /// Suspects of an unattributed fault, and when their probation ends.
    probation: HashMap<u64, Instant>,
    /// The suspect whose work runs now (others on probation wait for it).
    serial_holder: Option<u64>,
    /// Suspects waiting for the turn, in order: a release hands it to the first, so a busy
    /// suspect that takes the turn again at once cannot starve the others.
    turn_queue: VecDeque<u64>,
}

/// What a restart carries over to the next image, by client process id: whose work faulted
/// (refused for a while, so one program cannot restart the broker again and again) and who
/// was a suspect (on probation: its work runs alone, so a second fault names it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Carry {
    pub evicted: Vec<i32>,
    pub probation: Vec<i32>,
    /// How long both last, from the restart.
    pub seconds: u64,
}

/// The environment variable a restarting gpushared passes a [`Carry`] in.
pub const CARRY_ENV: &str = "GPUSHARE_FAULT_CARRY";

impl Carry {
    /// `evicted=1,2;probation=3;seconds=60`
    pub fn to_env(&self) -> String {
        let list = |v: &[i32]| v.iter().map(i32::to_string).collect::<Vec<_>>().join(",");
        format!(
            "evicted={};probation={};seconds={}",
            list(&self.evicted),
            list(&self.probation),
            self.seconds
        )
    }

    /// Reads [`Carry::to_env`]'s format; anything malformed is ignored.
    pub fn from_env(text: &str) -> Carry {
        let mut carry = Carry::default();
        for part in text.split(';') {
            let Some((key, value)) = part.split_once('=') else {
                continue;
            };
            let pids = || -> Vec<i32> {
                value
                    .split(',')
                    .filter_map(|p| p.trim().parse().ok())
                    .filter(|p| *p > 0)
                    .collect()
            };
            match key.trim() {
                "evicted" => carry.evicted = pids(),
                "probation" => carry.probation = pids(),
                "seconds" => carry.seconds = value.trim().parse().unwrap_or(0).min(86_400),
                _ => {}
            }
        }
        carry
    }

    pub fn is_empty(&self) -> bool {
        self.evicted.is_empty() && self.probation.is_empty()
    }
}

/// Set when a GPU cannot be recovered in place: the broker must restart (see
/// [`Device::reset_deadline`]). Shared by every GPU's health.
#[derive(Default)]
pub struct Stuck {
    reason: Mutex<Option<String>>,
    carry: Mutex<Carry>,
    notify: tokio::sync::Notify,
}

impl Stuck {
    fn set(&self, reason: String) {
        let mut r = self.reason.lock().unwrap_or_else(|e| e.into_inner());
        if r.is_none() {
            *r = Some(reason);
            self.notify.notify_one();
        }
    }

    fn set_carry(&self, carry: Carry) {
        *self.carry.lock().unwrap_or_else(|e| e.into_inner()) = carry;
    }

    /// What the next image should know.
    pub fn carry(&self) -> Carry {
        self.carry.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Why the broker must restart, if it must.
    pub fn reason(&self) -> Option<String> {
        self.reason
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Resolves (with the reason) once a GPU is stuck.
    pub async fn wait(&self) -> String {
        loop {
            if let Some(r) = self.reason() {
                return r;
            }
            self.notify.notified().await;
        }
    }
}

/// One GPU's health, shared by its sessions and its guardian.
pub struct DeviceHealth {
    pub config: FaultConfig,
    stuck: Arc<Stuck>,
    /// Bumped when a reset starts; a session that sees it move parks, then rebuilds.
    epoch: AtomicU64,
    resetting: AtomicBool,
    /// Time origin for the sessions' busy/progress stamps.
    origin: Instant,
    state: Mutex<HealthState>,
    changed: Condvar,
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
        })
    }

    fn lock(&self) -> MutexGuard<'_, HealthState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Nanoseconds since this GPU's guardian started, never 0 (0 means "not busy").
    pub fn now_ns(&self) -> u64 {
        (self.origin.elapsed().as_nanos() as u64).max(1)
    }

    pub fn register(&self, info: Arc<SessionInfo>) {
        self.lock().sessions.insert(info.id, info);
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
        st.verdicts
            .remove(&id)
            .unwrap_or_else(|| Verdict::Lost("the GPU was reset after a fault".into()))
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

    /// Ends the turn; the suspect that has waited longest gets it.
    pub fn release_turn(&self, id: u64) {
        let mut st = self.lock();
        if st.serial_holder == Some(id) {
            st.serial_holder = st.turn_queue.pop_front();
            drop(st);
            self.changed.notify_all();
        }
    }

    /// The guardian: watches for faults and hangs on `device` until `stop` is set.
    pub fn guard(self: Arc<Self>, device: Arc<Device>, gpu: u32, stop: Arc<AtomicBool>) {
        while !stop.load(Ordering::Acquire) && self.stuck.reason().is_none() {
            let fault = {
                let st = self.lock();
                let (mut st, _) = self
                    .changed
                    .wait_timeout_while(st, WATCH_TICK, |s| s.fault.is_none())
                    .unwrap_or_else(|e| e.into_inner());
                // A report from before the last reset was about what that reset dealt with
                // (one can slip in while the guardian starts a recovery).
                st.fault
                    .take()
                    .filter(|&(_, epoch, _)| epoch == self.epoch())
                    .map(|(reporter, _, what)| (reporter, what))
            };
            let cause = match fault.or_else(|| device.fault().map(|what| (0, what))) {
                Some((_, what)) => Some((what, None)),
                None => self.find_hang().map(|(id, stuck)| {
                    (
                        format!(
                            "work queued by client {id} made no progress for {:.1} s (--kernel-timeout)",
                            stuck.as_secs_f64()
                        ),
                        Some(id),
                    )
                }),
            };
            if let Some((what, hung)) = cause {
                self.recover(&device, gpu, &what, hung);
            }
        }
    }

    /// A session whose queued work has not progressed for the kernel timeout.
    fn find_hang(&self) -> Option<(u64, Duration)> {
        let now = self.now_ns();
        let limit = self.config.kernel_timeout.as_nanos() as u64;
        let st = self.lock();
        // Work queued behind a hung kernel (streams can share a hardware queue) stalls too:
        // the culprit is the client whose stalled work is oldest.
        st.sessions
            .values()
            .filter_map(|s| {
                let busy = s.fault_watch.busy_since.load(Ordering::Acquire);
                let progress = s.fault_watch.progress.load(Ordering::Acquire);
                let since = busy.max(progress);
                (busy != 0 && now.saturating_sub(since) > limit).then_some((busy, s.id, since))
            })
            .min()
            .map(|(_, id, since)| (id, Duration::from_nanos(now.saturating_sub(since))))
    }

    /// Asks for a restart (only a new process gets a working GPU back), telling the next
    /// image whom to refuse and whom to put on probation.
    fn restart_after(
        &self,
        gpu: u32,
        what: &str,
        culprit: Option<u64>,
        suspects: &[u64],
        pids: &HashMap<u64, i32>,
    ) {
        let pid = |id: &u64| pids.get(id).copied();
        self.stuck.set_carry(Carry {
            evicted: culprit.iter().filter_map(pid).collect(),
            probation: if culprit.is_none() {
                suspects.iter().filter_map(pid).collect()
            } else {
                Vec::new()
            },
            seconds: self.config.probation.as_secs().max(1),
        });
        let cause = culprit.map_or("cause not attributable".to_string(), |c| {
            format!("caused by client {c}")
        });
        self.stuck.set(format!(
            "GPU {gpu} faulted ({what}; {cause}) and the driver cannot recover it in place; gpushared restarts, reconnect"
        ));
    }

    /// Stops every session, recreates the context, evicts the culprit, releases the rest.
    fn recover(&self, device: &Device, gpu: u32, what: &str, hung: Option<u64>) {
        let started = Instant::now();
        // Who had work in flight when it happened?
        let (suspects, sessions, holder, pids) = {
            let st = self.lock();
            let busy: Vec<u64> = st
                .sessions
                .values()
                .filter(|s| s.fault_watch.busy_since.load(Ordering::Acquire) != 0)
                .map(|s| s.id)
                .collect();
            let sessions: Vec<Arc<SessionInfo>> = st.sessions.values().cloned().collect();
            let pids: HashMap<u64, i32> = st.sessions.values().map(|s| (s.id, s.pid)).collect();
            (busy, sessions, st.serial_holder, pids)
        };
        let culprit = match (hung, holder, suspects.as_slice()) {
            (Some(id), _, _) => Some(id),
            // On probation only the turn holder's work runs among the suspects.
            (None, Some(h), _) if suspects.contains(&h) => Some(h),
            (None, _, [one]) => Some(*one),
            _ => None,
        };
        tracing::error!(gpu, fault = what, ?culprit, ?suspects, "GPU fault");
        // Stop everyone: waits are cut short, and sessions park at their next step.
        self.resetting.store(true, Ordering::Release);
        device.interrupt();
        self.epoch.fetch_add(1, Ordering::AcqRel);
        self.changed.notify_all();
        let give_up = |why: &str| {
            tracing::error!(gpu, "{why}; restarting gpushared");
            self.restart_after(gpu, what, culprit, &suspects, &pids);
        };
        if !device.resets_in_place() {
            // Nothing to save in this process: restart at once (every client is told why).
            give_up("the driver cannot recover this GPU in place");
            return;
        }
        tracing::error!(gpu, "resetting the device context");
        for s in &sessions {
            s.submit_wake().signal();
        }
        // Wait until every session has parked (each stops touching the device).
        {
            let st = self.lock();
            let (st, timeout) = self
                .changed
                .wait_timeout_while(st, PARK_TIMEOUT, |s| {
                    s.sessions.keys().any(|id| !s.parked.contains(id))
                })
                .unwrap_or_else(|e| e.into_inner());
            if timeout.timed_out() {
                let missing: Vec<u64> = st
                    .sessions
                    .keys()
                    .filter(|id| !st.parked.contains(id))
                    .copied()
                    .collect();
                tracing::warn!(?missing, "sessions did not stop in time; resetting anyway");
            }
        }
        // The driver waits for running kernels before it tears a context down, so a kernel
        // that never ends can keep a reset in place waiting forever; only the end of the
        // process holding the context stops it.
        let reset_done = Arc::new(AtomicBool::new(false));
        {
            let (done, stuck, what) = (reset_done.clone(), self.stuck.clone(), what.to_string());
            let deadline = device.reset_deadline();
            let _ = std::thread::Builder::new()
                .name(format!("gpushare-reset-{gpu}"))
                .spawn(move || {
                    std::thread::sleep(deadline);
                    if !done.load(Ordering::Acquire) {
                        tracing::error!(gpu, "the context reset has not finished in {deadline:?} (a kernel that never ends keeps it waiting); restarting gpushared");
                        stuck.set(format!("GPU {gpu} hung ({what}) and the driver cannot stop the kernel in place; gpushared restarts, reconnect"));
                    }
                });
        }
        let reset = device.reset();
        reset_done.store(true, Ordering::Release);
        if let Err(e) = reset {
            give_up(&format!(
                "the device context cannot be recreated in this process ({e})"
            ));
            return; // sessions stay parked until the restart
        }

        let mut st = self.lock();
        let lost = format!("the GPU was reset after a fault ({what})");
        for s in &sessions {
            let verdict = if Some(s.id) == culprit {
                Verdict::Culprit(format!("your work faulted the GPU and was stopped: {what}"))
            } else {
                Verdict::Lost(lost.clone())
            };
            st.verdicts.insert(s.id, verdict);
            s.fault_watch.busy_since.store(0, Ordering::Release);
        }
        st.serial_holder = None;
        st.turn_queue.clear();
        if culprit.is_none() && suspects.len() > 1 {
            let until = Instant::now() + self.config.probation;
            for id in &suspects {
                st.probation.insert(*id, until);
            }
            tracing::warn!(gpu, ?suspects, probation = ?self.config.probation, "fault not attributable: suspects run one at a time");
        } else if let Some(c) = culprit {
            st.probation.remove(&c);
        }
        // Fault noticed → context recreated and sessions released.
        let recovery = started.elapsed();
        tracing::warn!(
            gpu,
            recovery_ms = recovery.as_secs_f64() * 1e3,
            "device context recreated; clients resume"
        );
        self.resetting.store(false, Ordering::Release);
        drop(st);
        self.changed.notify_all();
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
}

#[cfg(test)]
mod tests {
    use super::*;

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

//! GPU fault containment: one client's faulting or never-ending kernel must not take the
//! broker, or the other clients' sessions, down with it.
//!
//! All clients of a GPU context share it, and an illegal address (or any other sticky error)
//! poisons it for everyone. The only way out is a new context, which loses every client's
//! device state. So, per context, a guardian thread:
//!
//! 1. notices the fault: a session reports a sticky error ([`DeviceHealth::report_fault`]), or
//!    the watchdog sees a session whose queued work has made no progress for
//!    `--kernel-timeout`;
//! 2. names the suspects: the sessions that had work in flight at that moment (one suspect is
//!    the culprit; several go on probation, below);
//! 3. stops everyone: interrupts every wait on the device, wakes every session, and waits
//!    until each has parked ([`DeviceHealth::park`]);
//! 4. replaces the context ([`Device::reset`]: a spare worker takes over);
//! 5. evicts the culprit and lets the others go on: each drops its (now inert) handles, gets a
//!    fresh default stream, and tells its client exactly what it lost.
//!
//! Probation: when several clients had work in flight, none is evicted; instead their work
//! runs one client at a time for `--fault-probation`, so that a second fault has exactly one
//! suspect, who is then evicted.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::health::{DeviceHealth, Member, Verdict};
use super::restart::Carry;
use crate::device::{Device, Memory};

/// The client a fault is pinned on. Only a client that alone had work in flight is named. Not
/// the suspect holding its turn on probation: the turn may have passed to it after the faulting
/// kernel ran, and clients run beside it (on the H200 that named an innocent PyTorch trainer).
fn culprit_of(blame: Blame, suspects: &[u64]) -> Option<u64> {
    match (blame, suspects) {
        (Blame::Culprit(id), _) => Some(id),
        (Blame::Nobody, _) => None,
        (Blame::Suspects, [one]) => Some(*one),
        _ => None,
    }
}

/// Whom a fault is pinned on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Blame {
    /// This client, shown to have caused it.
    Culprit(u64),
    /// The one client with work in flight, if only one had (several run on probation).
    Suspects,
    /// Nobody: clients with work in flight run on probation, none is evicted.
    Nobody,
}

/// How long the guardian waits for every session to park before resetting anyway.
const PARK_TIMEOUT: Duration = Duration::from_secs(2);
/// How often the watchdog looks for hangs and faults while work is on the device.
const WATCH_TICK: Duration = Duration::from_millis(20);
/// How often it looks while none is: a fault or a hang needs work on the device, and the
/// first work queued rouses it. With 100 idle sessions the 20 ms tick cost gpushared 2 % of
/// a core (`gpushare-demo cost`, debug build).
const DOZE_TICK: Duration = Duration::from_secs(1);

impl DeviceHealth {
    /// The guardian: watches for faults and hangs on `device` until `stop` is set.
    pub fn guard(self: Arc<Self>, device: Arc<Device>, gpu: u32, stop: Arc<AtomicBool>) {
        while !stop.load(Ordering::Acquire) && self.stuck.reason().is_none() {
            let fault = {
                let st = self.lock();
                self.dozing.store(true, Ordering::SeqCst);
                let idle = st
                    .sessions
                    .values()
                    .all(|s| s.watch().busy_since.load(Ordering::SeqCst) == 0);
                self.dozing.store(idle, Ordering::SeqCst);
                let tick = if idle { DOZE_TICK } else { WATCH_TICK };
                let (mut st, _) = self
                    .changed
                    .wait_timeout_while(st, tick, |s| {
                        s.fault.is_none() && (!idle || self.dozing.load(Ordering::SeqCst))
                    })
                    .unwrap_or_else(|e| e.into_inner());
                self.dozing.store(false, Ordering::SeqCst);
                // A report from before the last reset was about what that reset dealt with
                // (one can slip in while the guardian starts a recovery).
                st.fault
                    .take()
                    .filter(|&(_, epoch, _)| epoch == self.epoch())
                    .map(|(reporter, _, what)| (reporter, what))
            };
            let cause = match fault.or_else(|| device.fault().map(|what| (0, what))) {
                Some((_, what)) => Some((what, Blame::Suspects)),
                None => self.find_hang().or_else(|| self.silent_worker(&device)),
            };
            if let Some((what, blame)) = cause {
                self.recover(&device, gpu, &what, blame);
            }
        }
    }

    /// Sessions whose queued work has not progressed for the kernel timeout: one is the
    /// culprit; several (work queued behind a hung kernel stalls too, and the GPU does not say
    /// which kernel hangs) are suspects, who run one at a time from then on.
    fn find_hang(&self) -> Option<(String, Blame)> {
        let now = self.now_ns();
        let limit = self.config.kernel_timeout.as_nanos() as u64;
        let st = self.lock();
        let stalled: Vec<(u64, u64)> = st
            .sessions
            .values()
            .filter_map(|s| {
                let busy = s.watch().busy_since.load(Ordering::Acquire);
                let progress = s.watch().progress.load(Ordering::Acquire);
                let since = busy.max(progress);
                (busy != 0 && now.saturating_sub(since) > limit).then_some((s.id(), since))
            })
            .collect();
        let oldest = stalled.iter().map(|&(_, since)| since).min()?;
        let stuck = Duration::from_nanos(now.saturating_sub(oldest)).as_secs_f64();
        Some(match stalled.as_slice() {
            [(id, _)] => (
                format!(
                    "work queued by client {id} made no progress for {stuck:.1} s (--kernel-timeout)"
                ),
                Blame::Culprit(*id),
            ),
            _ => (
                format!(
                    "work queued by clients {:?} made no progress for {stuck:.1} s (--kernel-timeout)",
                    stalled.iter().map(|&(id, _)| id).collect::<Vec<_>>()
                ),
                Blame::Suspects,
            ),
        })
    }

    /// A device worker that, alive, has not answered the fault check for the kernel timeout:
    /// it is replaced, but nothing shows whose doing it is, so nobody is evicted.
    fn silent_worker(&self, device: &Device) -> Option<(String, Blame)> {
        let silent = device
            .unresponsive()
            .filter(|d| *d > self.config.kernel_timeout)?;
        Some((
            format!(
                "the device worker has not answered for {:.1} s (--kernel-timeout)",
                silent.as_secs_f64()
            ),
            Blame::Nobody,
        ))
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
    fn recover(&self, device: &Device, gpu: u32, what: &str, blame: Blame) {
        let started = Instant::now();
        // Who had work in flight when it happened?
        let (busy, sessions, pids, uids) = {
            let st = self.lock();
            let busy: Vec<Arc<dyn Member>> = st
                .sessions
                .values()
                .filter(|s| s.watch().busy())
                .cloned()
                .collect();
            let sessions: Vec<Arc<dyn Member>> = st.sessions.values().cloned().collect();
            let pids: HashMap<u64, i32> = st.sessions.values().map(|s| (s.id(), s.pid())).collect();
            let uids: HashMap<u64, u32> = st.sessions.values().map(|s| (s.id(), s.uid())).collect();
            (busy, sessions, pids, uids)
        };
        // Work that the device never took cannot have faulted it (refused once the context had
        // faulted, or never sent).
        let got_to = |busy: &[Arc<dyn Member>]| -> Vec<u64> {
            busy.iter()
                .filter(|s| s.watch().got_to(|m| device.reached(m)))
                .map(|s| s.id())
                .collect()
        };
        let suspects = got_to(&busy);
        let culprit = culprit_of(blame, &suspects);
        tracing::error!(gpu, fault = what, ?culprit, ?suspects, "GPU fault");
        // Stop everyone: waits are cut short, and sessions park at their next step.
        self.resetting.store(true, Ordering::Release);
        device.interrupt();
        self.epoch.fetch_add(1, Ordering::AcqRel);
        self.changed.notify_all();
        let give_up = |why: &str, culprit: Option<u64>, suspects: &[u64]| {
            tracing::error!(gpu, "{why}; restarting gpushared");
            self.restart_after(gpu, what, culprit, suspects, &pids);
        };
        if !device.resets_in_place() {
            // Nothing to save in this process: restart at once (every client is told why).
            give_up(
                "the driver cannot recover this GPU in place",
                culprit,
                &suspects,
            );
            return;
        }
        tracing::error!(gpu, "resetting the device context");
        for s in &sessions {
            s.wake();
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
        // A worker marks that the device got to a stream's work once the call that began it
        // has returned. The fault can be noticed before that: another session's
        // synchronization sees it as soon as the faulting launch is accepted (the sim device
        // does this at once). With every session stopped those calls have returned, so who
        // was busy when it was noticed is judged again.
        let (culprit, suspects) = {
            let again = got_to(&busy);
            if again != suspects {
                let culprit = culprit_of(blame, &again);
                tracing::warn!(gpu, ?culprit, suspects = ?again, "GPU fault: suspects once every session stopped");
                (culprit, again)
            } else {
                (culprit, suspects)
            }
        };
        // The driver waits for running kernels before it tears a context down, so a kernel
        // that never ends can keep a reset in place waiting forever; only the end of the
        // process holding the context stops it.
        // The watch ends with the reset (the sender dropped), not at its deadline: a storm of
        // faults must not pile up sleeping threads.
        let (reset_done, done) = std::sync::mpsc::channel::<()>();
        {
            let (stuck, what) = (self.stuck.clone(), what.to_string());
            let deadline = device.reset_deadline();
            let _ = std::thread::Builder::new()
                .name(format!("gpushare-reset-{gpu}"))
                .spawn(move || {
                    if done.recv_timeout(deadline) == Err(std::sync::mpsc::RecvTimeoutError::Timeout) {
                        tracing::error!(gpu, "the context reset has not finished in {deadline:?} (a kernel that never ends keeps it waiting); restarting gpushared");
                        stuck.set(format!("GPU {gpu} hung ({what}) and the driver cannot stop the kernel in place; gpushared restarts, reconnect"));
                    }
                });
        }
        let reset = device.reset();
        drop(reset_done);
        let memory = match reset {
            Ok(m) => m,
            Err(e) => {
                give_up(
                    &format!("the device context cannot be recreated in this process ({e})"),
                    culprit,
                    &suspects,
                );
                return; // sessions stay parked until the restart
            }
        };

        let mut st = self.lock();
        st.kept = memory == Memory::Kept;
        let lost = format!("the GPU was reset after a fault ({what})");
        for s in &sessions {
            let verdict = if Some(s.id()) == culprit {
                Verdict::Culprit(format!("your work faulted the GPU and was stopped: {what}"))
            } else if st.kept {
                Verdict::Survived(what.to_string())
            } else {
                Verdict::Lost(lost.clone())
            };
            st.verdicts.insert(s.id(), verdict);
            s.watch().busy_since.store(0, Ordering::Release);
        }
        st.serial_holder = None;
        st.turn_queue.clear();
        let unattributed = match blame {
            Blame::Nobody => !suspects.is_empty(),
            _ => suspects.len() > 1,
        };
        if culprit.is_none() && unattributed {
            let until = Instant::now() + self.config.probation;
            for id in &suspects {
                st.probation.insert(*id, until);
                if let Some(&uid) = uids.get(id) {
                    st.probation_users.insert(uid, until);
                }
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
            kept = st.kept,
            "device context recreated; clients resume"
        );
        self.resetting.store(false, Ordering::Release);
        drop(st);
        self.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::sim::{SimDevice, SimOptions};
    use crate::gpu::health::{FaultConfig, FaultWatch};
    use crate::gpu::restart::Stuck;

    struct Session {
        id: u64,
        watch: FaultWatch,
    }

    impl Member for Session {
        fn id(&self) -> u64 {
            self.id
        }
        fn pid(&self) -> i32 {
            self.id as i32
        }
        fn uid(&self) -> u32 {
            1000
        }
        fn watch(&self) -> &FaultWatch {
            &self.watch
        }
        fn wake(&self) {}
    }

    fn health() -> Arc<DeviceHealth> {
        let config = FaultConfig {
            kernel_timeout: Duration::from_millis(5),
            ..FaultConfig::default()
        };
        DeviceHealth::new(config, Arc::new(Stuck::default()))
    }

    /// A session with work queued now that makes no progress.
    fn stalled(health: &DeviceHealth, id: u64) -> Arc<Session> {
        let s = Arc::new(Session {
            id,
            watch: FaultWatch::default(),
        });
        s.watch.busy_since.store(health.now_ns(), Ordering::Release);
        health.register(s.clone());
        s
    }

    fn past_the_timeout(health: &DeviceHealth) {
        let until = health.now_ns() + 2 * health.config.kernel_timeout.as_nanos() as u64;
        while health.now_ns() < until {
            std::thread::yield_now();
        }
    }

    #[test]
    fn a_hang_names_its_one_stalled_client_and_several_stalled_clients_are_only_suspects() {
        let health = health();
        let one = stalled(&health, 1);
        let idle = Arc::new(Session {
            id: 2,
            watch: FaultWatch::default(),
        });
        health.register(idle);
        past_the_timeout(&health);
        let (what, blame) = health.find_hang().expect("a hang");
        assert_eq!(blame, Blame::Culprit(1), "{what}");
        // A second client stalled too: the GPU does not say whose kernel hangs.
        let _two = stalled(&health, 3);
        one.watch
            .busy_since
            .store(health.now_ns(), Ordering::Release);
        past_the_timeout(&health);
        let (what, blame) = health.find_hang().expect("a hang");
        assert_eq!(blame, Blame::Suspects, "{what}");
        assert!(
            what.contains("clients [1, 3]") || what.contains("clients [3, 1]"),
            "{what}"
        );
    }

    /// A link whose worker, alive, has not answered for a while.
    struct Silent {
        inner: Arc<dyn crate::device::Link>,
        silent: Duration,
    }

    impl crate::device::Link for Silent {
        crate::device::link::pass_on_to_inner!();
        fn create_chunk(&self, at: u64, size: u64) -> crate::device::DeviceResult<()> {
            self.inner.create_chunk(at, size)
        }
        fn release_chunk(&self, at: u64, size: u64) {
            self.inner.release_chunk(at, size)
        }
        fn interrupt(&self) {}
        fn fault(&self) -> Option<String> {
            None
        }
        fn unresponsive(&self) -> Option<Duration> {
            Some(self.silent)
        }
        fn reset(&self) -> crate::device::DeviceResult<Memory> {
            Ok(Memory::Kept)
        }
        fn resets_in_place(&self) -> bool {
            true
        }
        fn reset_deadline(&self) -> Duration {
            Duration::from_secs(1)
        }
    }

    fn silent_device(silent: Duration) -> Device {
        let sim = Device::local(SimDevice::new(SimOptions::default()), None).expect("sim");
        let link = Arc::new(Silent {
            inner: sim.link().clone(),
            silent,
        });
        Device::new(link, 0)
    }

    #[test]
    fn a_worker_that_stops_answering_is_replaced_and_nobody_is_blamed_for_it() {
        let health = health();
        let busy = stalled(&health, 7);
        busy.watch.progress.store(u64::MAX / 2, Ordering::Release);
        // Slow for less than the kernel timeout: not a fault at all.
        assert!(
            health
                .silent_worker(&silent_device(Duration::from_millis(1)))
                .is_none()
        );
        let (what, blame) = health
            .silent_worker(&silent_device(Duration::from_secs(30)))
            .expect("silent past the timeout");
        assert_eq!(blame, Blame::Nobody, "{what}");
        // The one client with work in flight is not evicted: it runs on probation.
        let device = silent_device(Duration::from_secs(30));
        health.recover(&device, 0, &what, blame);
        assert_eq!(
            health.lock().verdicts.get(&7),
            Some(&Verdict::Survived(what.clone()))
        );
        assert!(health.lock().probation.contains_key(&7));
    }

    #[test]
    fn the_suspect_holding_its_turn_is_not_blamed_while_another_had_work_in_flight() {
        let health = health();
        // Clients 1 and 4 are on probation; 1 holds the turn now, but 4 had work in flight
        // too (its kernel may have run before the turn passed): either could have faulted.
        let _one = stalled(&health, 1);
        let _four = stalled(&health, 4);
        for id in [1, 4] {
            health.set_probation(id, Instant::now() + Duration::from_secs(60));
        }
        assert!(health.acquire_turn(1));
        let device = silent_device(Duration::ZERO);
        health.recover(&device, 0, "a device-side assert", Blame::Suspects);
        let st = health.lock();
        for id in [1, 4] {
            assert!(
                matches!(st.verdicts.get(&id), Some(Verdict::Survived(_))),
                "client {id}: {:?}",
                st.verdicts.get(&id)
            );
            assert!(st.probation.contains_key(&id), "client {id} on probation");
        }
    }
}

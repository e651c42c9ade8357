//! The data thread's loop: drains the submission ring, publishes completions, charges the
//! device time measured, and sleeps on the submission eventfd when the client goes quiet.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use gpushare_protocol::ring::CompletionEntry;
use gpushare_protocol::wake::SpinClock;

use super::rhythm::Rhythm;
use super::{SessionEnd, SessionState};
use crate::device::Pace;

/// How soon an idle data thread looks again at device-time measurements still in flight.
const MEASURE_RECHECK: Duration = Duration::from_millis(2);
/// Within a long batch, device time is charged at least this often.
const ACCOUNT_EVERY: Duration = Duration::from_millis(5);
/// How long a client pauses before the accounting of its last batch runs
/// ([`SessionState::end_of_batch`]).
const ACCOUNT_IDLE: Duration = Duration::from_micros(20);
/// How long the data thread waits on a full completion ring before looking again (and
/// reporting the client's finished kernels to the scheduler).
const CQ_FULL_RECHECK: Duration = Duration::from_millis(10);

/// Why a client that left its completion ring full was evicted.
fn stalled(limit: Duration) -> String {
    format!(
        "stopped reading its completions for {} s (its completion ring stayed full); a client must read what it submits",
        limit.as_secs_f64()
    )
}

impl SessionState {
    /// Runs the client's commands until the session ends: stopped, evicted, culprit of a
    /// fault, or a client that broke the ring protocol.
    pub(super) fn serve(&mut self) -> SessionEnd {
        // How long the ring has been empty (the clock read every few looks).
        let mut idle = SpinClock::new();
        // When the batch under way began: it goes on while the client's commands keep coming;
        // and when its last command ended (a command's latency runs from there: one read of
        // the clock per command, none before it).
        let mut batch_started: Option<Instant> = None;
        let mut last_end = Instant::now();
        // The device stays awake for this thread's next request as long as this thread does
        // for its client's, and at its CPU priority.
        let mut pace_told: Option<Pace> = None;
        let mut rhythm = Rhythm::new(self.pacing.spin, self.pacing.spin_ceiling);
        loop {
            if let Some(end) = self.ended.take() {
                return end;
            }
            if self.health.epoch() != self.epoch
                && let Some(end) = self.after_reset()
            {
                return end;
            }
            if self.info.stopping() {
                return self
                    .info
                    .eviction()
                    .map_or(SessionEnd::Stopped, SessionEnd::Evicted);
            }
            self.expire_lease();
            let available = match self.rings.submissions.available() {
                Ok(n) => n,
                Err(e) => return SessionEnd::ProtocolViolation(e.to_string()),
            };
            if available > 0 {
                self.info
                    .counters
                    .queue_depth
                    .store(available as u64, Ordering::Relaxed);
                if batch_started.is_none() {
                    let now = Instant::now();
                    rhythm.note(now.duration_since(last_end));
                    last_end = now;
                    batch_started = Some(last_end);
                }
                for _ in 0..available {
                    if self.health.epoch() != self.epoch || self.ended.is_some() {
                        break; // stop touching the device: the next loop parks
                    }
                    let entry = self.rings.submissions.pop();
                    // Each slot goes back at once: a client that outruns the broker waits for
                    // one free slot, never for a group (it would sleep meanwhile).
                    self.rings.submissions.release();
                    let completion = self.process(&entry);
                    if let Some(completion) = completion
                        && let Err(end) = self.complete(completion)
                    {
                        return end;
                    }
                    let finished = Instant::now();
                    if let Some(h) = &mut self.latency {
                        let took = finished.duration_since(last_end).as_nanos() as u64;
                        let _ = h.record(took.max(1));
                    }
                    last_end = finished;
                    crate::timeline::point("data", "completed");
                    // A long batch (slow commands, a full ring) still shows in status. The
                    // latency's clock read serves here too: none more per command.
                    if batch_started.is_some_and(|at| finished.duration_since(at) >= ACCOUNT_EVERY)
                    {
                        self.account(false);
                        self.publish_latency();
                        batch_started = Some(finished);
                    }
                }
                // More already came (a client that went on as soon as its sync was answered):
                // the batch goes on, and its end's bookkeeping waits until the ring is empty,
                // unless someone waits on it.
                if !self.batch_end_awaited()
                    && matches!(self.rings.submissions.available(), Ok(n) if n > 0)
                {
                    continue;
                }
                self.info.counters.queue_depth.store(0, Ordering::Relaxed);
                self.publish_latency();
                self.end_of_batch();
                crate::timeline::point("data", "batch_end");
                batch_started = None;
                idle.restart();
                continue;
            }
            let spun = idle.spun();
            if self.unaccounted && spun >= ACCOUNT_IDLE {
                self.account(false);
            }
            let pace = self.pace(&rhythm);
            if pace_told != Some(pace) {
                crate::thread_nice::follow(pace.nice);
                self.device.pace_hint(pace);
                self.info.counters.spin_ns.store(
                    pace.spin.as_nanos().min(u128::from(u64::MAX)) as u64,
                    Ordering::Relaxed,
                );
                pace_told = Some(pace);
            }
            if spun < pace.spin && gpushare_protocol::wake::spin_turn(spun) {
                continue;
            }
            self.sleep();
            // Awake again, most likely for a request: wake the device up beside this thread
            // rather than after it.
            self.device.pace_hint(pace);
            idle.restart();
        }
    }

    /// How long to spin on an empty ring (longer for a high-priority client, and for one
    /// whose requests have been coming close together) and at what CPU priority (better for
    /// a high-priority client, `--high-nice`); its class can change live.
    fn pace(&self, rhythm: &Rhythm) -> Pace {
        if self.info.class() == gpushare_protocol::PriorityClass::High {
            Pace {
                spin: self.pacing.high_spin,
                nice: self.pacing.high_nice,
            }
        } else {
            Pace {
                spin: rhythm.spin(),
                nice: 0,
            }
        }
    }

    /// Nothing for a while: closes the measurements, then sleeps until the client signals
    /// (it will, because it sees NEED_WAKEUP after publishing).
    fn sleep(&mut self) {
        self.account(true);
        self.rings.submissions.prepare_sleep();
        // Measurements still in flight: wake up soon to read them, so status stays true.
        let recheck = if !self.granted.is_empty() {
            Some(
                self.dispatch
                    .granted_recheck()
                    .map_or(MEASURE_RECHECK, |r| r.min(MEASURE_RECHECK)),
            )
        } else {
            self.streams
                .values()
                .any(|s| self.device.measuring(&s.stream))
                .then_some(MEASURE_RECHECK)
        };
        let timeout = match self.lease_left() {
            Some(left) => Some(left.min(recheck.unwrap_or(MEASURE_RECHECK))),
            None => recheck,
        };
        match self.rings.submissions.available() {
            Ok(0) if !self.info.stopping() => self.info.submit_wake().wait(timeout),
            _ => {}
        }
        self.rings.submissions.finish_sleep();
    }

    /// Publishes the latency percentiles every 100 ms and starts a fresh window, so status
    /// shows recent behaviour.
    fn publish_latency(&mut self) {
        if self.latency_published.elapsed() < Duration::from_millis(100) {
            return;
        }
        self.latency_published = Instant::now();
        if let Some(h) = &mut self.latency
            && !h.is_empty()
        {
            let c = &self.info.counters;
            c.latency_p50_ns
                .store(h.value_at_quantile(0.5), Ordering::Relaxed);
            c.latency_p99_ns
                .store(h.value_at_quantile(0.99), Ordering::Relaxed);
            h.reset();
        }
    }

    /// Tells the client that the command being run succeeded, before the rest of its
    /// bookkeeping runs (a wait that saw its work finish: on an H200 that bookkeeping and the
    /// completion after it were 0.7 µs of a launch and its sync's round trip). Once only; the
    /// command must not fail after it.
    pub(super) fn answer_early(&mut self) {
        let Some(user_tag) = self.answering.take() else {
            return;
        };
        let entry = CompletionEntry {
            user_tag,
            status: 0,
            flags: 0,
            result: 0,
            result2: 0,
        };
        if let Err(end) = self.complete(entry) {
            self.ended = Some(end);
        }
    }

    /// Whether someone waits on a batch's end: the scheduler on granted kernels, other
    /// suspects on this one's turn.
    fn batch_end_awaited(&self) -> bool {
        self.holding_turn || !self.granted.is_empty()
    }

    /// After a batch of commands: its accounting now when something waits on it (granted
    /// kernels for the scheduler, a suspect's turn) or [`ACCOUNT_EVERY`] has passed, else
    /// once the client pauses for [`ACCOUNT_IDLE`]. Run after every batch it was on the
    /// client's next command's path: 0.6 µs of each launch and sync on an H200.
    fn end_of_batch(&mut self) {
        if self.batch_end_awaited() || self.accounted_at.elapsed() >= ACCOUNT_EVERY {
            self.account(false);
        } else {
            self.unaccounted = true;
        }
    }

    /// Publishes one completion, waiting (bounded, interruptible) while the ring is full.
    ///
    /// A full ring means the client is not reading its completions: only it waits, and it
    /// holds nothing in the scheduler meanwhile (its kernels that finished are reported
    /// done, and an open governed lease expires as usual), so that nobody waits on it. If it
    /// leaves the ring full for the stall limit it is evicted, and told why.
    fn complete(&mut self, entry: CompletionEntry) -> Result<(), SessionEnd> {
        let mut full_since = None;
        loop {
            match self.rings.completions.try_push(entry) {
                Ok(true) => break,
                Ok(false) => {
                    let since = *full_since.get_or_insert_with(Instant::now);
                    self.reap_granted(true);
                    self.expire_lease();
                    if since.elapsed() >= self.pacing.stall_limit {
                        let reason = stalled(self.pacing.stall_limit);
                        tracing::warn!(%reason, "evicting a client that does not read");
                        self.info.evict(reason.clone());
                        return Err(SessionEnd::Evicted(reason));
                    }
                    self.rings.completions.wait_for_room();
                    self.park_if_resetting();
                    let still_full = matches!(self.rings.completions.free_slots(), Ok(0));
                    if still_full && !self.info.stopping() {
                        let wait = self
                            .lease_left()
                            .map_or(CQ_FULL_RECHECK, |left| left.min(CQ_FULL_RECHECK));
                        self.info.submit_wake().wait(Some(wait));
                    }
                    self.rings.completions.finish_wait_for_room();
                    if self.info.stopping() {
                        return Err(SessionEnd::Stopped);
                    }
                }
                Err(e) => return Err(SessionEnd::ProtocolViolation(e.to_string())),
            }
        }
        self.rings.completions.publish();
        if self.rings.completions.consumer_needs_wakeup() {
            self.complete_wake.signal();
        }
        Ok(())
    }

    /// Nothing of the session's left on the device: the watchdog's in-flight stamp goes (the
    /// next work queued sets it again).
    pub(super) fn unstamp_if_off_the_device(&mut self) {
        let device = &self.device;
        if self
            .streams
            .values_mut()
            .any(|s| device.stream_busy(&mut s.stream))
        {
            return;
        }
        let watch = &self.info.fault_watch;
        watch
            .progress
            .store(self.health.now_ns(), Ordering::Release);
        watch.busy_since.store(0, Ordering::Release);
    }

    /// Device time measured for the client's work: into its counters (what `status` shows)
    /// and to the scheduler (for a policy that charges it).
    pub(super) fn charge_device_time(&self, ns: u64) {
        self.info.counters.add_gpu_time(ns);
        self.dispatch.device_time(self.info.id, ns);
    }

    /// Ends the batch on every stream that got work (every stream when the client went
    /// `idle`) and charges the device time measured so far.
    pub(super) fn account(&mut self, idle: bool) {
        self.unaccounted = false;
        self.accounted_at = Instant::now();
        self.reap_granted(idle);
        if self.holding_turn {
            // On probation the batch finishes before another suspect's work may start.
            for slot in self.streams.values_mut() {
                if slot.touched {
                    let _ = self.device.sync_stream(&mut slot.stream);
                }
            }
        }
        let mut spent: u64 = 0;
        for slot in self.streams.values_mut() {
            if slot.touched || idle {
                self.device.end_batch(&mut slot.stream, idle);
                slot.touched = false;
            }
            spent = spent.saturating_add(self.device.take_busy_ns(&mut slot.stream));
        }
        self.charge_device_time(spent);
        let watch = &self.info.fault_watch;
        if watch.busy_since.load(Ordering::Relaxed) != 0 {
            let now = self.health.now_ns();
            if spent > 0 {
                watch.progress.store(now, Ordering::Release);
            }
            if idle || self.holding_turn {
                self.unstamp_if_off_the_device();
            }
        }
        if self.holding_turn {
            self.health.release_turn(self.info.id);
            self.holding_turn = false;
        }
    }
}

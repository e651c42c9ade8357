//! Device resets as one session lives through them: what a reset took, what the client is
//! told, and how commands naming lost handles fail (with `DeviceReset`, once) rather than
//! with a bad handle or a claim that lost work ran. Also the in-flight bookkeeping that tells
//! the fault watchdog whether this session had work on the GPU when a fault came.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::time::Duration;

use gpushare_protocol::control::{BrokerMessage, LostState};
use gpushare_protocol::text::Printable;
use gpushare_protocol::{Command, DevicePtr, ErrorCode, EventId, StreamId};

use super::replay::NotStarted;
use super::{SessionEnd, SessionState, StreamSlot};
use crate::gpu::health::Verdict;

/// Handles a session lost in device resets.
#[derive(Default)]
pub(super) struct Lost {
    buffers: BTreeMap<DevicePtr, u64>,
    streams: HashSet<StreamId>,
    events: HashSet<EventId>,
    functions: HashSet<u64>,
    /// Streams with work not yet synchronized when a reset took it: the next sync that
    /// covers one fails with `DeviceReset` (once), rather than saying work ran that never did.
    unsynced: BTreeSet<StreamId>,
    /// The same after a reset that kept the client's state: only the work is lost, and the
    /// next sync that covers it fails with `WorkLost` (once). Events recorded after it too.
    work: BTreeSet<StreamId>,
    /// Events recorded after lost work, and the stream whose work it was.
    work_events: HashMap<EventId, StreamId>,
    /// Streams of `work` whose later commands were refused: a refused command's error tells
    /// the client, so the sync that ends the refusals does not say it again.
    refused: BTreeSet<StreamId>,
}

impl Lost {
    fn has_ptr(&self, ptr: DevicePtr) -> bool {
        self.buffers
            .range(..=ptr)
            .next_back()
            .is_some_and(|(&base, &len)| ptr < base.saturating_add(len))
    }

    /// Whether a command that failed with a bad handle or pointer named something lost.
    fn named_by(&self, cmd: &Command) -> bool {
        if cmd.stream().is_some_and(|s| self.streams.contains(&s)) {
            return true;
        }
        let ptrs: Vec<DevicePtr> = match *cmd {
            Command::Free { ptr } => vec![ptr],
            Command::CopyHtoD { dst, .. } | Command::Memset { dst, .. } => vec![dst],
            Command::CopyDtoH { src, .. } => vec![src],
            Command::CopyDtoD { src, dst, .. } => vec![src, dst],
            Command::Launch { kernel, .. } => kernel
                .operands()
                .map(|ops| ops.iter().map(|o| o.ptr).collect())
                .unwrap_or_default(),
            Command::LaunchModule { launch, .. } => {
                return self.functions.contains(&launch.function);
            }
            Command::StreamSync { stream } | Command::StreamDestroy { stream } => {
                return self.streams.contains(&stream);
            }
            Command::EventRecord { event, .. }
            | Command::EventQuery { event }
            | Command::EventSync { event }
            | Command::EventDestroy { event } => return self.events.contains(&event),
            Command::EventElapsed { start, end } => {
                return self.events.contains(&start) || self.events.contains(&end);
            }
            _ => vec![],
        };
        ptrs.into_iter().any(|p| self.has_ptr(p))
    }

    /// Forgets the lost handle that `cmd` releases: releasing what a reset took already is
    /// done, not an error. False when `cmd` releases nothing.
    fn release(&mut self, cmd: &Command) -> bool {
        match *cmd {
            Command::Free { ptr } => {
                self.buffers.remove(&ptr);
            }
            Command::StreamDestroy { stream } => {
                self.streams.remove(&stream);
                self.unsynced.remove(&stream);
            }
            Command::EventDestroy { event } => {
                self.events.remove(&event);
            }
            _ => return false,
        }
        true
    }

    /// Whether a reset took unsynchronized work of `stream` that no sync has reported yet;
    /// after this, none has to.
    pub(super) fn take_unsynced(&mut self, stream: StreamId) -> bool {
        self.unsynced.remove(&stream)
    }

    /// Whether a reset took unsynchronized work of any stream that no sync has reported yet;
    /// after this, none has to.
    pub(super) fn take_any_unsynced(&mut self) -> bool {
        let any = !self.unsynced.is_empty();
        self.unsynced.clear();
        any
    }

    /// Whether a reset took work of `stream` that no sync has reported yet (its state kept).
    /// Once said, an event recorded after it need not say it again.
    /// Whether a command on `stream` is refused: the stream lost work to a reset and no sync
    /// has covered it since (what follows would run on what the lost work never wrote).
    /// The refusal's error tells the client of the loss.
    pub(super) fn refuse(&mut self, stream: StreamId) -> bool {
        let refuse = self.work.contains(&stream);
        if refuse {
            self.refused.insert(stream);
        }
        refuse
    }

    /// Ends `stream`'s lost work at a sync that covers it; whether the sync must say so (no
    /// refused command said it already). Told of it, the client knows it lost work: the
    /// losses of its other streams end too (what it queues next, it queued knowing).
    pub(super) fn take_work(&mut self, stream: StreamId) -> bool {
        let taken = self.work.contains(&stream);
        let told = self.refused.contains(&stream);
        if taken {
            self.told_all();
        }
        taken && !told
    }

    /// An event recorded on `stream`: if the stream's lost work is not reported yet, a sync
    /// on the event covers it and reports it.
    pub(super) fn note_record(&mut self, event: EventId, stream: StreamId) {
        if self.work.contains(&stream) {
            self.work_events.insert(event, stream);
        }
    }

    /// The client was told that a reset took its work, by a command it waits for: commands
    /// it queues from now on, on any stream, run (it may have caught the error and gone on).
    pub(super) fn told_all(&mut self) {
        self.work.clear();
        self.work_events.clear();
        self.refused.clear();
    }

    /// Whether a reset took work of any stream that no sync has reported yet.
    pub(super) fn take_any_work(&mut self) -> bool {
        let any = self.work.iter().any(|s| !self.refused.contains(s));
        self.told_all();
        any
    }

    /// Whether event `event` was recorded after work a reset took, not reported yet (its
    /// stream's sync need not say it again then).
    pub(super) fn take_work_event(&mut self, event: EventId) -> bool {
        match self.work_events.remove(&event) {
            Some(stream) => self.take_work(stream),
            None => false,
        }
    }

    /// Memory lost in `[start, end)` is there again (a client placing it anew).
    pub(super) fn forget_buffers_in(&mut self, start: DevicePtr, end: DevicePtr) {
        self.buffers
            .retain(|&base, &mut len| base.saturating_add(len) <= start || base >= end);
    }
}

impl SessionState {
    /// What a failed command tells the client when a reset is behind the failure: a command
    /// naming something a reset took fails with `DeviceReset` (or, releasing it, succeeds),
    /// and a sticky device error gets the context reset and is reported the same way.
    pub(super) fn on_failure(
        &mut self,
        cmd: Command,
        code: ErrorCode,
    ) -> Result<(u64, u64), ErrorCode> {
        match code {
            ErrorCode::InvalidPointer | ErrorCode::InvalidHandle if self.lost.named_by(&cmd) => {
                if self.lost.release(&cmd) {
                    Ok((0, 0))
                } else {
                    Err(ErrorCode::DeviceReset)
                }
            }
            ErrorCode::DeviceError | ErrorCode::LaunchFailed => self.on_device_failure(cmd, code),
            // Cut short by a reset under way (the link was cut).
            ErrorCode::DeviceReset if self.health.epoch() != self.epoch => {
                self.on_device_failure(cmd, code)
            }
            _ => Err(code),
        }
    }

    /// A command failed on the device, or was cut short by a reset: if a reset is behind
    /// it, the command runs again where that is safe, else fails as lost to the reset.
    fn on_device_failure(
        &mut self,
        cmd: Command,
        code: ErrorCode,
    ) -> Result<(u64, u64), ErrorCode> {
        // A reset already under way took the command: a device replaced in place (a new
        // worker) no longer shows the fault, so the epoch is what tells.
        let lost = self.health.epoch() != self.epoch
            || match self.device.fault() {
                // A sticky error poisons everyone's context: get it reset now.
                Some(what) => {
                    self.health.report_fault(self.info.id, self.epoch, what);
                    self.health
                        .wait_for_recovery_start(self.epoch, Duration::from_secs(2))
                }
                None => self.health.epoch() != self.epoch,
            };
        if !lost {
            return Err(code);
        }
        // Where the client's state was kept and the command can run again, it does, once
        // the client's work is sorted out.
        if let Some(again) = self.run_again_after_reset(cmd, code) {
            return again;
        }
        // Lost to the fault, like everything else the reset takes: say so, once the reset
        // says whether the client's state was kept (then only the work was lost).
        self.told_lost(&cmd);
        Err(self.reset_error())
    }

    /// This command's failure tells the client that the reset took the work of the streams
    /// it covers: a later sync need not say so again.
    fn told_lost(&mut self, cmd: &Command) {
        let stream = match *cmd {
            Command::ClientSync => {
                for slot in self.streams.values_mut() {
                    slot.unsynced = false;
                }
                return;
            }
            Command::StreamSync { stream } => Some(stream),
            Command::EventSync { event } => self.event_marks.get(&event).map(|&(s, _)| s),
            ref other => other.stream(),
        };
        if let Some(slot) = stream.and_then(|s| self.streams.get_mut(&s)) {
            slot.unsynced = false;
        }
    }

    /// After a successful synchronization: work made progress, and when nothing is left on
    /// any stream the session has no work in flight (so a fault right after is not pinned on
    /// it).
    pub(super) fn settle_in_flight(&mut self) {
        let watch = &self.info.fault_watch;
        watch
            .progress
            .store(self.health.now_ns(), Ordering::Release);
        // No driver call here: this is on every synchronization's path.
        if watch.busy_since.load(Ordering::Relaxed) != 0
            && !self.streams.values().any(|s| s.unsynced)
        {
            watch.busy_since.store(0, Ordering::Release);
            watch.clear_marks();
        }
    }

    /// An event the client saw complete: the work it was recorded after is done, so a
    /// stream with nothing submitted since is synchronized.
    pub(super) fn settle_marked(&mut self, event: EventId) {
        if let Some(&(stream, submitted)) = self.event_marks.get(&event)
            && let Some(slot) = self.streams.get_mut(&stream)
            && slot.submitted == submitted
        {
            slot.unsynced = false;
            self.device.settled(&mut slot.stream);
            self.granted_seen_finished(stream);
            self.publish_mark(stream);
        }
    }

    /// Parks (once) while a device reset is under way, keeping the outcome for
    /// [`SessionState::after_reset`].
    /// What a command a reset took (or kept from running) fails with, once the reset says
    /// whether the client's state was kept: `WorkLost` if it was, else `DeviceReset`.
    pub(super) fn reset_error(&mut self) -> ErrorCode {
        self.park_if_resetting();
        match self.verdict {
            Some(Verdict::Survived(_)) => ErrorCode::WorkLost,
            _ => ErrorCode::DeviceReset,
        }
    }

    pub(super) fn park_if_resetting(&mut self) {
        if self.health.epoch() != self.epoch && self.verdict.is_none() {
            self.verdict = Some(self.health.park(self.info.id));
        }
    }

    /// Forgets the streams, events and host regions of a context that no longer exists:
    /// its handles are inert, so they are dropped rather than destroyed.
    pub(super) fn forget_dead_context(&mut self) {
        self.forget_legacy();
        self.release_hosts(false);
        self.streams.clear();
        self.events.clear();
        self.event_marks.clear();
    }

    /// After a device reset: forgets every (now inert) handle, sets up a fresh default
    /// stream, and tells the client what it lost — or ends the session of the culprit.
    pub(super) fn after_reset(&mut self) -> Option<SessionEnd> {
        let verdict = match self.verdict.take() {
            Some(v) => v,
            None => self.health.park(self.info.id),
        };
        self.epoch = self.health.epoch();
        self.holding_turn = false;
        self.forget_granted();
        self.dispatch.remove_client(self.info.id);
        self.register_with_scheduler();
        self.governed.forget_lease();
        self.info.fault_watch.busy_since.store(0, Ordering::Release);
        self.info.fault_watch.clear_marks();
        for slot in self.streams.values_mut() {
            slot.published = None;
        }
        match verdict {
            // Its memory and handles live on in the new context: the session's end releases
            // them as ever.
            Verdict::Culprit(reason) => {
                self.info.account().note_fault();
                Some(SessionEnd::Evicted(reason))
            }
            Verdict::Survived(what) => match self.survive() {
                Ok(again) => {
                    self.probation_until = self.health.probation_until(self.info.id);
                    self.queue_again(again);
                    None
                }
                Err(why) => {
                    tracing::warn!(%why, "device reset: this client's state cannot be kept");
                    self.release_live_state();
                    self.lose_state(format!(
                        "the GPU was reset after a fault ({what}), and this program's state could not be kept: {why}"
                    ))
                }
            },
            Verdict::Lost(reason) => self.lose_state(reason),
        }
    }

    /// After a reset that kept every client's memory and handles: work on the GPU that may
    /// have run in part is reported lost at its stream's next synchronization (as are events
    /// recorded after it); work that never started is returned, to queue again; nothing else
    /// changes. Fails where the client's state cannot be kept (a module global it looked up
    /// moved).
    fn survive(&mut self) -> Result<NotStarted, String> {
        self.globals_kept()?;
        // What the old context had registered, the new one registers again.
        self.register_arena().map_err(|e| e.to_string())?;
        self.register_hosts_again()?;
        let (again, lost) = self.sort_out_work();
        if !lost.is_empty() {
            tracing::info!(
                streams = lost.len(),
                "device reset: the work on the GPU was lost; memory and handles kept"
            );
        }
        self.lose_work(lost);
        Ok(again)
    }

    /// The work of `streams` is lost: their next synchronization (or an event recorded
    /// after it) says so, once.
    pub(super) fn lose_work(&mut self, streams: impl IntoIterator<Item = StreamId>) {
        for stream in streams {
            for (&event, &(s, _)) in &self.event_marks {
                if s == stream {
                    self.lost.work_events.insert(event, stream);
                }
            }
            if let Some(slot) = self.streams.get_mut(&stream) {
                slot.unsynced = false;
            }
            self.lost.work.insert(stream);
        }
    }

    /// Whether the module globals the client looked up are where they were in the new
    /// context (the module was loaded again there): their addresses are in its hands. Their
    /// contents start again from the image, so a client that wrote into one loses its state.
    fn globals_kept(&self) -> Result<(), String> {
        let modules = self
            .modules
            .lock()
            .map_err(|_| "its module table is poisoned".to_string())?;
        let globals = modules.globals();
        if globals.is_empty() {
            return Ok(());
        }
        if modules.globals_written() {
            return Err("it wrote into a module global, which the new context has afresh".into());
        }
        for (base, size, module, name) in globals {
            let m = modules
                .module(module)
                .ok_or_else(|| format!("the module of global `{}` is gone", Printable(&name)))?;
            let id = self.device.id(&*m).map_err(|e| e.to_string())?;
            let (now, now_size) = self
                .device
                .call(
                    crate::device::Call::ModuleGlobal { module: id },
                    name.as_bytes(),
                )
                .and_then(crate::device::Reply::pair)
                .map_err(|e| format!("global `{}`: {e}", Printable(&name)))?;
            if (now, now_size) != (base, size) {
                return Err(format!(
                    "module global `{}` is at {now:#x} in the new context, not {base:#x}",
                    Printable(&name)
                ));
            }
        }
        Ok(())
    }

    /// Registers the client's shared host memory with the new context, where device code
    /// must still reach it by the same pointer.
    fn register_hosts_again(&mut self) -> Result<(), String> {
        let hosts: Vec<(crate::shm::Span, u64)> = self
            .info
            .hosts
            .lock()
            .map(|h| h.spans())
            .map_err(|_| "its host memory table is poisoned".to_string())?;
        for (span, device_ptr) in hosts {
            let got = self
                .device
                .call(crate::device::Call::RegisterHost { span }, &[])
                .and_then(crate::device::Reply::value)
                .map_err(|e| format!("its host memory cannot be registered again: {e}"))?;
            if got != device_ptr {
                return Err(format!(
                    "its host memory is at {got:#x} on the device now, not {device_ptr:#x}"
                ));
            }
        }
        Ok(())
    }

    /// Gives back memory and handles that outlived the reset but that the client is told it
    /// lost.
    fn release_live_state(&mut self) {
        for (_, slot) in self.streams.drain() {
            self.device.destroy_stream(slot.stream);
        }
        for (ptr, _) in self.allocations.iter().collect::<Vec<_>>() {
            let _ = self.device.free(ptr);
        }
        self.release_vmm();
    }

    /// Forgets every (now inert) handle, sets up a fresh default stream, and tells the client
    /// what it lost.
    fn lose_state(&mut self, reason: String) -> Option<SessionEnd> {
        let mut lost = LostState {
            buffers: self.allocations.iter().collect(),
            streams: self.streams.keys().copied().filter(|&s| s != 0).collect(),
            events: self.events.keys().copied().collect(),
            modules: Vec::new(),
        };
        lost.streams.sort_unstable();
        lost.events.sort_unstable();
        self.lost.unsynced.extend(
            self.streams
                .iter()
                .filter(|(_, slot)| slot.unsynced)
                .map(|(&id, _)| id),
        );
        let (modules, functions) = self
            .modules
            .lock()
            .map(|mut m| m.take_ids())
            .unwrap_or_default();
        lost.modules = modules;
        self.forget_ipc();
        self.lost.buffers.extend(self.allocations.take());
        let mapped: Vec<_> = self.vmm.mappings().collect();
        self.lost.buffers.extend(mapped);
        self.forget_vmm();
        self.lost.streams.extend(lost.streams.iter().copied());
        self.lost.events.extend(lost.events.iter().copied());
        self.lost.functions.extend(functions);
        self.forget_dead_context();
        self.spare_events.clear();
        self.placed_charges.clear();
        let c = &self.info.counters;
        // A governed client's memory is in its own context, which the reset did not touch.
        self.info.set_memory_used(self.governed.reserved());
        let rebuilt = self
            .register_arena()
            .and_then(|()| self.device.create_stream(self.info.grant().class));
        match rebuilt {
            Ok(stream) => {
                self.streams.insert(0, StreamSlot::new(stream));
                c.streams.store(1, Ordering::Relaxed);
            }
            Err(e) => {
                return Some(SessionEnd::Evicted(format!(
                    "the GPU was reset and this session could not be set up again: {e}"
                )));
            }
        }
        self.probation_until = self.health.probation_until(self.info.id);
        tracing::info!(
            buffers = lost.buffers.len(),
            streams = lost.streams.len(),
            events = lost.events.len(),
            modules = lost.modules.len(),
            "device reset: client state lost"
        );
        self.info.post_notice(BrokerMessage::DeviceReset {
            gpu: self.info.gpu,
            reason,
            lost,
        });
        None
    }
}

#[cfg(test)]
mod tests;

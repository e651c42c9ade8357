//! After a fault that kept the client's state: its work that never started is queued again in
//! the order it came (`device::progress` tells which), the rest is reported lost; and a
//! command the fault cut short that can safely run again (a wait, a copy, or work never sent)
//! runs again once the client's work is sorted out, rather than failing.

use std::collections::BTreeSet;

use gpushare_protocol::{Command, ErrorCode, StreamId};

use super::SessionState;
use crate::device::{Fate, Kept, drop_dependents};
use crate::gpu::health::Verdict;

/// Work of a session's streams that a fault found not started, by stream.
pub(super) type NotStarted = Vec<(StreamId, Vec<Kept>)>;

/// Whether `cmd`, failed because a reset took the device (`code`), may run again in the
/// context that took over: running it twice cannot give a wrong result. Waits and queries
/// only wait; copies and memsets write what they would have written; anything refused
/// before it was sent (`DeviceReset`: the link was cut) never ran.
fn may_run_again(cmd: &Command, code: ErrorCode) -> bool {
    waited_for(cmd)
        || matches!(
            cmd,
            Command::CopyHtoD { .. }
                | Command::CopyDtoH { .. }
                | Command::CopyDtoD { .. }
                | Command::CopyHtoDHost { .. }
                | Command::CopyDtoHHost { .. }
                | Command::Memset { .. }
                | Command::MemsetWide { .. }
        )
        || (code == ErrorCode::DeviceReset && cmd.stream().is_some())
}

/// Whether a client waits for this command's answer whatever its library: a synchronization,
/// a query, or a copy that is done when it returns.
pub(super) fn waited_for(cmd: &Command) -> bool {
    matches!(
        cmd,
        Command::StreamSync { .. }
            | Command::EventSync { .. }
            | Command::ClientSync
            | Command::StreamQuery { .. }
            | Command::EventQuery { .. }
            | Command::CopyHtoDStaged { .. }
            | Command::CopyDtoHStaged { .. }
    )
}

impl SessionState {
    /// Sorts out the work of streams not synchronized when the fault came: returns what of
    /// it never started, and the streams whose work may have run (lost). Work that waits on
    /// an event recorded in lost work is lost too.
    pub(super) fn sort_out_work(&mut self) -> (NotStarted, Vec<StreamId>) {
        let mut again = Vec::new();
        let mut lost = Vec::new();
        for (&id, slot) in self.streams.iter_mut() {
            let fate = self.device.fate(&mut slot.stream);
            if slot.unsynced {
                match fate {
                    Fate::NotStarted(calls) => again.push((id, calls)),
                    Fate::Lost(calls) => lost.push((id, calls)),
                    Fate::Idle => lost.push((id, Vec::new())),
                }
            }
            slot.unsynced = false;
            self.device.forget_work(&mut slot.stream);
        }
        drop_dependents(&mut again, &mut lost);
        (again, lost.into_iter().map(|(id, _)| id).collect())
    }

    /// Queues `work` again, in the order it first came. A suspect on probation takes its
    /// turn first, as for any work; a stream whose work cannot all be queued again has it
    /// reported lost.
    pub(super) fn queue_again(&mut self, work: NotStarted) {
        if work.is_empty() {
            return;
        }
        let streams: Vec<StreamId> = work.iter().map(|(id, _)| *id).collect();
        if !self.take_probation_turn() {
            // Another reset began: this work goes with it.
            self.lose_work(streams);
            return;
        }
        let mut calls: Vec<(StreamId, Kept)> = work
            .into_iter()
            .flat_map(|(id, calls)| calls.into_iter().map(move |k| (id, k)))
            .collect();
        calls.sort_by_key(|(_, k)| k.seq);
        let total = calls.len();
        let mut failed = BTreeSet::new();
        for (id, kept) in calls {
            if failed.contains(&id) {
                continue;
            }
            let Some(slot) = self.streams.get_mut(&id) else {
                continue;
            };
            match self
                .device
                .requeue(&mut slot.stream, kept.call, &kept.payload)
            {
                Ok(()) => {
                    slot.unsynced = true;
                    slot.touched = true;
                }
                Err(e) => {
                    tracing::warn!(stream = id, error = %e, "device reset: work that had not started cannot be queued again; it is reported lost");
                    failed.insert(id);
                }
            }
        }
        self.health.mark_busy(&self.info.fault_watch);
        for &id in &streams {
            self.publish_mark(id);
        }
        tracing::info!(
            calls = total,
            streams = streams.len(),
            "device reset: work that had not started queued again"
        );
        self.lose_work(failed);
        // On probation the turn goes back once this work has finished, as after any batch:
        // a client that goes quiet now must not keep the other suspects waiting.
        if self.holding_turn {
            self.account(true);
        }
    }

    /// Tells the fault watchdog where `stream`'s unfinished work begins, when that changed.
    pub(super) fn publish_mark(&mut self, stream: StreamId) {
        let Some(slot) = self.streams.get_mut(&stream) else {
            return;
        };
        let mark = self.device.mark(&slot.stream);
        if mark != slot.published {
            slot.published = mark;
            let mut marks = self
                .info
                .fault_watch
                .marks
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            match mark {
                Some(m) => marks.insert(u64::from(stream), m),
                None => marks.remove(&u64::from(stream)),
            };
        }
    }

    /// A command that failed because a reset took the device: where the client's state was
    /// kept and the command may run again, sorts out the client's work now and runs it again
    /// (`None` otherwise: it fails as before).
    pub(super) fn run_again_after_reset(
        &mut self,
        cmd: Command,
        code: ErrorCode,
    ) -> Option<Result<(u64, u64), ErrorCode>> {
        if !may_run_again(&cmd, code) {
            return None;
        }
        self.park_if_resetting();
        if !matches!(self.verdict, Some(Verdict::Survived(_))) {
            return None;
        }
        if let Some(end) = self.after_reset() {
            self.ended = Some(end);
            return Some(Err(ErrorCode::DeviceReset));
        }
        Some(self.execute(cmd))
    }
}

#[cfg(test)]
mod tests {
    use gpushare_protocol::Kernel;

    use super::*;

    #[test]
    fn only_what_cannot_go_wrong_twice_runs_again() {
        let launch = Command::Launch {
            stream: 0,
            kernel: Kernel::FillF32 {
                dst: 0,
                n: 1,
                value: 0.0,
            },
        };
        assert!(
            !may_run_again(&launch, ErrorCode::DeviceError),
            "it may have run"
        );
        assert!(may_run_again(&launch, ErrorCode::DeviceReset), "never sent");
        assert!(may_run_again(
            &Command::StreamSync { stream: 0 },
            ErrorCode::DeviceError
        ));
        assert!(may_run_again(&Command::ClientSync, ErrorCode::DeviceError));
        let copy = Command::CopyDtoD {
            stream: 0,
            src: 0,
            dst: 8,
            len: 8,
        };
        assert!(may_run_again(&copy, ErrorCode::DeviceError));
        assert!(!may_run_again(
            &Command::Free { ptr: 0 },
            ErrorCode::DeviceReset
        ));
    }
}

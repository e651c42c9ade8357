//! Which queued work a faulted context never started, so that it can run in the context that
//! takes over instead of being reported lost.
//!
//! Each stream has a 32-bit slot in a page of host memory that gpushared makes and shares
//! with every worker of the device. When work is queued on a stream that was known idle (an
//! *episode* begins), its first call carries a fresh *opening* value ([`Call::Opening`]),
//! which the worker writes into the slot from its CPU once it has passed that call to the
//! device, unless a faulted context refused it.
//! The episode's calls are kept until a synchronization says they finished. A call that waits
//! for the stream (a synchronization, a copy into the client's memory) *closes* the episode:
//! once it has seen everything before it finish, it writes a *closing* value the same way.
//! When a fault takes the context, the slot says what became of the episode: the closing
//! value, all of it finished (nothing lost); the opening value, some of it may have run in
//! part (lost, never run twice: an in-place update run twice is a wrong result); neither, the
//! device never took it (a call refused because the context had faulted, or never sent):
//! none of it ran, and all of it can be queued again in order. A staged upload (its source
//! read at once, from memory the client reuses) is kept with its bytes, and queued again from
//! a staging area of the page.
//!
//! Both values used to be stream writes (`cuStreamWriteValue32`), written when the stream got
//! there. They cost a launch and its synchronization 3.2 µs of 7.5 over direct CUDA on an
//! H200, and told no more: an H200 goes on running the other streams of a context for the
//! 100–160 ms between an illegal address and its driver seeing it, so work queued in that time
//! was found started either way (docs/benchmarks.md, "Issue 34").

use std::collections::HashSet;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::call::{Call, GateWord, Handle, ProgressValue, Span};
use super::gate::{Gate, gate_word};
use super::handles::Stream;
use super::link::Link;
use super::{DeviceError, DeviceResult};
use crate::shm::{ArenaSlice, HostRegion, sealed_memfd};

/// Streams the page has slots for (every stream of every session on the device).
const SLOTS: u32 = 16 * 1024;
/// The slot that is no stream's: the priority gate ([`Gate`]).
pub(super) const GATE_SLOT: u32 = 0;
/// After the slots: where kept uploads are put to queue them again, one at a time. A larger
/// staged upload is not kept (its stream's work is lost at a fault, as before): keeping
/// costs a copy of its bytes on every upload.
const STAGING: u64 = 128 << 10;
/// An episode kept for queuing again holds at most this many calls and payload bytes; past
/// that it is reported lost at a fault, as before (a client that never synchronizes a
/// stream must not make gpushared keep its work forever).
const MAX_CALLS: usize = 4096;
const MAX_BYTES: usize = 4 << 20;
/// What all episodes of a device keep at most, calls and payloads: 1,024 streams of 64
/// sessions never synchronized must not make gpushared hold gigabytes.
const MAX_KEPT: u64 = 256 << 20;

/// The page of progress slots, and which are free.
pub struct Progress {
    _memfd: OwnedFd,
    page: Arc<HostRegion>,
    /// Free slots, the longest free first: a destroyed stream's last writes may still land
    /// (its work was not waited for), and must not land on a new stream's slot.
    free: Mutex<std::collections::VecDeque<u32>>,
    /// The value the next episode writes (never 0: a fresh slot holds 0).
    next_value: AtomicU32,
    /// Orders calls across a session's streams, to queue them again as they came.
    next_seq: AtomicU64,
    /// Held while the staging area holds an upload being queued again.
    staging: Mutex<()>,
    /// Bytes all episodes keep now.
    kept: Arc<AtomicU64>,
}

/// The 32-bit word of slot `slot` in a progress page (as the page is mapped where it is
/// written: a worker's mapping, a backend's).
pub fn slot_word(page: ArenaSlice<'_>, slot: u32) -> DeviceResult<ArenaSlice<'_>> {
    page.part(u64::from(slot) * 4, 4)
        .ok_or_else(|| DeviceError::InvalidArgument("progress slot outside its page".into()))
}

/// Whether a done-slot holding `seen` got past the mark `value`: marks come from a counter
/// that wraps (skipping 0, what a fresh slot holds), and a stream's pending marks are never
/// 2^31 apart.
fn at_or_past(seen: u32, value: u32) -> bool {
    seen != 0 && seen.wrapping_sub(value) as i32 >= 0
}

/// One call of an episode, kept to queue again.
pub struct Kept {
    pub seq: u64,
    pub call: Call,
    pub payload: Box<[u8]>,
}

/// Work queued on a stream since it was last known idle.
pub struct Episode {
    /// The value its progress call writes; `None` when it has none (no slot), and cannot be
    /// told apart from work that started.
    mark: Option<u32>,
    calls: Vec<Kept>,
    /// Bytes its calls and payloads take, counted in `kept`.
    bytes: usize,
    kept: Arc<AtomicU64>,
    /// Calls posted in it, kept or not.
    posted: usize,
    /// Too much to keep, or a call that cannot be kept: lost at a fault unless it finished.
    overflowed: bool,
    /// The value the stream writes when it has finished the episode's first `n` calls.
    tail: Option<(u32, usize)>,
}

impl Episode {
    pub fn mark(&self) -> Option<u32> {
        self.mark
    }

    /// Keeps nothing more: lost at a fault unless it finished.
    fn give_up(&mut self) {
        self.overflowed = true;
        self.calls = Vec::new();
        self.kept.fetch_sub(self.bytes as u64, Ordering::Relaxed);
        self.bytes = 0;
    }
}

impl Drop for Episode {
    fn drop(&mut self) {
        self.kept.fetch_sub(self.bytes as u64, Ordering::Relaxed);
    }
}

/// What a fault did to a stream's work not known finished.
pub enum Fate {
    /// Nothing was in flight.
    Idle,
    /// None of it started: queue these again, in order.
    NotStarted(Vec<Kept>),
    /// Some of it may have run: report it lost. The calls it kept (none when it kept none).
    Lost(Vec<Kept>),
}

impl Progress {
    /// Makes the page and shares it with the link's workers; `None` (work in flight is then
    /// always reported lost at a fault) where it cannot be made.
    pub fn new(link: &dyn Link) -> Option<Progress> {
        match Progress::make(link) {
            Ok(p) => Some(p),
            Err(e) => {
                tracing::warn!(error = %e, "no progress page: work that never started is reported lost at a fault, not queued again");
                None
            }
        }
    }

    fn make(link: &dyn Link) -> DeviceResult<Progress> {
        let failed = |what: &str, e: &dyn std::fmt::Display| {
            DeviceError::Failed(format!("progress page: {what}: {e}"))
        };
        let len = u64::from(SLOTS) * 4 + STAGING;
        let memfd =
            sealed_memfd("gpushare-progress", len as usize).map_err(|e| failed("memfd", &e))?;
        let page = HostRegion::map(&memfd, len, 0).map_err(|e| failed("map", &e))?;
        link.share_memory(page.id(), memfd.as_fd(), len, 0, 0)?;
        Ok(Progress {
            _memfd: memfd,
            page: Arc::new(page),
            free: Mutex::new((GATE_SLOT + 1..SLOTS).collect()),
            next_value: AtomicU32::new(1),
            next_seq: AtomicU64::new(0),
            staging: Mutex::new(()),
            kept: Arc::default(),
        })
    }

    pub(crate) fn span(&self) -> Span {
        self.page.whole().span()
    }

    /// The device's priority gate, in this page.
    pub fn gate(&self) -> Gate {
        Gate::new(self.page.clone())
    }

    /// What a launch carries to wait at [`Progress::gate`] (asked per launch: no reference
    /// taken to the page).
    pub fn gate_word(&self) -> GateWord {
        gate_word(&self.page)
    }

    /// A slot for a new stream; `None` when every slot is taken.
    pub fn take_slot(&self) -> Option<u32> {
        self.free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop_front()
    }

    pub fn give_slot(&self, slot: u32) {
        self.free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_back(slot);
    }

    fn read(&self, slot: u32) -> Option<u32> {
        Some(self.page.slice(u64::from(slot) * 4, 4)?.load_u32())
    }

    /// Whether the stream with `slot` got to the work whose mark is `value`.
    pub fn reached(&self, slot: u32, value: u32) -> bool {
        self.read(slot).is_none_or(|v| v == value)
    }

    /// The call that makes `stream` write a fresh value into its done-slot `slot` once it
    /// gets past the work queued before, and that value (see [`Progress::passed`]).
    pub fn done_mark(&self, stream: Handle, slot: u32) -> (Call, u32) {
        let value = self.fresh_value();
        let call = Call::Progress {
            stream,
            page: self.span(),
            slot,
            value,
        };
        (call, value)
    }

    /// Whether the stream whose done-slot is `slot` got past the mark of `value`: its marks
    /// are written in stream order, from a counter that only grows (wrapping), so the slot
    /// holds the latest mark it passed.
    pub fn passed(&self, slot: u32, value: u32) -> bool {
        self.read(slot).is_some_and(|seen| at_or_past(seen, value))
    }

    fn fresh_value(&self) -> u32 {
        loop {
            let v = self.next_value.fetch_add(1, Ordering::Relaxed);
            if v != 0 {
                return v;
            }
        }
    }

    /// Before work is queued on `stream`: begins an episode if the stream was idle, and then
    /// says the opening value its first call carries ([`Progress::opening`]).
    pub fn begin(&self, stream: &mut Stream) -> Option<ProgressValue> {
        if stream.episode.is_some() {
            return None;
        }
        let slot = stream.slot;
        let mark = slot.map(|_| self.fresh_value());
        stream.episode = Some(Episode {
            mark,
            calls: Vec::new(),
            bytes: 0,
            kept: self.kept.clone(),
            posted: 0,
            overflowed: mark.is_none(),
            tail: None,
        });
        Some(ProgressValue {
            page: self.span(),
            slot: slot?,
            value: mark?,
        })
    }

    /// `call` as the first call of an episode: with its opening value, if it has one.
    pub fn opening(opening: Option<ProgressValue>, call: Call) -> Call {
        match opening {
            Some(opening) => Call::Opening {
                opening,
                call: Box::new(call),
            },
            None => call,
        }
    }

    /// Whether an upload of `len` bytes is kept (so its bytes are worth copying).
    pub fn keeps_upload(&self, len: u64) -> bool {
        len <= STAGING
    }

    /// Keeps a call queued in the stream's episode, to queue again if it never starts;
    /// `None` for one that cannot be (the episode is then lost at a fault unless finished).
    pub fn keep(&self, stream: &mut Stream, call: Option<Call>, payload: &[u8]) {
        let Some(ep) = stream.episode.as_mut() else {
            return;
        };
        ep.posted += 1;
        if ep.overflowed {
            return;
        }
        let Some(call) = call else {
            ep.give_up();
            return;
        };
        let size = std::mem::size_of::<Kept>() + payload.len();
        if ep.calls.len() >= MAX_CALLS
            || ep.bytes + size > MAX_BYTES
            || self.kept.load(Ordering::Relaxed) + size as u64 > MAX_KEPT
        {
            ep.give_up();
            return;
        }
        ep.bytes += size;
        self.kept.fetch_add(size as u64, Ordering::Relaxed);
        ep.calls.push(Kept {
            seq: self.next_seq.fetch_add(1, Ordering::Relaxed),
            call,
            payload: payload.into(),
        });
    }

    /// For a call that waits for the stream's work: the closing value it writes once it has
    /// seen that work finish (`None`: nothing to close). Closed already, with nothing queued
    /// since, the same value again (the call that was to write it may have failed).
    pub fn close(&self, stream: &mut Stream) -> Option<ProgressValue> {
        let slot = stream.slot?;
        let ep = stream.episode.as_mut()?;
        ep.mark?;
        let value = match ep.tail {
            Some((value, n)) if n == ep.posted => value,
            _ => {
                let value = self.fresh_value();
                ep.tail = Some((value, ep.posted));
                value
            }
        };
        Some(ProgressValue {
            page: self.span(),
            slot,
            value,
        })
    }

    /// Puts `bytes` in the staging area for an upload queued again; the span to copy from,
    /// and the guard that keeps it there until the upload has read it.
    pub fn stage(&self, bytes: &[u8]) -> Option<(std::sync::MutexGuard<'_, ()>, Span)> {
        let guard = self.staging.lock().unwrap_or_else(|e| e.into_inner());
        let at = self.page.slice(u64::from(SLOTS) * 4, bytes.len() as u64)?;
        at.write_from(bytes);
        Some((guard, at.span()))
    }

    /// After a fault: what became of the stream's episode (it ends here either way).
    pub fn fate(&self, stream: &mut Stream) -> Fate {
        let Some(mut ep) = stream.episode.take() else {
            return Fate::Idle;
        };
        let calls = std::mem::take(&mut ep.calls);
        let (Some(mark), Some(slot)) = (ep.mark, stream.slot) else {
            return Fate::Lost(calls);
        };
        match judge(mark, ep.tail, ep.posted, ep.overflowed, self.read(slot)) {
            Judged::Finished => Fate::Idle,
            Judged::NotStarted => Fate::NotStarted(calls),
            Judged::Lost => Fate::Lost(calls),
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Judged {
    Finished,
    NotStarted,
    Lost,
}

/// What a fault did to an episode opened with `mark`, closed (if at all) with `tail` after
/// its first `n` calls, of `posted` calls (`overflowed`: not all kept), when its stream's
/// slot reads `now`.
fn judge(
    mark: u32,
    tail: Option<(u32, usize)>,
    posted: usize,
    overflowed: bool,
    now: Option<u32>,
) -> Judged {
    match tail {
        // Finished up to the closing value; what came after it may have started.
        Some((tail, n)) if now == Some(tail) => {
            if n == posted {
                Judged::Finished
            } else {
                Judged::Lost
            }
        }
        // Got to it, or nothing of it can be queued again, or the slot cannot be read.
        _ if now == Some(mark) || overflowed || now.is_none() => Judged::Lost,
        _ => Judged::NotStarted,
    }
}

/// Of streams whose work a fault found not started (`replay`) and streams whose work it
/// took (`lost`, each with the calls it kept): moves to `lost` every stream whose work waits
/// on an event recorded in lost work — queued again, it would run without what the lost work
/// never wrote. An event recorded in no kept episode was recorded in work that finished,
/// unless a lost episode kept no calls (then it may be there).
pub fn drop_dependents<K>(replay: &mut Vec<(K, Vec<Kept>)>, lost: &mut Vec<(K, Vec<Kept>)>) {
    let recorded = |calls: &[Kept]| -> Vec<Handle> {
        calls
            .iter()
            .filter_map(|k| match k.call {
                Call::RecordEvent { event, .. } => Some(event),
                _ => None,
            })
            .collect()
    };
    let unknown_lost = lost.iter().any(|(_, c)| c.is_empty());
    loop {
        let tainted: HashSet<Handle> = lost.iter().flat_map(|(_, c)| recorded(c)).collect();
        let replayed: HashSet<Handle> = replay.iter().flat_map(|(_, c)| recorded(c)).collect();
        let depends = |calls: &[Kept]| {
            calls.iter().any(|k| match k.call {
                Call::StreamWaitEvent { event, .. } => {
                    tainted.contains(&event) || (unknown_lost && !replayed.contains(&event))
                }
                _ => false,
            })
        };
        let Some(i) = replay.iter().position(|(_, c)| depends(c)) else {
            return;
        };
        lost.push(replay.swap_remove(i));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_done_slot_is_past_every_mark_up_to_the_latest_written_across_the_wrap() {
        assert!(!at_or_past(0, 1), "a fresh slot");
        assert!(at_or_past(5, 5));
        assert!(at_or_past(9, 5));
        assert!(!at_or_past(4, 5));
        assert!(at_or_past(2, u32::MAX - 1), "past the wrap");
        assert!(!at_or_past(u32::MAX - 1, 2));
    }

    fn kept(seq: u64, call: Call) -> Kept {
        Kept {
            seq,
            call,
            payload: Box::new([]),
        }
    }

    fn record(event: Handle, stream: Handle) -> Call {
        Call::RecordEvent {
            event,
            stream,
            start: false,
        }
    }

    fn wait(stream: Handle, event: Handle) -> Call {
        Call::StreamWaitEvent { stream, event }
    }

    fn sync(stream: Handle) -> Call {
        Call::SyncStream {
            stream,
            close: None,
            told: None,
        }
    }

    fn streams(replay: &[(u64, Vec<Kept>)]) -> Vec<u64> {
        let mut s: Vec<Handle> = replay.iter().map(|(s, _)| *s).collect();
        s.sort_unstable();
        s
    }

    #[test]
    fn a_slot_tells_finished_work_from_work_that_may_have_run_and_work_never_started() {
        // Opened with 7; the slot still holds the previous episode's 3.
        assert_eq!(judge(7, None, 2, false, Some(3)), Judged::NotStarted);
        assert_eq!(judge(7, None, 2, false, Some(7)), Judged::Lost);
        assert_eq!(
            judge(7, None, 2, true, Some(3)),
            Judged::Lost,
            "not all kept"
        );
        // Closed with 8 after both calls.
        assert_eq!(judge(7, Some((8, 2)), 2, false, Some(8)), Judged::Finished);
        assert_eq!(judge(7, Some((8, 2)), 2, true, Some(8)), Judged::Finished);
        assert_eq!(judge(7, Some((8, 2)), 2, false, Some(7)), Judged::Lost);
        assert_eq!(
            judge(7, Some((8, 2)), 2, false, Some(3)),
            Judged::NotStarted
        );
        // A call queued after the closing value may have started once it was written.
        assert_eq!(judge(7, Some((8, 2)), 3, false, Some(8)), Judged::Lost);
        assert_eq!(judge(7, None, 1, false, None), Judged::Lost, "unreadable");
    }

    #[test]
    fn work_waiting_on_an_event_of_lost_work_is_lost_too_and_so_is_what_waits_on_it() {
        // Stream 1 lost work that recorded event 10; stream 2 waits on 10 and records 11;
        // stream 3 waits on 11; stream 4 waits on nothing.
        let mut lost = vec![(1, vec![kept(0, sync(1)), kept(1, record(10, 1))])];
        let mut replay = vec![
            (2, vec![kept(2, wait(2, 10)), kept(3, record(11, 2))]),
            (3, vec![kept(4, wait(3, 11))]),
            (4, vec![kept(5, sync(4))]),
        ];
        drop_dependents(&mut replay, &mut lost);
        assert_eq!(streams(&replay), vec![4]);
        assert_eq!(streams(&lost), vec![1, 2, 3]);
    }

    #[test]
    fn work_waiting_on_an_event_queued_again_or_finished_stays() {
        // Stream 2 waits on event 10, recorded in stream 1's work that is queued again, and
        // on event 12, recorded in work that finished before.
        let mut lost = vec![(5, vec![kept(0, sync(5))])];
        let mut replay = vec![
            (1, vec![kept(1, record(10, 1))]),
            (2, vec![kept(2, wait(2, 10)), kept(3, wait(2, 12))]),
        ];
        drop_dependents(&mut replay, &mut lost);
        assert_eq!(streams(&replay), vec![1, 2]);
    }

    #[test]
    fn a_lost_episode_that_kept_nothing_taints_every_event_not_queued_again() {
        let mut lost = vec![(5, vec![])];
        let mut replay = vec![
            (1, vec![kept(1, record(10, 1))]),
            (2, vec![kept(2, wait(2, 10))]),
            (3, vec![kept(3, wait(3, 12))]),
        ];
        drop_dependents(&mut replay, &mut lost);
        assert_eq!(streams(&replay), vec![1, 2]);
    }
}

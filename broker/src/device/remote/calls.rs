//! The calling side of the channels: each thread of gpushared that calls a device gets a channel
//! to that device's worker, opened on first use; a call either waits for its answer or is
//! posted (work queued on a stream, a release), its answer collected later into the ledger.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use gpushare_protocol::control::{decode, encode_into};

use super::channel::{CallerEnd, Gave, MAX_REQUEST};
use super::wire::{Envelope, Payload, ToWorker};
use super::{Active, Remote};
use crate::device::Pace;
use crate::device::call::{Answer, Call, Handle};
use crate::device::{DeviceError, DeviceResult};

/// One thread's channel to one device's worker.
pub(super) struct Caller {
    device: u64,
    generation: u64,
    pub(super) end: CallerEnd,
    worker: Arc<Active>,
    /// One entry per request whose answer has not been read, oldest first: posted ones (with
    /// the stream whose work it is, if any) and, last, a waited one (`None`).
    posted: VecDeque<Option<Option<Handle>>>,
}

/// How a wait past its deadline is told from a worker that is gone.
const LATE: &str = "the device worker, busy, did not answer within";

/// Requests posted and not yet answered on one channel, at most: the answers (and the
/// failures and device time they report) stay close behind.
const MAX_POSTED: usize = 256;
/// Room for an encoded envelope (its variable parts travel as payload).
const ENVELOPE_ROOM: usize = 4096;
/// Payloads up to this size travel in the request ring; bigger ones as a blob.
const INLINE_PAYLOAD: usize = MAX_REQUEST - ENVELOPE_ROOM;

/// Whether a request waits for its answer (with an optional bound) or is posted.
#[derive(Clone, Copy)]
enum Send_ {
    Wait(Option<Duration>),
    Post(Option<Handle>),
}

thread_local! {
    static CALLERS: RefCell<Vec<Caller>> = const { RefCell::new(Vec::new()) };
    /// The pace each device's channel of this thread should have (kept across new channels).
    static PACES: RefCell<HashMap<u64, Pace>> = RefCell::new(HashMap::new());
}

/// Sets this thread's channel pace for device `id` (now, and for a channel opened later), and
/// nudges the worker's thread awake.
pub(super) fn pace_hint(id: u64, pace: Pace) {
    PACES.with(|s| s.borrow_mut().insert(id, pace));
    let _ = CALLERS.try_with(|callers| {
        if let Ok(callers) = callers.try_borrow() {
            for c in callers.iter().filter(|c| c.device == id) {
                c.end.set_pace(pace);
                c.end.nudge();
            }
        }
    });
}

impl Remote {
    /// Sends a call on this thread's channel and waits for its answer (giving up after
    /// `deadline`, if set).
    pub(super) fn call_within(
        &self,
        call: Call,
        payload: &[u8],
        deadline: Option<Duration>,
    ) -> DeviceResult<Answer> {
        match self.send(call, payload, Send_::Wait(deadline))? {
            Some(answer) => Ok(answer),
            None => Err(DeviceError::Failed(
                "no answer from the device worker".into(),
            )),
        }
    }

    /// Posts a call without waiting for its answer: the channel's next call collects it into
    /// the ledger (a failure of work on `stream` is kept for its next synchronization, as CUDA
    /// reports asynchronous errors), so the worker runs it while this thread goes on. A
    /// release (`stream` none) of a worker that is gone has nothing to do.
    pub(super) fn post_call(
        &self,
        stream: Option<Handle>,
        call: Call,
        payload: &[u8],
    ) -> DeviceResult<()> {
        if stream.is_none() && self.active().process.gone().is_some() {
            return Ok(()); // released with its worker
        }
        // On a thread that is ending this may find no channel table left: nothing is lost, the
        // worker frees everything when it goes.
        self.send(call, payload, Send_::Post(stream)).map(drop)
    }

    /// Sends a request on this thread's channel: waits for its answer (behind the answers to
    /// what was posted before it), or posts it.
    fn send(&self, call: Call, payload: &[u8], how: Send_) -> DeviceResult<Option<Answer>> {
        let shared = &self.shared;
        if shared.interrupted.load(Ordering::Acquire) {
            return Err(DeviceError::Cancelled);
        }
        // The serving worker's generation names this thread's channel to it; the worker
        // itself (a lock and a count shared by every calling thread) only for a new channel
        // or a large payload.
        let generation = shared.generation.load(Ordering::Acquire);
        let inline = payload.len() <= INLINE_PAYLOAD;
        let envelope_payload = if !inline {
            let active = self.active();
            if let Some(why) = active.process.gone() {
                return Err(self.worker_lost(&why));
            }
            Payload::Blob(self.send_blob(&active, payload)?)
        } else if payload.is_empty() {
            Payload::None
        } else {
            Payload::Inline(payload.len() as u32)
        };
        let envelope = Envelope {
            call,
            payload: envelope_payload,
        };
        let sent = CALLERS.try_with(|callers| {
            let Ok(mut callers) = callers.try_borrow_mut() else {
                return Err(DeviceError::Failed(
                    "a device call from within another (a bug)".into(),
                ));
            };
            let caller = self.caller(&mut callers, generation)?;
            if let Some(why) = caller.worker.process.gone() {
                return Err(self.worker_lost(&why));
            }
            // Posted work's answers: what has come, and enough to keep them bounded.
            self.collect(caller, false)?;
            while caller.end.outstanding() >= MAX_POSTED {
                self.collect_one(caller, None)?;
            }
            let room = ENVELOPE_ROOM + if inline { payload.len() } else { 0 };
            caller
                .end
                .send(
                    room,
                    |area| {
                        let used = encode_into(&envelope, area).map_err(|e| e.to_string())?;
                        if inline && !payload.is_empty() {
                            area.get_mut(used..used + payload.len())
                                .ok_or("a payload too big to send")?
                                .copy_from_slice(payload);
                            return Ok(used + payload.len());
                        }
                        Ok(used)
                    },
                    &self.give_up(&caller.worker, None),
                )
                .map_err(|g| self.gave(g))?;
            crate::timeline::point("data", "sent");
            match how {
                Send_::Post(stream) => {
                    caller.posted.push_back(Some(stream));
                    Ok(None)
                }
                Send_::Wait(deadline) => {
                    caller.posted.push_back(None);
                    // The answers to what was posted before come first (and that of a wait
                    // that gave up earlier), within the same deadline.
                    while caller.posted.len() > 1 {
                        self.collect_one(caller, deadline)?;
                    }
                    let answer = self.next_answer(caller, deadline)?;
                    crate::timeline::point("data", "answer");
                    caller.posted.pop_front();
                    answer.map(Some).map_err(|e| {
                        DeviceError::Failed(format!("an answer that does not decode: {e}"))
                    })
                }
            }
        });
        sent.unwrap_or_else(|_| Err(DeviceError::Failed("the thread is ending".into())))
    }

    /// Collects the answers to posted work that have come (all of them, waiting, when
    /// `wait`); a failure is kept for its stream's next synchronization.
    fn collect(&self, caller: &mut Caller, wait: bool) -> DeviceResult<()> {
        while matches!(caller.posted.front(), Some(Some(_))) {
            let got = if wait {
                self.next_answer(caller, None).map(Some)?
            } else {
                let give_up = self.give_up(&caller.worker, None);
                caller
                    .end
                    .answer(false, &give_up, decode_answer)
                    .map_err(|g| self.gave(g))?
            };
            let Some(answer) = got else {
                return Ok(());
            };
            let Some(Some(stream)) = caller.posted.pop_front() else {
                return Ok(());
            };
            self.note_posted(caller.generation, stream, answer);
        }
        Ok(())
    }

    /// Waits for the oldest outstanding answer, of posted work.
    fn collect_one(&self, caller: &mut Caller, deadline: Option<Duration>) -> DeviceResult<()> {
        let answer = self.next_answer(caller, deadline)?;
        if let Some(Some(stream)) = caller.posted.pop_front() {
            self.note_posted(caller.generation, stream, answer);
        }
        Ok(())
    }

    /// Keeps what a posted call's answer says of its stream in the ledger (a release's, or
    /// one that does not decode, nobody asks for).
    fn note_posted(&self, generation: u64, stream: Option<Handle>, answer: Result<Answer, String>) {
        if let (Some(_), Ok(answer)) = (stream, answer) {
            self.shared.ledger.note(generation, stream, answer);
        }
    }

    /// Waits for the channel's next answer, decoded.
    fn next_answer(
        &self,
        caller: &mut Caller,
        deadline: Option<Duration>,
    ) -> DeviceResult<Result<Answer, String>> {
        let give_up = self.give_up(&caller.worker, deadline);
        match caller.end.answer(true, &give_up, decode_answer) {
            Ok(Some(answer)) => Ok(answer),
            Ok(None) => Err(DeviceError::Failed(
                "no answer from the device worker".into(),
            )),
            Err(g) => Err(self.gave(g)),
        }
    }

    /// Why to stop waiting on `caller`'s channel: a reset under way, or done meanwhile (its
    /// worker replaced; both said as an empty reason, which is `Cancelled`), its worker gone,
    /// or `deadline` passed.
    fn give_up<'a>(
        &'a self,
        worker: &'a Active,
        deadline: Option<Duration>,
    ) -> impl Fn() -> Option<String> + 'a {
        let shared = &self.shared;
        let started = deadline.map(|_| Instant::now());
        move || {
            let replaced = || shared.generation.load(Ordering::Acquire) != worker.generation;
            if shared.interrupted.load(Ordering::Acquire) || replaced() {
                return Some(String::new());
            }
            if let Some(why) = worker.process.gone() {
                return Some(why);
            }
            deadline
                .zip(started)
                .filter(|(d, at)| at.elapsed() >= *d)
                .map(|(d, _)| format!("{LATE} {d:?}"))
        }
    }

    /// The error for a wait that ended without its answer.
    fn gave(&self, gave: Gave) -> DeviceError {
        match gave {
            Gave::Up(why) if why.is_empty() => DeviceError::Cancelled,
            // Alive but busy: the answer comes later, and the channel's next call skips it.
            Gave::Up(why) if why.starts_with(LATE) => DeviceError::NoAnswer(why),
            Gave::Up(why) => self.worker_lost(&why),
            Gave::Broken(why) => self.worker_lost(&format!("its channel broke: {why}")),
        }
    }

    /// This thread's channel to `active`, opened on first use; channels to replaced workers
    /// are dropped.
    fn caller<'c>(
        &self,
        callers: &'c mut Vec<Caller>,
        generation: u64,
    ) -> DeviceResult<&'c mut Caller> {
        let id = self.shared.id;
        callers.retain(|c| c.device != id || c.generation == generation);
        if let Some(i) = callers.iter().position(|c| c.device == id) {
            return Ok(&mut callers[i]);
        }
        let active = self.active();
        let mut end = CallerEnd::create().map_err(|e| {
            DeviceError::Failed(format!("cannot make a channel to the device worker: {e}"))
        })?;
        if let Some(pace) = PACES.with(|s| s.borrow().get(&id).copied()) {
            end.set_pace(pace);
        }
        let channel = active.channels.fetch_add(1, Ordering::Relaxed);
        let fd = end.fd().map(|f| f.as_raw_fd()).unwrap_or(-1);
        active
            .process
            .request(&ToWorker::OpenChannel { id: channel }, &[fd])
            .map_err(|e| self.worker_lost(&e.to_string()))?;
        end.handed_over();
        callers.push(Caller {
            device: id,
            generation: active.generation,
            end,
            worker: active.clone(),
            posted: VecDeque::new(),
        });
        let last = callers.len() - 1;
        Ok(&mut callers[last])
    }

    /// Sends a payload too big for a channel as a memfd of its own.
    fn send_blob(&self, active: &Active, payload: &[u8]) -> DeviceResult<u64> {
        let file = payload_memfd(payload).map_err(|e| {
            DeviceError::Failed(format!(
                "cannot hand a large payload to the device worker: {e}"
            ))
        })?;
        let len = (payload.len() as u64).div_ceil(4096) * 4096;
        let id = self.shared.next_blob.fetch_add(1, Ordering::Relaxed);
        active
            .process
            .request(&ToWorker::Blob { id, len }, &[file.as_raw_fd()])
            .map_err(|e| self.worker_lost(&e.to_string()))?;
        Ok(id)
    }
}

/// An answer as its bytes in the channel say it.
fn decode_answer(bytes: &[u8]) -> Result<Answer, String> {
    decode::<Answer>(bytes).map_err(|e| e.to_string())
}

/// `payload` in a sealed memfd of whole pages (the worker maps it; it reads only
/// `payload.len()` bytes of them).
pub(super) fn payload_memfd(payload: &[u8]) -> Result<std::os::fd::OwnedFd, String> {
    use nix::fcntl::{FcntlArg, SealFlag, fcntl};
    use nix::sys::memfd::{MFdFlags, memfd_create};
    let fd = memfd_create(
        "gpushare-worker-blob",
        MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING,
    )
    .map_err(|e| format!("memfd: {e}"))?;
    let mut file = std::fs::File::from(fd);
    std::io::Write::write_all(&mut file, payload).map_err(|e| format!("write: {e}"))?;
    let len = (payload.len() as u64).div_ceil(4096) * 4096;
    file.set_len(len).map_err(|e| format!("size: {e}"))?;
    fcntl(
        &file,
        FcntlArg::F_ADD_SEALS(SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW),
    )
    .map_err(|e| format!("seal: {e}"))?;
    Ok(file.into())
}

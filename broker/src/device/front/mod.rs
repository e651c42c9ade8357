//! [`Device`]: one GPU context as the broker's sessions, dispatcher and guardian use it. Its
//! interface is the [`Call`]: work queued on a stream is posted (its failure reported at the
//! stream's next synchronization, as CUDA reports asynchronous errors), everything else waits
//! for its answer. Handles are checked against the context generation they were made in.
//! Here too: what it takes to keep a stream's device time and start markers, the same for
//! every link.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use gpushare_protocol::control::DeviceInfo;
use gpushare_protocol::{DevicePtr, PriorityClass};

use super::call::{Call, Handle, ProgressValue, Reply, Span};
use super::handles::{Named, Owner, Recipe, Stream};
use super::link::{Link, Memory, Pace};
use super::pool::Pool;
use super::progress::Progress;
use super::{DeviceError, DeviceResult};

mod code;
mod events;
mod memory;
mod progress;
#[cfg(test)]
mod tests;

/// A busy stream's batch is ended at most this often (the CUDA backend closes a measured span
/// once it is 2 ms old: asking more often would only cost a round trip).
const SPAN_CHECK: Duration = Duration::from_millis(2);

/// One GPU context, through its link, and its clients' memory.
pub struct Device {
    link: Arc<dyn Link>,
    pool: Pool,
    /// What sessions share with each other (CUDA IPC).
    ipc: super::ipc::Ipc,
    /// What handles share: the link, every live handle's recipe, and the epoch handles are
    /// valid in (it ends only when a reset cannot make them again).
    owner: Arc<Owner>,
    /// The next handle name.
    next: AtomicU64,
    /// Where streams' work has got to, for telling at a fault which work never started.
    progress: Option<Progress>,
}

impl Device {
    /// A device; fresh memory goes at or above `floor` (where an earlier image's ended).
    pub fn new(link: Arc<dyn Link>, floor: u64) -> Device {
        let pool = Pool::new(link.space(), floor);
        let owner = Arc::new(Owner {
            link: link.clone(),
            recipes: Arc::default(),
            epoch: Arc::new(AtomicU64::new(0)),
        });
        let progress = Progress::new(&*link);
        Device {
            link,
            pool,
            ipc: super::ipc::Ipc::default(),
            owner,
            next: AtomicU64::new(1),
            progress,
        }
    }

    /// The priority gate of this device's progress page, if it has one.
    pub fn gate(&self) -> Option<super::gate::Gate> {
        self.progress.as_ref().map(Progress::gate)
    }

    /// What a launch carries to wait at [`Device::gate`].
    pub fn gate_word(&self) -> Option<super::GateWord> {
        self.progress.as_ref().map(Progress::gate_word)
    }

    fn epoch(&self) -> u64 {
        self.owner.epoch.load(Ordering::Acquire)
    }

    fn name(&self) -> Handle {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    /// Where fresh memory goes from now on (for a restarting gpushared's next image).
    pub fn high_water(&self) -> u64 {
        self.pool.high_water()
    }

    /// Where clients' memory lives.
    pub fn space(&self) -> super::link::Space {
        self.link.space()
    }

    pub fn link(&self) -> &Arc<dyn Link> {
        &self.link
    }

    /// Maps this device's clients' memory into `peer`'s context at the same addresses, now
    /// and as it is made, for session `holder` (see [`Link::mirror_into`]).
    pub fn mirror_into(&self, peer: &Device, holder: u64) -> DeviceResult<()> {
        self.link.mirror_into(Arc::downgrade(&peer.link), holder)
    }

    /// Session `holder` no longer needs `peer` to reach this device's memory.
    pub fn stop_mirroring(&self, peer: &Device, holder: u64) {
        self.link
            .stop_mirroring(&Arc::downgrade(&peer.link), holder)
    }

    /// `"sim"` or `"cuda"`.
    pub fn backend(&self) -> &'static str {
        self.link.backend()
    }

    pub fn info(&self) -> &DeviceInfo {
        self.link.info()
    }

    pub fn sm_partitions(&self) -> bool {
        self.link.sm_partitions()
    }

    /// Checks that a handle is of the epoch serving now.
    fn live(&self, epoch: u64) -> DeviceResult<()> {
        if epoch == self.epoch() {
            Ok(())
        } else {
            Err(DeviceError::Cancelled)
        }
    }

    /// The executor's number for a live handle (`Cancelled` for one from before a reset).
    pub fn id(&self, handle: &impl Named) -> DeviceResult<Handle> {
        let held = handle.held();
        self.live(held.epoch)?;
        Ok(held.id)
    }

    /// Runs `call` and waits for its reply; a failure is the error. Not for calls on a
    /// stream: their answers bring the stream's device time, which only
    /// [`Device::on_stream`] and the ledger keep.
    pub fn call(&self, call: Call, payload: &[u8]) -> DeviceResult<Reply> {
        let answer = self.link.call(call, payload, None)?;
        debug_assert!(
            answer.news.is_none(),
            "a call on a stream went through Device::call: its device time would be lost"
        );
        answer.reply.ok()
    }

    /// [`Device::call`], giving up after `deadline`.
    pub fn call_within(&self, call: Call, deadline: Duration) -> DeviceResult<Reply> {
        let answer = self.link.call(call, &[], Some(deadline))?;
        debug_assert!(
            answer.news.is_none(),
            "a call on a stream went through Device::call_within: its device time would be lost"
        );
        answer.reply.ok()
    }

    pub fn pace_hint(&self, pace: Pace) {
        self.link.pace_hint(pace)
    }

    // ---- streams ---------------------------------------------------------------------

    pub fn create_stream(&self, class: PriorityClass) -> DeviceResult<Stream> {
        let (epoch, id) = (self.epoch(), self.name());
        self.call(Call::CreateStream { id, class }, &[])?.done()?;
        self.owner.recipes.add(id, Recipe::Stream { class });
        let slot = self.progress.as_ref().and_then(Progress::take_slot);
        Ok(Stream::new(epoch, id, slot))
    }

    /// Waits for the stream's work, then releases it.
    pub fn destroy_stream(&self, mut stream: Stream) {
        if let Some(p) = &self.progress {
            for slot in [stream.slot.take(), stream.done_slot.take()]
                .into_iter()
                .flatten()
            {
                p.give_slot(slot);
            }
        }
        let _ = self.take_deferred(&stream);
        self.take_news(&mut stream);
        self.owner.recipes.remove(stream.id);
        if self.live(stream.epoch).is_ok() {
            let _ = self.call(Call::DestroyStream { stream: stream.id }, &[]);
        }
    }

    /// Queues work on `stream` without waiting for it: `call` gets the stream's number.
    pub fn queue(
        &self,
        stream: &mut Stream,
        call: impl FnOnce(Handle) -> Call,
        payload: &[u8],
    ) -> DeviceResult<()> {
        self.live(stream.epoch)?;
        stream.dirty = true;
        stream.unfinished = true;
        let mut call = call(stream.id);
        match call.start_marker() {
            // A kernel takes the start marker recorded for it along.
            Some(start) => *start = stream.pending_start.take(),
            None => self.flush_start(stream),
        }
        let Some(progress) = &self.progress else {
            return self.link.post(Some(stream.id), call, payload);
        };
        let opening = progress.begin(stream);
        let kept = call.clone();
        self.link
            .post(Some(stream.id), Progress::opening(opening, call), payload)?;
        progress.keep(stream, Some(kept), payload);
        Ok(())
    }

    /// Queues again work a fault found not started ([`Device::fate`]), as it was queued.
    pub fn requeue(&self, stream: &mut Stream, call: Call, payload: &[u8]) -> DeviceResult<()> {
        match call {
            Call::CopyHtoD {
                dst, staged: true, ..
            } => {
                let progress = self.progress.as_ref().ok_or(DeviceError::Cancelled)?;
                let (_staged, src) = progress.stage(payload).ok_or_else(|| {
                    DeviceError::Failed("a kept upload larger than its staging area".into())
                })?;
                self.upload_now(stream, src, dst, Some(payload))
            }
            // The client destroyed the event since: nobody can see a record of it, and a wait
            // on it cannot be kept (the stream's work is then lost, not run out of order).
            Call::RecordEvent { event, .. } if !self.owner.recipes.contains(event) => Ok(()),
            Call::StreamWaitEvent { event, .. } if !self.owner.recipes.contains(event) => Err(
                DeviceError::InvalidArgument("the event this work waited on is gone".into()),
            ),
            call => self.queue(stream, |_| call, payload),
        }
    }

    /// Client bytes at `src` to `dst` behind the stream's work, read before this returns
    /// (the client reuses them): `bytes` is a copy of them, kept to queue the upload again
    /// after a fault (`None`: the upload cannot be, see [`Device::keeps_upload`]).
    pub fn upload_now(
        &self,
        stream: &mut Stream,
        src: Span,
        dst: DevicePtr,
        bytes: Option<&[u8]>,
    ) -> DeviceResult<()> {
        let mut opening = None;
        if let Some(progress) = &self.progress {
            self.live(stream.epoch)?;
            opening = progress.begin(stream);
        }
        let call = Call::CopyHtoD {
            stream: stream.id,
            src,
            dst,
            staged: true,
        };
        let kept = bytes.map(|_| call.clone());
        self.on_stream_now(stream, |_| Progress::opening(opening, call), &[])?;
        if let Some(progress) = &self.progress {
            progress.keep(stream, kept, bytes.unwrap_or_default());
        }
        Ok(())
    }

    /// Whether an upload of `len` bytes is kept to queue again after a fault (its bytes are
    /// worth copying for [`Device::upload_now`]).
    pub fn keeps_upload(&self, len: u64) -> bool {
        self.progress.as_ref().is_some_and(|p| p.keeps_upload(len))
    }

    /// Device bytes at `src` into client memory `dst` once the stream's work before has
    /// finished, there when this returns.
    pub fn download_now(&self, stream: &mut Stream, src: DevicePtr, dst: Span) -> DeviceResult<()> {
        let close = self.close(stream);
        let copy = |stream| Call::CopyDtoH {
            stream,
            src,
            dst,
            staged: true,
            close,
        };
        self.on_stream_now(stream, copy, &[])?;
        self.settled(stream);
        Ok(())
    }

    /// Runs a call on `stream` and waits for its reply, learning what it says of the stream's
    /// device time.
    pub fn on_stream(
        &self,
        stream: &mut Stream,
        call: impl FnOnce(Handle) -> Call,
        payload: &[u8],
    ) -> DeviceResult<Reply> {
        self.live(stream.epoch)?;
        self.flush_start(stream);
        let answer = self.link.call(call(stream.id), payload, None)?;
        stream.learn(answer.news);
        answer.reply.ok()
    }

    /// Stream work whose effect the caller needs at once (a staged copy): it waits.
    pub fn on_stream_now(
        &self,
        stream: &mut Stream,
        call: impl FnOnce(Handle) -> Call,
        payload: &[u8],
    ) -> DeviceResult<()> {
        stream.dirty = true;
        stream.unfinished = true;
        self.on_stream(stream, call, payload)?.done()
    }

    /// Waits for all work on the stream; reports the first error it met (work posted earlier
    /// that failed reports here, after the rest has finished).
    pub fn sync_stream(&self, stream: &mut Stream) -> DeviceResult<()> {
        self.sync_stream_telling(stream, None)
    }

    /// [`Device::sync_stream`] for a client that waits on it: `told` is written (from the
    /// worker's CPU, as soon as the work is seen finished) where the client looks first,
    /// unless the synchronization is to report a failure.
    pub fn sync_stream_telling(
        &self,
        stream: &mut Stream,
        told: Option<ProgressValue>,
    ) -> DeviceResult<()> {
        let close = self.close(stream);
        let synced = self
            .on_stream(
                stream,
                |stream| Call::SyncStream {
                    stream,
                    close,
                    told,
                },
                &[],
            )
            .and_then(Reply::done);
        match self.take_deferred(stream) {
            Some(e) => Err(e),
            None => {
                if synced.is_ok() {
                    self.settled(stream);
                }
                synced
            }
        }
    }

    /// The session finished a batch of commands that queued work on this stream; `idle` says
    /// the client has gone quiet. A point where the backend may close a measurement.
    pub fn end_batch(&self, stream: &mut Stream, idle: bool) {
        self.take_news(stream);
        if self.live(stream.epoch).is_err() || !(stream.dirty || stream.measuring) {
            return;
        }
        if !idle && stream.ended.is_some_and(|at| at.elapsed() < SPAN_CHECK) {
            return;
        }
        let ended = self.on_stream(stream, |stream| Call::EndBatch { stream, idle }, &[]);
        if ended.is_ok() {
            stream.ended = Some(Instant::now());
            if idle {
                stream.dirty = false;
            }
        }
    }

    /// Device time of this stream's work measured since the last call, in ns. Work still
    /// running is counted by a later call.
    pub fn take_busy_ns(&self, stream: &mut Stream) -> u64 {
        self.take_news(stream);
        std::mem::take(&mut stream.busy_ns)
    }

    /// Forgets what was known of the stream's work in a context that is gone (its object
    /// was made again, idle, in the new one).
    pub fn forget_work(&self, stream: &mut Stream) {
        stream.episode = None;
        stream.pending_start = None;
        stream.measuring = false;
        stream.dirty = false;
        stream.unfinished = false;
        stream.ended = None;
    }

    /// Whether measurements of finished work are still to be read.
    pub fn measuring(&self, stream: &Stream) -> bool {
        stream.measuring
    }

    /// Whether work queued on the stream has not finished yet (an error counts as busy, as
    /// on the device itself: the work's fate is unknown).
    pub fn stream_busy(&self, stream: &mut Stream) -> bool {
        if self.live(stream.epoch).is_err() || !stream.unfinished {
            return false;
        }
        let busy = self
            .ask_of_stream(stream, Call::StreamBusy { stream: stream.id })
            .and_then(Reply::flag)
            .unwrap_or(true);
        stream.unfinished = busy;
        busy
    }

    /// Whether all work queued on the stream has finished (a failure of posted work reports
    /// here).
    pub fn stream_done(&self, stream: &Stream) -> DeviceResult<bool> {
        self.live(stream.epoch)?;
        if let Some(e) = self.take_deferred(stream) {
            return Err(e);
        }
        self.ask_of_stream(stream, Call::StreamDone { stream: stream.id })?
            .flag()
    }

    /// A question about the stream that does not change it: device time learnt on the way
    /// waits in the ledger for the next account.
    fn ask_of_stream(&self, stream: &Stream, call: Call) -> DeviceResult<Reply> {
        let answer = self.link.call(call, &[], None)?;
        let generation = self.link.generation();
        self.link
            .ledger()
            .note_news(generation, stream.id, answer.news);
        answer.reply.ok()
    }

    fn take_news(&self, stream: &mut Stream) {
        let news = self
            .link
            .ledger()
            .take_news(self.link.generation(), stream.id);
        stream.learn(news);
    }

    fn take_deferred(&self, stream: &Stream) -> Option<DeviceError> {
        self.link
            .ledger()
            .take_deferred(self.link.generation(), stream.id)
    }

    /// Records a start marker no kernel took along (something else came first).
    fn flush_start(&self, stream: &mut Stream) {
        if let Some(event) = stream.pending_start.take() {
            let call = Call::RecordEvent {
                event,
                stream: stream.id,
                start: true,
            };
            // Device time learnt on the way is the stream's. (Its event may be gone by now:
            // the executor records nothing then, and reports nothing.)
            let _ = self.link.post(Some(stream.id), call, &[]);
        }
    }

    // ---- faults ----------------------------------------------------------------------

    pub fn interrupt(&self) {
        self.link.interrupt()
    }

    pub fn fault(&self) -> Option<String> {
        self.link.fault()
    }

    /// How long the device worker has not answered the fault check ([`Link::unresponsive`]).
    pub fn unresponsive(&self) -> Option<Duration> {
        self.link.unresponsive()
    }

    /// Replaces the context after a fault: the link's spare takes over, and every live
    /// handle is made again there under its own name, so that callers' handles and memory
    /// stay as they were (`Memory::Kept`). Where memory or a handle cannot be kept, every
    /// handle's epoch ends: callers learn their state is gone (`Memory::Lost`).
    pub fn reset(&self) -> DeviceResult<Memory> {
        let memory = self.link.reset()?;
        let started = Instant::now();
        let mirrored = self.link.mirrors();
        let remade = match memory {
            Memory::Kept => self.remake(mirrored),
            Memory::Lost => Err(DeviceError::Failed(
                "the memory went with the context".into(),
            )),
        };
        match remade {
            Ok(n) => {
                tracing::info!(handles = n, modules_made_ahead = mirrored, took = ?started.elapsed(), "every stream, event, module, function and graph made again in the new context");
                Ok(Memory::Kept)
            }
            Err(e) => {
                tracing::warn!(error = %e, "clients' device state could not be kept across the reset");
                self.owner.epoch.fetch_add(1, Ordering::AcqRel);
                self.pool.forget();
                Ok(Memory::Lost)
            }
        }
    }

    /// Makes every live handle again, in the order they were made (modules and functions
    /// only where the new context does not hold them already: not `mirrored`); returns how
    /// many.
    fn remake(&self, mirrored: bool) -> DeviceResult<usize> {
        let all: Vec<_> = self
            .owner
            .recipes
            .all()
            .into_iter()
            .filter(|(_, r)| {
                !(mirrored && matches!(r, Recipe::Module { .. } | Recipe::Function { .. }))
            })
            .collect();
        for (id, recipe) in &all {
            let id = *id;
            match recipe {
                Recipe::Stream { class } => self
                    .call(Call::CreateStream { id, class: *class }, &[])?
                    .done()?,
                Recipe::Event { kind } => self
                    .call(Call::CreateEvent { id, kind: *kind }, &[])?
                    .done()?,
                Recipe::Module { format, image } => self
                    .call(
                        Call::LoadModule {
                            id,
                            format: *format,
                        },
                        image,
                    )?
                    .done()?,
                Recipe::Function {
                    module,
                    name,
                    attributes,
                } => {
                    let get = Call::GetFunction {
                        id,
                        module: *module,
                    };
                    self.call(get, name.as_bytes())?.done()?;
                    for &(attribute, value) in attributes {
                        let set = Call::SetFunctionAttribute {
                            function: id,
                            attribute,
                            value,
                        };
                        self.call(set, &[])?.done()?;
                    }
                }
                Recipe::Graph { nodes } => self.call(Call::MakeGraph { id }, nodes)?.done()?,
            }
        }
        Ok(all.len())
    }

    pub fn resets_in_place(&self) -> bool {
        self.link.resets_in_place()
    }

    pub fn reset_deadline(&self) -> Duration {
        self.link.reset_deadline()
    }
}

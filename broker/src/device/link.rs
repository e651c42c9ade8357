//! [`Link`]: where a device's calls run — an executor in this process ([`super::local`]) or
//! one in a device worker ([`super::remote`]) — and the [`Ledger`] of what posted work's
//! answers said, which both keep the same way.

use std::collections::HashMap;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpushare_protocol::control::DeviceInfo;

use super::call::{Answer, Call, Handle, Reply};
use super::{DeviceError, DeviceResult};

/// How a calling thread's calls are to be served ([`Link::pace_hint`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pace {
    /// How long the serving thread stays awake for the next call.
    pub spin: Duration,
    /// What the serving thread's nice value is moved by (`crate::thread_nice`).
    pub nice: i32,
}

/// The device addresses clients' memory lives at: a range reserved at the same place in every
/// context that serves the device, and the granule its chunks come in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Space {
    pub base: u64,
    pub size: u64,
    pub granularity: u64,
}

impl Space {
    /// Bytes of address space per byte of device memory: room for the unmapped granule after
    /// each chunk, for fragmentation, and for the ranges programs reserve themselves
    /// (PyTorch's expandable segments reserve as much as the device has per segment).
    /// Address space costs nothing until mapped.
    pub const PER_BYTE: u64 = 64;

    /// The address space to reserve for a device of `memory` bytes.
    pub fn size_for(memory: u64) -> u64 {
        memory.max(1 << 30).saturating_mul(Self::PER_BYTE)
    }

    /// The device memory this space was sized for.
    pub fn memory(&self) -> u64 {
        self.size / Self::PER_BYTE
    }
}

/// Where a device's calls run. It carries [`Call`]s without knowing them one by one.
pub trait Link: Send + Sync + 'static {
    /// `"sim"` or `"cuda"`.
    fn backend(&self) -> &'static str;
    fn info(&self) -> &DeviceInfo;
    /// Whether the device partitions SMs (without, the scheduler paces partitioned clients).
    fn sm_partitions(&self) -> bool;
    /// Which context serves now: a reset makes a new one, and every handle of an older one is
    /// inert.
    fn generation(&self) -> u64;
    /// What posted work's answers said.
    fn ledger(&self) -> &Ledger;

    /// Runs `call` and waits for its answer (giving up after `deadline`, if set).
    fn call(&self, call: Call, payload: &[u8], deadline: Option<Duration>) -> DeviceResult<Answer>;
    /// Runs `call` without waiting for its answer: work queued on `stream`, or a release
    /// (`None`). Its answer goes to the ledger; a failure already known may come back here.
    fn post(&self, stream: Option<Handle>, call: Call, payload: &[u8]) -> DeviceResult<()>;

    /// Client memory that calls may name by `region` ([`super::call::Span`]): `len` bytes at
    /// `offset` of the file, mapped at `at` where it can (0: anywhere).
    fn share_memory(
        &self,
        region: u64,
        fd: BorrowedFd<'_>,
        len: u64,
        at: u64,
        offset: u64,
    ) -> DeviceResult<()>;
    /// The region is gone: nothing names it any more.
    fn unshare_memory(&self, region: u64);
    /// How the device should serve the calling thread's calls: how long it stays awake for
    /// the next one, and at what CPU priority. Said again when the thread wakes up: a call
    /// is likely to follow.
    fn pace_hint(&self, _pace: Pace) {}
    /// Where clients' memory lives ([`Link::create_chunk`]).
    fn space(&self) -> Space;
    /// Makes `size` bytes of physical memory at `at` (inside [`Link::space`]) in the context
    /// serving now and in the one ready to take over; the link keeps its descriptor, so the
    /// memory lives as long as the link does, whatever its contexts do.
    fn create_chunk(&self, at: u64, size: u64) -> DeviceResult<()>;
    /// Lets go of the chunk at `at` everywhere.
    fn release_chunk(&self, at: u64, size: u64);
    /// Makes `size` bytes of physical memory mapped nowhere (a program's `cuMemCreate`); the
    /// memory lives while the returned descriptor or a chunk made of it does.
    fn make_memory(&self, size: u64) -> DeviceResult<std::os::fd::OwnedFd> {
        let _ = size;
        Err(DeviceError::NotSupported {
            backend: self.backend().into(),
            what: "physical memory mapped nowhere".into(),
        })
    }
    /// Maps `size` bytes of the memory `fd` describes (from [`Link::make_memory`]) at `at`
    /// (inside [`Link::space`]) as a chunk: in the context serving now and in the one ready
    /// to take over, kept like every chunk until [`Link::release_chunk`].
    fn map_chunk(&self, at: u64, size: u64, fd: BorrowedFd<'_>) -> DeviceResult<()> {
        let _ = (at, size, fd);
        Err(DeviceError::NotSupported {
            backend: self.backend().into(),
            what: "mapping physical memory".into(),
        })
    }
    /// Maps every chunk of this device's, now and as they are made, into `peer`'s contexts at
    /// their own addresses (until they are let go): a program on `peer`'s device then reaches
    /// this device's memory, as CUDA's peer access gives. `holder` (a session) asks for it;
    /// it lasts until the last holder stops it ([`Link::stop_mirroring`]).
    fn mirror_into(&self, peer: std::sync::Weak<dyn Link>, holder: u64) -> DeviceResult<()> {
        let _ = (peer, holder);
        Err(no_peer_access(self.backend()))
    }
    /// `holder` no longer needs `peer` to map this device's memory (see
    /// [`Link::mirror_into`]).
    fn stop_mirroring(&self, peer: &std::sync::Weak<dyn Link>, holder: u64) {
        let _ = (peer, holder);
    }
    /// Lets go of every chunk of another device's range (`space`) mapped here.
    fn forget_peer(&self, space: Space) {
        let _ = space;
    }
    /// Reserves another device's range of clients' memory (`space`) in this device's contexts,
    /// for [`Link::map_peer_chunk`].
    fn reserve_peer(&self, space: Space) -> DeviceResult<()> {
        let _ = space;
        Err(no_peer_access(self.backend()))
    }
    /// Maps another device's chunk (`fd`) at its own address `at` in this device's contexts.
    fn map_peer_chunk(&self, at: u64, size: u64, fd: BorrowedFd<'_>) -> DeviceResult<()> {
        let _ = (at, size, fd);
        Err(no_peer_access(self.backend()))
    }
    /// Lets go of another device's chunk mapped at `at` (it is being let go there).
    fn release_peer_chunk(&self, at: u64, size: u64) {
        let _ = (at, size);
    }
    /// Runs `call` (a module or function being made, or an attribute set on one: `owner`)
    /// in the context ready to take over too, ahead of a fault, so that taking over costs no
    /// module load. `payload` is the call's (an image, a name).
    fn mirror(&self, _owner: Handle, _call: &Call, _payload: &Arc<[u8]>) {}
    /// `owner` is released (by `release`): so is whatever was mirrored for it.
    fn forget_mirror(&self, _owner: Handle, _release: &Call) {}
    /// Whether the context that takes over after a reset holds what was mirrored already.
    fn mirrors(&self) -> bool {
        false
    }

    /// Cuts short every wait on the device (they fail with [`DeviceError::Cancelled`]) until
    /// [`Link::reset`] finishes: the first step of recovering from a fault.
    fn interrupt(&self);
    /// Whether the context is poisoned by a sticky error (an illegal address …), and which.
    /// Cheap: the guardian asks every few milliseconds.
    fn fault(&self) -> Option<String>;
    /// How long the worker serving the context, alive, has not answered the fault check
    /// (`None` when it answers, or when calls run in this process).
    fn unresponsive(&self) -> Option<Duration> {
        None
    }
    /// Replaces the context after a fault or a hang. Every stream, event and module made
    /// before is gone (the caller makes them again); the chunks are kept (`Kept`), or lost
    /// with the context where they could not be (`Lost`).
    fn reset(&self) -> DeviceResult<Memory>;
    /// Whether [`Link::reset`] can recover the device within this process; when not, the
    /// broker restarts itself after a fault.
    fn resets_in_place(&self) -> bool;
    /// How long [`Link::reset`] may take before the broker takes the device for stuck.
    fn reset_deadline(&self) -> Duration;
}

/// What a link without peer access for one process on two GPUs answers.
fn no_peer_access(backend: &'static str) -> DeviceError {
    DeviceError::NotSupported {
        backend: backend.into(),
        what: "peer access between GPUs for one process".into(),
    }
}

/// In a test's `impl Link` for a link that wraps another (its field `inner`): the methods it
/// passes on unchanged (`sm_partitions` says none), so that the test writes only what it
/// changes.
#[cfg(test)]
macro_rules! pass_on_to_inner {
    () => {
        fn backend(&self) -> &'static str {
            self.inner.backend()
        }
        fn info(&self) -> &gpushare_protocol::control::DeviceInfo {
            self.inner.info()
        }
        fn sm_partitions(&self) -> bool {
            false
        }
        fn generation(&self) -> u64 {
            self.inner.generation()
        }
        fn ledger(&self) -> &$crate::device::link::Ledger {
            self.inner.ledger()
        }
        fn call(
            &self,
            call: $crate::device::Call,
            payload: &[u8],
            deadline: Option<std::time::Duration>,
        ) -> $crate::device::DeviceResult<$crate::device::call::Answer> {
            self.inner.call(call, payload, deadline)
        }
        fn post(
            &self,
            stream: Option<$crate::device::call::Handle>,
            call: $crate::device::Call,
            payload: &[u8],
        ) -> $crate::device::DeviceResult<()> {
            self.inner.post(stream, call, payload)
        }
        fn share_memory(
            &self,
            region: u64,
            fd: std::os::fd::BorrowedFd<'_>,
            len: u64,
            at: u64,
            offset: u64,
        ) -> $crate::device::DeviceResult<()> {
            self.inner.share_memory(region, fd, len, at, offset)
        }
        fn unshare_memory(&self, region: u64) {
            self.inner.unshare_memory(region)
        }
        fn space(&self) -> $crate::device::Space {
            self.inner.space()
        }
    };
}
#[cfg(test)]
pub(crate) use pass_on_to_inner;

/// What a reset did with clients' memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Memory {
    Kept,
    Lost,
}

/// What answers to posted work said, by (generation, stream), until the stream's next
/// synchronization or account takes it.
#[derive(Default)]
pub struct Ledger {
    /// Failures of posted work, for the stream's next synchronization.
    deferred: Mutex<HashMap<(u64, Handle), DeviceError>>,
    any_deferred: AtomicBool,
    /// Device time measured since, and whether measurements are pending still.
    news: Mutex<HashMap<(u64, Handle), (u64, bool)>>,
    any_news: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Ledger {
    /// Keeps what a posted call's answer says of its stream: its failure, for the next
    /// synchronization; its device time, for the next account.
    pub fn note(&self, generation: u64, stream: Option<Handle>, answer: Answer) {
        let Some(stream) = stream else {
            return;
        };
        let key = (generation, stream);
        if let Reply::Failed(e) = answer.reply {
            lock(&self.deferred).entry(key).or_insert(e);
            self.any_deferred.store(true, Ordering::Release);
        }
        self.note_news(generation, stream, answer.news);
    }

    /// Keeps what an answer said of its stream's device time, for the next account (every
    /// call on a stream may be the one that learns it, and it is learnt only once).
    pub fn note_news(&self, generation: u64, stream: Handle, news: Option<(u64, bool)>) {
        if let Some((busy, measuring)) = news {
            let mut news = lock(&self.news);
            let entry = news.entry((generation, stream)).or_insert((0, false));
            // Device time a client's work claims may be anything: it saturates.
            entry.0 = entry.0.saturating_add(busy);
            entry.1 = measuring;
            self.any_news.store(true, Ordering::Release);
        }
    }

    /// What posted work said of the stream's device time since last asked.
    pub fn take_news(&self, generation: u64, stream: Handle) -> Option<(u64, bool)> {
        if !self.any_news.load(Ordering::Acquire) {
            return None;
        }
        let mut news = lock(&self.news);
        let got = news.remove(&(generation, stream));
        if news.is_empty() {
            self.any_news.store(false, Ordering::Release);
        }
        got
    }

    /// The failure of work posted earlier on the stream, once.
    pub fn take_deferred(&self, generation: u64, stream: Handle) -> Option<DeviceError> {
        if !self.any_deferred.load(Ordering::Acquire) {
            return None;
        }
        let mut deferred = lock(&self.deferred);
        let e = deferred.remove(&(generation, stream));
        if deferred.is_empty() {
            self.any_deferred.store(false, Ordering::Release);
        }
        e
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_posted_failure_is_told_once_to_its_own_stream() {
        let ledger = Ledger::default();
        ledger.note(0, Some(3), Answer::failed(DeviceError::NotReady));
        ledger.note(0, Some(3), Answer::failed(DeviceError::OutOfMemory));
        assert_eq!(ledger.take_deferred(0, 4), None);
        assert_eq!(ledger.take_deferred(1, 3), None, "another generation's");
        assert_eq!(ledger.take_deferred(0, 3), Some(DeviceError::NotReady));
        assert_eq!(ledger.take_deferred(0, 3), None);
    }

    #[test]
    fn device_time_adds_up_until_taken() {
        let ledger = Ledger::default();
        let news = |busy, measuring| Answer {
            reply: Reply::Done,
            news: Some((busy, measuring)),
        };
        ledger.note(0, Some(1), news(5, true));
        ledger.note(0, Some(1), news(7, false));
        ledger.note(0, None, news(100, true));
        assert_eq!(ledger.take_news(0, 1), Some((12, false)));
        assert_eq!(ledger.take_news(0, 1), None);
        // A sim kernel told to run for u64::MAX microseconds, twice: this once overflowed.
        ledger.note(0, Some(1), news(u64::MAX, false));
        ledger.note(0, Some(1), news(u64::MAX, false));
        assert_eq!(ledger.take_news(0, 1), Some((u64::MAX, false)));
    }
}

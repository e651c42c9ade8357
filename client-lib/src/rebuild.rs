//! What a client with rebuild on ([`ConnectOptions::rebuild`](crate::ConnectOptions)) records
//! so that it can make its device state again after a GPU reset: every allocation (address and
//! size) with a host shadow of the bytes uploaded into it, the modules it loaded (image and
//! format) and the functions it looked up, its streams and events.
//!
//! Device addresses stay the same across a rebuild (the broker places the new allocations at
//! the old addresses, `Command::AllocAt`), so kernel parameters holding raw pointers stay
//! right. Streams, events, modules and functions get new broker ids: the handles the library
//! gives out are its own numbers, translated to the broker's on every command.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::thread::ThreadId;

use gpushare_protocol::command::ModuleLaunch;
use gpushare_protocol::control::{LostState, ModuleFormat};
use gpushare_protocol::{Command, DevicePtr, EventId, StreamId};

pub use gpushare_conn::RebuildError;

/// An allocation and the host copy of what was uploaded into it.
pub(crate) struct RecordedBuffer {
    pub bytes: u64,
    /// The buffer's bytes as uploaded from the host, made at the first upload (zero where
    /// nothing was uploaded); `None` for a buffer only the device wrote.
    pub shadow: Option<Vec<u8>>,
    /// An upload could not be recorded (no host memory for the shadow): a rebuild must
    /// fail rather than bring the buffer back without it.
    pub shadow_lost: bool,
}

pub(crate) struct RecordedModule {
    pub broker: u64,
    pub format: ModuleFormat,
    pub image: Arc<[u8]>,
}

pub(crate) struct RecordedFunction {
    pub broker: u64,
    /// The library's id of its module.
    pub module: u64,
    pub name: String,
}

/// Broker ids nothing maps to: commands naming an unknown handle fail with `InvalidHandle`
/// instead of reaching another of the client's objects.
const NO_STREAM: StreamId = StreamId::MAX;
const NO_EVENT: EventId = EventId::MAX;
const NO_OBJECT: u64 = u64::MAX;

/// The record, and the translation from the library's handle ids to the broker's.
pub(crate) struct Registry {
    pub buffers: BTreeMap<DevicePtr, RecordedBuffer>,
    /// Library id → broker id. The default stream is 0 on both sides and not listed.
    pub streams: BTreeMap<StreamId, StreamId>,
    pub events: BTreeMap<EventId, EventId>,
    pub modules: BTreeMap<u64, RecordedModule>,
    pub functions: BTreeMap<u64, RecordedFunction>,
    /// The last job profile and deadline declared (`DeclareJob`, `DeclareDeadline`), made
    /// again after a restart.
    pub declarations: Vec<Command>,
    next_stream: StreamId,
    next_event: EventId,
    next_object: u64,
    /// Set for good when a rebuild failed.
    pub failed: Option<RebuildError>,
    /// Rebuilds done.
    pub rebuilds: u64,
    /// Where each event was last recorded (library ids).
    event_streams: BTreeMap<EventId, StreamId>,
    /// Streams (library ids) with asynchronous work not yet waited for, and the threads that
    /// submitted it.
    unsynced: BTreeMap<StreamId, HashSet<ThreadId>>,
    /// Such work a rebuild found: the reset took it. It is reported (as `Rebuilt`) once, to
    /// the first call that waits for its stream, or to each thread that submitted it, in
    /// whatever call that thread meets the rebuild with.
    lost_work: BTreeMap<StreamId, HashSet<ThreadId>>,
    /// Why the last rebuild was needed.
    pub last_reason: String,
}

/// What a call that returned waited for.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Waited {
    /// All of the client's work.
    All,
    Stream(StreamId),
    /// The work before an event.
    Event(EventId),
}

impl Registry {
    pub fn new() -> Registry {
        Registry {
            buffers: BTreeMap::new(),
            streams: BTreeMap::new(),
            events: BTreeMap::new(),
            modules: BTreeMap::new(),
            functions: BTreeMap::new(),
            declarations: Vec::new(),
            next_stream: 1,
            next_event: 1,
            next_object: 1,
            failed: None,
            rebuilds: 0,
            event_streams: BTreeMap::new(),
            unsynced: BTreeMap::new(),
            lost_work: BTreeMap::new(),
            last_reason: String::new(),
        }
    }

    /// An asynchronous command was submitted (library ids).
    pub fn submitted_async(&mut self, cmd: &Command) {
        if let Command::EventRecord { stream, event } = *cmd {
            self.event_streams.insert(event, stream);
            return;
        }
        if let Some(stream) = cmd.stream() {
            self.submitted_async_on(stream);
        }
    }

    /// Work was submitted to `stream` (a library id) without waiting.
    pub fn submitted_async_on(&mut self, stream: StreamId) {
        self.unsynced
            .entry(stream)
            .or_default()
            .insert(std::thread::current().id());
    }

    /// A call returned having waited for `waited`'s work: it is no longer in flight. Returns
    /// whether the reset took some of it (that call must say so).
    pub fn waited(&mut self, waited: Waited) -> bool {
        let stream = match waited {
            Waited::All => {
                self.unsynced.clear();
                let lost = !self.lost_work.is_empty();
                self.lost_work.clear();
                return lost;
            }
            Waited::Stream(s) => s,
            Waited::Event(e) => match self.event_streams.get(&e) {
                Some(&s) => s,
                None => return false,
            },
        };
        self.unsynced.remove(&stream);
        self.lost_work.remove(&stream).is_some()
    }

    /// After a rebuild: every bit of work not yet waited for was lost.
    pub fn lose_unsynced(&mut self) {
        for (stream, threads) in std::mem::take(&mut self.unsynced) {
            self.lost_work.entry(stream).or_default().extend(threads);
        }
    }

    /// The current thread was told of the rebuild: the work it submitted before is reported.
    pub fn told_this_thread(&mut self) {
        let me = std::thread::current().id();
        self.lost_work.retain(|_, threads| {
            threads.remove(&me);
            !threads.is_empty()
        });
    }

    pub fn stream(&self, id: StreamId) -> StreamId {
        if id == 0 {
            return 0;
        }
        self.streams.get(&id).copied().unwrap_or(NO_STREAM)
    }

    pub fn event(&self, id: EventId) -> EventId {
        self.events.get(&id).copied().unwrap_or(NO_EVENT)
    }

    pub fn module(&self, id: u64) -> u64 {
        self.modules.get(&id).map_or(NO_OBJECT, |m| m.broker)
    }

    pub fn function(&self, id: u64) -> u64 {
        self.functions.get(&id).map_or(NO_OBJECT, |f| f.broker)
    }

    /// A command naming the library's ids, as the broker names them.
    pub fn translate(&self, cmd: Command) -> Command {
        let s = |id| self.stream(id);
        let e = |id| self.event(id);
        match cmd {
            Command::CopyHtoD {
                stream,
                arena_offset,
                dst,
                len,
            } => Command::CopyHtoD {
                stream: s(stream),
                arena_offset,
                dst,
                len,
            },
            Command::CopyDtoH {
                stream,
                src,
                arena_offset,
                len,
            } => Command::CopyDtoH {
                stream: s(stream),
                src,
                arena_offset,
                len,
            },
            Command::CopyDtoD {
                stream,
                src,
                dst,
                len,
            } => Command::CopyDtoD {
                stream: s(stream),
                src,
                dst,
                len,
            },
            Command::Memset {
                stream,
                dst,
                value,
                len,
            } => Command::Memset {
                stream: s(stream),
                dst,
                value,
                len,
            },
            Command::StreamDestroy { stream } => Command::StreamDestroy { stream: s(stream) },
            Command::StreamSync { stream } => Command::StreamSync { stream: s(stream) },
            Command::EventRecord { stream, event } => Command::EventRecord {
                stream: s(stream),
                event: e(event),
            },
            Command::EventQuery { event } => Command::EventQuery { event: e(event) },
            Command::EventSync { event } => Command::EventSync { event: e(event) },
            Command::EventElapsed { start, end } => Command::EventElapsed {
                start: e(start),
                end: e(end),
            },
            Command::EventDestroy { event } => Command::EventDestroy { event: e(event) },
            Command::Launch { stream, kernel } => Command::Launch {
                stream: s(stream),
                kernel,
            },
            Command::LaunchModule { stream, launch } => Command::LaunchModule {
                stream: s(stream),
                launch: ModuleLaunch {
                    function: self.function(launch.function),
                    ..launch
                },
            },
            other => other,
        }
    }

    /// Notes what a successful command made or ended; returns its result as the caller sees
    /// it (a new stream or event as the library's id).
    pub fn record(&mut self, cmd: &Command, result: (u64, u64)) -> (u64, u64) {
        match *cmd {
            Command::Alloc { bytes } => {
                self.add_buffer(result.0, bytes);
            }
            Command::AllocAt { bytes, ptr } => {
                self.add_buffer(ptr, bytes);
            }
            Command::StreamCreate => {
                if let Ok(broker) = StreamId::try_from(result.0) {
                    return (self.add_stream(broker) as u64, result.1);
                }
            }
            Command::EventCreate => {
                if let Ok(broker) = EventId::try_from(result.0) {
                    return (self.add_event(broker) as u64, result.1);
                }
            }
            Command::DeclareJob { .. } | Command::DeclareDeadline { .. } => {
                let same = std::mem::discriminant(cmd);
                self.declarations
                    .retain(|d| std::mem::discriminant(d) != same);
                self.declarations.push(*cmd);
            }
            _ => {}
        }
        result
    }

    /// Forgets what a command ends, whatever the broker answers (a release of something a
    /// reset took is done, and the broker says so; anything else was never the client's).
    pub fn forget(&mut self, cmd: &Command) {
        match *cmd {
            Command::Free { ptr } => {
                self.buffers.remove(&ptr);
            }
            Command::StreamDestroy { stream } => {
                self.unsynced.remove(&stream);
                self.lost_work.remove(&stream);
                self.streams.remove(&stream);
            }
            Command::EventDestroy { event } => {
                self.events.remove(&event);
                self.event_streams.remove(&event);
            }
            _ => {}
        }
    }

    pub fn add_buffer(&mut self, ptr: DevicePtr, bytes: u64) {
        self.buffers.insert(
            ptr,
            RecordedBuffer {
                bytes,
                shadow: None,
                shadow_lost: false,
            },
        );
    }

    pub fn add_stream(&mut self, broker: StreamId) -> StreamId {
        let id = self.next_stream;
        self.next_stream = self.next_stream.wrapping_add(1).max(1);
        self.streams.insert(id, broker);
        id
    }

    pub fn add_event(&mut self, broker: EventId) -> EventId {
        let id = self.next_event;
        self.next_event = self.next_event.wrapping_add(1).max(1);
        self.events.insert(id, broker);
        id
    }

    fn next_object(&mut self) -> u64 {
        let id = self.next_object;
        self.next_object += 1;
        id
    }

    pub fn add_module(&mut self, broker: u64, format: ModuleFormat, image: &[u8]) -> u64 {
        let id = self.next_object();
        self.modules.insert(
            id,
            RecordedModule {
                broker,
                format,
                image: image.into(),
            },
        );
        id
    }

    pub fn remove_module(&mut self, id: u64) {
        self.modules.remove(&id);
        self.functions.retain(|_, f| f.module != id);
    }

    pub fn add_function(&mut self, broker: u64, module: u64, name: &str) -> u64 {
        let id = self.next_object();
        self.functions.insert(
            id,
            RecordedFunction {
                broker,
                module,
                name: name.into(),
            },
        );
        id
    }

    /// Copies `data`, just uploaded to `dst`, into the shadow of the buffer holding it.
    /// Uploads that are not inside one recorded buffer are not recorded (the broker refused
    /// them anyway). A shadow that cannot be had (host memory) marks the buffer: rebuilding
    /// it fails instead of bringing it back without its contents.
    pub fn record_upload(&mut self, dst: DevicePtr, data: &[u8]) {
        let Some((&base, buffer)) = self.buffers.range_mut(..=dst).next_back() else {
            return;
        };
        let offset = dst - base;
        let Some(end) = offset.checked_add(data.len() as u64) else {
            return;
        };
        if end > buffer.bytes || data.is_empty() {
            return;
        }
        if buffer.shadow.is_none() {
            let Ok(len) = usize::try_from(buffer.bytes) else {
                buffer.shadow_lost = true;
                return;
            };
            let mut shadow = Vec::new();
            if shadow.try_reserve_exact(len).is_err() {
                buffer.shadow_lost = true;
                return;
            }
            shadow.resize(len, 0);
            buffer.shadow = Some(shadow);
        }
        if let Some(shadow) = &mut buffer.shadow {
            // In bounds: `end <= bytes == shadow.len()`.
            shadow[offset as usize..end as usize].copy_from_slice(data);
        }
    }

    /// Host bytes the record holds (shadows and module images).
    pub fn host_bytes(&self) -> u64 {
        let shadows: u64 = self
            .buffers
            .values()
            .filter_map(|b| b.shadow.as_ref().map(|s| s.len() as u64))
            .sum();
        let images: u64 = self.modules.values().map(|m| m.image.len() as u64).sum();
        shadows + images
    }
}

/// What to make again: everything (after a restart, the new session has nothing), or what
/// the broker's notices say resets took (in place: objects made since are not lost). Broker
/// ids.
pub(crate) enum Lost {
    Everything,
    Listed {
        buffers: HashSet<DevicePtr>,
        streams: HashSet<StreamId>,
        events: HashSet<EventId>,
        modules: HashSet<u64>,
    },
}

impl Lost {
    pub fn listed(states: impl IntoIterator<Item = LostState>) -> Lost {
        let (mut buffers, mut streams, mut events, mut modules) = (
            HashSet::new(),
            HashSet::new(),
            HashSet::new(),
            HashSet::new(),
        );
        for s in states {
            buffers.extend(s.buffers.iter().map(|&(p, _)| p));
            streams.extend(s.streams);
            events.extend(s.events);
            modules.extend(s.modules);
        }
        Lost::Listed {
            buffers,
            streams,
            events,
            modules,
        }
    }

    pub fn buffer(&self, ptr: DevicePtr) -> bool {
        match self {
            Lost::Everything => true,
            Lost::Listed { buffers, .. } => buffers.contains(&ptr),
        }
    }

    pub fn stream(&self, broker: StreamId) -> bool {
        match self {
            Lost::Everything => true,
            Lost::Listed { streams, .. } => streams.contains(&broker),
        }
    }

    pub fn event(&self, broker: EventId) -> bool {
        match self {
            Lost::Everything => true,
            Lost::Listed { events, .. } => events.contains(&broker),
        }
    }

    pub fn module(&self, broker: u64) -> bool {
        match self {
            Lost::Everything => true,
            Lost::Listed { modules, .. } => modules.contains(&broker),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uploads_land_in_the_shadow_of_their_buffer_only() {
        let mut r = Registry::new();
        r.add_buffer(0x1000, 16);
        r.add_buffer(0x2000, 8);
        r.record_upload(0x1004, &[1, 2, 3, 4]);
        r.record_upload(0x100e, &[9, 9, 9]); // runs past the end: not recorded
        r.record_upload(0x3000, &[5]); // no buffer there
        let shadow = r.buffers[&0x1000].shadow.as_deref().expect("shadow made");
        assert_eq!(shadow, &[0, 0, 0, 0, 1, 2, 3, 4, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert!(r.buffers[&0x2000].shadow.is_none(), "never uploaded");
        assert_eq!(r.host_bytes(), 16);
        r.forget(&Command::Free { ptr: 0x1000 });
        assert_eq!(r.host_bytes(), 0);
    }

    #[test]
    fn handles_are_the_librarys_and_translate_to_the_brokers() {
        let mut r = Registry::new();
        let (s, _) = r.record(&Command::StreamCreate, (7, 0));
        let (e, _) = r.record(&Command::EventCreate, (3, 0));
        assert_eq!((s, e), (1, 1));
        // After a rebuild the broker's ids change; the library's stay.
        r.streams.insert(1, 9);
        assert_eq!(
            r.translate(Command::EventRecord {
                stream: s as StreamId,
                event: e as EventId
            }),
            Command::EventRecord {
                stream: 9,
                event: 3
            }
        );
        assert_eq!(
            r.translate(Command::StreamSync { stream: 0 }),
            Command::StreamSync { stream: 0 }
        );
        // An unknown id never reaches another object.
        assert_eq!(
            r.translate(Command::StreamSync { stream: 2 }),
            Command::StreamSync { stream: NO_STREAM }
        );
        r.forget(&Command::StreamDestroy { stream: 1 });
        assert_eq!(r.stream(1), NO_STREAM);
        let m = r.add_module(40, ModuleFormat::Ptx, b"image");
        let f = r.add_function(41, m, "k");
        assert_eq!((r.module(m), r.function(f)), (40, 41));
        r.remove_module(m);
        assert_eq!(r.function(f), NO_OBJECT);
    }
}

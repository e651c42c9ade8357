//! What consolidated clients (a client-side CUDA driver) ask of a session besides what every
//! client does: streams and events under ids they choose, stream-to-event waits and stream
//! queries, CUDA's legacy default-stream order, staged and page-locked copies, wider
//! memsets, device memory as their quota shows it, function attributes and occupancy, and
//! points where they run a host function in stream order.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use gpushare_protocol::{Command, DevicePtr, ErrorCode, StreamId};

use super::{MAX_EVENTS, MAX_STREAMS, SessionState, StreamSlot};
use crate::device::{Call, Device, Event, EventKind, Function, Occupancy, Reply};

/// `CU_STREAM_NON_BLOCKING`.
const NON_BLOCKING: u32 = 0x1;

/// CUDA's legacy order between stream 0 and the blocking streams: a marker event per stream,
/// and how much work stream 0 has been given.
#[derive(Default)]
pub(super) struct Legacy {
    markers: HashMap<StreamId, Event>,
    /// Stream 0's operations so far.
    epoch: u64,
    /// Blocking streams with work stream 0 has not been ordered after (their slots say
    /// `unordered`): kept apart so that stream 0's launches never walk every stream.
    unordered: Vec<StreamId>,
}

impl SessionState {
    /// Runs a command only consolidated clients send; `None` for any other command.
    pub(super) fn execute_consolidated(
        &mut self,
        cmd: Command,
    ) -> Option<Result<(u64, u64), ErrorCode>> {
        Some(match cmd {
            Command::StreamCreateAs {
                stream,
                flags,
                priority: _,
            } => self.create_stream_as(stream, flags),
            Command::EventCreateAs { event, flags } => self.create_event_as(event, flags),
            Command::StreamWaitEvent { stream, event } => self.wait_event(stream, event),
            Command::StreamQuery { stream } if self.lost.take_work(stream) => {
                Err(ErrorCode::WorkLost)
            }
            Command::StreamQuery { stream } => self.query_stream(stream),
            Command::MemsetWide {
                stream,
                dst,
                value,
                elem_bytes,
                count,
            } => count
                .checked_mul(elem_bytes as u64)
                .ok_or(ErrorCode::InvalidArgument)
                .and_then(|len| self.check_write(dst, len))
                .and_then(|()| {
                    self.on_stream(stream, |d, s| {
                        let memset = |stream| Call::Memset {
                            stream,
                            dst,
                            value,
                            elem_bytes,
                            count,
                        };
                        d.queue(s, memset, &[])
                    })
                }),
            Command::CopyHtoDStaged {
                stream,
                arena_offset,
                dst,
                len,
            } => self.check_write(dst, len).and_then(|()| {
                let src = self
                    .region
                    .arena_slice(arena_offset, len)
                    .ok_or(ErrorCode::ArenaOutOfBounds)?;
                // A copy of the bytes, to upload them again if a fault stops the upload
                // before it starts (the client reuses its arena once this returns).
                let bytes = self.device.keeps_upload(len).then(|| {
                    let mut bytes = vec![0; src.len()];
                    src.read_into(&mut bytes);
                    bytes
                });
                let src = src.span();
                let r =
                    self.on_stream(stream, |d, s| d.upload_now(s, src, dst, bytes.as_deref()))?;
                self.info
                    .counters
                    .bytes_htod
                    .fetch_add(len, Ordering::Relaxed);
                Ok(r)
            }),
            Command::CopyDtoHStaged {
                stream,
                src,
                arena_offset,
                len,
            } => self.check_device(src, len).and_then(|()| {
                let dst = self
                    .region
                    .arena_slice(arena_offset, len)
                    .ok_or(ErrorCode::ArenaOutOfBounds)?
                    .span();
                let r = self.on_stream(stream, |d, s| d.download_now(s, src, dst))?;
                if let Some(slot) = self.streams.get_mut(&stream) {
                    slot.unsynced = false;
                }
                self.granted_seen_finished(stream);
                self.publish_mark(stream);
                self.info
                    .counters
                    .bytes_dtoh
                    .fetch_add(len, Ordering::Relaxed);
                Ok(r)
            }),
            Command::CopyHtoDHost {
                stream,
                region,
                offset,
                dst,
                len,
            } => self.check_write(dst, len).and_then(|()| {
                let host = self.host(region)?;
                let src = host
                    .slice(offset, len)
                    .ok_or(ErrorCode::ArenaOutOfBounds)?
                    .span();
                self.queue_htod(stream, src, dst, len)
            }),
            Command::CopyDtoHHost {
                stream,
                src,
                region,
                offset,
                len,
            } => self.check_device(src, len).and_then(|()| {
                let host = self.host(region)?;
                let dst = host
                    .slice(offset, len)
                    .ok_or(ErrorCode::ArenaOutOfBounds)?
                    .span();
                self.queue_dtoh(stream, src, dst, len)
            }),
            // What is left of the user's quota, beside all of their sessions.
            Command::MemInfo => match self.info.grant().memory_quota {
                Some(quota) => {
                    let used = self.info.account().memory_used();
                    Ok((quota.saturating_sub(used), quota))
                }
                None => self
                    .device
                    .call(Call::MemoryInfo, &[])
                    .and_then(Reply::pair)
                    .map_err(|e| e.code()),
            },
            Command::FunctionSetAttribute {
                function,
                attribute,
                value,
            } => self.function(function).and_then(|function| {
                let call = Call::SetFunctionAttribute {
                    function,
                    attribute,
                    value,
                };
                self.device
                    .call(call, &[])
                    .and_then(Reply::done)
                    .map(|()| (0, 0))
                    .map_err(|e| e.code())
            }),
            Command::Occupancy {
                function,
                query,
                block_size,
                dynamic_smem,
                flags,
                cluster,
            } => self.function(function).and_then(|function| {
                let question = Occupancy {
                    query,
                    block_size,
                    dynamic_smem,
                    flags,
                    cluster,
                };
                self.device
                    .call(Call::Occupancy { function, question }, &[])
                    .and_then(Reply::value)
                    .map(|n| (n, 0))
                    .map_err(|e| e.code())
            }),
            _ => return None,
        })
    }

    fn create_stream_as(&mut self, id: StreamId, flags: u32) -> Result<(u64, u64), ErrorCode> {
        if id == 0 || self.streams.contains_key(&id) {
            return Err(ErrorCode::InvalidHandle);
        }
        if self.streams.len() >= MAX_STREAMS {
            return Err(ErrorCode::TooManyHandles);
        }
        let stream = self
            .device
            .create_stream(self.info.grant().class)
            .map_err(|e| e.code())?;
        let mut slot = StreamSlot::new(stream);
        slot.blocking = flags & NON_BLOCKING == 0;
        self.streams.insert(id, slot);
        self.info
            .counters
            .streams
            .store(self.streams.len() as u64, Ordering::Relaxed);
        Ok((0, 0))
    }

    fn create_event_as(&mut self, id: u32, flags: u32) -> Result<(u64, u64), ErrorCode> {
        if id == 0 || self.events.contains_key(&id) {
            return Err(ErrorCode::InvalidHandle);
        }
        if self.events.len() >= MAX_EVENTS {
            return Err(ErrorCode::TooManyHandles);
        }
        let event = self
            .device
            .create_event(EventKind::Flags(flags))
            .map_err(|e| e.code())?;
        self.events.insert(id, Arc::new(event));
        Ok((0, 0))
    }

    fn host(&self, region: u32) -> Result<std::sync::Arc<crate::shm::HostRegion>, ErrorCode> {
        self.info
            .hosts
            .lock()
            .map_err(|_| ErrorCode::Internal)?
            .get(region)
            .ok_or(ErrorCode::InvalidHandle)
    }

    /// A function's number on the device, for a call that names it.
    fn function(&self, id: u64) -> Result<u64, ErrorCode> {
        let f: std::sync::Arc<Function> = self
            .modules
            .lock()
            .map_err(|_| ErrorCode::Internal)?
            .function(id)
            .ok_or(ErrorCode::InvalidHandle)?;
        self.device.id(&*f).map_err(|e| e.code())
    }

    /// `cuStreamWaitEvent`: work queued on `stream` after this waits for the event's work.
    fn wait_event(&mut self, stream: StreamId, event: u32) -> Result<(u64, u64), ErrorCode> {
        let e = self.events.get(&event).ok_or(ErrorCode::InvalidHandle)?;
        let event = self.device.id(&**e).map_err(|e| e.code())?;
        self.on_stream(stream, |d, s| {
            d.queue(s, |stream| Call::StreamWaitEvent { stream, event }, &[])
        })
    }

    /// Before an operation on `stream` of a consolidated client: CUDA's legacy order. Work
    /// on stream 0 waits for the blocking streams' work before it, and work on a blocking
    /// stream for stream 0's.
    pub(super) fn order_legacy(&mut self, stream: StreamId) -> Result<(), ErrorCode> {
        let device = self.device.clone();
        if stream == 0 {
            while let Some(&id) = self.legacy.unordered.last() {
                // A stream destroyed since has nothing left to order.
                if self.streams.get(&id).is_some_and(|s| s.unordered) {
                    self.mark_and_wait(&device, id, 0)?;
                    if let Some(s) = self.streams.get_mut(&id) {
                        s.unordered = false;
                    }
                }
                self.legacy.unordered.pop();
            }
        } else if let Some(slot) = self.streams.get(&stream)
            && slot.blocking
            && slot.legacy_seen < self.legacy.epoch
        {
            self.mark_and_wait(&device, 0, stream)?;
            let epoch = self.legacy.epoch;
            if let Some(s) = self.streams.get_mut(&stream) {
                s.legacy_seen = epoch;
            }
        }
        Ok(())
    }

    /// After an operation on `stream`: what the next one on the other side must wait for.
    pub(super) fn note_legacy(&mut self, stream: StreamId) {
        if stream == 0 {
            self.legacy.epoch += 1;
        } else if let Some(s) = self.streams.get_mut(&stream)
            && s.blocking
            && !s.unordered
        {
            s.unordered = true;
            self.legacy.unordered.push(stream);
        }
    }

    /// Records `from`'s marker at the end of `from`, and makes `to` wait for it.
    fn mark_and_wait(
        &mut self,
        device: &Device,
        from: StreamId,
        to: StreamId,
    ) -> Result<(), ErrorCode> {
        if let std::collections::hash_map::Entry::Vacant(v) = self.legacy.markers.entry(from) {
            v.insert(
                device
                    .create_event(EventKind::Marker)
                    .map_err(|e| e.code())?,
            );
        }
        let marker = self.legacy.markers.get(&from).ok_or(ErrorCode::Internal)?;
        let source = self
            .streams
            .get_mut(&from)
            .ok_or(ErrorCode::InvalidHandle)?;
        device
            .record_event(marker, &mut source.stream)
            .map_err(|e| e.code())?;
        let event = device.id(marker).map_err(|e| e.code())?;
        let target = self.streams.get_mut(&to).ok_or(ErrorCode::InvalidHandle)?;
        device
            .queue(
                &mut target.stream,
                |stream| Call::StreamWaitEvent { stream, event },
                &[],
            )
            .map_err(|e| e.code())
    }

    /// Forgets the legacy markers (their streams are gone: a reset, or the session's end).
    pub(super) fn forget_legacy(&mut self) {
        self.legacy = Legacy::default();
    }
}

impl SessionState {
    /// A point where the client runs a host function in stream order (`StreamHostPoint`):
    /// both words must be the client's page-locked host memory as the device reaches it.
    pub(super) fn host_point(
        &mut self,
        stream: StreamId,
        done: DevicePtr,
        go: DevicePtr,
        value: u32,
    ) -> Result<(u64, u64), ErrorCode> {
        self.check_write(done, 4)?;
        self.check_device(go, 4)?;
        // Noted first, and the stop flag read under the same lock: a stop (which sets the flag,
        // then takes the points under that lock) either finds this point, or is seen here
        // and the point is let go at once: a program already gone never runs its function.
        let stopping = {
            let mut points = self
                .info
                .host_points
                .lock()
                .map_err(|_| ErrorCode::Internal)?;
            let held = points.entry(go).or_insert(value);
            *held = (*held).max(value);
            self.info.stopping()
        };
        if stopping {
            self.info.release_host_points();
        }
        let point = |stream| Call::HostPoint {
            stream,
            done,
            go,
            value,
        };
        self.on_stream(stream, |d, s| d.queue(s, point, &[]))
    }

    /// Whether the stream's work is done (`cuStreamQuery`); done, it is known idle.
    fn query_stream(&mut self, stream: StreamId) -> Result<(u64, u64), ErrorCode> {
        let device = self.device.clone();
        let slot = self
            .streams
            .get_mut(&stream)
            .ok_or(ErrorCode::InvalidHandle)?;
        let done = device.stream_done(&slot.stream).map_err(|e| e.code())?;
        if done {
            slot.unsynced = false;
            device.settled(&mut slot.stream);
            self.granted_seen_finished(stream);
        }
        Ok((done as u64, 0))
    }
}

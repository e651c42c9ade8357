//! One request, run on the worker's device: the handles and regions it names looked up, the
//! device called, the answer made.

use std::sync::{Arc, Mutex};

use super::{Worker, lock};
use crate::device::remote::wire::{Answer, Handle, Reply, Request, WireError};
use crate::device::{Device, DeviceError, DeviceResult};

impl<D: Device> Worker<D> {
    /// Runs `f` on a live stream; the answer also says what the stream's device time
    /// measurements found since the last answer.
    fn on_stream(
        &self,
        id: Handle,
        f: impl FnOnce(&mut D::Stream) -> DeviceResult<Reply>,
    ) -> Answer {
        let slot = match self.stream(id) {
            Ok(s) => s,
            Err(e) => return failed(e),
        };
        let mut guard = lock(&slot);
        let Some(stream) = guard.as_mut() else {
            return failed(DeviceError::InvalidArgument(format!(
                "stream {id} destroyed"
            )));
        };
        let reply = f(stream).unwrap_or_else(|e| Reply::Failed(WireError::from(&e)));
        let busy = self.device.take_busy_ns(stream);
        let measuring = self.device.measuring(stream);
        let news = Some((busy, measuring));
        Answer { reply, news }
    }

    /// The event a launch's start is marked with, if it has one.
    fn start_event(&self, start: Option<Handle>) -> DeviceResult<Option<Arc<Mutex<D::Event>>>> {
        start.map(|e| self.event(e)).transpose()
    }

    /// Marks where the stream's next work starts, just before it is queued.
    fn mark_start(
        &self,
        start: Option<&Arc<Mutex<D::Event>>>,
        stream: &mut D::Stream,
    ) -> DeviceResult<()> {
        match start {
            Some(e) => self.device.record_start(&mut lock(e), stream),
            None => Ok(()),
        }
    }

    /// Runs one request.
    pub(super) fn run(&self, request: Request, payload: &[u8]) -> Answer {
        let dev = &self.device;
        let done = |r: DeviceResult<()>| r.map(|()| Reply::Done);
        let value = |r: DeviceResult<u64>| r.map(Reply::Value);
        let result: DeviceResult<Reply> = match request {
            Request::Alloc { bytes } => value(dev.alloc(bytes)),
            Request::AllocAt { ptr, bytes } => value(dev.alloc_at(ptr, bytes)),
            Request::Free { ptr } => done(dev.free(ptr)),
            Request::RegisterArena { span } => self
                .region(span.region)
                .and_then(|r| done(dev.register_arena(self.slice(&r, span)?))),
            Request::UnregisterArena { span } => self.region(span.region).and_then(|r| {
                dev.unregister_arena(self.slice(&r, span)?);
                Ok(Reply::Done)
            }),
            Request::RegisterHost { span } => self
                .region(span.region)
                .and_then(|r| value(dev.register_host(self.slice(&r, span)?))),
            Request::UnregisterHost { span } => self.region(span.region).and_then(|r| {
                dev.unregister_host(self.slice(&r, span)?);
                Ok(Reply::Done)
            }),
            Request::CreateStream { class } => dev.create_stream(class).map(|s| {
                let id = self.handle();
                lock(&self.streams).insert(id, Arc::new(Mutex::new(Some(s))));
                Reply::Value(id)
            }),
            Request::DestroyStream { stream } => {
                let slot = lock(&self.streams).remove(&stream);
                if let Some(s) = slot.and_then(|slot| lock(&slot).take()) {
                    dev.destroy_stream(s);
                }
                Ok(Reply::Done)
            }
            Request::CopyHtoD {
                stream,
                src,
                dst,
                staged,
            } => {
                return match self.region(src.region) {
                    Ok(r) => self.on_stream(stream, |s| {
                        let src = self.slice(&r, src)?;
                        done(if staged {
                            dev.copy_htod_staged(s, src, dst)
                        } else {
                            dev.copy_htod(s, src, dst)
                        })
                    }),
                    Err(e) => failed(e),
                };
            }
            Request::CopyDtoH {
                stream,
                src,
                dst,
                staged,
            } => {
                return match self.region(dst.region) {
                    Ok(r) => self.on_stream(stream, |s| {
                        let dst = self.slice(&r, dst)?;
                        done(if staged {
                            dev.copy_dtoh_staged(s, src, dst)
                        } else {
                            dev.copy_dtoh(s, src, dst)
                        })
                    }),
                    Err(e) => failed(e),
                };
            }
            Request::CopyDtoD {
                stream,
                src,
                dst,
                len,
            } => return self.on_stream(stream, |s| done(dev.copy_dtod(s, src, dst, len))),
            Request::Memset {
                stream,
                dst,
                value,
                elem_bytes,
                count,
            } => {
                return self.on_stream(stream, |s| {
                    done(if elem_bytes == 1 {
                        dev.memset(s, dst, value as u8, count)
                    } else {
                        dev.memset_wide(s, dst, value, elem_bytes, count)
                    })
                });
            }
            Request::Launch {
                stream,
                kernel,
                start,
            } => {
                return match self.start_event(start) {
                    Ok(start) => self.on_stream(stream, |s| {
                        self.mark_start(start.as_ref(), s)?;
                        done(dev.launch(s, &kernel))
                    }),
                    Err(e) => failed(e),
                };
            }
            Request::LimitSms { stream, sms } => {
                return self.on_stream(stream, |s| done(dev.limit_sms(s, sms)));
            }
            Request::LaunchModule {
                stream,
                function,
                launch,
                attributes,
                start,
            } => {
                return match self
                    .function(function)
                    .and_then(|f| Ok((f, self.start_event(start)?)))
                {
                    Ok((f, start)) => self.on_stream(stream, |s| {
                        self.mark_start(start.as_ref(), s)?;
                        done(dev.launch_module(s, &f, &launch, &attributes, payload))
                    }),
                    Err(e) => failed(e),
                };
            }
            Request::SyncStream { stream } => {
                return self.on_stream(stream, |s| done(dev.sync_stream(s)));
            }
            Request::EndBatch { stream, idle } => {
                return self.on_stream(stream, |s| {
                    dev.end_batch(s, idle);
                    Ok(Reply::Done)
                });
            }
            Request::StreamBusy { stream } => {
                return self.on_stream(stream, |s| Ok(Reply::Flag(dev.stream_busy(s))));
            }
            Request::StreamDone { stream } => {
                return self.on_stream(stream, |s| dev.stream_done(s).map(Reply::Flag));
            }
            Request::StreamWaitEvent { stream, event } => {
                return match self.event(event) {
                    Ok(e) => self.on_stream(stream, |s| done(dev.stream_wait_event(s, &lock(&e)))),
                    Err(e) => failed(e),
                };
            }
            Request::CreateEvent { marker, flags } => {
                let made = match (flags, marker) {
                    (Some(flags), _) => dev.create_event_flags(flags),
                    (None, true) => dev.create_marker(),
                    (None, false) => dev.create_event(),
                };
                made.map(|e| {
                    let id = self.handle();
                    lock(&self.events).insert(id, Arc::new(Mutex::new(e)));
                    Reply::Value(id)
                })
            }
            Request::DestroyEvent { event } => {
                lock(&self.events).remove(&event);
                Ok(Reply::Done)
            }
            Request::RecordEvent {
                event,
                stream,
                start,
            } => {
                return match self.event(event) {
                    Ok(e) => self.on_stream(stream, |s| {
                        let mut e = lock(&e);
                        done(if start {
                            dev.record_start(&mut e, s)
                        } else {
                            dev.record_event(&mut e, s)
                        })
                    }),
                    Err(e) => failed(e),
                };
            }
            Request::EventDone { event } => self
                .event(event)
                .and_then(|e| dev.event_done(&lock(&e)).map(Reply::Flag)),
            Request::SyncEvent { event } => self
                .event(event)
                .and_then(|e| done(dev.sync_event(&lock(&e)))),
            Request::ElapsedNs { start, end } => self.event(start).and_then(|s| {
                let e = self.event(end)?;
                if Arc::ptr_eq(&s, &e) {
                    return value(dev.elapsed_ns(&lock(&s), &lock(&s)));
                }
                let (s, e) = (lock(&s), lock(&e));
                value(dev.elapsed_ns(&s, &e))
            }),
            Request::Fault => Ok(Reply::Fault(dev.fault())),
            Request::LoadModule { format } => dev.load_module(format, payload).map(|m| {
                let id = self.handle();
                lock(&self.modules).insert(id, Arc::new(m));
                Reply::Value(id)
            }),
            Request::DropModule { module } => {
                lock(&self.modules).remove(&module);
                Ok(Reply::Done)
            }
            Request::GetFunction { module } => self.module(module).and_then(|m| {
                let name = name(payload)?;
                dev.get_function(&m, name).map(|f| {
                    let id = self.handle();
                    lock(&self.functions).insert(id, Arc::new(f));
                    Reply::Value(id)
                })
            }),
            Request::DropFunction { function } => {
                lock(&self.functions).remove(&function);
                Ok(Reply::Done)
            }
            Request::MemoryInfo => dev.memory_info().map(|(f, t)| Reply::Pair(f, t)),
            Request::FunctionShape { function } => self
                .function(function)
                .and_then(|f| dev.function_shape(&f).map(Reply::Shape)),
            Request::SetFunctionAttribute {
                function,
                attribute,
                value,
            } => self
                .function(function)
                .and_then(|f| done(dev.set_function_attribute(&f, attribute, value))),
            Request::Occupancy { function, question } => self
                .function(function)
                .and_then(|f| value(dev.occupancy(&f, &question))),
            Request::ModuleGlobal { module } => self.module(module).and_then(|m| {
                let name = name(payload)?;
                dev.module_global(&m, name).map(|(a, b)| Reply::Pair(a, b))
            }),
        };
        Answer {
            reply: result.unwrap_or_else(|e| Reply::Failed(WireError::from(&e))),
            news: None,
        }
    }
}

/// The answer of a request that failed.
pub(super) fn failed(e: DeviceError) -> Answer {
    Answer {
        reply: Reply::Failed(WireError::from(&e)),
        news: None,
    }
}

fn name(payload: &[u8]) -> DeviceResult<&str> {
    std::str::from_utf8(payload)
        .map_err(|_| DeviceError::InvalidArgument("a name that is not UTF-8".into()))
}

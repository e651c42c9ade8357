//! The one `match` that runs a [`Call`] on a backend ([`Executor::run`]): the handles and
//! regions it names looked up, the backend called, the answer made.

use super::*;

impl<B: Backend> Executor<B> {
    /// Runs one call: the handles and regions it names looked up, the backend called, the
    /// answer made.
    pub fn run(&self, call: Call, payload: &[u8]) -> Answer {
        let Some(began) = crate::timeline::begin() else {
            return self.run_call(call, payload);
        };
        // A stream's first call is noted as itself.
        let noted = match &call {
            Call::Opening { call, .. } => (**call).clone(),
            call => call.clone(),
        };
        let answer = self.run_call(call, payload);
        crate::timeline::note("device", &noted, Some(began));
        answer
    }

    fn run_call(&self, call: Call, payload: &[u8]) -> Answer {
        let stream = call.stream();
        let answer = self.run_one(call, payload);
        if let (Some(stream), Reply::Failed(_)) = (stream, &answer.reply) {
            self.failed_on(stream);
        }
        answer
    }

    fn run_one(&self, call: Call, payload: &[u8]) -> Answer {
        let dev = self.backend();
        let done = |r: DeviceResult<()>| r.map(|()| Reply::Done);
        let value = |r: DeviceResult<u64>| r.map(Reply::Value);
        let result: DeviceResult<Reply> = match call {
            Call::RegisterArena { span } => self.with_span(span, |s| done(dev.register_arena(s))),
            Call::UnregisterArena { span } => self.with_span(span, |s| {
                dev.unregister_arena(s);
                Ok(Reply::Done)
            }),
            Call::RegisterHost { span } => self.with_span(span, |s| value(dev.register_host(s))),
            Call::UnregisterHost { span } => self.with_span(span, |s| {
                dev.unregister_host(s);
                Ok(Reply::Done)
            }),
            Call::CreateStream { id, class } => dev
                .create_stream(class)
                .and_then(|s| self.add_stream(id, s))
                .map(|()| Reply::Done),
            Call::DestroyStream { stream } => {
                if let Some(s) = self.remove_stream(stream) {
                    dev.destroy_stream(s);
                }
                Ok(Reply::Done)
            }
            Call::CopyHtoD {
                stream,
                src,
                dst,
                staged,
            } => {
                return self.on_stream_with(stream, Some(src), |s, src| {
                    let src = src.ok_or_else(no_span)?;
                    done(if staged {
                        dev.copy_htod_staged(s, src, dst)
                    } else {
                        dev.copy_htod(s, src, dst)
                    })
                });
            }
            Call::CopyDtoH {
                stream,
                src,
                dst,
                staged,
                close,
            } => {
                return self.on_stream_with(stream, Some(dst), |s, dst| {
                    let dst = dst.ok_or_else(no_span)?;
                    if !staged {
                        return done(dev.copy_dtoh(s, src, dst));
                    }
                    dev.copy_dtoh_staged(s, src, dst)?;
                    self.write_progress(close);
                    Ok(Reply::Done)
                });
            }
            Call::CopyDtoD {
                stream,
                src,
                dst,
                len,
            } => return self.on_stream(stream, |s| done(dev.copy_dtod(s, src, dst, len))),
            Call::Memset {
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
            Call::Launch {
                stream,
                kernel,
                start,
                place,
            } => return self.on_kernel(stream, start, place, |s| dev.launch(s, &kernel)),
            Call::LaunchModule {
                stream,
                function,
                launch,
                attributes,
                start,
                place,
            } => {
                return match self.function(function) {
                    Ok(f) => self.on_kernel(stream, start, place, |s| {
                        dev.launch_module(s, &f, &launch, &attributes, payload)
                    }),
                    Err(e) => Answer::failed(e),
                };
            }
            Call::MakeGraph { id } => gpushare_protocol::graph::decode_graph(payload)
                .map_err(|e| DeviceError::InvalidArgument(e.to_string()))
                .and_then(|nodes| crate::device::graph::resolve(nodes, |f| self.function(f)))
                .and_then(|nodes| dev.make_graph(nodes))
                .and_then(|g| self.add_graph(id, g))
                .map(|()| Reply::Done),
            Call::DropGraph { graph } => {
                self.remove_graph(graph);
                Ok(Reply::Done)
            }
            Call::UpdateGraph { graph } => self.update_graph(graph, payload).map(|()| Reply::Done),
            Call::LaunchGraph {
                stream,
                graph,
                start,
                place,
            } => {
                return match self.graph(graph) {
                    Ok(g) => self.on_kernel(stream, start, place, |s| dev.launch_graph(s, &g)),
                    Err(e) => Answer::failed(e),
                };
            }
            Call::HostPoint {
                stream,
                done: reached,
                go,
                value,
            } => {
                return self.on_stream(stream, |s| done(dev.host_point(s, reached, go, value)));
            }
            Call::Progress {
                stream,
                page,
                slot,
                value,
            } => {
                return self.on_stream_with(stream, Some(page), |s, page| {
                    let page = page.ok_or_else(no_span)?;
                    done(dev.write_done_mark(s, page, slot, value))
                });
            }
            Call::Opening { opening, call } => {
                // Its failure is noted once, by `run_call` around this arm.
                let answer = self.run_one(*call, payload);
                // Refused by a faulted context (or cut short by a reset), nothing of the
                // stream's work runs here. Refused otherwise (a bad argument), the calls after
                // it still may: counted as started, it is never run twice.
                if !matches!(
                    answer.reply,
                    Reply::Failed(DeviceError::Fault(_) | DeviceError::Cancelled)
                ) {
                    self.write_progress(Some(opening));
                }
                return answer;
            }
            Call::SyncStream {
                stream,
                close,
                told,
            } => {
                let failed = self.failed_since_sync(stream);
                return self.on_stream(stream, |s| {
                    dev.sync_stream(s)?;
                    self.write_progress(close);
                    if !failed {
                        self.write_progress(told);
                    }
                    Ok(Reply::Done)
                });
            }
            Call::EndBatch { stream, idle } => {
                return self.on_stream(stream, |s| {
                    dev.end_batch(s, idle);
                    Ok(Reply::Done)
                });
            }
            Call::StreamBusy { stream } => {
                return self.on_stream(stream, |s| Ok(Reply::Flag(dev.stream_busy(s))));
            }
            Call::StreamDone { stream } => {
                return self.on_stream(stream, |s| dev.stream_done(s).map(Reply::Flag));
            }
            Call::StreamWaitEvent { stream, event } => {
                return match self.event(event) {
                    Ok(e) => self.on_stream(stream, |s| done(dev.stream_wait_event(s, &lock(&e)))),
                    Err(e) => Answer::failed(e),
                };
            }
            Call::CreateEvent { id, kind } => {
                let made = match kind {
                    EventKind::Timing => dev.create_event(),
                    EventKind::Marker => dev.create_marker(),
                    EventKind::Flags(flags) => dev.create_event_flags(flags),
                };
                made.and_then(|e| self.add_event(id, e))
                    .map(|()| Reply::Done)
            }
            Call::DestroyEvent { event } => {
                self.remove_event(event);
                Ok(Reply::Done)
            }
            Call::RecordEvent {
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
                    // A start marker left over from a kernel that never came (its event
                    // destroyed meanwhile) marks nothing: not a failure of the stream's work.
                    Err(_) if start => Answer {
                        reply: Reply::Done,
                        news: None,
                    },
                    Err(e) => Answer::failed(e),
                };
            }
            Call::EventDone { event } => self
                .event(event)
                .and_then(|e| dev.event_done(&lock(&e)).map(Reply::Flag)),
            Call::SyncEvent { event } => self
                .event(event)
                .and_then(|e| done(dev.sync_event(&lock(&e)))),
            Call::ElapsedNs { start, end } => self.event(start).and_then(|s| {
                let e = self.event(end)?;
                if Arc::ptr_eq(&s, &e) {
                    // One event at both ends: locked once (a second lock would never return).
                    let s = lock(&s);
                    return value(dev.elapsed_ns(&s, &s));
                }
                let (s, e) = (lock(&s), lock(&e));
                value(dev.elapsed_ns(&s, &e))
            }),
            Call::Fault => Ok(Reply::Fault(dev.fault())),
            Call::LoadModule { id, format } => dev
                .load_module(format, payload)
                .and_then(|m| self.add_module(id, m))
                .map(|()| Reply::Done),
            Call::DropModule { module } => {
                // The last of a module's handles unloads it: `cuModuleUnload` waits for work
                // held at the gate (`device::gate`).
                let _open = self.hold_gate();
                self.remove_module(module);
                Ok(Reply::Done)
            }
            Call::GetFunction { id, module } => self.module(module).and_then(|m| {
                let f = dev.get_function(&m, name(payload)?)?;
                self.add_function(id, f).map(|()| Reply::Done)
            }),
            Call::DropFunction { function } => {
                let _open = self.hold_gate();
                self.remove_function(function);
                Ok(Reply::Done)
            }
            Call::MemoryInfo => dev.memory_info().map(|(f, t)| Reply::Pair(f, t)),
            Call::EncodeTensorMap => gpushare_protocol::control::decode(payload)
                .map_err(|e| DeviceError::InvalidArgument(e.to_string()))
                .and_then(|args| dev.encode_tensor_map(&args))
                .map(Reply::Bytes),
            Call::FunctionShape { function } => self
                .function(function)
                .and_then(|f| dev.function_shape(&f).map(Reply::Shape)),
            Call::SetFunctionAttribute {
                function,
                attribute,
                value,
            } => self
                .function(function)
                .and_then(|f| done(dev.set_function_attribute(&f, attribute, value))),
            Call::Occupancy { function, question } => self
                .function(function)
                .and_then(|f| value(dev.occupancy(&f, &question))),
            Call::ModuleGlobal { module } => self.module(module).and_then(|m| {
                dev.module_global(&m, name(payload)?)
                    .map(|(a, b)| Reply::Pair(a, b))
            }),
            Call::FunctionNames { module, first } => self
                .module(module)
                .and_then(|m| Reply::names_page(dev.function_names(&m)?, first)),
        };
        Answer {
            reply: result.unwrap_or_else(Reply::Failed),
            news: None,
        }
    }
}

fn no_span() -> DeviceError {
    DeviceError::InvalidArgument("a copy without its client memory".into())
}

fn name(payload: &[u8]) -> DeviceResult<&str> {
    std::str::from_utf8(payload)
        .map_err(|_| DeviceError::InvalidArgument("a name that is not UTF-8".into()))
}

//! Every device operation, declared once: a [`Call`] with its arguments, the [`Reply`] it
//! gets, and the one `match` that runs it on a backend ([`Executor::run`]). The session makes
//! calls, the link carries them (in this process, or to a device worker, serialised whole
//! without knowing them one by one), and the executor at the other end runs them. A new
//! operation is a variant here, an arm below, and a [`Backend`] method.

use std::sync::Arc;

use gpushare_protocol::command::{LaunchAttributes, ModuleLaunch};
use gpushare_protocol::control::ModuleFormat;
use gpushare_protocol::{DevicePtr, Kernel, PriorityClass};
use serde::{Deserialize, Serialize};

use super::backend::Backend;
use super::executor::{Executor, lock};
pub use super::reply::{Answer, Handle, Reply};
use super::{DeviceError, DeviceResult, Occupancy};
pub use crate::shm::Span;

/// Which kind of event to make.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventKind {
    /// One that can time work.
    Timing,
    /// One only for knowing when work is done (cheaper to record on a GPU).
    Marker,
    /// As `cuEventCreate` makes it with these flags.
    Flags(u32),
}

/// A value for a stream's slot in the progress page ([`super::progress`]): written into slot
/// `slot` of the page `page` from the worker's CPU, the opening value once the device has
/// taken the first call of the stream's work, the closing one once a call that waits for the
/// stream has seen that work finish (a write queued on the stream instead costs the work a
/// memory operation on the GPU each, about 1.3 µs on an H200 before a launch and 1.9 µs
/// before a synchronization).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProgressValue {
    pub page: Span,
    pub slot: u32,
    pub value: u32,
}

/// One device operation. Variable-length parts (launch parameters, a module image, a name)
/// travel beside it as its payload.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Call {
    RegisterArena {
        span: Span,
    },
    UnregisterArena {
        span: Span,
    },
    /// The reply is where device code reaches the region.
    RegisterHost {
        span: Span,
    },
    UnregisterHost {
        span: Span,
    },
    /// Streams, events, modules and functions are named by their caller: after a fault the
    /// same names are made again in the context that takes over.
    CreateStream {
        id: Handle,
        class: PriorityClass,
    },
    DestroyStream {
        stream: Handle,
    },
    /// `staged`: the device has read `src` when the call returns (the client reuses it).
    CopyHtoD {
        stream: Handle,
        src: Span,
        dst: DevicePtr,
        staged: bool,
    },
    /// `staged`: the bytes are in `dst` when the call returns, and `close` (if any) is
    /// written once the stream's work before the copy has finished.
    CopyDtoH {
        stream: Handle,
        src: DevicePtr,
        dst: Span,
        staged: bool,
        close: Option<ProgressValue>,
    },
    CopyDtoD {
        stream: Handle,
        src: DevicePtr,
        dst: DevicePtr,
        len: u64,
    },
    /// `count` elements of `elem_bytes` (1, 2 or 4) set to `value`.
    Memset {
        stream: Handle,
        dst: DevicePtr,
        value: u32,
        elem_bytes: u8,
        count: u64,
    },
    /// `start`: an event marking where the kernel starts, recorded just before it (in one
    /// step, so that nothing can come between them). `sms`: the SM partition the stream's
    /// work goes to from this kernel on (`None`: the whole GPU); every launch says it, so
    /// that no call of its own travels for it.
    Launch {
        stream: Handle,
        kernel: Kernel,
        start: Option<Handle>,
        sms: Option<u32>,
    },
    /// A graph of the encoded nodes that are the payload ([`gpushare_protocol::graph`]), each
    /// kernel's function a handle of this executor's.
    MakeGraph {
        id: Handle,
    },
    DropGraph {
        graph: Handle,
    },
    /// New parameters for some nodes, in place; the payload is the encoded changes
    /// ([`gpushare_protocol::graph::encode_changes`]). Fails where the device cannot change
    /// the graph in place (the caller then makes it again whole).
    UpdateGraph {
        graph: Handle,
    },
    LaunchGraph {
        stream: Handle,
        graph: Handle,
        start: Option<Handle>,
        sms: Option<u32>,
    },
    /// The packed parameters are the payload.
    LaunchModule {
        stream: Handle,
        function: Handle,
        launch: ModuleLaunch,
        attributes: LaunchAttributes,
        start: Option<Handle>,
        sms: Option<u32>,
    },
    /// The stream writes `value` (32 bits) at `done` when it gets there, then waits until the
    /// 32 bits at `go` are at least `value` (a client's host function in stream order; both
    /// are the client's page-locked host memory as the device reaches it).
    HostPoint {
        stream: Handle,
        done: DevicePtr,
        go: DevicePtr,
        value: u32,
    },
    /// The stream writes `value` into slot `slot` (32 bits) of the progress page `page` once
    /// the work before it has finished: a mark that tells the session so without asking
    /// ([`super::Device::mark_done`]).
    Progress {
        stream: Handle,
        page: Span,
        slot: u32,
        value: u32,
    },
    /// The first call of a stream's work since it was known idle: runs `call`, then writes the
    /// `opening` value (`super::progress`) unless a faulted context refused it.
    Opening {
        opening: ProgressValue,
        call: Box<Call>,
    },
    /// Waits for the stream's work; then writes `close`, if any, and `told` (the client's
    /// sync word: [`gpushare_protocol::ring::SYNC_WORD`]) unless a call on the stream failed
    /// since its last synchronization (the sync then reports that failure).
    SyncStream {
        stream: Handle,
        close: Option<ProgressValue>,
        told: Option<ProgressValue>,
    },
    EndBatch {
        stream: Handle,
        idle: bool,
    },
    StreamBusy {
        stream: Handle,
    },
    StreamDone {
        stream: Handle,
    },
    StreamWaitEvent {
        stream: Handle,
        event: Handle,
    },
    CreateEvent {
        id: Handle,
        kind: EventKind,
    },
    DestroyEvent {
        event: Handle,
    },
    /// `start`: marks where the stream's next work starts (for timing it).
    RecordEvent {
        event: Handle,
        stream: Handle,
        start: bool,
    },
    EventDone {
        event: Handle,
    },
    SyncEvent {
        event: Handle,
    },
    ElapsedNs {
        start: Handle,
        end: Handle,
    },
    /// Whether the context is poisoned, and by what.
    Fault,
    /// The image is the payload.
    LoadModule {
        id: Handle,
        format: ModuleFormat,
    },
    DropModule {
        module: Handle,
    },
    /// The name is the payload.
    GetFunction {
        id: Handle,
        module: Handle,
    },
    DropFunction {
        function: Handle,
    },
    MemoryInfo,
    /// A TMA tensor map; the arguments (`control::TensorMapArgs`, encoded) are the payload.
    EncodeTensorMap,
    FunctionShape {
        function: Handle,
    },
    SetFunctionAttribute {
        function: Handle,
        attribute: u32,
        value: i32,
    },
    Occupancy {
        function: Handle,
        question: Occupancy,
    },
    /// The name is the payload.
    ModuleGlobal {
        module: Handle,
    },
    /// The names of a module's functions, in the module's order, from the `first`th on: a
    /// page of them ([`Reply::names_page`]).
    FunctionNames {
        module: Handle,
        first: u32,
    },
}

impl Call {
    /// The stream whose work a call is, if any (an episode's first call: its own).
    pub fn stream(&self) -> Option<Handle> {
        match self {
            Call::DestroyStream { stream }
            | Call::CopyHtoD { stream, .. }
            | Call::CopyDtoH { stream, .. }
            | Call::CopyDtoD { stream, .. }
            | Call::Memset { stream, .. }
            | Call::Launch { stream, .. }
            | Call::LaunchGraph { stream, .. }
            | Call::LaunchModule { stream, .. }
            | Call::HostPoint { stream, .. }
            | Call::Progress { stream, .. }
            | Call::SyncStream { stream, .. }
            | Call::EndBatch { stream, .. }
            | Call::StreamBusy { stream }
            | Call::StreamDone { stream }
            | Call::StreamWaitEvent { stream, .. }
            | Call::RecordEvent { stream, .. } => Some(*stream),
            Call::Opening { call, .. } => call.stream(),
            _ => None,
        }
    }

    /// The start marker a kernel takes along, for the calls that launch one.
    pub fn start_marker(&mut self) -> Option<&mut Option<Handle>> {
        match self {
            Call::Launch { start, .. }
            | Call::LaunchModule { start, .. }
            | Call::LaunchGraph { start, .. } => Some(start),
            _ => None,
        }
    }
}

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
                sms,
            } => {
                return match self.start_event(start) {
                    Ok(start) => self.on_stream(stream, |s| {
                        self.before_kernel(s, sms, start.as_ref())?;
                        done(dev.launch(s, &kernel))
                    }),
                    Err(e) => Answer::failed(e),
                };
            }
            Call::LaunchModule {
                stream,
                function,
                launch,
                attributes,
                start,
                sms,
            } => {
                return match self
                    .function(function)
                    .and_then(|f| Ok((f, self.start_event(start)?)))
                {
                    Ok((f, start)) => self.on_stream(stream, |s| {
                        self.before_kernel(s, sms, start.as_ref())?;
                        done(dev.launch_module(s, &f, &launch, &attributes, payload))
                    }),
                    Err(e) => Answer::failed(e),
                };
            }
            Call::MakeGraph { id } => gpushare_protocol::graph::decode_graph(payload)
                .map_err(|e| DeviceError::InvalidArgument(e.to_string()))
                .and_then(|nodes| super::graph::resolve(nodes, |f| self.function(f)))
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
                sms,
            } => {
                return match self
                    .graph(graph)
                    .and_then(|g| Ok((g, self.start_event(start)?)))
                {
                    Ok((g, start)) => self.on_stream(stream, |s| {
                        self.before_kernel(s, sms, start.as_ref())?;
                        done(dev.launch_graph(s, &g))
                    }),
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
                let answer = self.run_call(*call, payload);
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
                self.remove_module(module);
                Ok(Reply::Done)
            }
            Call::GetFunction { id, module } => self.module(module).and_then(|m| {
                let f = dev.get_function(&m, name(payload)?)?;
                self.add_function(id, f).map(|()| Reply::Done)
            }),
            Call::DropFunction { function } => {
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

#[cfg(test)]
mod tests;

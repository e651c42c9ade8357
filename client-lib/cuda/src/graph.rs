//! CUDA graphs by stream capture, recorded in the client and replayed: while a stream
//! captures, its launches, device copies and memsets are recorded instead of sent (with the
//! launches' arguments as they were at capture, as CUDA keeps them); launching the graph
//! sends them again, in capture order, on the launch stream. Capture order is an order the
//! graph's dependencies allow, so the results are the graph's; a replay costs one submission
//! per node rather than one for the graph.
//!
//! Streams that join a capture through an event recorded in it record into the same graph.
//! Graphs built node by node (`cuGraphAdd*Node`) are not supported.

use std::cell::Cell;
use std::collections::{HashMap, HashSet};
use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use gpushare_protocol::Command;

use crate::driver::{self, Driver};
use crate::launch::LaunchShape;
use crate::status::{Cu, entry, out};
use crate::types::{CUgraph, CUgraphExec, CUgraphNode, CUresult, CUstream, capture, result};

/// One recorded node.
#[derive(Debug, Clone)]
pub enum Op {
    Launch {
        function: u64,
        shape: LaunchShape,
        params: Vec<u8>,
    },
    /// A stream-ordered command (a copy or memset), sent again on the launch stream.
    Command(Command),
}

struct Capture {
    id: u64,
    ops: Mutex<Vec<Op>>,
    invalidated: AtomicBool,
    /// The graph being built (what `cuStreamGetCaptureInfo` hands out), as an address.
    graph: usize,
}

/// A captured graph.
struct Graph {
    ops: Mutex<Arc<Vec<Op>>>,
}

/// An instantiated graph.
struct Exec {
    ops: Arc<Vec<Op>>,
}

#[derive(Default)]
pub struct Graphs {
    /// Streams capturing now: launches look here only when it is not zero.
    capturing: AtomicUsize,
    captures: Mutex<HashMap<u32, Arc<Capture>>>,
    /// Events recorded in a capture, for streams that wait on them to join it.
    events: Mutex<HashMap<u32, Arc<Capture>>>,
    graphs: Mutex<HashSet<usize>>,
    execs: Mutex<HashSet<usize>>,
    next_id: AtomicU64,
}

thread_local! {
    static MODE: Cell<i32> = const { Cell::new(capture::MODE_GLOBAL) };
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn capture_of(d: &Driver, stream: u32) -> Option<Arc<Capture>> {
    if d.graphs.capturing.load(Ordering::Acquire) == 0 {
        return None;
    }
    lock(&d.graphs.captures).get(&stream).cloned()
}

/// Whether `stream` is capturing.
#[inline]
pub fn capturing(d: &Driver, stream: u32) -> bool {
    d.graphs.capturing.load(Ordering::Acquire) != 0 && capture_of(d, stream).is_some()
}

/// Records the op `make` builds when `stream` is capturing (`Ok(true)`); `Ok(false)` when
/// it is not and the caller sends it.
#[inline]
pub fn capture(d: &Driver, stream: u32, make: impl FnOnce() -> Op) -> Cu<bool> {
    let Some(c) = capture_of(d, stream) else {
        return Ok(false);
    };
    if c.invalidated.load(Ordering::Acquire) {
        return Err(result::STREAM_CAPTURE_INVALIDATED);
    }
    lock(&c.ops).push(make());
    Ok(true)
}

fn invalidate(d: &Driver, stream: u32) -> Cu<()> {
    if let Some(c) = capture_of(d, stream) {
        c.invalidated.store(true, Ordering::Release);
        return Err(result::STREAM_CAPTURE_UNSUPPORTED);
    }
    Ok(())
}

/// Waiting for a capturing stream is not allowed (it invalidates the capture).
pub fn refuse_while_capturing(d: &Driver, stream: u32) -> Cu<()> {
    invalidate(d, stream)
}

/// Copies with pageable host memory cannot be captured (CUDA refuses them too).
pub fn refuse_pageable_in_capture(d: &Driver, stream: u32) -> Cu<()> {
    invalidate(d, stream)
}

/// An event recorded on a capturing stream marks a point of the capture (`Ok(true)`).
pub fn record_in_capture(d: &Driver, stream: u32, event: u32) -> Cu<bool> {
    let Some(c) = capture_of(d, stream) else {
        return Ok(false);
    };
    lock(&d.graphs.events).insert(event, c);
    Ok(true)
}

/// A stream waiting on an event of a capture joins the capture (`Ok(true)`). A capturing
/// stream's wait on an event outside its capture is an external dependency, which replay
/// orders by sending everything on one stream.
pub fn wait_in_capture(d: &Driver, stream: u32, event: u32) -> Cu<bool> {
    if d.graphs.capturing.load(Ordering::Acquire) == 0 {
        return Ok(false);
    }
    let joined = lock(&d.graphs.events).get(&event).cloned();
    if let Some(c) = joined {
        if let std::collections::hash_map::Entry::Vacant(slot) =
            lock(&d.graphs.captures).entry(stream)
        {
            slot.insert(c);
            d.graphs.capturing.fetch_add(1, Ordering::AcqRel);
        }
        return Ok(true);
    }
    Ok(capture_of(d, stream).is_some())
}

impl Driver {
    fn new_graph(&self, ops: Vec<Op>) -> CUgraph {
        let g = Box::into_raw(Box::new(Graph {
            ops: Mutex::new(Arc::new(ops)),
        }));
        lock(&self.graphs.graphs).insert(g as usize);
        g.cast()
    }

    fn graph(&self, h: CUgraph) -> Cu<&Graph> {
        if !lock(&self.graphs.graphs).contains(&(h as usize)) {
            return Err(result::INVALID_VALUE);
        }
        // SAFETY: a live graph handle is a `Box<Graph>` not yet destroyed; destroying removes
        // it from the set first.
        Ok(unsafe { &*(h as *const Graph) })
    }

    /// Sends a graph's ops on `stream`.
    fn replay(&self, ops: &[Op], stream: u32) -> Cu<()> {
        for op in ops {
            match op {
                Op::Launch {
                    function,
                    shape,
                    params,
                } => self.send_launch(*function, shape, stream, params.len(), |dst| {
                    // SAFETY: `dst` has room for the recorded arguments.
                    unsafe { std::ptr::copy_nonoverlapping(params.as_ptr(), dst, params.len()) }
                })?,
                Op::Command(cmd) => self.transport.post(on_stream(*cmd, stream))?,
            }
        }
        Ok(())
    }
}

/// A recorded command, on another stream.
fn on_stream(cmd: Command, s: u32) -> Command {
    match cmd {
        Command::CopyDtoD { src, dst, len, .. } => Command::CopyDtoD {
            stream: s,
            src,
            dst,
            len,
        },
        Command::Memset {
            dst, value, len, ..
        } => Command::Memset {
            stream: s,
            dst,
            value,
            len,
        },
        Command::MemsetWide {
            dst,
            value,
            elem_bytes,
            count,
            ..
        } => Command::MemsetWide {
            stream: s,
            dst,
            value,
            elem_bytes,
            count,
        },
        Command::CopyHtoDHost {
            region,
            offset,
            dst,
            len,
            ..
        } => Command::CopyHtoDHost {
            stream: s,
            region,
            offset,
            dst,
            len,
        },
        Command::CopyDtoHHost {
            src,
            region,
            offset,
            len,
            ..
        } => Command::CopyDtoHHost {
            stream: s,
            src,
            region,
            offset,
            len,
        },
        other => other,
    }
}

fn begin(h: CUstream, mode: c_int, per_thread: bool) -> Cu<()> {
    let d = driver::live()?;
    let stream = d.stream(h, per_thread)?;
    if stream == 0 && !per_thread {
        // The legacy stream cannot be captured.
        return Err(result::STREAM_CAPTURE_UNSUPPORTED);
    }
    if !(capture::MODE_GLOBAL..=capture::MODE_RELAXED).contains(&mode) {
        return Err(result::INVALID_VALUE);
    }
    let mut captures = lock(&d.graphs.captures);
    if captures.contains_key(&stream) {
        return Err(result::ILLEGAL_STATE);
    }
    let c = Arc::new(Capture {
        id: d.graphs.next_id.fetch_add(1, Ordering::Relaxed) + 1,
        ops: Mutex::new(Vec::new()),
        invalidated: AtomicBool::new(false),
        graph: d.new_graph(Vec::new()) as usize,
    });
    captures.insert(stream, c);
    d.graphs.capturing.fetch_add(1, Ordering::AcqRel);
    Ok(())
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamBeginCapture_v2(h: CUstream, mode: c_int) -> CUresult {
    entry("cuStreamBeginCapture_v2", || begin(h, mode, false))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamBeginCapture_v2_ptsz(h: CUstream, mode: c_int) -> CUresult {
    entry("cuStreamBeginCapture_v2_ptsz", || begin(h, mode, true))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamBeginCapture(h: CUstream) -> CUresult {
    entry("cuStreamBeginCapture", || {
        begin(h, capture::MODE_GLOBAL, false)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamBeginCapture_ptsz(h: CUstream) -> CUresult {
    entry("cuStreamBeginCapture_ptsz", || {
        begin(h, capture::MODE_GLOBAL, true)
    })
}

fn end(h: CUstream, graph: *mut CUgraph, per_thread: bool) -> Cu<()> {
    let d = driver::live()?;
    let stream = d.stream(h, per_thread)?;
    let c = {
        let mut captures = lock(&d.graphs.captures);
        let c = captures.remove(&stream).ok_or(result::ILLEGAL_STATE)?;
        // Every stream that joined this capture leaves it with its origin.
        let joined: Vec<u32> = captures
            .iter()
            .filter(|(_, other)| Arc::ptr_eq(other, &c))
            .map(|(&s, _)| s)
            .collect();
        for s in &joined {
            captures.remove(s);
        }
        d.graphs
            .capturing
            .fetch_sub(1 + joined.len(), Ordering::AcqRel);
        c
    };
    lock(&d.graphs.events).retain(|_, other| !Arc::ptr_eq(other, &c));
    if c.invalidated.load(Ordering::Acquire) {
        // SAFETY: NULL or writable, per the contract.
        unsafe { out(graph, std::ptr::null_mut()) }.ok();
        return Err(result::STREAM_CAPTURE_INVALIDATED);
    }
    let ops = std::mem::take(&mut *lock(&c.ops));
    *lock(&d.graph(c.graph as CUgraph)?.ops) = Arc::new(ops);
    // SAFETY: the caller's contract.
    unsafe { out(graph, c.graph as CUgraph) }
}

/// # Safety
/// `graph` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamEndCapture(h: CUstream, graph: *mut CUgraph) -> CUresult {
    entry("cuStreamEndCapture", || end(h, graph, false))
}

/// # Safety
/// `graph` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamEndCapture_ptsz(h: CUstream, graph: *mut CUgraph) -> CUresult {
    entry("cuStreamEndCapture_ptsz", || end(h, graph, true))
}

fn status_of(c: Option<&Arc<Capture>>) -> i32 {
    match c {
        None => capture::STATUS_NONE,
        Some(c) if c.invalidated.load(Ordering::Acquire) => capture::STATUS_INVALIDATED,
        Some(_) => capture::STATUS_ACTIVE,
    }
}

fn is_capturing(h: CUstream, status: *mut c_int, per_thread: bool) -> Cu<()> {
    let d = driver::live()?;
    let stream = d.stream(h, per_thread)?;
    let c = capture_of(d, stream);
    // SAFETY: the caller's contract.
    unsafe { out(status, status_of(c.as_ref())) }
}

/// # Safety
/// `status` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamIsCapturing(h: CUstream, status: *mut c_int) -> CUresult {
    entry("cuStreamIsCapturing", || is_capturing(h, status, false))
}

/// # Safety
/// `status` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamIsCapturing_ptsz(h: CUstream, status: *mut c_int) -> CUresult {
    entry("cuStreamIsCapturing_ptsz", || is_capturing(h, status, true))
}

/// The capture's status, id and graph; no dependency nodes are reported (the recorded graph
/// is a sequence).
#[allow(clippy::too_many_arguments)] // CUDA's own parameter list
fn capture_info(
    h: CUstream,
    per_thread: bool,
    status: *mut c_int,
    id: *mut u64,
    graph: *mut CUgraph,
    deps: *mut *const CUgraphNode,
    edges: *mut *const c_void,
    num_deps: *mut usize,
) -> Cu<()> {
    let d = driver::live()?;
    let stream = d.stream(h, per_thread)?;
    let c = capture_of(d, stream);
    // SAFETY: each is NULL (allowed except `status`) or writable, per the contract.
    unsafe {
        out(status, status_of(c.as_ref()))?;
        if let Some(c) = c {
            if !id.is_null() {
                out(id, c.id)?;
            }
            if !graph.is_null() {
                out(graph, c.graph as CUgraph)?;
            }
        }
        if !deps.is_null() {
            out(deps, std::ptr::null())?;
        }
        if !edges.is_null() {
            out(edges, std::ptr::null())?;
        }
        if !num_deps.is_null() {
            out(num_deps, 0)?;
        }
    }
    Ok(())
}

/// # Safety
/// Out-parameters are NULL or valid for writing (`status` must not be NULL).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetCaptureInfo_v3(
    h: CUstream,
    status: *mut c_int,
    id: *mut u64,
    graph: *mut CUgraph,
    deps: *mut *const CUgraphNode,
    edges: *mut *const c_void,
    num_deps: *mut usize,
) -> CUresult {
    entry("cuStreamGetCaptureInfo_v3", || {
        capture_info(h, false, status, id, graph, deps, edges, num_deps)
    })
}

/// # Safety
/// As `cuStreamGetCaptureInfo_v3`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetCaptureInfo_v3_ptsz(
    h: CUstream,
    status: *mut c_int,
    id: *mut u64,
    graph: *mut CUgraph,
    deps: *mut *const CUgraphNode,
    edges: *mut *const c_void,
    num_deps: *mut usize,
) -> CUresult {
    entry("cuStreamGetCaptureInfo_v3_ptsz", || {
        capture_info(h, true, status, id, graph, deps, edges, num_deps)
    })
}

/// # Safety
/// As `cuStreamGetCaptureInfo_v3`, without edge data.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetCaptureInfo_v2(
    h: CUstream,
    status: *mut c_int,
    id: *mut u64,
    graph: *mut CUgraph,
    deps: *mut *const CUgraphNode,
    num_deps: *mut usize,
) -> CUresult {
    entry("cuStreamGetCaptureInfo_v2", || {
        capture_info(
            h,
            false,
            status,
            id,
            graph,
            deps,
            std::ptr::null_mut(),
            num_deps,
        )
    })
}

/// # Safety
/// As `cuStreamGetCaptureInfo_v3`, without edge data.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetCaptureInfo_v2_ptsz(
    h: CUstream,
    status: *mut c_int,
    id: *mut u64,
    graph: *mut CUgraph,
    deps: *mut *const CUgraphNode,
    num_deps: *mut usize,
) -> CUresult {
    entry("cuStreamGetCaptureInfo_v2_ptsz", || {
        capture_info(
            h,
            true,
            status,
            id,
            graph,
            deps,
            std::ptr::null_mut(),
            num_deps,
        )
    })
}

/// # Safety
/// `mode` is valid for reading and writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuThreadExchangeStreamCaptureMode(mode: *mut c_int) -> CUresult {
    entry("cuThreadExchangeStreamCaptureMode", || {
        driver::get()?;
        if mode.is_null() {
            return Err(result::INVALID_VALUE);
        }
        // SAFETY: valid, per the contract.
        let asked = unsafe { *mode };
        if !(capture::MODE_GLOBAL..=capture::MODE_RELAXED).contains(&asked) {
            return Err(result::INVALID_VALUE);
        }
        let old = MODE.with(|m| m.replace(asked));
        // SAFETY: as above.
        unsafe { out(mode, old) }
    })
}

/// # Safety
/// `graph` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphCreate(graph: *mut CUgraph, flags: c_uint) -> CUresult {
    entry("cuGraphCreate", || {
        let d = driver::live()?;
        if flags != 0 {
            return Err(result::INVALID_VALUE);
        }
        // SAFETY: the caller's contract.
        unsafe { out(graph, d.new_graph(Vec::new())) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphDestroy(graph: CUgraph) -> CUresult {
    entry("cuGraphDestroy", || {
        let d = driver::live()?;
        if !lock(&d.graphs.graphs).remove(&(graph as usize)) {
            return Err(result::INVALID_VALUE);
        }
        // SAFETY: a live handle, just removed from the set (so never freed twice).
        drop(unsafe { Box::from_raw(graph as *mut Graph) });
        Ok(())
    })
}

/// # Safety
/// `nodes` is NULL or holds `*count` entries; `count` is valid for reading and writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphGetNodes(
    graph: CUgraph,
    nodes: *mut CUgraphNode,
    count: *mut usize,
) -> CUresult {
    entry("cuGraphGetNodes", || {
        let d = driver::live()?;
        let n = lock(&d.graph(graph)?.ops).len();
        if count.is_null() {
            return Err(result::INVALID_VALUE);
        }
        if !nodes.is_null() {
            // SAFETY: `count` is readable, per the contract.
            let room = unsafe { *count };
            for i in 0..room.min(n) {
                // Opaque node handles: the node's index, never dereferenced.
                // SAFETY: `i < room`, inside the array.
                unsafe { *nodes.add(i) = (i + 1) as CUgraphNode };
            }
        }
        // SAFETY: as above.
        unsafe { out(count, n) }
    })
}

fn instantiate(exec: *mut CUgraphExec, graph: CUgraph) -> Cu<()> {
    let d = driver::live()?;
    let ops = lock(&d.graph(graph)?.ops).clone();
    let e = Box::into_raw(Box::new(Exec { ops }));
    lock(&d.graphs.execs).insert(e as usize);
    // SAFETY: the caller's contract.
    unsafe { out(exec, e.cast()) }
}

/// # Safety
/// `exec` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiateWithFlags(
    exec: *mut CUgraphExec,
    graph: CUgraph,
    _flags: u64,
) -> CUresult {
    entry("cuGraphInstantiateWithFlags", || instantiate(exec, graph))
}

/// # Safety
/// `exec` is NULL or valid for writing; `params` is NULL or a valid parameter block.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiateWithParams(
    exec: *mut CUgraphExec,
    graph: CUgraph,
    _params: *mut c_void,
) -> CUresult {
    entry("cuGraphInstantiateWithParams", || instantiate(exec, graph))
}

/// # Safety
/// As `cuGraphInstantiateWithParams`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiateWithParams_ptsz(
    exec: *mut CUgraphExec,
    graph: CUgraph,
    _params: *mut c_void,
) -> CUresult {
    entry("cuGraphInstantiateWithParams_ptsz", || {
        instantiate(exec, graph)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphExecDestroy(exec: CUgraphExec) -> CUresult {
    entry("cuGraphExecDestroy", || {
        let d = driver::live()?;
        if !lock(&d.graphs.execs).remove(&(exec as usize)) {
            return Err(result::INVALID_VALUE);
        }
        // SAFETY: a live handle, just removed from the set.
        drop(unsafe { Box::from_raw(exec as *mut Exec) });
        Ok(())
    })
}

fn launch(exec: CUgraphExec, h: CUstream, per_thread: bool) -> Cu<()> {
    let d = driver::live()?;
    let ops = {
        if !lock(&d.graphs.execs).contains(&(exec as usize)) {
            return Err(result::INVALID_VALUE);
        }
        // SAFETY: a live exec handle (destroying removes it from the set first).
        unsafe { &*(exec as *const Exec) }.ops.clone()
    };
    let stream = d.stream(h, per_thread)?;
    d.replay(&ops, stream)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphLaunch(exec: CUgraphExec, h: CUstream) -> CUresult {
    entry("cuGraphLaunch", || launch(exec, h, false))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphLaunch_ptsz(exec: CUgraphExec, h: CUstream) -> CUresult {
    entry("cuGraphLaunch_ptsz", || launch(exec, h, true))
}

/// Nothing to upload ahead: a replay sends its nodes when launched.
#[unsafe(no_mangle)]
pub extern "C" fn cuGraphUpload(exec: CUgraphExec, _h: CUstream) -> CUresult {
    entry("cuGraphUpload", || {
        let d = driver::live()?;
        lock(&d.graphs.execs)
            .contains(&(exec as usize))
            .then_some(())
            .ok_or(result::INVALID_VALUE)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphUpload_ptsz(exec: CUgraphExec, h: CUstream) -> CUresult {
    cuGraphUpload(exec, h)
}

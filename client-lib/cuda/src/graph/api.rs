//! The graph entry points: stream capture, graphs, and their instantiation and launch.

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::Mutex;

use super::capture::{MODE, status_of};
use super::{Exec, lock};
use crate::driver;
use crate::status::{Cu, entry, out};
use crate::types::{CUgraph, CUgraphExec, CUgraphNode, CUresult, CUstream, capture, result};

fn begin(h: CUstream, mode: c_int, per_thread: bool) -> Cu<()> {
    let d = crate::route::by_stream(h)?;
    let stream = d.stream(h, per_thread)?;
    if stream == 0 && !per_thread {
        // The legacy stream cannot be captured.
        return Err(result::STREAM_CAPTURE_UNSUPPORTED);
    }
    d.graphs.begin(stream, mode)
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
    let d = crate::route::by_stream(h)?;
    let stream = d.stream(h, per_thread)?;
    match d.graphs.end(stream) {
        // SAFETY: the caller's contract.
        Ok(g) => unsafe { out(graph, g) },
        Err(code) => {
            if code == result::STREAM_CAPTURE_INVALIDATED {
                // SAFETY: NULL or writable, per the contract.
                unsafe { out(graph, std::ptr::null_mut()) }.ok();
            }
            Err(code)
        }
    }
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

fn is_capturing(h: CUstream, status: *mut c_int, per_thread: bool) -> Cu<()> {
    let d = crate::route::by_stream(h)?;
    let stream = d.stream(h, per_thread)?;
    let c = d.graphs.capture_of(stream);
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

thread_local! {
    /// The dependencies `cuStreamGetCaptureInfo` last handed this thread.
    static TAIL: std::cell::RefCell<Vec<CUgraphNode>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The capture's status, id, graph, and the nodes the stream's next node would depend on.
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
    let d = crate::route::by_stream(h)?;
    let stream = d.stream(h, per_thread)?;
    let c = d.graphs.capture_of(stream);
    // SAFETY: each is NULL (allowed except `status`) or writable, per the contract.
    unsafe {
        out(status, status_of(c.as_ref()))?;
        if let Some(c) = &c {
            if !id.is_null() {
                out(id, c.id)?;
            }
            if !graph.is_null() {
                out(graph, c.graph as CUgraph)?;
            }
        }
        let tail = c
            .map(|c| d.graphs.capture_tail(&c, stream))
            .unwrap_or_default();
        // Valid until the thread's next call, as CUDA's array is until the capture changes.
        let at = TAIL.with(|t| {
            let mut t = t.borrow_mut();
            *t = tail.iter().map(|&h| h as CUgraphNode).collect();
            t.as_ptr()
        });
        if !deps.is_null() {
            out(
                deps,
                if tail.is_empty() {
                    std::ptr::null()
                } else {
                    at
                },
            )?;
        }
        if !edges.is_null() {
            // Every edge is a default one: no edge data.
            out(edges, std::ptr::null())?;
        }
        if !num_deps.is_null() {
            out(num_deps, tail.len())?;
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
        unsafe { out(graph, d.graphs.new_graph()) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphDestroy(graph: CUgraph) -> CUresult {
    entry("cuGraphDestroy", || driver::live()?.graphs.destroy(graph))
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
        let handles: Vec<usize> = lock(&d.graphs.graph(graph)?.nodes)
            .iter()
            .map(|n| n.handle)
            .collect();
        // SAFETY: the caller's contract.
        unsafe { super::nodes::hand_out(&handles, nodes, count) }
    })
}

fn instantiate(exec: *mut CUgraphExec, graph: CUgraph) -> Cu<()> {
    let d = driver::live()?;
    if exec.is_null() {
        return Err(result::INVALID_VALUE);
    }
    let g = d.graphs.graph(graph)?;
    let nodes = lock(&g.nodes).clone();
    let children = lock(&g.children).clone();
    let state = d.instantiate_nodes(nodes, children)?;
    let e = Box::into_raw(Box::new(Exec {
        state: Mutex::new(state),
    }));
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

/// The form before CUDA 12 (`cuGraphInstantiate_v2`): no error node or log to give, as
/// instantiation here fails only on a graph CUDA would refuse too.
///
/// # Safety
/// `exec` is NULL or valid for writing; `error_node` NULL or writable; `log` NULL or valid
/// for `log_size` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiate_v2(
    exec: *mut CUgraphExec,
    graph: CUgraph,
    error_node: *mut CUgraphNode,
    log: *mut c_char,
    log_size: usize,
) -> CUresult {
    entry("cuGraphInstantiate_v2", || {
        if !error_node.is_null() {
            // SAFETY: writable, per the contract.
            unsafe { error_node.write(std::ptr::null_mut()) };
        }
        if !log.is_null() && log_size > 0 {
            // SAFETY: `log` has room for at least one byte.
            unsafe { log.write(0) };
        }
        instantiate(exec, graph)
    })
}

/// # Safety
/// As `cuGraphInstantiate_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiate(
    exec: *mut CUgraphExec,
    graph: CUgraph,
    error_node: *mut CUgraphNode,
    log: *mut c_char,
    log_size: usize,
) -> CUresult {
    // SAFETY: the caller's contract.
    unsafe { cuGraphInstantiate_v2(exec, graph, error_node, log, log_size) }
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
        let e = unsafe { Box::from_raw(exec as *mut Exec) };
        d.destroy_exec(&mut lock(&e.state))
    })
}

fn launch(exec: CUgraphExec, h: CUstream, per_thread: bool) -> Cu<()> {
    let d = crate::route::by_stream(h)?;
    let stream = d.stream(h, per_thread)?;
    super::exec::with_exec(d, exec, |st| d.launch_exec(st, stream))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphLaunch(exec: CUgraphExec, h: CUstream) -> CUresult {
    entry("cuGraphLaunch", || launch(exec, h, false))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphLaunch_ptsz(exec: CUgraphExec, h: CUstream) -> CUresult {
    entry("cuGraphLaunch_ptsz", || launch(exec, h, true))
}

/// Nothing to upload ahead: gpushared made the graph when it was instantiated.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn before_cu_init_capture_calls_say_not_initialized() {
        // Before cuInit, as the CUDA runtime may ask.
        assert_eq!(
            cuStreamBeginCapture(std::ptr::null_mut()),
            result::NOT_INITIALIZED
        );
        let mut mode = capture::MODE_THREAD_LOCAL;
        // SAFETY: a valid in-out parameter.
        let got = unsafe { cuThreadExchangeStreamCaptureMode(&mut mode) };
        assert_eq!(got, result::NOT_INITIALIZED);
        assert_eq!(mode, capture::MODE_THREAD_LOCAL, "unchanged");
    }
}

//! The graph entry points: stream capture, graphs, and their instantiation and launch.

use std::ffi::{c_int, c_uint, c_void};

use super::capture::{MODE, status_of};
use super::{Exec, Graph, lock};
use crate::driver;
use crate::status::{Cu, entry, out};
use crate::types::{CUgraph, CUgraphExec, CUgraphNode, CUresult, CUstream, capture, result};

fn begin(h: CUstream, mode: c_int, per_thread: bool) -> Cu<()> {
    let d = driver::live()?;
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
    let d = driver::live()?;
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
    let d = driver::live()?;
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
    let c = d.graphs.capture_of(stream);
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
        unsafe { out(graph, d.graphs.new_graph(Vec::new())) }
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
        let n = lock(&d.graphs.graph(graph)?.ops).len();
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
    let ops = lock(&d.graphs.graph(graph)?.ops).clone();
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

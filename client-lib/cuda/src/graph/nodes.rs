//! Graphs built node by node (`cuGraphAdd*Node`, what XLA's command buffers and several
//! libraries use), their nodes' parameters, and updates to an instantiated graph
//! (`cuGraphExec*SetParams`, `cuGraphExecUpdate`). Kernel, device-to-device copy, memset,
//! empty and child-graph nodes; a child graph's nodes are copied into the parent.

use std::ffi::{c_int, c_void};

use super::params::{
    Described, KernelNodeParams, Memcpy3d, MemsetNodeParams, NodeParams, copy_op, described,
    kernel_op, memset_op, type_of,
};
use super::{Graphs, Node, Op, lock};
use crate::driver::{self, Driver};
use crate::status::{Cu, entry, out};
use crate::types::{CUgraph, CUgraphNode, CUresult, CUstream, result};

/// Writes `handles` into a program's array of `*count` entries (the rest NULL) and how many
/// it got into `count`; only the number when `nodes` is NULL.
///
/// # Safety
/// `count` is NULL or valid for reading and writing; `nodes` is NULL or holds `*count`
/// entries.
pub(super) unsafe fn hand_out(
    handles: &[usize],
    nodes: *mut CUgraphNode,
    count: *mut usize,
) -> Cu<()> {
    if count.is_null() {
        return Err(result::INVALID_VALUE);
    }
    if nodes.is_null() {
        // SAFETY: the caller's contract.
        return unsafe { out(count, handles.len()) };
    }
    // SAFETY: as above.
    let room = unsafe { *count };
    for i in 0..room {
        // SAFETY: `i < room`, inside the array.
        unsafe {
            *nodes.add(i) = handles
                .get(i)
                .map_or(std::ptr::null_mut(), |&h| h as CUgraphNode)
        };
    }
    // SAFETY: as above.
    unsafe { out(count, room.min(handles.len())) }
}

/// Bytes of one `CUgraphEdgeData`.
pub(super) const EDGE_DATA: usize = 8;

/// Writes `*count` edge data as the default one (a full dependency, the only kind gpushare
/// keeps), where the caller passed an array for them.
///
/// # Safety
/// `count` is NULL or valid for reading; `data` is NULL or holds `*count` `CUgraphEdgeData`.
pub(super) unsafe fn default_edge_data(data: *mut c_void, count: *const usize) {
    if !data.is_null() && !count.is_null() {
        // SAFETY: the caller's contract.
        unsafe { std::ptr::write_bytes(data.cast::<u8>(), 0, *count * EDGE_DATA) };
    }
}

/// The dependencies a program passed, as indices of `graph`'s nodes.
///
/// # Safety
/// `deps` holds `n` handles (or is NULL with `n` 0).
unsafe fn dep_indices(
    g: &Graphs,
    graph: CUgraph,
    deps: *const CUgraphNode,
    n: usize,
) -> Cu<Vec<u32>> {
    if n > 0 && deps.is_null() {
        return Err(result::INVALID_VALUE);
    }
    // Not sized by `n` ahead: a count that is not the array's must not cost an allocation.
    let mut out = Vec::new();
    for i in 0..n {
        // SAFETY: the caller's contract.
        let (owner, index) = g.node(unsafe { *deps.add(i) })?;
        if owner != graph as usize {
            return Err(result::INVALID_VALUE);
        }
        if !out.contains(&index) {
            out.push(index);
        }
    }
    Ok(out)
}

impl Graphs {
    /// Adds a node doing `op` after `deps`; its handle.
    ///
    /// # Safety
    /// As [`dep_indices`].
    unsafe fn add(&self, graph: CUgraph, deps: *const CUgraphNode, n: usize, op: Op) -> Cu<usize> {
        // SAFETY: the caller's contract.
        let deps = unsafe { dep_indices(self, graph, deps, n) }?;
        let node = Node {
            op,
            deps,
            handle: self.node_handle(),
        };
        Ok(self.append(graph, vec![node])?[0])
    }
}

fn add_node(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    n: usize,
    make: impl FnOnce(&Driver) -> Cu<Op>,
) -> Cu<()> {
    let d = driver::live()?;
    if node.is_null() {
        return Err(result::INVALID_VALUE);
    }
    d.graphs.graph(graph)?;
    let op = make(d)?;
    // SAFETY: the entry point's contract.
    let h = unsafe { d.graphs.add(graph, deps, n, op) }?;
    // SAFETY: checked not NULL; the caller's contract.
    unsafe { out(node, h as CUgraphNode) }
}

/// # Safety
/// As CUDA's: out-parameter writable, `deps` holds `n` nodes, `params` valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddKernelNode_v2(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    n: usize,
    params: *const KernelNodeParams,
) -> CUresult {
    entry("cuGraphAddKernelNode_v2", || {
        // SAFETY: the caller's contract.
        add_node(node, graph, deps, n, |d| unsafe {
            kernel_op(d, params, true)
        })
    })
}

/// # Safety
/// As `cuGraphAddKernelNode_v2`, with a v1 parameter block.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddKernelNode(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    n: usize,
    params: *const KernelNodeParams,
) -> CUresult {
    entry("cuGraphAddKernelNode", || {
        // SAFETY: the caller's contract.
        add_node(node, graph, deps, n, |d| unsafe {
            kernel_op(d, params, false)
        })
    })
}

/// # Safety
/// As CUDA's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddMemcpyNode(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    n: usize,
    params: *const Memcpy3d,
    _ctx: *mut c_void,
) -> CUresult {
    entry("cuGraphAddMemcpyNode", || {
        // SAFETY: the caller's contract.
        add_node(node, graph, deps, n, |_| unsafe { copy_op(params) })
    })
}

/// # Safety
/// As CUDA's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddMemsetNode(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    n: usize,
    params: *const MemsetNodeParams,
    _ctx: *mut c_void,
) -> CUresult {
    entry("cuGraphAddMemsetNode", || {
        // SAFETY: the caller's contract.
        add_node(node, graph, deps, n, |_| unsafe { memset_op(params) })
    })
}

/// # Safety
/// As CUDA's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddEmptyNode(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    n: usize,
) -> CUresult {
    entry("cuGraphAddEmptyNode", || {
        add_node(node, graph, deps, n, |_| Ok(Op::Empty))
    })
}

/// A host function's node (the graph is then replayed, its function called in order).
///
/// # Safety
/// As CUDA's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddHostNode(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    n: usize,
    params: *const super::params::HostNodeParams,
) -> CUresult {
    entry("cuGraphAddHostNode", || {
        // SAFETY: the caller's contract.
        add_node(node, graph, deps, n, |_| unsafe {
            super::params::host_op(params)
        })
    })
}

/// A child graph's nodes are copied in after `deps`; the node handed back is an empty node
/// after all of them.
///
/// # Safety
/// As CUDA's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddChildGraphNode(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    n: usize,
    child: CUgraph,
) -> CUresult {
    entry("cuGraphAddChildGraphNode", || {
        // SAFETY: the caller's contract.
        unsafe { add_child(node, graph, deps, n, child) }
    })
}

/// Copies `child`'s nodes into `graph` after `deps`, then an empty node after all of them,
/// whose handle goes to `node`.
///
/// # Safety
/// As `cuGraphAddChildGraphNode`'s contract.
unsafe fn add_child(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    n: usize,
    child: CUgraph,
) -> Cu<()> {
    let d = driver::live()?;
    if node.is_null() || child == graph {
        return Err(result::INVALID_VALUE);
    }
    let g = &d.graphs;
    // SAFETY: the caller's contract.
    let deps = unsafe { dep_indices(g, graph, deps, n) }?;
    let inner = lock(&g.graph(child)?.nodes).clone();
    let base = u32::try_from(lock(&g.graph(graph)?.nodes).len()).map_err(|_| result::UNKNOWN)?;
    let count = inner.len() as u32;
    let mut copied: Vec<Node> = inner
        .into_iter()
        .map(|c| Node {
            deps: if c.deps.is_empty() {
                deps.clone()
            } else {
                c.deps.iter().map(|&i| base + i).collect()
            },
            op: c.op,
            handle: g.node_handle(),
        })
        .collect();
    copied.push(Node {
        op: Op::Empty,
        deps: if count == 0 {
            deps
        } else {
            (base..base + count).collect()
        },
        handle: g.node_handle(),
    });
    let handles = g.append(graph, copied)?;
    let last = handles.last().copied().ok_or(result::UNKNOWN)?;
    lock(&g.graph(graph)?.children).insert(last, (base, count));
    // SAFETY: checked not NULL; the caller's contract.
    unsafe { out(node, last as CUgraphNode) }
}

/// # Safety
/// `from` and `to` hold `n` nodes each.
unsafe fn add_dependencies(
    graph: CUgraph,
    from: *const CUgraphNode,
    to: *const CUgraphNode,
    n: usize,
) -> Cu<()> {
    let d = driver::live()?;
    let g = &d.graphs;
    // SAFETY: the caller's contract.
    let (from, to) = unsafe {
        (
            dep_indices(g, graph, from, n)?,
            dep_indices(g, graph, to, n)?,
        )
    };
    let mut nodes = lock(&g.graph(graph)?.nodes);
    for (f, t) in from.into_iter().zip(to) {
        let deps = &mut nodes[t as usize].deps;
        if f == t {
            return Err(result::INVALID_VALUE);
        }
        if !deps.contains(&f) {
            deps.push(f);
        }
    }
    Ok(())
}

/// # Safety
/// As CUDA's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddDependencies(
    graph: CUgraph,
    from: *const CUgraphNode,
    to: *const CUgraphNode,
    n: usize,
) -> CUresult {
    // SAFETY: the caller's contract.
    entry("cuGraphAddDependencies", || unsafe {
        add_dependencies(graph, from, to, n)
    })
}

/// Edge data other than the default is not kept (every edge is a full dependency).
///
/// # Safety
/// As CUDA's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddDependencies_v2(
    graph: CUgraph,
    from: *const CUgraphNode,
    to: *const CUgraphNode,
    _edges: *const c_void,
    n: usize,
) -> CUresult {
    // SAFETY: the caller's contract.
    entry("cuGraphAddDependencies_v2", || unsafe {
        add_dependencies(graph, from, to, n)
    })
}

/// The node a handle names: a copy of it, and its dependencies as handles.
fn node_of(g: &Graphs, h: CUgraphNode) -> Cu<(Node, Vec<usize>)> {
    let (graph, index) = g.node(h)?;
    let nodes = lock(&g.graph(graph as CUgraph)?.nodes);
    let node = nodes
        .get(index as usize)
        .ok_or(result::INVALID_VALUE)?
        .clone();
    let deps = node
        .deps
        .iter()
        .filter_map(|&i| nodes.get(i as usize))
        .map(|n| n.handle)
        .collect();
    Ok((node, deps))
}

/// # Safety
/// As CUDA's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphNodeGetDependencies(
    node: CUgraphNode,
    deps: *mut CUgraphNode,
    n: *mut usize,
) -> CUresult {
    entry("cuGraphNodeGetDependencies", || {
        let (_, handles) = node_of(&driver::live()?.graphs, node)?;
        // SAFETY: the caller's contract.
        unsafe { hand_out(&handles, deps, n) }
    })
}

/// # Safety
/// As CUDA's; every edge is reported as a default one (no edge data written).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphNodeGetDependencies_v2(
    node: CUgraphNode,
    deps: *mut CUgraphNode,
    edges: *mut c_void,
    n: *mut usize,
) -> CUresult {
    entry("cuGraphNodeGetDependencies_v2", || {
        if !deps.is_null() {
            // SAFETY: the caller's contract.
            unsafe { default_edge_data(edges, n) };
        }
        let (_, handles) = node_of(&driver::live()?.graphs, node)?;
        // SAFETY: the caller's contract.
        unsafe { hand_out(&handles, deps, n) }
    })
}

/// A node of any type CUDA 12.2's generic parameters describe that gpushare serves (kernel,
/// copy, memset, empty, child graph); edge data other than the default is not kept.
///
/// # Safety
/// As CUDA's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddNode_v2(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    _edges: *const c_void,
    n: usize,
    params: *mut NodeParams,
) -> CUresult {
    // SAFETY: the caller's contract.
    entry("cuGraphAddNode_v2", || unsafe {
        add_any(node, graph, deps, n, params)
    })
}

/// # Safety
/// As `cuGraphAddNode_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddNode(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    n: usize,
    params: *mut NodeParams,
) -> CUresult {
    // SAFETY: the caller's contract.
    entry("cuGraphAddNode", || unsafe {
        add_any(node, graph, deps, n, params)
    })
}

/// # Safety
/// As `cuGraphAddNode_v2`.
unsafe fn add_any(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    n: usize,
    params: *mut NodeParams,
) -> Cu<()> {
    let d = driver::live()?;
    // SAFETY: the caller's contract.
    match unsafe { described(d, params) }? {
        Described::Op(op) => add_node(node, graph, deps, n, |_| Ok(op)),
        // SAFETY: as above.
        Described::Child(child) => unsafe { add_child(node, graph, deps, n, child) },
    }
}

/// # Safety
/// `kind` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphNodeGetType(node: CUgraphNode, kind: *mut c_int) -> CUresult {
    entry("cuGraphNodeGetType", || {
        let (n, _) = node_of(&driver::live()?.graphs, node)?;
        if kind.is_null() {
            return Err(result::INVALID_VALUE);
        }
        // SAFETY: checked not NULL; the caller's contract.
        unsafe { out(kind, type_of(&n.op)) }
    })
}

fn begin_to_graph(
    h: CUstream,
    graph: CUgraph,
    deps: *const CUgraphNode,
    n: usize,
    mode: c_int,
    per_thread: bool,
) -> Cu<()> {
    let d = crate::route::by_stream(h)?;
    let stream = d.stream(h, per_thread)?;
    if stream == 0 && !per_thread {
        return Err(result::STREAM_CAPTURE_UNSUPPORTED);
    }
    // SAFETY: the entry point's contract.
    let deps = unsafe { dep_indices(&d.graphs, graph, deps, n) }?;
    d.graphs.begin_into(stream, mode, Some(graph), deps)
}

/// Captures into an existing graph, after `deps` (edge data other than the default is not
/// kept).
///
/// # Safety
/// As CUDA's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamBeginCaptureToGraph(
    h: CUstream,
    graph: CUgraph,
    deps: *const CUgraphNode,
    _edges: *const c_void,
    n: usize,
    mode: c_int,
) -> CUresult {
    entry("cuStreamBeginCaptureToGraph", || {
        begin_to_graph(h, graph, deps, n, mode, false)
    })
}

/// # Safety
/// As `cuStreamBeginCaptureToGraph`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamBeginCaptureToGraph_ptsz(
    h: CUstream,
    graph: CUgraph,
    deps: *const CUgraphNode,
    _edges: *const c_void,
    n: usize,
    mode: c_int,
) -> CUresult {
    entry("cuStreamBeginCaptureToGraph_ptsz", || {
        begin_to_graph(h, graph, deps, n, mode, true)
    })
}

//! Changing a graph's nodes after they were added (`cuGraph*NodeSetParams`) and an
//! instantiated graph's (`cuGraphExec*SetParams`, `cuGraphNodeSetEnabled`,
//! `cuGraphExecUpdate`): an instantiated graph changed is made again in gpushared at its next
//! launch, launches queued before keeping what they had.

use std::ffi::{c_int, c_uint, c_void};

use super::exec::{ExecState, with_exec};
use super::params::{
    Described, KernelNodeParams, Memcpy3d, MemsetNodeParams, NodeParams, copy_op, described,
    kernel_op, memset_op, type_of,
};
use super::{Node, Op, lock};
use crate::driver::{self, Driver};
use crate::status::{Cu, entry, out};
use crate::types::{CUgraph, CUgraphExec, CUgraphNode, CUresult, result};

/// `CUgraphExecUpdateResultInfo`.
#[repr(C)]
pub struct ExecUpdateResultInfo {
    result: c_int,
    error_node: CUgraphNode,
    error_from_node: CUgraphNode,
}

/// `CUgraphExecUpdateResult`.
mod update_result {
    pub const SUCCESS: i32 = 0;
    pub const ERROR_TOPOLOGY_CHANGED: i32 = 2;
    pub const ERROR_NODE_TYPE_CHANGED: i32 = 3;
}

const GRAPH_EXEC_UPDATE_FAILURE: CUresult = 910;

/// Replaces a node's op in its graph, which must keep its type.
fn set_in_graph(node: CUgraphNode, op: Op) -> Cu<()> {
    let d = driver::live()?;
    let (graph, index) = d.graphs.node(node)?;
    let mut nodes = lock(&d.graphs.graph(graph as CUgraph)?.nodes);
    let n = nodes.get_mut(index as usize).ok_or(result::INVALID_VALUE)?;
    if type_of(&n.op) != type_of(&op) {
        return Err(result::INVALID_VALUE);
    }
    n.op = op;
    Ok(())
}

/// # Safety
/// As CUDA's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphKernelNodeSetParams_v2(
    node: CUgraphNode,
    params: *const KernelNodeParams,
) -> CUresult {
    entry("cuGraphKernelNodeSetParams_v2", || {
        // SAFETY: the caller's contract.
        let op = unsafe { kernel_op(driver::live()?, params, true) }?;
        set_in_graph(node, op)
    })
}

/// # Safety
/// As CUDA's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphMemcpyNodeSetParams(
    node: CUgraphNode,
    params: *const Memcpy3d,
) -> CUresult {
    entry("cuGraphMemcpyNodeSetParams", || {
        // SAFETY: the caller's contract.
        set_in_graph(node, unsafe { copy_op(params) }?)
    })
}

/// # Safety
/// As CUDA's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphMemsetNodeSetParams(
    node: CUgraphNode,
    params: *const MemsetNodeParams,
) -> CUresult {
    entry("cuGraphMemsetNodeSetParams", || {
        // SAFETY: the caller's contract.
        set_in_graph(node, unsafe { memset_op(params) }?)
    })
}

/// Replaces the op of an instantiated graph's node (of the graph it was instantiated from),
/// which must keep its type; gpushared's graph is made again at the next launch.
fn set_in_exec(d: &Driver, exec: CUgraphExec, node: CUgraphNode, op: Op) -> Cu<()> {
    with_exec(d, exec, |st| {
        let &i = st
            .index
            .get(&(node as usize))
            .ok_or(result::INVALID_VALUE)?;
        if type_of(&st.nodes[i as usize].op) != type_of(&op) {
            return Err(result::INVALID_VALUE);
        }
        st.change(i, op);
        Ok(())
    })
}

/// # Safety
/// As CUDA's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphExecKernelNodeSetParams_v2(
    exec: CUgraphExec,
    node: CUgraphNode,
    params: *const KernelNodeParams,
) -> CUresult {
    entry("cuGraphExecKernelNodeSetParams_v2", || {
        let d = driver::live()?;
        // SAFETY: the caller's contract.
        let op = unsafe { kernel_op(d, params, true) }?;
        set_in_exec(d, exec, node, op)
    })
}

/// # Safety
/// As CUDA's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphExecMemcpyNodeSetParams(
    exec: CUgraphExec,
    node: CUgraphNode,
    params: *const Memcpy3d,
    _ctx: *mut c_void,
) -> CUresult {
    entry("cuGraphExecMemcpyNodeSetParams", || {
        let d = driver::live()?;
        // SAFETY: the caller's contract.
        set_in_exec(d, exec, node, unsafe { copy_op(params) }?)
    })
}

/// # Safety
/// As CUDA's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphExecMemsetNodeSetParams(
    exec: CUgraphExec,
    node: CUgraphNode,
    params: *const MemsetNodeParams,
    _ctx: *mut c_void,
) -> CUresult {
    entry("cuGraphExecMemsetNodeSetParams", || {
        let d = driver::live()?;
        // SAFETY: the caller's contract.
        set_in_exec(d, exec, node, unsafe { memset_op(params) }?)
    })
}

/// Turns a node of an instantiated graph off (it then does nothing) or on again.
#[unsafe(no_mangle)]
pub extern "C" fn cuGraphNodeSetEnabled(
    exec: CUgraphExec,
    node: CUgraphNode,
    enabled: c_uint,
) -> CUresult {
    entry("cuGraphNodeSetEnabled", || {
        let d = driver::live()?;
        with_exec(d, exec, |st| st.set_enabled(node as usize, enabled != 0))
    })
}

/// # Safety
/// `enabled` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphNodeGetEnabled(
    exec: CUgraphExec,
    node: CUgraphNode,
    enabled: *mut c_uint,
) -> CUresult {
    entry("cuGraphNodeGetEnabled", || {
        let d = driver::live()?;
        let on = with_exec(d, exec, |st| st.enabled(node as usize))?;
        if enabled.is_null() {
            return Err(result::INVALID_VALUE);
        }
        // SAFETY: checked not NULL; the caller's contract.
        unsafe { out(enabled, c_uint::from(on)) }
    })
}

/// Takes `graph`'s parameters into an instantiated graph of the same shape (same nodes, same
/// types, same dependencies); anything else is refused as CUDA refuses it.
///
/// # Safety
/// `info` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphExecUpdate_v2(
    exec: CUgraphExec,
    graph: CUgraph,
    info: *mut ExecUpdateResultInfo,
) -> CUresult {
    entry("cuGraphExecUpdate_v2", || {
        let d = driver::live()?;
        let nodes = lock(&d.graphs.graph(graph)?.nodes).clone();
        let verdict = with_exec(d, exec, |st| Ok(st.update_from(nodes)))?;
        if !info.is_null() {
            // SAFETY: checked not NULL; the caller's contract.
            unsafe {
                info.write(ExecUpdateResultInfo {
                    result: verdict,
                    error_node: std::ptr::null_mut(),
                    error_from_node: std::ptr::null_mut(),
                })
            };
        }
        if verdict == update_result::SUCCESS {
            Ok(())
        } else {
            Err(GRAPH_EXEC_UPDATE_FAILURE)
        }
    })
}

impl ExecState {
    /// Takes the ops of `nodes` if they have the exec's shape; the update result.
    fn update_from(&mut self, nodes: Vec<Node>) -> c_int {
        if nodes.len() != self.nodes.len()
            || nodes.iter().zip(&self.nodes).any(|(a, b)| a.deps != b.deps)
        {
            return update_result::ERROR_TOPOLOGY_CHANGED;
        }
        if nodes
            .iter()
            .zip(&self.nodes)
            .any(|(a, b)| type_of(&a.op) != type_of(&b.op))
        {
            return update_result::ERROR_NODE_TYPE_CHANGED;
        }
        for (i, theirs) in nodes.into_iter().enumerate() {
            self.change(i as u32, theirs.op);
        }
        update_result::SUCCESS
    }
}

/// # Safety
/// As CUDA's: `params` describes a node of the node's type.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphNodeSetParams(
    node: CUgraphNode,
    params: *mut NodeParams,
) -> CUresult {
    entry("cuGraphNodeSetParams", || {
        // SAFETY: the caller's contract.
        match unsafe { described(driver::live()?, params) }? {
            Described::Op(op) => set_in_graph(node, op),
            Described::Child(_) => Err(result::NOT_SUPPORTED),
        }
    })
}

/// # Safety
/// As CUDA's: `params` describes a node of the node's type.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphExecNodeSetParams(
    exec: CUgraphExec,
    node: CUgraphNode,
    params: *mut NodeParams,
) -> CUresult {
    entry("cuGraphExecNodeSetParams", || {
        let d = driver::live()?;
        // SAFETY: the caller's contract.
        match unsafe { described(d, params) }? {
            Described::Op(op) => set_in_exec(d, exec, node, op),
            Described::Child(_) => Err(result::NOT_SUPPORTED),
        }
    })
}

/// A child graph's node of an instantiated graph takes the parameters of `child`, which must
/// have the shape of the graph it was made from (its nodes, their types and dependencies, in
/// the same order), as CUDA requires.
#[unsafe(no_mangle)]
pub extern "C" fn cuGraphExecChildGraphNodeSetParams(
    exec: CUgraphExec,
    node: CUgraphNode,
    child: CUgraph,
) -> CUresult {
    entry("cuGraphExecChildGraphNodeSetParams", || {
        let d = driver::live()?;
        let nodes = lock(&d.graphs.graph(child)?.nodes).clone();
        with_exec(d, exec, |st| {
            let &(base, count) = st
                .children
                .get(&(node as usize))
                .ok_or(result::INVALID_VALUE)?;
            if nodes.len() != count as usize {
                return Err(result::INVALID_VALUE);
            }
            for (i, n) in nodes.iter().enumerate() {
                let mine = &st.nodes[base as usize + i];
                // A root of the child depends on what the child node does in the parent.
                let same_deps = n.deps.is_empty()
                    || n.deps
                        .iter()
                        .map(|&d| d + base)
                        .eq(mine.deps.iter().copied());
                if !same_deps || type_of(&n.op) != type_of(&mine.op) {
                    return Err(result::INVALID_VALUE);
                }
            }
            for (i, n) in nodes.into_iter().enumerate() {
                st.change(base + i as u32, n.op);
            }
            Ok(())
        })
    })
}

//! Questions about a graph's shape: its root nodes, its edges, a node's dependents. XLA asks
//! for a traced command buffer's root nodes (an empty capture is its error), and tools walk a
//! graph by its edges. Every edge is a full dependency: edge data is written as the default.

use std::ffi::c_void;

use super::nodes::{default_edge_data, hand_out};
use super::{Node, lock};
use crate::driver;
use crate::status::{Cu, entry};
use crate::types::{CUgraph, CUgraphNode, CUresult, result};

/// The handles of the nodes that depend on nothing.
fn roots(nodes: &[Node]) -> Vec<usize> {
    nodes
        .iter()
        .filter(|n| n.deps.is_empty())
        .map(|n| n.handle)
        .collect()
}

/// Every edge (from, to) as handles, in the order the nodes were added.
fn edges(nodes: &[Node]) -> Vec<(usize, usize)> {
    nodes
        .iter()
        .flat_map(|n| {
            n.deps
                .iter()
                .filter_map(|&d| nodes.get(d as usize))
                .map(move |from| (from.handle, n.handle))
        })
        .collect()
}

/// The handles of the nodes that depend on node `index`.
fn dependents(nodes: &[Node], index: u32) -> Vec<usize> {
    nodes
        .iter()
        .filter(|n| n.deps.contains(&index))
        .map(|n| n.handle)
        .collect()
}

/// Writes `edges` as CUDA hands them out: with `from` and `to` both NULL, only their number;
/// else up to `*count` of them, NULL after the last, and the number written.
///
/// # Safety
/// `count` is NULL or valid for reading and writing; `from`, `to` and `data` are NULL or hold
/// `*count` entries.
unsafe fn hand_out_edges(
    edges: &[(usize, usize)],
    from: *mut CUgraphNode,
    to: *mut CUgraphNode,
    data: *mut c_void,
    count: *mut usize,
) -> Cu<()> {
    if count.is_null() || from.is_null() != to.is_null() {
        return Err(result::INVALID_VALUE);
    }
    let (froms, tos): (Vec<usize>, Vec<usize>) = edges.iter().copied().unzip();
    if !from.is_null() {
        // SAFETY: the caller's contract.
        unsafe { default_edge_data(data, count) };
        // SAFETY: checked not NULL; the caller's contract.
        let room = unsafe { *count };
        // SAFETY: the caller's contract; `hand_out` writes `room` entries and the number.
        unsafe { hand_out(&tos, to, count) }?;
        // SAFETY: as above; `count` said `room` again before this call.
        unsafe { *count = room };
        // SAFETY: the caller's contract.
        return unsafe { hand_out(&froms, from, count) };
    }
    if !data.is_null() {
        return Err(result::INVALID_VALUE);
    }
    // SAFETY: the caller's contract.
    unsafe { hand_out(&froms, from, count) }
}

/// # Safety
/// As CUDA's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphGetRootNodes(
    graph: CUgraph,
    nodes: *mut CUgraphNode,
    count: *mut usize,
) -> CUresult {
    entry("cuGraphGetRootNodes", || {
        let d = driver::live()?;
        let handles = roots(&lock(&d.graphs.graph(graph)?.nodes));
        // SAFETY: the caller's contract.
        unsafe { hand_out(&handles, nodes, count) }
    })
}

/// # Safety
/// As CUDA's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphGetEdges(
    graph: CUgraph,
    from: *mut CUgraphNode,
    to: *mut CUgraphNode,
    count: *mut usize,
) -> CUresult {
    entry("cuGraphGetEdges", || {
        let d = driver::live()?;
        let all = edges(&lock(&d.graphs.graph(graph)?.nodes));
        // SAFETY: the caller's contract.
        unsafe { hand_out_edges(&all, from, to, std::ptr::null_mut(), count) }
    })
}

/// # Safety
/// As CUDA's; every edge's data is the default.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphGetEdges_v2(
    graph: CUgraph,
    from: *mut CUgraphNode,
    to: *mut CUgraphNode,
    data: *mut c_void,
    count: *mut usize,
) -> CUresult {
    entry("cuGraphGetEdges_v2", || {
        let d = driver::live()?;
        let all = edges(&lock(&d.graphs.graph(graph)?.nodes));
        // SAFETY: the caller's contract.
        unsafe { hand_out_edges(&all, from, to, data, count) }
    })
}

fn dependents_of(node: CUgraphNode) -> Cu<Vec<usize>> {
    let g = &driver::live()?.graphs;
    let (graph, index) = g.node(node)?;
    Ok(dependents(&lock(&g.graph(graph as CUgraph)?.nodes), index))
}

/// # Safety
/// As CUDA's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphNodeGetDependentNodes(
    node: CUgraphNode,
    nodes: *mut CUgraphNode,
    count: *mut usize,
) -> CUresult {
    entry("cuGraphNodeGetDependentNodes", || {
        let handles = dependents_of(node)?;
        // SAFETY: the caller's contract.
        unsafe { hand_out(&handles, nodes, count) }
    })
}

/// # Safety
/// As CUDA's; every edge's data is the default.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphNodeGetDependentNodes_v2(
    node: CUgraphNode,
    nodes: *mut CUgraphNode,
    data: *mut c_void,
    count: *mut usize,
) -> CUresult {
    entry("cuGraphNodeGetDependentNodes_v2", || {
        let handles = dependents_of(node)?;
        if !nodes.is_null() {
            // SAFETY: the caller's contract.
            unsafe { default_edge_data(data, count) };
        }
        // SAFETY: the caller's contract.
        unsafe { hand_out(&handles, nodes, count) }
    })
}

#[cfg(test)]
mod tests {
    use super::super::Op;
    use super::*;

    fn graph() -> Vec<Node> {
        // 10 → 11 → 13, 10 → 12 → 13, and 14 alone.
        let node = |handle, deps: &[u32]| Node {
            op: Op::Empty,
            deps: deps.to_vec(),
            handle,
        };
        vec![
            node(10, &[]),
            node(11, &[0]),
            node(12, &[0]),
            node(13, &[1, 2]),
            node(14, &[]),
        ]
    }

    #[test]
    fn a_graph_s_roots_edges_and_dependents_follow_its_dependencies() {
        let g = graph();
        assert_eq!(roots(&g), vec![10, 14]);
        assert_eq!(edges(&g), vec![(10, 11), (10, 12), (11, 13), (12, 13)]);
        assert_eq!(dependents(&g, 0), vec![11, 12]);
        assert_eq!(dependents(&g, 3), Vec::<usize>::new());
    }

    #[test]
    fn edges_are_counted_then_handed_out_with_null_after_the_last() {
        let all = edges(&graph());
        let mut count = 0usize;
        let none = std::ptr::null_mut();
        // SAFETY: NULL arrays, a valid count.
        let r = unsafe { hand_out_edges(&all, none, none, std::ptr::null_mut(), &mut count) };
        assert_eq!((r, count), (Ok(()), 4));
        let mut from = [std::ptr::dangling_mut::<c_void>(); 6];
        let mut to = [std::ptr::dangling_mut::<c_void>(); 6];
        let mut data = [0xffu8; 6 * super::super::nodes::EDGE_DATA];
        count = 6;
        // SAFETY: arrays of `count` entries each.
        let r = unsafe {
            hand_out_edges(
                &all,
                from.as_mut_ptr().cast(),
                to.as_mut_ptr().cast(),
                data.as_mut_ptr().cast(),
                &mut count,
            )
        };
        assert_eq!((r, count), (Ok(()), 4));
        assert_eq!(from[1] as usize, 10);
        assert_eq!(to[3] as usize, 13);
        assert!(from[4].is_null() && to[5].is_null());
        assert!(data.iter().all(|&b| b == 0), "default edge data");
        count = 2;
        // SAFETY: as above, room for 2.
        let r = unsafe {
            hand_out_edges(
                &all,
                from.as_mut_ptr().cast(),
                none,
                none.cast(),
                &mut count,
            )
        };
        assert_eq!(r, Err(result::INVALID_VALUE), "from without to");
    }
}

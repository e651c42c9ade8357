//! CUDA graphs: recorded in the client (by stream capture, or node by node), and made real
//! graphs in gpushared when instantiated. While a stream captures, its launches, device copies
//! and memsets are recorded instead of sent (with the launches' arguments as they were at
//! capture, as CUDA keeps them), each depending on what its stream did before and on the
//! events it waited for. Instantiating sends the nodes to gpushared, which makes and
//! instantiates a CUDA graph of them in the context that runs the client's work; a launch is
//! then one ring command, and the scheduler grants it as one unit. A graph with nodes that
//! cannot go into gpushared's graph (copies with page-locked host memory, host functions) is
//! replayed instead: its nodes sent again one by one, in an order their dependencies allow.
//!
//! Node handles are numbers from one counter, never reused, looked up here.

mod capture;
mod exec;
mod replay;

pub mod api;
pub mod nodes;
pub mod params;
pub mod query;
pub mod update;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use gpushare_protocol::Command;

use crate::launch::LaunchShape;
use crate::status::Cu;
use crate::types::{CUgraph, CUgraphNode, result};

pub use capture::{
    capture, capturing, record_in_capture, refuse_pageable_in_capture, refuse_while_capturing,
    wait_in_capture,
};

/// What one node does.
#[derive(Debug, Clone)]
pub enum Op {
    Launch {
        function: u64,
        shape: LaunchShape,
        params: Vec<u8>,
    },
    /// A stream-ordered command (a copy or memset), sent again on the launch stream.
    Command(Command),
    /// Nothing: a point others depend on (`cuGraphAddEmptyNode`, the end of a child graph).
    Empty,
    /// A host function (`cuLaunchHostFunc` captured, `cuGraphAddHostNode`) and its data (an
    /// address). A graph holding one is replayed.
    Host {
        function: crate::host_func::HostFnPtr,
        data: usize,
    },
}

/// One node: what it does, the nodes it depends on (indices into its graph), and its handle.
#[derive(Debug, Clone)]
pub struct Node {
    pub op: Op,
    pub deps: Vec<u32>,
    pub handle: usize,
}

struct Capture {
    id: u64,
    state: Mutex<Recording>,
    invalidated: AtomicBool,
    /// The graph being built (what `cuStreamGetCaptureInfo` hands out), as an address.
    graph: usize,
}

/// What a capture recorded so far.
#[derive(Default)]
struct Recording {
    nodes: Vec<Node>,
    /// Each capturing stream's last nodes: what its next node depends on.
    tails: HashMap<u32, Vec<u32>>,
    /// Events recorded in the capture: the nodes they mark.
    marks: HashMap<u32, Vec<u32>>,
    /// Nodes the graph held before the capture began (`cuStreamBeginCaptureToGraph`).
    base: u32,
}

/// A graph.
struct Graph {
    nodes: Mutex<Vec<Node>>,
    /// Child graphs copied in: each one's end node (its handle) → where its nodes are (the
    /// first index and how many), for `cuGraphExecChildGraphNodeSetParams`.
    children: Mutex<HashMap<usize, (u32, u32)>>,
}

/// An instantiated graph.
struct Exec {
    state: Mutex<exec::ExecState>,
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
    /// Node handle → its graph and index there.
    nodes: Mutex<HashMap<usize, (usize, u32)>>,
    next_id: AtomicU64,
    next_node: AtomicUsize,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Graphs {
    fn new_graph(&self) -> CUgraph {
        let g = Box::into_raw(Box::new(Graph {
            nodes: Mutex::new(Vec::new()),
            children: Mutex::new(HashMap::new()),
        }));
        lock(&self.graphs).insert(g as usize);
        g.cast()
    }

    fn graph(&self, h: CUgraph) -> Cu<&Graph> {
        if !lock(&self.graphs).contains(&(h as usize)) {
            return Err(result::INVALID_VALUE);
        }
        // SAFETY: a live graph handle is a `Box<Graph>` not yet destroyed; destroying removes
        // it from the set first.
        Ok(unsafe { &*(h as *const Graph) })
    }

    /// A fresh node handle.
    fn node_handle(&self) -> usize {
        self.next_node.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Adds `nodes` (their deps already indices of `graph`) to `graph`, naming each.
    fn append(&self, graph: CUgraph, nodes: Vec<Node>) -> Cu<Vec<usize>> {
        let g = self.graph(graph)?;
        let mut held = lock(&g.nodes);
        let mut names = lock(&self.nodes);
        let mut handles = Vec::with_capacity(nodes.len());
        for n in nodes {
            let index = u32::try_from(held.len()).map_err(|_| result::OUT_OF_MEMORY)?;
            names.insert(n.handle, (graph as usize, index));
            handles.push(n.handle);
            held.push(n);
        }
        Ok(handles)
    }

    /// The graph and index a node handle names.
    fn node(&self, h: CUgraphNode) -> Cu<(usize, u32)> {
        lock(&self.nodes)
            .get(&(h as usize))
            .copied()
            .ok_or(result::INVALID_VALUE)
    }

    /// Destroys a graph and forgets its nodes' handles.
    fn destroy(&self, graph: CUgraph) -> Cu<()> {
        if !lock(&self.graphs).remove(&(graph as usize)) {
            return Err(result::INVALID_VALUE);
        }
        // SAFETY: a live handle, just removed from the set (so never freed twice).
        let g = unsafe { Box::from_raw(graph as *mut Graph) };
        let mut names = lock(&self.nodes);
        for n in lock(&g.nodes).iter() {
            names.remove(&n.handle);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn graph_handles_name_only_graphs_made_here() {
        let g = Graphs::default();
        let graph = g.new_graph();
        assert!(g.graph(graph).is_ok());
        let stranger = Box::leak(Box::new(0u64)) as *mut u64;
        assert_eq!(g.graph(stranger.cast()).err(), Some(result::INVALID_VALUE));
    }

    #[test]
    fn node_handles_name_their_graph_and_place_until_it_is_destroyed() {
        let g = Graphs::default();
        let graph = g.new_graph();
        let node = |deps| Node {
            op: Op::Empty,
            deps,
            handle: g.node_handle(),
        };
        let (a, b) = (node(vec![]), node(vec![0]));
        let handles = g.append(graph, vec![a, b]).expect("append");
        assert_eq!(g.node(handles[1] as CUgraphNode), Ok((graph as usize, 1)));
        g.destroy(graph).expect("destroy");
        assert_eq!(
            g.node(handles[0] as CUgraphNode),
            Err(result::INVALID_VALUE)
        );
        assert_eq!(g.destroy(graph), Err(result::INVALID_VALUE), "once");
    }
}

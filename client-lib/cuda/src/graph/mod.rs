//! CUDA graphs by stream capture, recorded in the client and replayed: while a stream
//! captures, its launches, device copies and memsets are recorded instead of sent (with the
//! launches' arguments as they were at capture, as CUDA keeps them); launching the graph
//! sends them again, in capture order, on the launch stream. Capture order is an order the
//! graph's dependencies allow, so the results are the graph's; a replay costs one submission
//! per node rather than one for the graph.
//!
//! Streams that join a capture through an event recorded in it record into the same graph.
//! Graphs built node by node (`cuGraphAdd*Node`) are not supported.

mod capture;
mod replay;

pub mod api;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex};

use gpushare_protocol::Command;

use crate::launch::LaunchShape;
use crate::status::Cu;
use crate::types::{CUgraph, result};

pub use capture::{
    capture, capturing, record_in_capture, refuse_pageable_in_capture, refuse_while_capturing,
    wait_in_capture,
};

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

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Graphs {
    fn new_graph(&self, ops: Vec<Op>) -> CUgraph {
        let g = Box::into_raw(Box::new(Graph {
            ops: Mutex::new(Arc::new(ops)),
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn graph_handles_name_only_graphs_made_here() {
        let g = Graphs::default();
        let graph = g.new_graph(Vec::new());
        assert!(g.graph(graph).is_ok());
        let stranger = Box::leak(Box::new(0u64)) as *mut u64;
        assert_eq!(g.graph(stranger.cast()).err(), Some(result::INVALID_VALUE));
    }
}

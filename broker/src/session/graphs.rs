//! A client's CUDA graphs: made by the control task (`ClientMessage::MakeGraph`), launched by
//! the data thread as one unit the scheduler grants like a kernel, dropped behind the
//! launches queued before the drop.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use gpushare_protocol::command::{MAX_LAUNCH_PARAMS, shape_is_valid};
use gpushare_protocol::graph::{GraphNode, GraphOp, decode_changes, encode_graph};
use gpushare_protocol::{ErrorCode, GraphId, StreamId};

use super::{ModuleTable, SessionState};
use crate::device::{Call, Device, Function, Graph};

/// Most graphs one client may hold at once.
pub const MAX_GRAPHS: usize = 4096;

/// A device range a graph's copies read (`write` false) or its copies and memsets write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Touch {
    pub ptr: u64,
    pub len: u64,
    pub write: bool,
}

/// An instantiated graph of the client's.
pub struct SessionGraph {
    pub graph: Graph,
    pub parts: Mutex<GraphParts>,
}

/// What the broker knows of a graph's nodes.
pub struct GraphParts {
    /// The nodes as the device has them (kernels' functions are the device's handles).
    pub nodes: Vec<GraphNode>,
    /// The functions its kernels run, held while it lives.
    pub functions: Vec<Arc<Function>>,
    /// What its copies and memsets touch: checked at each launch, as the same commands sent
    /// one by one would be.
    pub touches: Vec<Touch>,
    /// Its kernel nodes, and the most thread blocks one of them launches.
    pub kernels: u64,
    pub blocks: u32,
}

impl GraphParts {
    /// Checks the client's nodes (their kernels' functions the session's), making each
    /// kernel's function the device's; refused with the node and why.
    pub fn check(
        nodes: Vec<GraphNode>,
        table: &ModuleTable,
        device: &Device,
    ) -> Result<GraphParts, (ErrorCode, String)> {
        let mut parts = GraphParts {
            nodes: Vec::with_capacity(nodes.len()),
            functions: Vec::new(),
            touches: Vec::new(),
            kernels: 0,
            blocks: 0,
        };
        for (i, mut node) in nodes.into_iter().enumerate() {
            if let Some(f) = check_op(i, &mut node.op, table, device)? {
                parts.hold(f);
            }
            parts.nodes.push(node);
        }
        parts.survey();
        Ok(parts)
    }

    /// Holds a function a kernel runs (once).
    fn hold(&mut self, f: Arc<Function>) {
        if !self.functions.iter().any(|held| Arc::ptr_eq(held, &f)) {
            self.functions.push(f);
        }
    }

    /// Counts kernels and blocks and lists what copies and memsets touch, from the nodes.
    fn survey(&mut self) {
        self.touches.clear();
        self.kernels = 0;
        self.blocks = 0;
        for node in &self.nodes {
            match &node.op {
                GraphOp::Kernel { grid, .. } => {
                    self.kernels += 1;
                    let blocks = grid.iter().fold(1u32, |a, &g| a.saturating_mul(g));
                    self.blocks = self.blocks.max(blocks);
                }
                GraphOp::Copy { src, dst, len } => {
                    self.touches.push(Touch {
                        ptr: *src,
                        len: *len,
                        write: false,
                    });
                    self.touches.push(Touch {
                        ptr: *dst,
                        len: *len,
                        write: true,
                    });
                }
                GraphOp::Memset {
                    dst,
                    elem_bytes,
                    count,
                    ..
                } => self.touches.push(Touch {
                    ptr: *dst,
                    len: count.saturating_mul(u64::from(*elem_bytes)),
                    write: true,
                }),
            }
        }
    }
}

/// Checks one node's op as a launch, copy or memset of it would be checked; a kernel's
/// function becomes the device's handle (the session's function is returned, to be held).
fn check_op(
    i: usize,
    op: &mut GraphOp,
    table: &ModuleTable,
    device: &Device,
) -> Result<Option<Arc<Function>>, (ErrorCode, String)> {
    let bad = |why: String| (ErrorCode::InvalidArgument, format!("graph node {i}: {why}"));
    match op {
        GraphOp::Kernel {
            function,
            grid,
            block,
            params,
            ..
        } => {
            let f = table.function(*function).ok_or_else(|| {
                (
                    ErrorCode::InvalidHandle,
                    format!("graph node {i}: no function {function}"),
                )
            })?;
            if !shape_is_valid(*grid, *block) {
                return Err(bad(format!(
                    "a launch of {grid:?} blocks of {block:?} threads"
                )));
            }
            if params.len() > MAX_LAUNCH_PARAMS as usize {
                return Err(bad(format!(
                    "{} bytes of parameters, at most {MAX_LAUNCH_PARAMS}",
                    params.len()
                )));
            }
            *function = device.id(&*f).map_err(|e| (e.code(), e.to_string()))?;
            Ok(Some(f))
        }
        GraphOp::Copy { .. } => Ok(None),
        GraphOp::Memset {
            elem_bytes, count, ..
        } => {
            if ![1, 2, 4].contains(elem_bytes) {
                return Err(bad(format!("memset elements of {elem_bytes} bytes")));
            }
            count
                .checked_mul(u64::from(*elem_bytes))
                .ok_or_else(|| bad("memset too large".into()))?;
            Ok(None)
        }
    }
}

/// The graphs a client holds, by id (never reused).
#[derive(Default)]
pub struct GraphTable {
    graphs: HashMap<GraphId, Arc<SessionGraph>>,
    next: GraphId,
}

impl GraphTable {
    pub fn insert(&mut self, graph: SessionGraph) -> Result<GraphId, ErrorCode> {
        if self.graphs.len() >= MAX_GRAPHS {
            return Err(ErrorCode::TooManyHandles);
        }
        self.next = self.next.checked_add(1).ok_or(ErrorCode::TooManyHandles)?;
        self.graphs.insert(self.next, Arc::new(graph));
        Ok(self.next)
    }

    pub fn get(&self, id: GraphId) -> Option<Arc<SessionGraph>> {
        self.graphs.get(&id).cloned()
    }

    pub fn remove(&mut self, id: GraphId) -> Option<Arc<SessionGraph>> {
        self.graphs.remove(&id)
    }

    pub fn clear(&mut self) {
        self.graphs.clear();
    }
}

/// Graph ids in the scheduler's profile table: apart from function handles.
const GRAPH_KEY: u64 = 1 << 38;

impl SessionState {
    fn graph(&self, id: GraphId) -> Result<Arc<SessionGraph>, ErrorCode> {
        self.modules
            .lock()
            .map_err(|_| ErrorCode::Internal)?
            .graphs
            .get(id)
            .ok_or(ErrorCode::InvalidHandle)
    }

    /// Launches a graph as one unit: granted by the scheduler and timed like one kernel.
    pub(super) fn launch_graph(
        &mut self,
        stream: StreamId,
        id: GraphId,
    ) -> Result<(u64, u64), ErrorCode> {
        let g = self.graph(id)?;
        // Checked under the graph's lock (then the module table's, as an update takes them).
        let (kernels, blocks) = {
            let p = g.parts.lock().map_err(|_| ErrorCode::Internal)?;
            for t in &p.touches {
                if t.write {
                    self.check_write(t.ptr, t.len)?;
                } else {
                    self.check_device(t.ptr, t.len)?;
                }
            }
            (p.kernels, p.blocks)
        };
        if !self.streams.contains_key(&stream) {
            return Err(ErrorCode::InvalidHandle);
        }
        let client = self.info.id;
        let key = GRAPH_KEY | u64::from(id);
        self.queue_granted(
            stream,
            kernels,
            |d| d.module_profile(client, key, blocks),
            |d, s, place| {
                let graph = d.id(&g.graph)?;
                let launch = |stream| Call::LaunchGraph {
                    stream,
                    graph,
                    start: None,
                    place,
                };
                d.queue(s, launch, &[])
            },
        )
    }

    /// New parameters for some of a graph's nodes, for the launches after this: checked as
    /// the graph was, then applied on the device behind the launches queued before (this
    /// thread's calls reach the device in order).
    pub(super) fn update_graph(
        &mut self,
        id: GraphId,
        offset: u64,
        len: u32,
    ) -> Result<(u64, u64), ErrorCode> {
        let g = self.graph(id)?;
        let slice = self
            .region
            .arena_slice(offset, u64::from(len))
            .ok_or(ErrorCode::ArenaOutOfBounds)?;
        let mut bytes = vec![0u8; slice.len()];
        slice.read_into(&mut bytes);
        let mut changes = decode_changes(&bytes).map_err(|_| ErrorCode::InvalidArgument)?;
        let mut parts = g.parts.lock().map_err(|_| ErrorCode::Internal)?;
        {
            let table = self.modules.lock().map_err(|_| ErrorCode::Internal)?;
            for c in &mut changes {
                let i = c.node as usize;
                let was = parts.nodes.get(i).ok_or(ErrorCode::InvalidArgument)?;
                if !was.op.same_kind(&c.op) {
                    return Err(ErrorCode::InvalidArgument);
                }
                if let Some(f) =
                    check_op(i, &mut c.op, &table, &self.device).map_err(|(code, _)| code)?
                {
                    parts.hold(f);
                }
            }
        }
        for c in &changes {
            parts.nodes[c.node as usize].op = c.op.clone();
        }
        parts.survey();
        let all = encode_graph(&parts.nodes).map_err(|_| ErrorCode::Internal)?;
        self.device
            .update_graph(&g.graph, &changes, Arc::from(all))
            .map_err(|e| e.code())?;
        Ok((0, 0))
    }

    /// Drops a graph; the device lets go of it after the launches queued before.
    pub(super) fn drop_graph(&mut self, id: GraphId) -> Result<(u64, u64), ErrorCode> {
        let gone = self
            .modules
            .lock()
            .map_err(|_| ErrorCode::Internal)?
            .graphs
            .remove(id)
            .ok_or(ErrorCode::InvalidHandle)?;
        // Dropped here, on the data thread: its release goes after this thread's launches.
        drop(gone);
        Ok((0, 0))
    }
}

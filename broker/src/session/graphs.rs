//! A client's CUDA graphs: made by the control task (`ClientMessage::MakeGraph`), launched by
//! the data thread as one unit the scheduler grants like a kernel, dropped behind the
//! launches queued before the drop.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use gpushare_protocol::{ErrorCode, GraphId, StreamId};

use super::SessionState;
use crate::device::{Call, Function, Graph};

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
    /// The functions its kernels run, held while it lives.
    pub functions: Vec<Arc<Function>>,
    /// What its copies and memsets touch: checked at each launch, as the same commands sent
    /// one by one would be.
    pub touches: Vec<Touch>,
    /// Its kernel nodes, and the most thread blocks one of them launches.
    pub kernels: u64,
    pub blocks: u32,
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
        for t in &g.touches {
            if t.write {
                self.check_write(t.ptr, t.len)?;
            } else {
                self.check_device(t.ptr, t.len)?;
            }
        }
        if !self.streams.contains_key(&stream) {
            return Err(ErrorCode::InvalidHandle);
        }
        let client = self.info.id;
        let key = GRAPH_KEY | u64::from(id);
        let turn = self.acquire(|d| d.module_profile(client, key, g.blocks));
        let sm_limit = turn.and_then(|t| t.sm_limit);
        let start = turn.and_then(|_| self.start_granted(stream));
        let r = self.on_stream(stream, |d, s| {
            let graph = d.id(&g.graph)?;
            d.queue(
                s,
                |stream| Call::LimitSms {
                    stream,
                    sms: sm_limit,
                },
                &[],
            )?;
            let launch = |stream| Call::LaunchGraph {
                stream,
                graph,
                start: None,
            };
            d.queue(s, launch, &[])
        });
        if let Some(turn) = turn {
            self.track_granted(stream, turn.request, start, r.is_ok());
        }
        let r = r?;
        self.info
            .counters
            .kernels
            .fetch_add(g.kernels, Ordering::Relaxed);
        Ok(r)
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

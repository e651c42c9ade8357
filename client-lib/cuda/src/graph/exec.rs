//! An instantiated graph: its nodes in an order their dependencies allow, made a graph in
//! gpushared (`MakeGraph`) and launched by one ring command, or replayed node by node when a
//! node cannot go into gpushared's graph. A node's parameters changed after instantiation
//! (`cuGraphExec*SetParams`, `cuGraphExecUpdate`) make a new graph in gpushared at the next
//! launch; the old one is dropped behind the launches already queued.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::os::fd::AsRawFd;

use gpushare_protocol::control::{BrokerMessage, ClientMessage};
use gpushare_protocol::graph::{GraphChange, GraphNode, GraphOp, encode_changes, encode_graph};
use gpushare_protocol::{Command, GraphId};

use super::{Exec, Node, Op, lock};
use crate::driver::Driver;
use crate::status::{Cu, from_code, from_error};
use crate::types::{CUgraphExec, result};

/// Set to `replay` to replay every graph node by node (for comparison).
const GRAPHS_ENV: &str = "GPUSHARE_GRAPHS";

pub(super) struct ExecState {
    pub(super) nodes: Vec<Node>,
    /// Node handle → index in `nodes`.
    pub(super) index: HashMap<usize, u32>,
    /// An order of `nodes` their dependencies allow.
    order: Vec<u32>,
    /// The graph gpushared made of them.
    broker: Option<GraphId>,
    /// Whether the nodes changed since `broker` was made.
    pub(super) dirty: bool,
    /// Nodes turned off (`cuGraphNodeSetEnabled`): they do nothing.
    disabled: HashSet<u32>,
    /// Each node's index in `broker`'s graph (none for nodes that do nothing).
    wire_of: Vec<Option<u32>>,
    /// Nodes given new parameters since `broker` was made or last updated.
    pending: Vec<GraphChange>,
    /// Child graphs copied in: end node handle → (first index, count).
    pub(super) children: HashMap<usize, (u32, u32)>,
}

impl ExecState {
    pub(super) fn set_enabled(&mut self, node: usize, on: bool) -> Cu<()> {
        let &i = self.index.get(&node).ok_or(result::INVALID_VALUE)?;
        let changed = if on {
            self.disabled.remove(&i)
        } else {
            self.disabled.insert(i)
        };
        self.dirty |= changed;
        Ok(())
    }

    pub(super) fn enabled(&self, node: usize) -> Cu<bool> {
        let i = self.index.get(&node).ok_or(result::INVALID_VALUE)?;
        Ok(!self.disabled.contains(i))
    }

    /// What node `i` does now; `None` for nothing.
    fn op(&self, i: u32) -> Option<&Op> {
        match &self.nodes[i as usize].op {
            _ if self.disabled.contains(&i) => None,
            Op::Empty => None,
            op => Some(op),
        }
    }

    /// Node `i` does `op` from now on (of the kind it was): a change for gpushare's graph,
    /// or, where the graph's shape changes, a new graph at the next launch.
    pub(super) fn change(&mut self, i: u32, op: Op) {
        self.nodes[i as usize].op = op;
        if self.dirty || self.broker.is_none() {
            self.dirty = true;
            return;
        }
        let at = self.wire_of.get(i as usize).copied().flatten();
        match (at, self.op(i).and_then(wire_op)) {
            (Some(node), Some(op)) => {
                self.pending.retain(|c| c.node != node);
                self.pending.push(GraphChange { node, op });
            }
            _ => self.dirty = true,
        }
    }
}

/// An order of `nodes` in which each comes after the nodes it depends on, earlier nodes
/// first where the dependencies allow (so a capture's order is kept); `INVALID_VALUE` for a
/// cycle or a dependency on no node.
pub(super) fn order(nodes: &[Node]) -> Cu<Vec<u32>> {
    let n = nodes.len();
    let mut waiting = vec![0usize; n];
    let mut dependents: Vec<Vec<u32>> = vec![Vec::new(); n];
    for (i, node) in nodes.iter().enumerate() {
        for &d in &node.deps {
            if d as usize >= n {
                return Err(result::INVALID_VALUE);
            }
            waiting[i] += 1;
            dependents[d as usize].push(i as u32);
        }
    }
    let mut ready: std::collections::BinaryHeap<std::cmp::Reverse<u32>> = (0..n as u32)
        .filter(|&i| waiting[i as usize] == 0)
        .map(std::cmp::Reverse)
        .collect();
    let mut out = Vec::with_capacity(n);
    while let Some(std::cmp::Reverse(i)) = ready.pop() {
        out.push(i);
        for &j in &dependents[i as usize] {
            waiting[j as usize] -= 1;
            if waiting[j as usize] == 0 {
                ready.push(std::cmp::Reverse(j));
            }
        }
    }
    if out.len() == n {
        Ok(out)
    } else {
        Err(result::INVALID_VALUE)
    }
}

/// What an op is in gpushared's graph; `None` for one that cannot go there (a copy with
/// page-locked host memory).
fn wire_op(op: &Op) -> Option<GraphOp> {
    Some(match op {
        Op::Launch {
            function,
            shape,
            params,
        } => GraphOp::Kernel {
            function: *function,
            grid: shape.grid,
            block: shape.block,
            shared_mem_bytes: shape.shared_mem_bytes,
            attributes: shape.attributes,
            params: params.clone(),
        },
        Op::Command(Command::CopyDtoD { src, dst, len, .. }) => GraphOp::Copy {
            src: *src,
            dst: *dst,
            len: *len,
        },
        Op::Command(Command::Memset {
            dst, value, len, ..
        }) => GraphOp::Memset {
            dst: *dst,
            value: u32::from(*value),
            elem_bytes: 1,
            count: *len,
        },
        Op::Command(Command::MemsetWide {
            dst,
            value,
            elem_bytes,
            count,
            ..
        }) => GraphOp::Memset {
            dst: *dst,
            value: *value,
            elem_bytes: *elem_bytes,
            count: *count,
        },
        Op::Command(_) | Op::Empty | Op::Host { .. } => return None,
    })
}

/// The nodes as gpushared takes them, in `order`, nodes that do nothing (`op_of` says `None`:
/// empty or turned off) left out (what depended on one depends on what it depended on), and
/// where each node went; `None` when a node cannot go into gpushared's graph.
fn to_wire<'a>(
    nodes: &[Node],
    order: &[u32],
    op_of: impl Fn(u32) -> Option<&'a Op>,
) -> Option<(Vec<GraphNode>, Vec<Option<u32>>)> {
    let mut wire_of = vec![None; nodes.len()];
    // For each node: the wire nodes that stand for it, for the nodes that depend on it.
    let mut stands: Vec<Vec<u32>> = vec![Vec::new(); nodes.len()];
    let mut out: Vec<GraphNode> = Vec::with_capacity(nodes.len());
    for &i in order {
        let node = &nodes[i as usize];
        let mut deps: Vec<u32> = Vec::new();
        for &d in &node.deps {
            for &w in &stands[d as usize] {
                if !deps.contains(&w) {
                    deps.push(w);
                }
            }
        }
        let Some(op) = op_of(i) else {
            // Nothing to do: what depends on it depends on what it depended on.
            stands[i as usize] = deps;
            continue;
        };
        let op = wire_op(op)?;
        wire_of[i as usize] = Some(out.len() as u32);
        stands[i as usize] = vec![out.len() as u32];
        out.push(GraphNode { deps, op });
    }
    Some((out, wire_of))
}

fn replay_only() -> bool {
    std::env::var(GRAPHS_ENV).is_ok_and(|v| v == "replay")
}

impl Driver {
    /// Instantiates a graph of `nodes`.
    pub(super) fn instantiate_nodes(
        &self,
        nodes: Vec<Node>,
        children: HashMap<usize, (u32, u32)>,
    ) -> Cu<ExecState> {
        let order = order(&nodes)?;
        let index = nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.handle, i as u32))
            .collect();
        let mut state = ExecState {
            nodes,
            index,
            order,
            broker: None,
            dirty: true,
            disabled: HashSet::new(),
            wire_of: Vec::new(),
            pending: Vec::new(),
            children,
        };
        self.make_in_broker(&mut state)?;
        Ok(state)
    }

    /// Makes the graph in gpushared from the nodes as they are now (nothing, for a graph
    /// that is replayed); a graph made before is dropped behind its launches.
    fn make_in_broker(&self, st: &mut ExecState) -> Cu<()> {
        let (made, wire_of) = match to_wire(&st.nodes, &st.order, |i| st.op(i)) {
            Some((wire, wire_of)) if !replay_only() => (Some(self.make_graph(&wire)?), wire_of),
            _ => (None, Vec::new()),
        };
        if let Some(old) = std::mem::replace(&mut st.broker, made) {
            self.transport.post(Command::DropGraph { graph: old })?;
        }
        st.wire_of = wire_of;
        st.pending.clear();
        st.dirty = false;
        Ok(())
    }

    fn make_graph(&self, nodes: &[GraphNode]) -> Cu<GraphId> {
        let bytes = encode_graph(nodes).map_err(|_| result::INVALID_VALUE)?;
        let fd =
            nix::sys::memfd::memfd_create("gpushare-graph", nix::sys::memfd::MFdFlags::MFD_CLOEXEC)
                .map_err(|_| result::OUT_OF_MEMORY)?;
        let mut file = std::fs::File::from(fd);
        file.write_all(&bytes).map_err(|_| result::OUT_OF_MEMORY)?;
        let reply = self
            .transport
            .session
            .request(
                |request| ClientMessage::MakeGraph {
                    request,
                    bytes: bytes.len() as u64,
                },
                &[file.as_raw_fd()],
            )
            .map_err(|e| from_error(&e))?;
        match reply {
            BrokerMessage::GraphMade { result: Ok(id), .. } => Ok(id),
            BrokerMessage::GraphMade { result: Err(w), .. } => {
                crate::log::say(&format!(
                    "gpushare: gpushared could not make the CUDA graph: {}",
                    w.message
                ));
                Err(from_code(w.code))
            }
            _ => Err(result::UNKNOWN),
        }
    }

    /// Sends the nodes' new parameters to gpushare's graph (launches queued before keep the
    /// old ones); changes too large for the arena make a new graph instead.
    fn send_changes(&self, st: &mut ExecState, graph: GraphId) -> Cu<()> {
        let bytes = encode_changes(&st.pending).map_err(|_| result::INVALID_VALUE)?;
        if bytes.len() > self.transport.piece() {
            return self.make_in_broker(st);
        }
        self.transport
            .send_with_payload(
                bytes.len(),
                false,
                // SAFETY: the payload has room for `bytes`.
                |p| unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), p.ptr, bytes.len()) },
                |offset| Command::UpdateGraph {
                    graph,
                    params_offset: offset,
                    params_len: bytes.len() as u32,
                },
                |_| (),
            )
            .map(drop)?;
        st.pending.clear();
        Ok(())
    }

    /// Launches the instantiated graph on `stream`.
    pub(super) fn launch_exec(&self, st: &mut ExecState, stream: u32) -> Cu<()> {
        if st.dirty {
            self.make_in_broker(st)?;
        } else if let (Some(graph), false) = (st.broker, st.pending.is_empty()) {
            self.send_changes(st, graph)?;
        }
        match st.broker {
            Some(graph) => self.transport.post(Command::LaunchGraph { stream, graph }),
            None => self.replay(st.order.iter().filter_map(|&i| st.op(i)), stream),
        }
    }

    /// Lets go of what gpushared holds for it.
    pub(super) fn destroy_exec(&self, st: &mut ExecState) -> Cu<()> {
        match st.broker.take() {
            Some(graph) => self.transport.post(Command::DropGraph { graph }),
            None => Ok(()),
        }
    }
}

/// Runs `f` on a live instantiated graph's state.
pub(super) fn with_exec<T>(
    d: &Driver,
    exec: CUgraphExec,
    f: impl FnOnce(&mut ExecState) -> Cu<T>,
) -> Cu<T> {
    let execs = lock(&d.graphs.execs);
    if !execs.contains(&(exec as usize)) {
        return Err(result::INVALID_VALUE);
    }
    // SAFETY: a live exec handle; destroying one removes it from the set first, under the
    // lock held until its state is locked here.
    let e = unsafe { &*(exec as *const Exec) };
    let mut st = lock(&e.state);
    drop(execs);
    f(&mut st)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(op: Op, deps: Vec<u32>) -> Node {
        Node {
            op,
            deps,
            handle: 0,
        }
    }

    fn memset(value: u8) -> Op {
        Op::Command(Command::Memset {
            stream: 0,
            dst: 0x1000,
            value,
            len: 16,
        })
    }

    #[test]
    fn nodes_come_after_what_they_depend_on_and_otherwise_in_their_order() {
        let nodes = vec![
            node(memset(0), vec![2]),
            node(memset(1), vec![]),
            node(memset(2), vec![1]),
            node(memset(3), vec![]),
        ];
        assert_eq!(order(&nodes), Ok(vec![1, 2, 0, 3]));
        let cycle = vec![node(memset(0), vec![1]), node(memset(1), vec![0])];
        assert_eq!(order(&cycle), Err(result::INVALID_VALUE));
        assert_eq!(
            order(&[node(memset(0), vec![5])]),
            Err(result::INVALID_VALUE)
        );
    }

    #[test]
    fn empty_nodes_pass_their_dependencies_on() {
        // 0 → empty(1) → 2, and 3 depends on 0 and the empty node.
        let nodes = vec![
            node(memset(0), vec![]),
            node(Op::Empty, vec![0]),
            node(memset(2), vec![1]),
            node(memset(3), vec![0, 1]),
        ];
        let order = order(&nodes).expect("order");
        let op_of = |i: u32| Some(&nodes[i as usize].op).filter(|op| !matches!(op, Op::Empty));
        let (wire, wire_of) = to_wire(&nodes, &order, op_of).expect("all wire nodes");
        assert_eq!(wire_of, [Some(0), None, Some(1), Some(2)]);
        let deps: Vec<Vec<u32>> = wire.iter().map(|n| n.deps.clone()).collect();
        assert_eq!(deps, [vec![], vec![0], vec![0]]);
    }

    #[test]
    fn a_copy_with_host_memory_makes_the_graph_a_replayed_one() {
        let host = Op::Command(Command::CopyHtoDHost {
            stream: 0,
            region: 1,
            offset: 0,
            dst: 0x1000,
            len: 16,
        });
        let nodes = vec![node(memset(0), vec![]), node(host, vec![0])];
        assert!(to_wire(&nodes, &[0, 1], |i| Some(&nodes[i as usize].op)).is_none());
    }
}

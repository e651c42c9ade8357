//! An instantiated graph: its nodes in an order their dependencies allow, made a graph in
//! gpushared (`MakeGraph`) and launched by one ring command, or replayed node by node when a
//! node cannot go into gpushared's graph. A node's parameters changed after instantiation
//! (`cuGraphExec*SetParams`, `cuGraphExecUpdate`) make a new graph in gpushared at the next
//! launch; the old one is dropped behind the launches already queued.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::os::fd::AsRawFd;

use gpushare_protocol::control::{BrokerMessage, ClientMessage};
use gpushare_protocol::graph::{GraphNode, GraphOp, encode_graph};
use gpushare_protocol::{Command, GraphId};

use super::{Node, Op};
use crate::driver::Driver;
use crate::status::{Cu, from_code, from_error};
use crate::types::result;

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

    /// What node `i` does now.
    fn op(&self, i: u32) -> &Op {
        if self.disabled.contains(&i) {
            &Op::Empty
        } else {
            &self.nodes[i as usize].op
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

/// The nodes as gpushared takes them, in `order`, empty nodes left out (what depended on one
/// depends on what it depended on); `None` when a node cannot go into gpushared's graph.
fn to_wire<'a>(
    nodes: &[Node],
    order: &[u32],
    op_of: impl Fn(u32) -> &'a Op,
) -> Option<Vec<GraphNode>> {
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
        let op = match op_of(i) {
            Op::Empty => {
                stands[i as usize] = deps;
                continue;
            }
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
            Op::Command(_) => return None,
        };
        stands[i as usize] = vec![out.len() as u32];
        out.push(GraphNode { deps, op });
    }
    Some(out)
}

fn replay_only() -> bool {
    std::env::var(GRAPHS_ENV).is_ok_and(|v| v == "replay")
}

impl Driver {
    /// Instantiates a graph of `nodes`.
    pub(super) fn instantiate_nodes(&self, nodes: Vec<Node>) -> Cu<ExecState> {
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
        };
        self.make_in_broker(&mut state)?;
        Ok(state)
    }

    /// Makes the graph in gpushared from the nodes as they are now (nothing, for a graph
    /// that is replayed); a graph made before is dropped behind its launches.
    fn make_in_broker(&self, st: &mut ExecState) -> Cu<()> {
        let made = match to_wire(&st.nodes, &st.order, |i| st.op(i)) {
            Some(wire) if !replay_only() => Some(self.make_graph(&wire)?),
            _ => None,
        };
        if let Some(old) = std::mem::replace(&mut st.broker, made) {
            self.transport.post(Command::DropGraph { graph: old })?;
        }
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

    /// Launches the instantiated graph on `stream`.
    pub(super) fn launch_exec(&self, st: &mut ExecState, stream: u32) -> Cu<()> {
        if st.dirty {
            self.make_in_broker(st)?;
        }
        match st.broker {
            Some(graph) => self.transport.post(Command::LaunchGraph { stream, graph }),
            None => self.replay(st.order.iter().map(|&i| st.op(i)), stream),
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
        let wire = to_wire(&nodes, &order, |i| &nodes[i as usize].op).expect("all wire nodes");
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
        assert!(to_wire(&nodes, &[0, 1], |i| &nodes[i as usize].op).is_none());
    }
}

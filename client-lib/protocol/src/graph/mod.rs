//! A CUDA graph as a consolidated client hands it to gpushared, to be made a real graph in the
//! context that runs the client's work: its nodes in an order their dependencies allow (each
//! depends only on nodes before it), encoded (`wire`) and passed as a sealed file
//! (`ClientMessage::MakeGraph`), since a graph may be larger than a control message.
//!
//! The same nodes travel on to the device worker, with each kernel's `function` then the
//! worker's function handle rather than the session's.

use crate::DevicePtr;
use crate::command::LaunchAttributes;

mod wire;

/// Most nodes one graph may hold.
pub const MAX_GRAPH_NODES: usize = 1 << 16;
/// Largest encoded graph.
pub const MAX_GRAPH_BYTES: u64 = 64 << 20;

/// One node and the nodes (by index, all earlier) it depends on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GraphNode {
    pub deps: Vec<u32>,
    pub op: GraphOp,
}

/// What a node does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GraphOp {
    /// A module function launch; `params` is the packed parameter block, as a
    /// `LaunchModule` carries it.
    Kernel {
        function: u64,
        grid: [u32; 3],
        block: [u32; 3],
        shared_mem_bytes: u32,
        attributes: LaunchAttributes,
        params: Vec<u8>,
    },
    /// Device to device.
    Copy {
        src: DevicePtr,
        dst: DevicePtr,
        len: u64,
    },
    /// `count` elements of `elem_bytes` (1, 2 or 4) set to `value`.
    Memset {
        dst: DevicePtr,
        value: u32,
        elem_bytes: u8,
        count: u64,
    },
}

/// A node of an instantiated graph given new parameters (`cuGraphExec*SetParams`): its index
/// in the graph as made, and what it does now (of the same kind).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GraphChange {
    pub node: u32,
    pub op: GraphOp,
}

/// Why an encoded graph was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GraphError {
    #[error("the graph cannot be read: {0}")]
    Decode(String),
    #[error("the graph has {0} nodes; at most {MAX_GRAPH_NODES} are allowed")]
    TooMany(usize),
    #[error("node {node} depends on node {dep}, which does not come before it")]
    Order { node: usize, dep: u32 },
}

/// The nodes, encoded.
pub fn encode_graph(nodes: &[GraphNode]) -> Result<Vec<u8>, GraphError> {
    wire::put_nodes(nodes)
}

/// Encoded nodes, checked: not too many, each depending only on nodes before it.
pub fn decode_graph(bytes: &[u8]) -> Result<Vec<GraphNode>, GraphError> {
    let nodes = wire::take_nodes(bytes)?;
    for (i, n) in nodes.iter().enumerate() {
        if let Some(&dep) = n.deps.iter().find(|&&d| d as usize >= i) {
            return Err(GraphError::Order { node: i, dep });
        }
    }
    Ok(nodes)
}

/// Changes, encoded (`Command::UpdateGraph`'s payload).
pub fn encode_changes(changes: &[GraphChange]) -> Result<Vec<u8>, GraphError> {
    wire::put_changes(changes)
}

/// Encoded changes, checked: not too many.
pub fn decode_changes(bytes: &[u8]) -> Result<Vec<GraphChange>, GraphError> {
    wire::take_changes(bytes)
}

impl GraphOp {
    /// Whether `other` is a node of the same kind (what an update may change into).
    pub fn same_kind(&self, other: &GraphOp) -> bool {
        std::mem::discriminant(self) == std::mem::discriminant(other)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn copy(deps: Vec<u32>) -> GraphNode {
        GraphNode {
            deps,
            op: GraphOp::Copy {
                src: 0x1000,
                dst: 0x2000,
                len: 64,
            },
        }
    }

    #[test]
    fn a_graph_comes_back_as_it_was_sent() {
        let nodes = vec![
            copy(vec![]),
            GraphNode {
                deps: vec![0],
                op: GraphOp::Kernel {
                    function: 7,
                    grid: [2, 1, 1],
                    block: [128, 1, 1],
                    shared_mem_bytes: 0,
                    attributes: LaunchAttributes::default(),
                    params: vec![1, 2, 3, 4],
                },
            },
            GraphNode {
                deps: vec![0, 1],
                op: GraphOp::Memset {
                    dst: 0x2000,
                    value: 9,
                    elem_bytes: 4,
                    count: 16,
                },
            },
        ];
        let bytes = encode_graph(&nodes).expect("encodes");
        assert_eq!(decode_graph(&bytes), Ok(nodes));
    }

    #[test]
    fn changes_come_back_as_they_were_sent() {
        let changes = vec![GraphChange {
            node: 3,
            op: copy(vec![]).op,
        }];
        let bytes = encode_changes(&changes).expect("encodes");
        assert_eq!(decode_changes(&bytes), Ok(changes));
        assert!(matches!(
            decode_changes(b"\xff"),
            Err(GraphError::Decode(_))
        ));
    }

    #[test]
    fn any_bytes_decode_to_a_graph_or_an_error_never_a_panic() {
        // A valid graph with each byte in turn changed, cut short, and bytes of a fixed
        // generator: what a hostile client's file may hold.
        let valid = encode_graph(&[
            copy(vec![]),
            GraphNode {
                deps: vec![0],
                op: GraphOp::Memset {
                    dst: 1,
                    value: 2,
                    elem_bytes: 4,
                    count: 3,
                },
            },
        ])
        .expect("encodes");
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for i in 0..valid.len() {
            for flip in [0x01u8, 0x80, 0xff] {
                let mut b = valid.clone();
                b[i] ^= flip;
                let _ = decode_graph(&b);
                let _ = decode_changes(&b);
            }
            let _ = decode_graph(&valid[..i]);
        }
        for _ in 0..2000 {
            let len = (next() % 64) as usize;
            let b: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            let _ = decode_graph(&b);
            let _ = decode_changes(&b);
        }
    }

    /// Counts a hostile file makes up are refused before anything is allocated for them, and
    /// so are bytes past the last item and kinds of node that do not exist.
    #[test]
    fn made_up_counts_trailing_bytes_and_unknown_kinds_are_refused() {
        let huge = u32::MAX.to_le_bytes();
        assert!(decode_graph(&huge).is_err());
        assert!(decode_changes(&huge).is_err());
        // One node claiming u32::MAX dependencies.
        let mut deps = 1u32.to_le_bytes().to_vec();
        deps.extend_from_slice(&huge);
        assert!(matches!(decode_graph(&deps), Err(GraphError::Decode(_))));
        // One kernel change claiming more parameter bytes than follow.
        let mut kernel = encode_changes(&[GraphChange {
            node: 0,
            op: GraphOp::Kernel {
                function: 1,
                grid: [1; 3],
                block: [1; 3],
                shared_mem_bytes: 0,
                attributes: LaunchAttributes::default(),
                params: vec![9; 8],
            },
        }])
        .expect("encodes");
        let at = kernel.len() - 8 - 4;
        kernel[at..at + 4].copy_from_slice(&9u32.to_le_bytes());
        assert!(matches!(
            decode_changes(&kernel),
            Err(GraphError::Decode(_))
        ));
        let mut trailing = encode_graph(&[copy(vec![])]).expect("encodes");
        trailing.push(0);
        assert!(matches!(
            decode_graph(&trailing),
            Err(GraphError::Decode(_))
        ));
        let mut unknown = encode_graph(&[copy(vec![])]).expect("encodes");
        unknown[8] = 7;
        assert!(matches!(decode_graph(&unknown), Err(GraphError::Decode(_))));
    }

    #[test]
    fn a_node_may_depend_only_on_nodes_before_it() {
        for deps in [vec![1], vec![0, 2]] {
            let bytes = encode_graph(&[copy(vec![]), copy(deps)]).expect("encodes");
            assert!(matches!(
                decode_graph(&bytes),
                Err(GraphError::Order { node: 1, .. })
            ));
        }
        assert!(matches!(
            decode_graph(b"\xff\xff\xff"),
            Err(GraphError::Decode(_))
        ));
    }
}

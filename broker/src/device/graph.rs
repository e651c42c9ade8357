//! CUDA graphs the broker makes for consolidated clients: the nodes a backend builds a graph
//! of, with each kernel's function looked up, and the sim's way of running one (each node in
//! turn, on the launch stream; the order they come in is one their dependencies allow).

use std::sync::Arc;

use gpushare_protocol::DevicePtr;
use gpushare_protocol::command::{LaunchAttributes, ModuleLaunch};
use gpushare_protocol::graph::{GraphNode, GraphOp};

use super::backend::Backend;
use super::{DeviceError, DeviceResult};

/// One node, its function looked up.
pub enum Step<F> {
    Kernel {
        function: Arc<F>,
        launch: ModuleLaunch,
        attributes: LaunchAttributes,
        params: Vec<u8>,
    },
    Copy {
        src: DevicePtr,
        dst: DevicePtr,
        len: u64,
    },
    Memset {
        dst: DevicePtr,
        value: u32,
        elem_bytes: u8,
        count: u64,
    },
}

// By hand: a derive would ask `F: Clone`, where only the `Arc` is cloned.
impl<F> Clone for Step<F> {
    fn clone(&self) -> Step<F> {
        match self {
            Step::Kernel {
                function,
                launch,
                attributes,
                params,
            } => Step::Kernel {
                function: function.clone(),
                launch: *launch,
                attributes: *attributes,
                params: params.clone(),
            },
            Step::Copy { src, dst, len } => Step::Copy {
                src: *src,
                dst: *dst,
                len: *len,
            },
            Step::Memset {
                dst,
                value,
                elem_bytes,
                count,
            } => Step::Memset {
                dst: *dst,
                value: *value,
                elem_bytes: *elem_bytes,
                count: *count,
            },
        }
    }
}

/// A node: what it does, and the earlier nodes it waits for.
pub struct Node<F> {
    pub deps: Vec<u32>,
    pub step: Step<F>,
}

/// The nodes of a graph as the broker sent them, each kernel's function (a worker handle)
/// looked up by `function`.
pub fn resolve<F>(
    nodes: Vec<GraphNode>,
    function: impl Fn(u64) -> DeviceResult<Arc<F>>,
) -> DeviceResult<Vec<Node<F>>> {
    nodes
        .into_iter()
        .map(|n| {
            Ok(Node {
                deps: n.deps,
                step: resolve_op(n.op, &function)?,
            })
        })
        .collect()
}

/// One node's op, its function looked up.
pub fn resolve_op<F>(
    op: GraphOp,
    function: impl Fn(u64) -> DeviceResult<Arc<F>>,
) -> DeviceResult<Step<F>> {
    Ok(match op {
        GraphOp::Kernel {
            function: f,
            grid,
            block,
            shared_mem_bytes,
            attributes,
            params,
        } => Step::Kernel {
            function: function(f)?,
            launch: ModuleLaunch {
                function: f,
                grid,
                block,
                shared_mem_bytes,
                params_offset: 0,
                params_len: u32::try_from(params.len()).map_err(|_| {
                    DeviceError::InvalidArgument("a kernel node's parameters".into())
                })?,
            },
            attributes,
            params,
        },
        GraphOp::Copy { src, dst, len } => Step::Copy { src, dst, len },
        GraphOp::Memset {
            dst,
            value,
            elem_bytes,
            count,
        } => Step::Memset {
            dst,
            value,
            elem_bytes,
            count,
        },
    })
}

/// Queues each node on `stream` in turn: a graph run without a graph of the device's own.
pub fn run_in_order<B: Backend>(
    dev: &B,
    stream: &mut B::Stream,
    nodes: &[Node<B::Function>],
) -> DeviceResult<()> {
    for n in nodes {
        match &n.step {
            Step::Kernel {
                function,
                launch,
                attributes,
                params,
            } => dev.launch_module(stream, function, launch, attributes, params)?,
            Step::Copy { src, dst, len } => dev.copy_dtod(stream, *src, *dst, *len)?,
            Step::Memset {
                dst,
                value,
                elem_bytes: 1,
                count,
            } => dev.memset(stream, *dst, *value as u8, *count)?,
            Step::Memset {
                dst,
                value,
                elem_bytes,
                count,
            } => dev.memset_wide(stream, *dst, *value, *elem_bytes, *count)?,
        }
    }
    Ok(())
}

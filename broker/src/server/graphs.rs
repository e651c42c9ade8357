//! `MakeGraph`: a consolidated client's CUDA graph read from the file it sent, each kernel's
//! function looked up in the session's table and checked as a launch of it would be, then
//! made and instantiated on the device and added to the session's graphs.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex};

use gpushare_protocol::command::{MAX_LAUNCH_PARAMS, shape_is_valid};
use gpushare_protocol::error::WireError;
use gpushare_protocol::graph::{GraphOp, MAX_GRAPH_BYTES, decode_graph, encode_graph};
use gpushare_protocol::{ErrorCode, GraphId};

use super::Broker;
use super::control::SessionScope;
use super::driver::told;
use crate::device::Device;
use crate::session::ModuleTable;
use crate::session::graphs::{SessionGraph, Touch};

fn bad(message: impl Into<String>) -> WireError {
    WireError::new(ErrorCode::InvalidArgument, message)
}

impl Broker {
    pub(super) async fn make_graph(
        (modules, device): SessionScope<'_>,
        fds: Vec<OwnedFd>,
        bytes: u64,
    ) -> Result<GraphId, WireError> {
        let fd = fds
            .into_iter()
            .next()
            .ok_or_else(|| bad("MakeGraph must carry the graph as a file descriptor"))?;
        if bytes > MAX_GRAPH_BYTES {
            return Err(bad(format!(
                "a graph of {bytes} bytes exceeds the {MAX_GRAPH_BYTES}-byte limit"
            )));
        }
        let (modules, device) = (modules.clone(), device.clone());
        tokio::task::spawn_blocking(move || make(&modules, &device, fd, bytes))
            .await
            .map_err(|e| WireError::new(ErrorCode::Internal, e.to_string()))?
    }
}

fn make(
    modules: &Mutex<ModuleTable>,
    device: &Device,
    fd: OwnedFd,
    bytes: u64,
) -> Result<GraphId, WireError> {
    let file = File::from(fd);
    let size = file.metadata().map(|m| m.len()).unwrap_or(0);
    if size < bytes {
        return Err(bad(format!(
            "the graph's file has {size} bytes, not the {bytes} announced"
        )));
    }
    let mut encoded = vec![0u8; bytes as usize];
    // By position: the client's file offset is not ours to trust.
    file.read_exact_at(&mut encoded, 0)
        .map_err(|e| bad(format!("cannot read the graph: {e}")))?;
    let mut nodes = decode_graph(&encoded).map_err(|e| bad(e.to_string()))?;
    let table = || {
        modules
            .lock()
            .map_err(|_| WireError::new(ErrorCode::Internal, "module table poisoned"))
    };
    let mut functions = Vec::new();
    let mut touches = Vec::new();
    let mut blocks = 0u32;
    for (i, node) in nodes.iter_mut().enumerate() {
        match &mut node.op {
            GraphOp::Kernel {
                function,
                grid,
                block,
                params,
                ..
            } => {
                let f = table()?.function(*function).ok_or_else(|| {
                    WireError::new(
                        ErrorCode::InvalidHandle,
                        format!("graph node {i}: no function {function}"),
                    )
                })?;
                if !shape_is_valid(*grid, *block) {
                    return Err(bad(format!(
                        "graph node {i}: a launch of {grid:?} blocks of {block:?} threads"
                    )));
                }
                if params.len() > MAX_LAUNCH_PARAMS as usize {
                    return Err(bad(format!(
                        "graph node {i}: {} bytes of parameters, at most {MAX_LAUNCH_PARAMS}",
                        params.len()
                    )));
                }
                blocks = blocks.max(grid.iter().fold(1u32, |a, &g| a.saturating_mul(g)));
                *function = device.id(&*f).map_err(told)?;
                functions.push(f);
            }
            GraphOp::Copy { src, dst, len } => {
                touches.push(Touch {
                    ptr: *src,
                    len: *len,
                    write: false,
                });
                touches.push(Touch {
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
            } => {
                if ![1, 2, 4].contains(elem_bytes) {
                    return Err(bad(format!(
                        "graph node {i}: memset elements of {elem_bytes} bytes"
                    )));
                }
                let len = count
                    .checked_mul(u64::from(*elem_bytes))
                    .ok_or_else(|| bad(format!("graph node {i}: memset too large")))?;
                touches.push(Touch {
                    ptr: *dst,
                    len,
                    write: true,
                });
            }
        }
    }
    let kernels = functions.len() as u64;
    let encoded = encode_graph(&nodes).map_err(|e| bad(e.to_string()))?;
    let graph = device.make_graph(Arc::from(encoded)).map_err(told)?;
    table()?
        .graphs
        .insert(SessionGraph {
            graph,
            functions,
            touches,
            kernels,
            blocks,
        })
        .map_err(|c| WireError::new(c, "too many graphs"))
}

//! `MakeGraph`: a consolidated client's CUDA graph read from the file it sent, its nodes
//! checked (`GraphParts::check`: each kernel's function looked up in the session's table and
//! checked as a launch of it would be), then made and instantiated on the device and added
//! to the session's graphs.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex};

use gpushare_protocol::error::WireError;
use gpushare_protocol::graph::{MAX_GRAPH_BYTES, decode_graph, encode_graph};
use gpushare_protocol::{ErrorCode, GraphId};

use super::Broker;
use super::control::SessionScope;
use super::driver::told;
use crate::device::Device;
use crate::session::ModuleTable;
use crate::session::graphs::{GraphParts, SessionGraph};

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
    let nodes = decode_graph(&encoded).map_err(|e| bad(e.to_string()))?;
    let parts = {
        let table = modules
            .lock()
            .map_err(|_| WireError::new(ErrorCode::Internal, "module table poisoned"))?;
        GraphParts::check(nodes, &table, device).map_err(|(code, why)| WireError::new(code, why))?
    };
    let encoded = encode_graph(&parts.nodes).map_err(|e| bad(e.to_string()))?;
    let graph = device.make_graph(Arc::from(encoded)).map_err(told)?;
    modules
        .lock()
        .map_err(|_| WireError::new(ErrorCode::Internal, "module table poisoned"))?
        .graphs
        .insert(SessionGraph {
            graph,
            parts: Mutex::new(parts),
        })
        .map_err(|c| WireError::new(c, "too many graphs"))
}

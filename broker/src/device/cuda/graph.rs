//! Real CUDA graphs for clients' graphs: built by capturing each node on a private stream, so
//! that a node goes to the device exactly as the same work queued on a stream would (launch
//! attributes, programmatic launches); each node's dependencies are set on the capture before
//! it, and the node the capture then made is read back for the nodes after it.
//!
//! A graph's kernels run in the context they were captured in, whatever stream launches the
//! graph: launched on an SM partition's stream (a green context's), they would still spread
//! over every SM (seen on the H200). So a graph launched while its client is kept to a
//! partition has its nodes queued one by one on the partition's stream instead, in their
//! order (one their dependencies allow), as the sim runs every graph.

use std::ptr;
use std::sync::{Arc, Mutex};

use cudarc::driver::result as cu;
use cudarc::driver::sys;

use super::copy;
use super::error::check;
use super::module::{CudaFunction, with_packed};
use super::{CudaDevice, CudaStream};
use crate::device::graph::{Node, Step};
use crate::device::{DeviceError, DeviceResult};

/// An instantiated graph; it keeps the functions its kernels run.
pub struct CudaGraph {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
    /// The graph's nodes, in the order of the nodes it was made of.
    nodes: Vec<sys::CUgraphNode>,
    /// What each node does now (updates included): queued one by one on an SM partition.
    steps: Mutex<Vec<Step<CudaFunction>>>,
    functions: Mutex<Vec<Arc<CudaFunction>>>,
}

// SAFETY: graph handles are not tied to a thread; launches are serialized by the stream's
// owner, and the handles are destroyed once, on drop.
unsafe impl Send for CudaGraph {}
// SAFETY: as above; launching one executable graph from several streams is allowed.
unsafe impl Sync for CudaGraph {}

impl Drop for CudaGraph {
    fn drop(&mut self) {
        // SAFETY: made by `make`, destroyed only here. A launch still running finishes first
        // (the driver frees an executable graph in flight when it completes).
        unsafe {
            let _ = sys::cuGraphExecDestroy(self.exec);
            let _ = sys::cuGraphDestroy(self.graph);
        }
    }
}

/// Makes and instantiates the graph of `nodes`.
pub(super) fn make(dev: &CudaDevice, nodes: Vec<Node<CudaFunction>>) -> DeviceResult<CudaGraph> {
    dev.bind()?;
    let stream = cu::stream::create(cu::stream::StreamKind::NonBlocking)
        .map_err(|e| super::error::driver("cuStreamCreate", e))?;
    let captured = capture(stream, &nodes);
    // SAFETY: made above; nothing else uses it.
    let _ = unsafe { cu::stream::destroy(stream) };
    let (graph, made) = captured?;
    let mut exec = ptr::null_mut();
    // SAFETY: a graph just made; `exec` is written on success.
    if let Err(e) = check("cuGraphInstantiateWithFlags", unsafe {
        sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0)
    }) {
        // SAFETY: ours, not instantiated.
        let _ = unsafe { sys::cuGraphDestroy(graph) };
        return Err(e);
    }
    let steps: Vec<Step<CudaFunction>> = nodes.into_iter().map(|n| n.step).collect();
    let functions = steps
        .iter()
        .filter_map(|s| match s {
            Step::Kernel { function, .. } => Some(function.clone()),
            _ => None,
        })
        .collect();
    Ok(CudaGraph {
        graph,
        exec,
        nodes: made,
        steps: Mutex::new(steps),
        functions: Mutex::new(functions),
    })
}

/// Captures every node on `stream`; the graph and its nodes, or the first failure (the
/// capture ended).
fn capture(
    stream: sys::CUstream,
    nodes: &[Node<CudaFunction>],
) -> DeviceResult<(sys::CUgraph, Vec<sys::CUgraphNode>)> {
    // SAFETY: a live stream of ours.
    check("cuStreamBeginCapture", unsafe {
        sys::cuStreamBeginCapture_v2(
            stream,
            sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
        )
    })?;
    let built = capture_nodes(stream, nodes);
    let mut graph = ptr::null_mut();
    // SAFETY: the capture begun above; `graph` is written.
    let ended = check("cuStreamEndCapture", unsafe {
        sys::cuStreamEndCapture(stream, &mut graph)
    });
    match (built, ended) {
        (Ok(made), Ok(())) => Ok((graph, made)),
        (built, ended) => {
            if !graph.is_null() {
                // SAFETY: the capture's graph, not used.
                let _ = unsafe { sys::cuGraphDestroy(graph) };
            }
            Err(built
                .err()
                .or(ended.err())
                .unwrap_or_else(|| DeviceError::Failed("the graph's capture failed".into())))
        }
    }
}

fn capture_nodes(
    stream: sys::CUstream,
    nodes: &[Node<CudaFunction>],
) -> DeviceResult<Vec<sys::CUgraphNode>> {
    let mut made: Vec<sys::CUgraphNode> = Vec::with_capacity(nodes.len());
    for (i, node) in nodes.iter().enumerate() {
        // The capture depends on the node just made: a chain needs no update (and keeps the
        // edge kinds capture gave it, such as programmatic launches').
        let chained = i > 0 && node.deps.len() == 1 && node.deps[0] as usize == i - 1;
        if !chained {
            let mut deps = node
                .deps
                .iter()
                .map(|&d| made.get(d as usize).copied())
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| DeviceError::InvalidArgument("a graph node's dependency".into()))?;
            // SAFETY: a capturing stream of ours; the nodes are this capture's.
            check("cuStreamUpdateCaptureDependencies", unsafe {
                sys::cuStreamUpdateCaptureDependencies_v2(
                    stream,
                    deps.as_mut_ptr(),
                    ptr::null(),
                    deps.len(),
                    sys::CUstreamUpdateCaptureDependencies_flags::CU_STREAM_SET_CAPTURE_DEPENDENCIES
                        as u32,
                )
            })?;
        }
        queue(stream, &node.step)?;
        made.push(last_node(stream)?);
    }
    Ok(made)
}

/// Queues one node's work on the capturing stream.
fn queue(stream: sys::CUstream, step: &Step<CudaFunction>) -> DeviceResult<()> {
    match step {
        Step::Kernel {
            function,
            launch,
            attributes,
            params,
        } => function.launch_on(stream, launch, attributes, params),
        Step::Copy { src, dst, len } => copy::dtod_on(stream, *src, *dst, *len),
        Step::Memset {
            dst,
            value,
            elem_bytes,
            count,
        } => copy::memset_on(stream, *dst, *value, *elem_bytes, *count),
    }
}

/// A node's byte or element count as the driver takes it.
fn size(n: u64) -> DeviceResult<usize> {
    usize::try_from(n).map_err(|_| DeviceError::InvalidArgument("a graph node's size".into()))
}

/// The node the capture made last: its only dependency now.
fn last_node(stream: sys::CUstream) -> DeviceResult<sys::CUgraphNode> {
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut deps: *const sys::CUgraphNode = ptr::null();
    let mut n = 0usize;
    // SAFETY: a capturing stream; every out-parameter is ours or NULL (not asked).
    check("cuStreamGetCaptureInfo", unsafe {
        sys::cuStreamGetCaptureInfo_v3(
            stream,
            &mut status,
            ptr::null_mut(),
            ptr::null_mut(),
            &mut deps,
            ptr::null_mut(),
            &mut n,
        )
    })?;
    if n != 1 || deps.is_null() {
        return Err(DeviceError::Failed(format!(
            "a graph node's capture left {n} dependencies, not the one node it made"
        )));
    }
    // SAFETY: the driver's array of `n` (= 1) nodes, valid until the capture changes.
    Ok(unsafe { *deps })
}

/// Gives nodes new parameters in the executable graph, for its launches queued after this
/// (CUDA leaves launches already queued as they were).
pub(super) fn update(
    dev: &CudaDevice,
    graph: &CudaGraph,
    changes: Vec<(u32, Step<CudaFunction>)>,
) -> DeviceResult<()> {
    dev.bind()?;
    for (i, step) in changes {
        let node = *graph
            .nodes
            .get(i as usize)
            .ok_or_else(|| DeviceError::InvalidArgument(format!("no graph node {i}")))?;
        if let Some(kept) = graph
            .steps
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_mut(i as usize)
        {
            *kept = step.clone();
        }
        match step {
            Step::Kernel {
                function,
                launch,
                params,
                ..
            } => {
                with_packed(&params, |extra| {
                    let p = sys::CUDA_KERNEL_NODE_PARAMS {
                        func: function.raw(),
                        gridDimX: launch.grid[0],
                        gridDimY: launch.grid[1],
                        gridDimZ: launch.grid[2],
                        blockDimX: launch.block[0],
                        blockDimY: launch.block[1],
                        blockDimZ: launch.block[2],
                        sharedMemBytes: launch.shared_mem_bytes,
                        kernelParams: ptr::null_mut(),
                        extra,
                        kern: ptr::null_mut(),
                        ctx: ptr::null_mut(),
                    };
                    // SAFETY: a node of this executable graph's graph; the parameters (which
                    // the driver copies) outlive the call.
                    check("cuGraphExecKernelNodeSetParams", unsafe {
                        sys::cuGraphExecKernelNodeSetParams_v2(graph.exec, node, &p)
                    })
                })?;
                let mut held = graph.functions.lock().unwrap_or_else(|e| e.into_inner());
                if !held.iter().any(|f| Arc::ptr_eq(f, &function)) {
                    held.push(function);
                }
            }
            Step::Copy { src, dst, len } => {
                let p = device_copy(src, dst, size(len)?);
                // SAFETY: as for kernels; addresses checked by the session at each launch.
                check("cuGraphExecMemcpyNodeSetParams", unsafe {
                    sys::cuGraphExecMemcpyNodeSetParams(graph.exec, node, &p, dev.ctx)
                })?;
            }
            Step::Memset {
                dst,
                value,
                elem_bytes,
                count,
            } => {
                let p = sys::CUDA_MEMSET_NODE_PARAMS {
                    dst,
                    pitch: 0,
                    value,
                    elementSize: u32::from(elem_bytes),
                    width: size(count)?,
                    height: 1,
                };
                // SAFETY: as for copies.
                check("cuGraphExecMemsetNodeSetParams", unsafe {
                    sys::cuGraphExecMemsetNodeSetParams(graph.exec, node, &p, dev.ctx)
                })?;
            }
        }
    }
    Ok(())
}

/// A copy node's parameters: `width` bytes from device address `src` to `dst`. Written out
/// whole: all-zero bytes are no valid `CUDA_MEMCPY3D` (its memory types have no zero), and
/// Rust aborts the process that asks for one.
fn device_copy(src: u64, dst: u64, width: usize) -> sys::CUDA_MEMCPY3D {
    sys::CUDA_MEMCPY3D {
        srcXInBytes: 0,
        srcY: 0,
        srcZ: 0,
        srcLOD: 0,
        srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
        srcHost: ptr::null(),
        srcDevice: src,
        srcArray: ptr::null_mut(),
        reserved0: ptr::null_mut(),
        srcPitch: 0,
        srcHeight: 0,
        dstXInBytes: 0,
        dstY: 0,
        dstZ: 0,
        dstLOD: 0,
        dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
        dstHost: ptr::null_mut(),
        dstDevice: dst,
        dstArray: ptr::null_mut(),
        reserved1: ptr::null_mut(),
        dstPitch: 0,
        dstHeight: 0,
        WidthInBytes: width,
        Height: 1,
        Depth: 1,
    }
}

/// Launches the graph on the stream as one unit.
pub(super) fn launch(
    dev: &CudaDevice,
    stream: &mut CudaStream,
    graph: &CudaGraph,
) -> DeviceResult<()> {
    stream.begin(dev)?;
    if stream.on_partition() {
        let steps = graph.steps.lock().unwrap_or_else(|e| e.into_inner());
        return steps.iter().try_for_each(|step| queue(stream.raw, step));
    }
    // SAFETY: a live executable graph and stream of this context.
    check("cuGraphLaunch", unsafe {
        sys::cuGraphLaunch(graph.exec, stream.raw)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A copy node's update is made without a GPU; it once aborted the device worker (a
    /// zeroed `CUDA_MEMCPY3D`) at the first update of a graph with a copy, as JAX's loops make.
    #[test]
    fn a_copy_node_s_parameters_are_a_device_to_device_copy_of_one_row() {
        let p = device_copy(0x1000, 0x2000, 256);
        assert_eq!(
            (p.srcDevice, p.dstDevice, p.WidthInBytes),
            (0x1000, 0x2000, 256)
        );
        assert_eq!((p.Height, p.Depth), (1, 1));
        assert!(matches!(
            (p.srcMemoryType, p.dstMemoryType),
            (
                sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
                sys::CUmemorytype::CU_MEMORYTYPE_DEVICE
            )
        ));
    }
}

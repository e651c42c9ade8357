//! The parameter blocks of graph nodes as programs pass them (`cuda.h`'s layouts), and the
//! ops they describe: kernel launches, device-to-device copies and memsets.

use std::ffi::{c_int, c_uint, c_void};

use gpushare_protocol::Command;
use gpushare_protocol::command::LaunchAttributes;

use super::Op;
use crate::driver::Driver;
use crate::launch::LaunchShape;
use crate::status::Cu;
use crate::types::{CUfunction, CUgraph, result};

/// `CUDA_KERNEL_NODE_PARAMS` (v2 and v3 share it; v1 is its first 56 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct KernelNodeParams {
    func: CUfunction,
    grid: [c_uint; 3],
    block: [c_uint; 3],
    shared_mem_bytes: c_uint,
    kernel_params: *mut *mut c_void,
    extra: *mut *mut c_void,
    /// A `CUkernel`, used when `func` is NULL (v2 on).
    kern: *mut c_void,
    ctx: *mut c_void,
}

/// `CUDA_MEMCPY3D`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Memcpy3d {
    src_x_in_bytes: usize,
    src_y: usize,
    src_z: usize,
    src_lod: usize,
    src_memory_type: c_uint,
    src_host: *const c_void,
    src_device: u64,
    src_array: *mut c_void,
    reserved0: *mut c_void,
    src_pitch: usize,
    src_height: usize,
    dst_x_in_bytes: usize,
    dst_y: usize,
    dst_z: usize,
    dst_lod: usize,
    dst_memory_type: c_uint,
    dst_host: *mut c_void,
    dst_device: u64,
    dst_array: *mut c_void,
    reserved1: *mut c_void,
    dst_pitch: usize,
    dst_height: usize,
    width_in_bytes: usize,
    height: usize,
    depth: usize,
}
const _: () = assert!(std::mem::size_of::<Memcpy3d>() == 200);

/// `CUDA_MEMSET_NODE_PARAMS`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct MemsetNodeParams {
    dst: u64,
    pitch: usize,
    value: c_uint,
    element_size: c_uint,
    width: usize,
    height: usize,
}

/// `CUgraphNodeType`.
pub mod node_type {
    pub const KERNEL: i32 = 0;
    pub const MEMCPY: i32 = 1;
    pub const MEMSET: i32 = 2;
    pub const HOST: i32 = 3;
    pub const GRAPH: i32 = 4;
    pub const EMPTY: i32 = 5;
}

/// `CUmemorytype`.
mod memory_type {
    pub const DEVICE: u32 = 2;
    pub const UNIFIED: u32 = 4;
}

/// `CUgraphNodeParams` (CUDA 12.2 on): a type, then that type's parameters.
#[repr(C)]
pub struct NodeParams {
    pub kind: c_int,
    reserved0: [c_int; 3],
    body: [u64; 29],
    reserved2: i64,
}
const _: () = assert!(std::mem::size_of::<NodeParams>() == 256);

/// What a generic parameter block describes.
pub enum Described {
    Op(Op),
    Child(CUgraph),
}

/// The op (or child graph) of a generic parameter block.
///
/// # Safety
/// `p` is NULL or a valid block of its type.
pub unsafe fn described(d: &Driver, p: *const NodeParams) -> Cu<Described> {
    if p.is_null() {
        return Err(result::INVALID_VALUE);
    }
    // SAFETY: the caller's contract; each type's parameters start the body.
    let body = unsafe { std::ptr::addr_of!((*p).body) }.cast::<u8>();
    // SAFETY: as above.
    let kind = unsafe { (*p).kind };
    Ok(match kind {
        // SAFETY: the body holds a kernel node's parameters, per the caller's contract.
        node_type::KERNEL => Described::Op(unsafe { kernel_op(d, body.cast(), true) }?),
        // `CUDA_MEMCPY_NODE_PARAMS`: flags, reserved, a context, then the copy.
        // SAFETY: as above, a copy node's.
        node_type::MEMCPY => Described::Op(unsafe { copy_op(body.add(16).cast()) }?),
        // `CUDA_MEMSET_NODE_PARAMS_v2`: v1's fields, then a context.
        // SAFETY: as above, a memset node's.
        node_type::MEMSET => Described::Op(unsafe { memset_op(body.cast()) }?),
        node_type::EMPTY => Described::Op(Op::Empty),
        // `CUDA_HOST_NODE_PARAMS(_v2)`: the function, then its data.
        // SAFETY: as above, a host node's.
        node_type::HOST => Described::Op(unsafe { host_op(body.cast()) }?),
        // `CUDA_CHILD_GRAPH_NODE_PARAMS`: the graph first.
        // SAFETY: as above, a child graph node's.
        node_type::GRAPH => Described::Child(unsafe { body.cast::<CUgraph>().read_unaligned() }),
        other => {
            crate::log::say_once(&format!(
                "gpushare: graph nodes of type {other} (event, conditional, memory) are not \
                 supported (CUDA_ERROR_NOT_SUPPORTED)"
            ));
            return Err(result::NOT_SUPPORTED);
        }
    })
}

/// A kernel node's launch, from the program's parameters.
///
/// # Safety
/// `p` is NULL or a valid parameter block whose arguments are as `cuLaunchKernel` takes them.
pub unsafe fn kernel_op(d: &Driver, p: *const KernelNodeParams, v2: bool) -> Cu<Op> {
    if p.is_null() {
        return Err(result::INVALID_VALUE);
    }
    // SAFETY: the caller's contract (v1 blocks end before `kern`).
    let p = unsafe { p.read() };
    let function = if p.func.is_null() && v2 {
        p.kern
    } else {
        p.func
    };
    if !gpushare_protocol::command::shape_is_valid(p.grid, p.block) {
        return Err(result::INVALID_VALUE);
    }
    // SAFETY: the caller's contract.
    let (function, params) = unsafe { d.packed(function, p.kernel_params, p.extra) }?;
    Ok(Op::Launch {
        function,
        shape: LaunchShape {
            grid: p.grid,
            block: p.block,
            shared_mem_bytes: p.shared_mem_bytes,
            attributes: LaunchAttributes::default(),
        },
        params,
    })
}

/// A copy node's copy: device to device, one row (what graphs of frameworks hold); anything
/// else is not supported.
///
/// # Safety
/// `p` is NULL or valid for reading.
pub unsafe fn copy_op(p: *const Memcpy3d) -> Cu<Op> {
    if p.is_null() {
        return Err(result::INVALID_VALUE);
    }
    // SAFETY: the caller's contract.
    let p = unsafe { p.read() };
    let device = |t| t == memory_type::DEVICE || t == memory_type::UNIFIED;
    let flat = p.height <= 1
        && p.depth <= 1
        && p.src_y == 0
        && p.src_z == 0
        && p.dst_y == 0
        && p.dst_z == 0;
    if !(device(p.src_memory_type) && device(p.dst_memory_type) && flat) {
        crate::log::say_once(
            "gpushare: a graph copy node other than one device-to-device row is not supported \
             (CUDA_ERROR_NOT_SUPPORTED)",
        );
        return Err(result::NOT_SUPPORTED);
    }
    Ok(Op::Command(Command::CopyDtoD {
        stream: 0,
        src: p.src_device + p.src_x_in_bytes as u64,
        dst: p.dst_device + p.dst_x_in_bytes as u64,
        len: p.width_in_bytes as u64,
    }))
}

/// A memset node's memset (one row).
///
/// # Safety
/// `p` is NULL or valid for reading.
pub unsafe fn memset_op(p: *const MemsetNodeParams) -> Cu<Op> {
    if p.is_null() {
        return Err(result::INVALID_VALUE);
    }
    // SAFETY: the caller's contract.
    let p = unsafe { p.read() };
    if p.height > 1 {
        crate::log::say_once(
            "gpushare: a graph memset node of more than one row is not supported \
             (CUDA_ERROR_NOT_SUPPORTED)",
        );
        return Err(result::NOT_SUPPORTED);
    }
    let count = p.width as u64;
    Ok(match p.element_size {
        1 => Op::Command(Command::Memset {
            stream: 0,
            dst: p.dst,
            value: p.value as u8,
            len: count,
        }),
        2 | 4 => Op::Command(Command::MemsetWide {
            stream: 0,
            dst: p.dst,
            value: p.value,
            elem_bytes: p.element_size as u8,
            count,
        }),
        _ => return Err(result::INVALID_VALUE),
    })
}

pub fn type_of(op: &Op) -> i32 {
    match op {
        Op::Launch { .. } => node_type::KERNEL,
        Op::Command(Command::Memset { .. } | Command::MemsetWide { .. }) => node_type::MEMSET,
        Op::Command(_) => node_type::MEMCPY,
        Op::Empty => node_type::EMPTY,
        Op::Host { .. } => node_type::HOST,
    }
}

/// `CUDA_HOST_NODE_PARAMS`: a host function and its data.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct HostNodeParams {
    function: crate::host_func::HostFn,
    data: *mut c_void,
}

/// A host node's function.
///
/// # Safety
/// `p` is NULL or valid for reading.
pub unsafe fn host_op(p: *const HostNodeParams) -> Cu<Op> {
    if p.is_null() {
        return Err(result::INVALID_VALUE);
    }
    // SAFETY: the caller's contract.
    let p = unsafe { p.read() };
    let function = p.function.ok_or(result::INVALID_VALUE)?;
    Ok(Op::Host {
        function,
        data: p.data as usize,
    })
}

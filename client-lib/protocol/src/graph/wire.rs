//! The bytes of a graph's nodes and of an update's changes: fixed little-endian fields, each
//! count checked against the bytes left before anything is allocated. Written out rather than
//! left to serde: an XLA step updates every kernel node of its graph, and gpushared decodes
//! the update, checks it and encodes the graph's recipe again on every step (serde's bincode
//! took about 0.4 µs a node each way).

use super::{GraphChange, GraphError, GraphNode, GraphOp, MAX_GRAPH_BYTES, MAX_GRAPH_NODES};
use crate::command::LaunchAttributes;

const KERNEL: u8 = 0;
const COPY: u8 = 1;
const MEMSET: u8 = 2;

/// Bytes of a kernel op before its parameters.
const KERNEL_FIXED: usize = 1 + 8 + 12 + 12 + 4 + 32 + 4;

fn too_large(len: usize) -> GraphError {
    GraphError::Decode(format!(
        "{len} bytes; at most {MAX_GRAPH_BYTES} are allowed"
    ))
}

pub(super) fn put_nodes(nodes: &[GraphNode]) -> Result<Vec<u8>, GraphError> {
    put_all(
        nodes,
        |n| 4 + 4 * n.deps.len() + op_size(&n.op),
        |out, n| {
            put_len(out, n.deps.len())?;
            for &d in &n.deps {
                out.extend_from_slice(&d.to_le_bytes());
            }
            put_op(out, &n.op)
        },
    )
}

pub(super) fn put_changes(changes: &[GraphChange]) -> Result<Vec<u8>, GraphError> {
    put_all(
        changes,
        |c| 4 + op_size(&c.op),
        |out, c| {
            out.extend_from_slice(&c.node.to_le_bytes());
            put_op(out, &c.op)
        },
    )
}

pub(super) fn take_nodes(bytes: &[u8]) -> Result<Vec<GraphNode>, GraphError> {
    take_all(bytes, |r| {
        let n = r.count(4)?;
        let deps = (0..n).map(|_| r.u32()).collect::<Result<_, _>>()?;
        Ok(GraphNode { deps, op: r.op()? })
    })
}

pub(super) fn take_changes(bytes: &[u8]) -> Result<Vec<GraphChange>, GraphError> {
    take_all(bytes, |r| {
        let node = r.u32()?;
        Ok(GraphChange { node, op: r.op()? })
    })
}

/// A count, then each item (`size` bytes, written by `put`).
fn put_all<T>(
    items: &[T],
    size: impl Fn(&T) -> usize,
    put: impl Fn(&mut Vec<u8>, &T) -> Result<(), GraphError>,
) -> Result<Vec<u8>, GraphError> {
    if items.len() > MAX_GRAPH_NODES {
        return Err(GraphError::TooMany(items.len()));
    }
    let mut out = Vec::with_capacity(4 + items.iter().map(&size).sum::<usize>());
    put_len(&mut out, items.len())?;
    for item in items {
        put(&mut out, item)?;
    }
    if out.len() as u64 > MAX_GRAPH_BYTES {
        return Err(too_large(out.len()));
    }
    Ok(out)
}

/// A count, then each item (`take` reads one), then nothing.
fn take_all<T>(
    bytes: &[u8],
    mut take: impl FnMut(&mut Reader<'_>) -> Result<T, GraphError>,
) -> Result<Vec<T>, GraphError> {
    let mut r = Reader::new(bytes)?;
    // Every item is at least 5 bytes (an index or a count, and an op's tag).
    let count = r.count(5)?;
    let mut items = Vec::with_capacity(count);
    for _ in 0..count {
        items.push(take(&mut r)?);
    }
    r.end()?;
    Ok(items)
}

fn op_size(op: &GraphOp) -> usize {
    match op {
        GraphOp::Kernel { params, .. } => KERNEL_FIXED + params.len(),
        GraphOp::Copy { .. } => 1 + 24,
        GraphOp::Memset { .. } => 1 + 8 + 4 + 1 + 8,
    }
}

fn put_len(out: &mut Vec<u8>, len: usize) -> Result<(), GraphError> {
    let len = u32::try_from(len).map_err(|_| too_large(len))?;
    out.extend_from_slice(&len.to_le_bytes());
    Ok(())
}

fn put_op(out: &mut Vec<u8>, op: &GraphOp) -> Result<(), GraphError> {
    match op {
        GraphOp::Kernel {
            function,
            grid,
            block,
            shared_mem_bytes,
            attributes,
            params,
        } => {
            out.push(KERNEL);
            out.extend_from_slice(&function.to_le_bytes());
            for v in grid.iter().chain(block) {
                out.extend_from_slice(&v.to_le_bytes());
            }
            out.extend_from_slice(&shared_mem_bytes.to_le_bytes());
            let a = attributes;
            for v in a.cluster.iter().chain([&a.flags]).chain(&a._reserved) {
                out.extend_from_slice(&v.to_le_bytes());
            }
            put_len(out, params.len())?;
            out.extend_from_slice(params);
        }
        GraphOp::Copy { src, dst, len } => {
            out.push(COPY);
            for v in [src, dst, len] {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        GraphOp::Memset {
            dst,
            value,
            elem_bytes,
            count,
        } => {
            out.push(MEMSET);
            out.extend_from_slice(&dst.to_le_bytes());
            out.extend_from_slice(&value.to_le_bytes());
            out.push(*elem_bytes);
            out.extend_from_slice(&count.to_le_bytes());
        }
    }
    Ok(())
}

struct Reader<'a> {
    bytes: &'a [u8],
}

fn short() -> GraphError {
    GraphError::Decode("the bytes end early".into())
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8]) -> Result<Self, GraphError> {
        if bytes.len() as u64 > MAX_GRAPH_BYTES {
            return Err(too_large(bytes.len()));
        }
        Ok(Reader { bytes })
    }

    fn take<const N: usize>(&mut self) -> Result<[u8; N], GraphError> {
        let (head, rest) = self.bytes.split_first_chunk::<N>().ok_or_else(short)?;
        self.bytes = rest;
        Ok(*head)
    }

    fn u8(&mut self) -> Result<u8, GraphError> {
        Ok(self.take::<1>()?[0])
    }

    fn u32(&mut self) -> Result<u32, GraphError> {
        Ok(u32::from_le_bytes(self.take()?))
    }

    fn u64(&mut self) -> Result<u64, GraphError> {
        Ok(u64::from_le_bytes(self.take()?))
    }

    fn u32s<const N: usize>(&mut self) -> Result<[u32; N], GraphError> {
        let mut v = [0u32; N];
        for x in &mut v {
            *x = self.u32()?;
        }
        Ok(v)
    }

    /// A count of items of at least `each` bytes: refused when the bytes left cannot hold
    /// them (nothing is allocated for a count a hostile file made up) or past the node limit.
    fn count(&mut self, each: usize) -> Result<usize, GraphError> {
        let n = self.u32()? as usize;
        if n > MAX_GRAPH_NODES && each > 4 {
            return Err(GraphError::TooMany(n));
        }
        if n.saturating_mul(each) > self.bytes.len() {
            return Err(short());
        }
        Ok(n)
    }

    fn op(&mut self) -> Result<GraphOp, GraphError> {
        Ok(match self.u8()? {
            KERNEL => {
                let function = self.u64()?;
                let grid = self.u32s()?;
                let block = self.u32s()?;
                let shared_mem_bytes = self.u32()?;
                let attributes = LaunchAttributes {
                    cluster: self.u32s()?,
                    flags: self.u32()?,
                    _reserved: self.u32s()?,
                };
                let len = self.count(1)?;
                let (params, rest) = self.bytes.split_at(len);
                self.bytes = rest;
                GraphOp::Kernel {
                    function,
                    grid,
                    block,
                    shared_mem_bytes,
                    attributes,
                    params: params.to_vec(),
                }
            }
            COPY => GraphOp::Copy {
                src: self.u64()?,
                dst: self.u64()?,
                len: self.u64()?,
            },
            MEMSET => GraphOp::Memset {
                dst: self.u64()?,
                value: self.u32()?,
                elem_bytes: self.u8()?,
                count: self.u64()?,
            },
            tag => return Err(GraphError::Decode(format!("no node kind {tag}"))),
        })
    }

    fn end(&self) -> Result<(), GraphError> {
        if self.bytes.is_empty() {
            Ok(())
        } else {
            Err(GraphError::Decode(format!(
                "{} bytes after the last node",
                self.bytes.len()
            )))
        }
    }
}

//! TMA tensor maps (`cuTensorMapEncodeTiled`, `cuTensorMapEncodeIm2col`,
//! `cuTensorMapReplaceAddress`): 128 bytes of host data that only NVIDIA's driver knows how to
//! make. gpushared's device worker makes them (a control request), in the context where this
//! program's device addresses are the same. XLA's autotuner and Triton on Hopper use them.
//! A map is a function of its arguments alone (the driver checks no allocation), so each
//! distinct one is asked of gpushared once: XLA encodes its TMA kernels' maps before every
//! launch, and a round trip to gpushared's control socket for each cost a JAX training step
//! on an H200 75-139 µs a map (docs/benchmarks.md, runs J4 and J6).

use std::ffi::{c_int, c_uint, c_void};

use gpushare_protocol::control::{
    BrokerMessage, ClientMessage, TENSOR_MAP_BYTES, TensorLayout, TensorMapArgs,
};

use crate::driver::{self, Driver};
use crate::memo::Memo;
use crate::status::{Cu, entry, from_code, from_error};
use crate::types::{CUresult, result};

/// Maps made, by what they were made of.
pub type Cache = Memo<TensorMapArgs, Vec<u8>>;

/// Most dimensions a tensor map has.
const MAX_RANK: u32 = 5;

/// Copies `n` values from a C array the program passed.
///
/// # Safety
/// `p` is NULL or valid for reading `n` values.
unsafe fn read<T: Copy>(p: *const T, n: usize) -> Cu<Vec<T>> {
    if n == 0 {
        return Ok(Vec::new());
    }
    if p.is_null() {
        return Err(result::INVALID_VALUE);
    }
    // SAFETY: the caller's contract; unaligned reads, as C arrays may be anywhere.
    Ok((0..n)
        .map(|i| unsafe { p.add(i).read_unaligned() })
        .collect())
}

impl Driver {
    fn tensor_map(&self, args: TensorMapArgs) -> Cu<Vec<u8>> {
        self.tensor_maps.answer(args, |args| {
            let reply = self
                .transport
                .session
                .request(
                    |request| ClientMessage::EncodeTensorMap {
                        request,
                        args: args.clone(),
                    },
                    &[],
                )
                .map_err(|e| from_error(&e))?;
            match reply {
                BrokerMessage::TensorMap { result: Ok(b), .. } if b.len() == TENSOR_MAP_BYTES => {
                    Ok(b)
                }
                BrokerMessage::TensorMap { result: Err(w), .. } => Err(from_code(w.code)),
                _ => Err(result::UNKNOWN),
            }
        })
    }
}

/// Writes the map's bytes where the program wants them.
///
/// # Safety
/// `out` is NULL or valid for writing [`TENSOR_MAP_BYTES`].
unsafe fn write_map(out: *mut c_void, bytes: &[u8]) -> Cu<()> {
    if out.is_null() {
        return Err(result::INVALID_VALUE);
    }
    // SAFETY: the caller's contract.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), out.cast::<u8>(), bytes.len()) };
    Ok(())
}

/// The parts of a layout both encoders read.
///
/// # Safety
/// Each array is NULL or valid for its length (by `rank`), as CUDA requires.
#[allow(clippy::too_many_arguments)]
unsafe fn layout(
    data_type: c_uint,
    rank: c_uint,
    address: *mut c_void,
    dim: *const u64,
    strides: *const u64,
    element_strides: *const u32,
    (interleave, swizzle, l2_promotion, oob_fill): (c_uint, c_uint, c_uint, c_uint),
) -> Cu<TensorLayout> {
    if rank == 0 || rank > MAX_RANK {
        return Err(result::INVALID_VALUE);
    }
    let n = rank as usize;
    // SAFETY: the caller's contract.
    unsafe {
        Ok(TensorLayout {
            data_type,
            global_address: address as u64,
            global_dim: read(dim, n)?,
            global_strides: read(strides, n - 1)?,
            element_strides: read(element_strides, n)?,
            interleave,
            swizzle,
            l2_promotion,
            oob_fill,
        })
    }
}

/// # Safety
/// Pointers as CUDA's `cuTensorMapEncodeTiled` requires them.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuTensorMapEncodeTiled(
    map: *mut c_void,
    data_type: c_uint,
    rank: c_uint,
    address: *mut c_void,
    dim: *const u64,
    strides: *const u64,
    box_dim: *const u32,
    element_strides: *const u32,
    interleave: c_uint,
    swizzle: c_uint,
    l2_promotion: c_uint,
    oob_fill: c_uint,
) -> CUresult {
    entry("cuTensorMapEncodeTiled", || {
        let d = driver::live()?;
        let enums = (interleave, swizzle, l2_promotion, oob_fill);
        // SAFETY: the caller's contract.
        let layout = unsafe {
            layout(
                data_type,
                rank,
                address,
                dim,
                strides,
                element_strides,
                enums,
            )?
        };
        // SAFETY: as above; the rank was checked.
        let box_dim = unsafe { read(box_dim, rank as usize)? };
        let bytes = d.tensor_map(TensorMapArgs::Tiled { layout, box_dim })?;
        // SAFETY: as above.
        unsafe { write_map(map, &bytes) }
    })
}

/// # Safety
/// Pointers as CUDA's `cuTensorMapEncodeIm2col` requires them.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuTensorMapEncodeIm2col(
    map: *mut c_void,
    data_type: c_uint,
    rank: c_uint,
    address: *mut c_void,
    dim: *const u64,
    strides: *const u64,
    lower: *const c_int,
    upper: *const c_int,
    channels_per_pixel: c_uint,
    pixels_per_column: c_uint,
    element_strides: *const u32,
    interleave: c_uint,
    swizzle: c_uint,
    l2_promotion: c_uint,
    oob_fill: c_uint,
) -> CUresult {
    entry("cuTensorMapEncodeIm2col", || {
        let d = driver::live()?;
        if rank < 3 {
            return Err(result::INVALID_VALUE);
        }
        let enums = (interleave, swizzle, l2_promotion, oob_fill);
        // SAFETY: the caller's contract.
        let layout = unsafe {
            layout(
                data_type,
                rank,
                address,
                dim,
                strides,
                element_strides,
                enums,
            )?
        };
        let spatial = rank as usize - 2;
        // SAFETY: as above; the rank was checked.
        let (lower_corner, upper_corner) =
            unsafe { (read(lower, spatial)?, read(upper, spatial)?) };
        let bytes = d.tensor_map(TensorMapArgs::Im2col {
            layout,
            lower_corner,
            upper_corner,
            channels_per_pixel,
            pixels_per_column,
        })?;
        // SAFETY: as above.
        unsafe { write_map(map, &bytes) }
    })
}

/// # Safety
/// `map` is NULL or a tensor map the program may read and write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuTensorMapReplaceAddress(
    map: *mut c_void,
    address: *mut c_void,
) -> CUresult {
    entry("cuTensorMapReplaceAddress", || {
        let d = driver::live()?;
        // SAFETY: the caller's contract.
        let old = unsafe { read(map.cast::<u8>().cast_const(), TENSOR_MAP_BYTES)? };
        let bytes = d.tensor_map(TensorMapArgs::ReplaceAddress {
            map: old,
            global_address: address as u64,
        })?;
        // SAFETY: as above.
        unsafe { write_map(map, &bytes) }
    })
}

//! TMA tensor maps (`cuTensorMapEncodeTiled`, `cuTensorMapEncodeIm2col`,
//! `cuTensorMapReplaceAddress`) for consolidated clients: host data only the driver knows how
//! to make, made here where the client's device addresses are the same. The enums' numbers
//! come from the client; each is turned into its variant by table, never by a cast.

use cudarc::driver::sys;
use gpushare_protocol::control::{TENSOR_MAP_BYTES, TensorLayout, TensorMapArgs};

use super::error::check;
use crate::device::{DeviceError, DeviceResult};

use sys::CUtensorMapDataType_enum as D;
use sys::CUtensorMapFloatOOBfill_enum as F;
use sys::CUtensorMapInterleave_enum as I;
use sys::CUtensorMapL2promotion_enum as L;
use sys::CUtensorMapSwizzle_enum as S;

const DATA_TYPES: [D; 16] = [
    D::CU_TENSOR_MAP_DATA_TYPE_UINT8,
    D::CU_TENSOR_MAP_DATA_TYPE_UINT16,
    D::CU_TENSOR_MAP_DATA_TYPE_UINT32,
    D::CU_TENSOR_MAP_DATA_TYPE_INT32,
    D::CU_TENSOR_MAP_DATA_TYPE_UINT64,
    D::CU_TENSOR_MAP_DATA_TYPE_INT64,
    D::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
    D::CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
    D::CU_TENSOR_MAP_DATA_TYPE_FLOAT64,
    D::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
    D::CU_TENSOR_MAP_DATA_TYPE_FLOAT32_FTZ,
    D::CU_TENSOR_MAP_DATA_TYPE_TFLOAT32,
    D::CU_TENSOR_MAP_DATA_TYPE_TFLOAT32_FTZ,
    D::CU_TENSOR_MAP_DATA_TYPE_16U4_ALIGN8B,
    D::CU_TENSOR_MAP_DATA_TYPE_16U4_ALIGN16B,
    D::CU_TENSOR_MAP_DATA_TYPE_16U6_ALIGN16B,
];
const INTERLEAVES: [I; 3] = [
    I::CU_TENSOR_MAP_INTERLEAVE_NONE,
    I::CU_TENSOR_MAP_INTERLEAVE_16B,
    I::CU_TENSOR_MAP_INTERLEAVE_32B,
];
const SWIZZLES: [S; 7] = [
    S::CU_TENSOR_MAP_SWIZZLE_NONE,
    S::CU_TENSOR_MAP_SWIZZLE_32B,
    S::CU_TENSOR_MAP_SWIZZLE_64B,
    S::CU_TENSOR_MAP_SWIZZLE_128B,
    S::CU_TENSOR_MAP_SWIZZLE_128B_ATOM_32B,
    S::CU_TENSOR_MAP_SWIZZLE_128B_ATOM_32B_FLIP_8B,
    S::CU_TENSOR_MAP_SWIZZLE_128B_ATOM_64B,
];
const L2_PROMOTIONS: [L; 4] = [
    L::CU_TENSOR_MAP_L2_PROMOTION_NONE,
    L::CU_TENSOR_MAP_L2_PROMOTION_L2_64B,
    L::CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
    L::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
];
const OOB_FILLS: [F; 2] = [
    F::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
    F::CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA,
];

fn pick<T: Copy>(table: &[T], n: u32, what: &str) -> DeviceResult<T> {
    table
        .get(n as usize)
        .copied()
        .ok_or_else(|| DeviceError::InvalidArgument(format!("{what} {n}")))
}

/// The enums of a layout, checked, and its arrays' lengths against its rank (1 to 5).
struct Checked {
    data_type: D,
    interleave: I,
    swizzle: S,
    l2: L,
    oob: F,
    rank: u32,
}

fn check_layout(l: &TensorLayout, min_rank: usize) -> DeviceResult<Checked> {
    let rank = l.global_dim.len();
    let lengths_fit = (min_rank..=5).contains(&rank)
        && l.global_strides.len() + 1 == rank
        && l.element_strides.len() == rank;
    if !lengths_fit {
        return Err(DeviceError::InvalidArgument(format!(
            "a tensor of rank {rank} with {} strides and {} element strides",
            l.global_strides.len(),
            l.element_strides.len()
        )));
    }
    Ok(Checked {
        data_type: pick(&DATA_TYPES, l.data_type, "data type")?,
        interleave: pick(&INTERLEAVES, l.interleave, "interleave")?,
        swizzle: pick(&SWIZZLES, l.swizzle, "swizzle")?,
        l2: pick(&L2_PROMOTIONS, l.l2_promotion, "L2 promotion")?,
        oob: pick(&OOB_FILLS, l.oob_fill, "out-of-bounds fill")?,
        rank: rank as u32,
    })
}

fn bytes(map: &sys::CUtensorMap) -> Vec<u8> {
    map.opaque.iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// Makes the map; the caller has bound the context.
pub(super) fn encode(args: &TensorMapArgs) -> DeviceResult<Vec<u8>> {
    let mut map = sys::CUtensorMap { opaque: [0; 16] };
    match args {
        TensorMapArgs::Tiled { layout: l, box_dim } => {
            let c = check_layout(l, 1)?;
            if box_dim.len() != c.rank as usize {
                return Err(DeviceError::InvalidArgument(
                    "box dimensions per rank".into(),
                ));
            }
            // SAFETY: every array is as long as the rank says (checked); the map is ours.
            check("cuTensorMapEncodeTiled", unsafe {
                sys::cuTensorMapEncodeTiled(
                    &mut map,
                    c.data_type,
                    c.rank,
                    l.global_address as *mut std::ffi::c_void,
                    l.global_dim.as_ptr(),
                    l.global_strides.as_ptr(),
                    box_dim.as_ptr(),
                    l.element_strides.as_ptr(),
                    c.interleave,
                    c.swizzle,
                    c.l2,
                    c.oob,
                )
            })?;
        }
        TensorMapArgs::Im2col {
            layout: l,
            lower_corner,
            upper_corner,
            channels_per_pixel,
            pixels_per_column,
        } => {
            let c = check_layout(l, 3)?;
            let spatial = c.rank as usize - 2;
            if lower_corner.len() != spatial || upper_corner.len() != spatial {
                return Err(DeviceError::InvalidArgument(
                    "pixel box corners per rank".into(),
                ));
            }
            // SAFETY: as above.
            check("cuTensorMapEncodeIm2col", unsafe {
                sys::cuTensorMapEncodeIm2col(
                    &mut map,
                    c.data_type,
                    c.rank,
                    l.global_address as *mut std::ffi::c_void,
                    l.global_dim.as_ptr(),
                    l.global_strides.as_ptr(),
                    lower_corner.as_ptr(),
                    upper_corner.as_ptr(),
                    *channels_per_pixel,
                    *pixels_per_column,
                    l.element_strides.as_ptr(),
                    c.interleave,
                    c.swizzle,
                    c.l2,
                    c.oob,
                )
            })?;
        }
        TensorMapArgs::ReplaceAddress {
            map: old,
            global_address,
        } => {
            if old.len() != TENSOR_MAP_BYTES {
                return Err(DeviceError::InvalidArgument(format!(
                    "a tensor map of {} bytes",
                    old.len()
                )));
            }
            for (w, b) in map.opaque.iter_mut().zip(old.chunks_exact(8)) {
                let mut word = [0u8; 8];
                word.copy_from_slice(b);
                *w = u64::from_le_bytes(word);
            }
            // SAFETY: a map of the right size, ours; the driver checks its contents.
            check("cuTensorMapReplaceAddress", unsafe {
                sys::cuTensorMapReplaceAddress(&mut map, *global_address as *mut std::ffi::c_void)
            })?;
        }
    }
    Ok(bytes(&map))
}

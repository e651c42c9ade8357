//! The launch entry points: each takes a token for its grid's blocks before the real launch
//! (a graph counts as one block).

#![allow(non_snake_case, clippy::too_many_arguments)]

use std::ffi::c_uint;

use crate::abi::{CUDA_ERROR_NOT_INITIALIZED, CUresult, Ptr};
use crate::governor;
use crate::real::real;

fn blocks(x: c_uint, y: c_uint, z: c_uint) -> u64 {
    u64::from(x.max(1)) * u64::from(y.max(1)) * u64::from(z.max(1))
}

macro_rules! launch_kernel {
    ($name:ident) => {
        /// # Safety
        /// As libcuda's function of this name.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            f: Ptr,
            grid_x: c_uint,
            grid_y: c_uint,
            grid_z: c_uint,
            block_x: c_uint,
            block_y: c_uint,
            block_z: c_uint,
            shared_mem_bytes: c_uint,
            h_stream: Ptr,
            kernel_params: *mut Ptr,
            extra: *mut Ptr,
        ) -> CUresult {
            type Launch = unsafe extern "C" fn(
                Ptr,
                c_uint,
                c_uint,
                c_uint,
                c_uint,
                c_uint,
                c_uint,
                c_uint,
                Ptr,
                *mut Ptr,
                *mut Ptr,
            ) -> CUresult;
            let Some(real) = real!($name: Launch) else {
                return CUDA_ERROR_NOT_INITIALIZED;
            };
            if let Err(code) = governor::admit_launch(blocks(grid_x, grid_y, grid_z)) {
                return code;
            }
            // SAFETY: forwarded as received.
            unsafe {
                real(
                    f,
                    grid_x,
                    grid_y,
                    grid_z,
                    block_x,
                    block_y,
                    block_z,
                    shared_mem_bytes,
                    h_stream,
                    kernel_params,
                    extra,
                )
            }
        }
    };
}
launch_kernel!(cuLaunchKernel);
launch_kernel!(cuLaunchKernel_ptsz);

macro_rules! launch_cooperative {
    ($name:ident) => {
        /// # Safety
        /// As libcuda's function of this name.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            f: Ptr,
            grid_x: c_uint,
            grid_y: c_uint,
            grid_z: c_uint,
            block_x: c_uint,
            block_y: c_uint,
            block_z: c_uint,
            shared_mem_bytes: c_uint,
            h_stream: Ptr,
            kernel_params: *mut Ptr,
        ) -> CUresult {
            type Launch = unsafe extern "C" fn(
                Ptr,
                c_uint,
                c_uint,
                c_uint,
                c_uint,
                c_uint,
                c_uint,
                c_uint,
                Ptr,
                *mut Ptr,
            ) -> CUresult;
            let Some(real) = real!($name: Launch) else {
                return CUDA_ERROR_NOT_INITIALIZED;
            };
            if let Err(code) = governor::admit_launch(blocks(grid_x, grid_y, grid_z)) {
                return code;
            }
            // SAFETY: forwarded as received.
            unsafe {
                real(
                    f,
                    grid_x,
                    grid_y,
                    grid_z,
                    block_x,
                    block_y,
                    block_z,
                    shared_mem_bytes,
                    h_stream,
                    kernel_params,
                )
            }
        }
    };
}
launch_cooperative!(cuLaunchCooperativeKernel);
launch_cooperative!(cuLaunchCooperativeKernel_ptsz);

/// The start of `CUlaunchConfig`: the grid comes first.
#[repr(C)]
pub struct LaunchConfigHead {
    pub grid_dim_x: c_uint,
    pub grid_dim_y: c_uint,
    pub grid_dim_z: c_uint,
}

macro_rules! launch_kernel_ex {
    ($name:ident) => {
        /// # Safety
        /// As libcuda's function of this name.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            config: *const LaunchConfigHead,
            f: Ptr,
            kernel_params: *mut Ptr,
            extra: *mut Ptr,
        ) -> CUresult {
            let Some(real) =
                real!($name: unsafe extern "C" fn(*const LaunchConfigHead, Ptr, *mut Ptr, *mut Ptr) -> CUresult)
            else {
                return CUDA_ERROR_NOT_INITIALIZED;
            };
            let grid = if config.is_null() {
                1
            } else {
                // SAFETY: a non-null `config` points to the caller's CUlaunchConfig, which
                // starts with the three grid dimensions.
                let c = unsafe { &*config };
                blocks(c.grid_dim_x, c.grid_dim_y, c.grid_dim_z)
            };
            if let Err(code) = governor::admit_launch(grid) {
                return code;
            }
            // SAFETY: forwarded as received.
            unsafe { real(config, f, kernel_params, extra) }
        }
    };
}
launch_kernel_ex!(cuLaunchKernelEx);
launch_kernel_ex!(cuLaunchKernelEx_ptsz);

macro_rules! graph_launch {
    ($name:ident) => {
        /// A graph counts as one launch of one block: its kernels are not visible here.
        ///
        /// # Safety
        /// As libcuda's function of this name.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(exec: Ptr, h_stream: Ptr) -> CUresult {
            let Some(real) = real!($name: unsafe extern "C" fn(Ptr, Ptr) -> CUresult) else {
                return CUDA_ERROR_NOT_INITIALIZED;
            };
            if let Err(code) = governor::admit_launch(1) {
                return code;
            }
            // SAFETY: forwarded as received.
            unsafe { real(exec, h_stream) }
        }
    };
}
graph_launch!(cuGraphLaunch);
graph_launch!(cuGraphLaunch_ptsz);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grid_counts_its_blocks_and_a_zero_dimension_as_one() {
        assert_eq!(blocks(4, 3, 2), 24);
        assert_eq!(blocks(0, 0, 0), 1);
        assert_eq!(blocks(7, 0, 1), 7);
        assert_eq!(
            blocks(u32::MAX, u32::MAX, 1),
            u64::from(u32::MAX) * u64::from(u32::MAX)
        );
    }
}

//! Kernel launches. The parameters are packed by the function's layout (from the broker at
//! its first use) straight into the arena, with the launch's attributes before them, and the
//! launch is sent without waiting: an error it meets surfaces at the next synchronization.

use std::ffi::{c_uint, c_void};

use gpushare_protocol::Command;
use gpushare_protocol::command::{
    LAUNCH_ATTRIBUTES_BYTES, LAUNCH_COOPERATIVE, LAUNCH_PROGRAMMATIC_SERIALIZATION,
    LaunchAttributes, MAX_LAUNCH_PARAMS, ModuleLaunch,
};
use zerocopy::IntoBytes;

use crate::driver::Driver;
use crate::module::FunctionInfo;
use crate::status::{Cu, entry};
use crate::types::{
    CUfunction, CUlaunchAttribute, CUlaunchConfig, CUresult, CUstream, launch_attr, launch_param,
    result,
};

/// A launch as the program described it.
#[derive(Debug, Clone, Copy)]
pub struct LaunchShape {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem_bytes: u32,
    pub attributes: LaunchAttributes,
}

/// Where the kernel's arguments are.
#[derive(Debug, Clone, Copy)]
enum Args {
    /// One pointer per parameter (`kernelParams`).
    Each(*mut *mut c_void),
    /// A packed buffer (`CU_LAUNCH_PARAM_BUFFER_POINTER` in `extra`).
    Packed(*const u8, usize),
    None,
}

/// Reads `kernelParams` / `extra` into where the arguments are and how many bytes they take.
///
/// # Safety
/// As `cuLaunchKernel`'s contract: `params` holds one valid pointer per parameter of the
/// function, `extra` is a CU_LAUNCH_PARAM_END-terminated list.
unsafe fn args(
    info: &FunctionInfo,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> Cu<(Args, usize)> {
    if !params.is_null() {
        return Ok((Args::Each(params), info.params_size));
    }
    if extra.is_null() {
        return if info.params.is_empty() {
            Ok((Args::None, 0))
        } else {
            Err(result::INVALID_VALUE)
        };
    }
    let (mut buffer, mut size) = (std::ptr::null::<u8>(), None);
    let mut i = 0;
    loop {
        // SAFETY: the list is terminated, per the contract; each key has a value after it.
        let key = unsafe { *extra.add(i) } as usize;
        match key {
            launch_param::END => break,
            launch_param::BUFFER_POINTER => {
                // SAFETY: as above.
                buffer = unsafe { *extra.add(i + 1) } as *const u8;
            }
            launch_param::BUFFER_SIZE => {
                // SAFETY: the value points to a size_t, per the contract.
                size = Some(unsafe { *(*extra.add(i + 1)).cast::<usize>() });
            }
            _ => return Err(result::INVALID_VALUE),
        }
        i += 2;
    }
    match (buffer.is_null(), size) {
        (false, Some(n)) if n <= MAX_LAUNCH_PARAMS as usize => Ok((Args::Packed(buffer, n), n)),
        _ => Err(result::INVALID_VALUE),
    }
}

/// Packs the arguments into `dst` (`len` bytes, as [`args`] said).
///
/// # Safety
/// `dst` is valid for writing `len` bytes; the arguments are as [`args`] found them.
unsafe fn pack(info: &FunctionInfo, args: Args, dst: *mut u8) {
    match args {
        Args::Each(params) => {
            for (i, &(offset, size)) in info.params.iter().enumerate() {
                // SAFETY: one pointer per parameter, each to `size` bytes of the argument;
                // `offset + size <= params_size`, the room in `dst`.
                unsafe {
                    let src = *params.add(i);
                    std::ptr::copy_nonoverlapping(
                        src.cast::<u8>(),
                        dst.add(offset as usize),
                        size as usize,
                    );
                }
            }
        }
        // SAFETY: `n` bytes of the program's buffer into `n` bytes of room.
        Args::Packed(src, n) => unsafe { std::ptr::copy_nonoverlapping(src, dst, n) },
        Args::None => {}
    }
}

impl Driver {
    /// Launches `function` on the broker stream `stream`.
    ///
    /// # Safety
    /// `params` / `extra` as `cuLaunchKernel`'s contract.
    pub unsafe fn launch(
        &self,
        function: CUfunction,
        shape: &LaunchShape,
        stream: u32,
        params: *mut *mut c_void,
        extra: *mut *mut c_void,
    ) -> Cu<()> {
        // Said now, as CUDA does; the broker would refuse it later.
        if !gpushare_protocol::command::shape_is_valid(shape.grid, shape.block) {
            return Err(result::INVALID_VALUE);
        }
        if crate::graph::capturing(self, stream) {
            // SAFETY: the caller's contract.
            let (id, bytes) = unsafe { self.packed(function, params, extra) }?;
            crate::graph::capture(self, stream, || crate::graph::Op::Launch {
                function: id,
                shape: *shape,
                params: bytes,
            })?;
            return Ok(());
        }
        let info = self.info(self.kernel(function)?)?;
        // SAFETY: the caller's contract.
        let (args, len) = unsafe { args(&info, params, extra) }?;
        self.send_launch(info.id, shape, stream, len, |dst| {
            // SAFETY: `dst` has `len` bytes of room; the arguments as the caller passed them.
            unsafe { pack(&info, args, dst) }
        })
    }

    /// The broker's function and the packed parameters of a launch of `function` (a recorded
    /// launch, a graph's kernel node).
    ///
    /// # Safety
    /// `params` / `extra` as `cuLaunchKernel`'s contract.
    pub unsafe fn packed(
        &self,
        function: CUfunction,
        params: *mut *mut c_void,
        extra: *mut *mut c_void,
    ) -> Cu<(u64, Vec<u8>)> {
        let info = self.info(self.kernel(function)?)?;
        // SAFETY: the caller's contract.
        let (args, len) = unsafe { args(&info, params, extra) }?;
        let mut bytes = vec![0u8; len];
        // SAFETY: `bytes` has `len` bytes.
        unsafe { pack(&info, args, bytes.as_mut_ptr()) };
        Ok((info.id, bytes))
    }

    /// Sends a launch whose `len` parameter bytes `fill` writes: a plain launch when it has
    /// no attributes, else one whose parameters follow its attributes.
    pub fn send_launch(
        &self,
        function: u64,
        shape: &LaunchShape,
        stream: u32,
        len: usize,
        fill: impl FnOnce(*mut u8),
    ) -> Cu<()> {
        let plain = shape.attributes == LaunchAttributes::default();
        let header = if plain {
            0
        } else {
            LAUNCH_ATTRIBUTES_BYTES as usize
        };
        self.transport
            .send_with_payload(
                header + len,
                false,
                |p| {
                    if !plain {
                        // SAFETY: the payload has `header + len` bytes of room.
                        unsafe {
                            std::ptr::copy_nonoverlapping(
                                shape.attributes.as_bytes().as_ptr(),
                                p.ptr,
                                header,
                            );
                        }
                    }
                    // SAFETY: as above, after the header.
                    fill(unsafe { p.ptr.add(header) });
                },
                |offset| {
                    let launch = ModuleLaunch {
                        function,
                        grid: shape.grid,
                        block: shape.block,
                        shared_mem_bytes: shape.shared_mem_bytes,
                        params_offset: offset,
                        params_len: (header + len) as u32,
                    };
                    if plain {
                        Command::LaunchModule { stream, launch }
                    } else {
                        Command::LaunchEx { stream, launch }
                    }
                },
                |_| (),
            )
            .map(drop)
    }
}

/// The attributes a `CUlaunchConfig` carries, as the broker takes them.
///
/// # Safety
/// `attrs` holds `n` attributes (or is NULL with `n` 0).
unsafe fn attributes(attrs: *const CUlaunchAttribute, n: u32) -> Cu<LaunchAttributes> {
    let mut out = LaunchAttributes::default();
    if n == 0 {
        return Ok(out);
    }
    if attrs.is_null() {
        return Err(result::INVALID_VALUE);
    }
    for i in 0..n as usize {
        // SAFETY: `i < n`, per the contract.
        let a = unsafe { *attrs.add(i) };
        match a.id {
            launch_attr::CLUSTER_DIMENSION => out.cluster = [a.value[0], a.value[1], a.value[2]],
            launch_attr::COOPERATIVE if a.value[0] != 0 => out.flags |= LAUNCH_COOPERATIVE,
            launch_attr::PROGRAMMATIC_STREAM_SERIALIZATION if a.value[0] != 0 => {
                out.flags |= LAUNCH_PROGRAMMATIC_SERIALIZATION
            }
            // Hints a driver may ignore without changing results.
            launch_attr::IGNORE
            | launch_attr::COOPERATIVE
            | launch_attr::PROGRAMMATIC_STREAM_SERIALIZATION
            | launch_attr::ACCESS_POLICY_WINDOW
            | launch_attr::SYNCHRONIZATION_POLICY
            | launch_attr::CLUSTER_SCHEDULING_POLICY_PREFERENCE
            | launch_attr::PRIORITY
            | launch_attr::MEM_SYNC_DOMAIN_MAP
            | launch_attr::MEM_SYNC_DOMAIN
            | launch_attr::PREFERRED_CLUSTER_DIMENSION
            | launch_attr::DEVICE_UPDATABLE_KERNEL_NODE
            | launch_attr::PREFERRED_SHARED_MEMORY_CARVEOUT => {}
            other => {
                crate::entry::say_unsupported(&format!(
                    "cuLaunchKernelEx with launch attribute {other}"
                ));
                return Err(result::NOT_SUPPORTED);
            }
        }
    }
    Ok(out)
}

#[allow(clippy::too_many_arguments)]
fn launch_kernel(
    f: CUfunction,
    grid: [c_uint; 3],
    block: [c_uint; 3],
    shared_mem_bytes: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
    per_thread: bool,
    flags: u32,
) -> Cu<()> {
    let d = crate::route::by_stream(stream)?;
    let s = d.stream(stream, per_thread)?;
    let shape = LaunchShape {
        grid,
        block,
        shared_mem_bytes,
        attributes: LaunchAttributes {
            flags,
            ..LaunchAttributes::default()
        },
    };
    // SAFETY: the program's arguments, per cuLaunchKernel's contract.
    unsafe { d.launch(f, &shape, s, params, extra) }
}

/// # Safety
/// CUDA's contract for `cuLaunchKernel`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernel(
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    entry("cuLaunchKernel", || {
        launch_kernel(
            f,
            [gx, gy, gz],
            [bx, by, bz],
            shared,
            stream,
            params,
            extra,
            false,
            0,
        )
    })
}

/// # Safety
/// CUDA's contract for `cuLaunchKernel`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernel_ptsz(
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    entry("cuLaunchKernel_ptsz", || {
        launch_kernel(
            f,
            [gx, gy, gz],
            [bx, by, bz],
            shared,
            stream,
            params,
            extra,
            true,
            0,
        )
    })
}

/// # Safety
/// CUDA's contract for `cuLaunchCooperativeKernel`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchCooperativeKernel(
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
) -> CUresult {
    entry("cuLaunchCooperativeKernel", || {
        launch_kernel(
            f,
            [gx, gy, gz],
            [bx, by, bz],
            shared,
            stream,
            params,
            std::ptr::null_mut(),
            false,
            LAUNCH_COOPERATIVE,
        )
    })
}

/// # Safety
/// CUDA's contract for `cuLaunchCooperativeKernel`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchCooperativeKernel_ptsz(
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
) -> CUresult {
    entry("cuLaunchCooperativeKernel_ptsz", || {
        launch_kernel(
            f,
            [gx, gy, gz],
            [bx, by, bz],
            shared,
            stream,
            params,
            std::ptr::null_mut(),
            true,
            LAUNCH_COOPERATIVE,
        )
    })
}

fn launch_ex(
    config: *const CUlaunchConfig,
    f: CUfunction,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
    per_thread: bool,
) -> Cu<()> {
    if config.is_null() {
        return Err(result::INVALID_VALUE);
    }
    // SAFETY: a valid config, per the contract.
    let c = unsafe { *config };
    let d = crate::route::by_stream(c.stream)?;
    // SAFETY: the config's attribute array, per the contract.
    let attributes = unsafe { attributes(c.attrs, c.num_attrs) }?;
    let s = d.stream(c.stream, per_thread)?;
    let shape = LaunchShape {
        grid: c.grid,
        block: c.block,
        shared_mem_bytes: c.shared_mem_bytes,
        attributes,
    };
    // SAFETY: the program's arguments, per the contract.
    unsafe { d.launch(f, &shape, s, params, extra) }
}

/// # Safety
/// CUDA's contract for `cuLaunchKernelEx`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernelEx(
    config: *const CUlaunchConfig,
    f: CUfunction,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    entry("cuLaunchKernelEx", || {
        launch_ex(config, f, params, extra, false)
    })
}

/// # Safety
/// CUDA's contract for `cuLaunchKernelEx`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernelEx_ptsz(
    config: *const CUlaunchConfig,
    f: CUfunction,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    entry("cuLaunchKernelEx_ptsz", || {
        launch_ex(config, f, params, extra, true)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(params: Vec<(u32, u32)>) -> FunctionInfo {
        FunctionInfo::from(gpushare_protocol::control::FunctionDetails {
            id: 1,
            params,
            attributes: vec![],
        })
    }

    #[test]
    fn arguments_are_packed_at_their_offsets() {
        let f = info(vec![(0, 8), (8, 4), (16, 8)]);
        let (mut a, mut b, mut c) = (0x1122_3344_5566_7788u64, 0xaabb_ccddu32, 7u64);
        let mut ptrs = [
            (&mut a as *mut u64).cast::<c_void>(),
            (&mut b as *mut u32).cast(),
            (&mut c as *mut u64).cast(),
        ];
        // SAFETY: one pointer per parameter.
        let (found, len) =
            unsafe { args(&f, ptrs.as_mut_ptr(), std::ptr::null_mut()) }.expect("args");
        assert_eq!(len, 24);
        let mut out = vec![0u8; len];
        // SAFETY: `out` has `len` bytes.
        unsafe { pack(&f, found, out.as_mut_ptr()) };
        assert_eq!(&out[0..8], &a.to_le_bytes());
        assert_eq!(&out[8..12], &b.to_le_bytes());
        assert_eq!(&out[16..24], &c.to_le_bytes());
    }

    #[test]
    fn a_packed_buffer_comes_through_extra() {
        let f = info(vec![(0, 4)]);
        let buf = [9u8, 8, 7, 6];
        let mut size = buf.len();
        let mut extra = [
            launch_param::BUFFER_POINTER as *mut c_void,
            buf.as_ptr() as *mut c_void,
            launch_param::BUFFER_SIZE as *mut c_void,
            (&mut size as *mut usize).cast(),
            launch_param::END as *mut c_void,
        ];
        // SAFETY: a terminated list.
        let (a, len) = unsafe { args(&f, std::ptr::null_mut(), extra.as_mut_ptr()) }.expect("args");
        let mut out = vec![0u8; len];
        // SAFETY: `out` has `len` bytes.
        unsafe { pack(&f, a, out.as_mut_ptr()) };
        assert_eq!(out, buf);
        // No arguments at all, for a function that takes some: refused.
        // SAFETY: NULL lists.
        assert!(unsafe { args(&f, std::ptr::null_mut(), std::ptr::null_mut()) }.is_err());
    }

    #[test]
    fn launch_attributes_are_read_and_unknown_ones_refused() {
        let mut cluster = CUlaunchAttribute {
            id: launch_attr::CLUSTER_DIMENSION,
            pad: [0; 4],
            value: [0; 16],
        };
        cluster.value[..3].copy_from_slice(&[2, 1, 1]);
        let mut pdl = CUlaunchAttribute {
            id: launch_attr::PROGRAMMATIC_STREAM_SERIALIZATION,
            pad: [0; 4],
            value: [0; 16],
        };
        pdl.value[0] = 1;
        let list = [cluster, pdl];
        // SAFETY: two attributes.
        let a = unsafe { attributes(list.as_ptr(), 2) }.expect("known");
        assert_eq!(a.cluster, [2, 1, 1]);
        assert_eq!(a.flags, LAUNCH_PROGRAMMATIC_SERIALIZATION);
        let event = CUlaunchAttribute {
            id: launch_attr::LAUNCH_COMPLETION_EVENT,
            pad: [0; 4],
            value: [0; 16],
        };
        // SAFETY: one attribute.
        let refused = unsafe { attributes(&event, 1) }.err();
        assert_eq!(refused, Some(result::NOT_SUPPORTED));
    }
}

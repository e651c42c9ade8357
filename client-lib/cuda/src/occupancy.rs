//! Occupancy queries: answered by the broker's driver (which knows the function's resources
//! on the real device) once per distinct question, then from a cache.

use std::ffi::{c_int, c_uint};

use gpushare_protocol::Command;
use gpushare_protocol::command::OccupancyQuery;

use crate::driver::{self, Driver};
use crate::memo::Memo;
use crate::status::{Cu, entry, out};
use crate::types::{CUfunction, CUlaunchConfig, CUresult, result};

type Key = (u64, u8, u32, u64, u32, [u32; 3]);

pub type Cache = Memo<Key, u64>;

impl Driver {
    fn occupancy(
        &self,
        f: CUfunction,
        query: OccupancyQuery,
        block_size: u32,
        dynamic_smem: u64,
        flags: u32,
        cluster: [u32; 3],
    ) -> Cu<u64> {
        let info = self.info(self.kernel(f)?)?;
        let key = (
            info.id,
            query as u8,
            block_size,
            dynamic_smem,
            flags,
            cluster,
        );
        self.occupancy.answer(key, |_| {
            let (v, _) = self.transport.call(Command::Occupancy {
                function: info.id,
                query,
                block_size,
                dynamic_smem,
                flags,
                cluster,
            })?;
            Ok(v)
        })
    }
}

fn blocks(n: *mut c_int, f: CUfunction, block_size: c_int, smem: usize, flags: c_uint) -> Cu<()> {
    let d = driver::live()?;
    let block = u32::try_from(block_size).map_err(|_| result::INVALID_VALUE)?;
    let v = d.occupancy(
        f,
        OccupancyQuery::BlocksPerSm,
        block,
        smem as u64,
        flags,
        [0; 3],
    )?;
    // SAFETY: the caller's contract.
    unsafe { out(n, v as c_int) }
}

/// # Safety
/// `n` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuOccupancyMaxActiveBlocksPerMultiprocessor(
    n: *mut c_int,
    f: CUfunction,
    block_size: c_int,
    smem: usize,
) -> CUresult {
    entry("cuOccupancyMaxActiveBlocksPerMultiprocessor", || {
        blocks(n, f, block_size, smem, 0)
    })
}

/// # Safety
/// `n` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
    n: *mut c_int,
    f: CUfunction,
    block_size: c_int,
    smem: usize,
    flags: c_uint,
) -> CUresult {
    entry(
        "cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags",
        || blocks(n, f, block_size, smem, flags),
    )
}

/// # Safety
/// `smem` is NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuOccupancyAvailableDynamicSMemPerBlock(
    smem: *mut usize,
    f: CUfunction,
    num_blocks: c_int,
    block_size: c_int,
) -> CUresult {
    entry("cuOccupancyAvailableDynamicSMemPerBlock", || {
        let d = driver::live()?;
        let (blocks, block) = (
            u32::try_from(num_blocks).map_err(|_| result::INVALID_VALUE)?,
            u32::try_from(block_size).map_err(|_| result::INVALID_VALUE)?,
        );
        // The block count rides in `dynamic_smem`'s place (see OccupancyQuery).
        let v = d.occupancy(
            f,
            OccupancyQuery::DynamicSmemPerBlock,
            block,
            blocks as u64,
            0,
            [0; 3],
        )?;
        // SAFETY: the caller's contract.
        unsafe { out(smem, v as usize) }
    })
}

/// # Safety
/// `n` is NULL or valid for writing; `config` is a valid launch configuration.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuOccupancyMaxActiveClusters(
    n: *mut c_int,
    f: CUfunction,
    config: *const CUlaunchConfig,
) -> CUresult {
    entry("cuOccupancyMaxActiveClusters", || {
        let d = driver::live()?;
        if config.is_null() {
            return Err(result::INVALID_VALUE);
        }
        // SAFETY: valid, per the contract.
        let c = unsafe { *config };
        let mut cluster = [0; 3];
        if !c.attrs.is_null() {
            for i in 0..c.num_attrs as usize {
                // SAFETY: `i < num_attrs`.
                let a = unsafe { *c.attrs.add(i) };
                if a.id == crate::types::launch_attr::CLUSTER_DIMENSION {
                    cluster = [a.value[0], a.value[1], a.value[2]];
                }
            }
        }
        let block = c.block[0]
            .saturating_mul(c.block[1])
            .saturating_mul(c.block[2]);
        let v = d.occupancy(
            f,
            OccupancyQuery::MaxActiveClusters,
            block,
            c.shared_mem_bytes as u64,
            0,
            cluster,
        )?;
        // SAFETY: the caller's contract.
        unsafe { out(n, v as c_int) }
    })
}

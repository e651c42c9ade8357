//! Launches of a client's module functions: how a launch travels in six argument words, the
//! attributes a `LaunchEx` carries before its parameters, and occupancy queries.

use super::{hi, lo, pack};
use crate::ErrorCode;

/// Largest parameter block a module launch may carry (CUDA's own limit is 32 KiB).
pub const MAX_LAUNCH_PARAMS: u32 = 32 * 1024;

/// Launch attributes a [`Command::LaunchEx`] carries at the start of its parameter block, in
/// the arena (the kernel's packed parameters follow it).
///
/// [`Command::LaunchEx`]: super::Command::LaunchEx
#[repr(C)]
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    serde::Serialize,
    serde::Deserialize,
    zerocopy::FromBytes,
    zerocopy::IntoBytes,
    zerocopy::Immutable,
    zerocopy::KnownLayout,
)]
pub struct LaunchAttributes {
    /// Thread-block cluster dimensions; all zero for no clusters.
    pub cluster: [u32; 3],
    /// [`LAUNCH_COOPERATIVE`], [`LAUNCH_PROGRAMMATIC_SERIALIZATION`].
    pub flags: u32,
    pub _reserved: [u32; 4],
}

/// The launch is cooperative (its blocks may synchronize grid-wide).
pub const LAUNCH_COOPERATIVE: u32 = 1;
/// Programmatic dependent launch: the kernel may start before the previous one on its stream
/// finishes (it waits where its code says).
pub const LAUNCH_PROGRAMMATIC_SERIALIZATION: u32 = 2;
/// Bytes of [`LaunchAttributes`] before the parameters of a [`Command::LaunchEx`].
///
/// [`Command::LaunchEx`]: super::Command::LaunchEx
pub const LAUNCH_ATTRIBUTES_BYTES: u32 = std::mem::size_of::<LaunchAttributes>() as u32;
const _: () = assert!(LAUNCH_ATTRIBUTES_BYTES == 32);

/// What an [`Command::Occupancy`] asks.
///
/// [`Command::Occupancy`]: super::Command::Occupancy
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum OccupancyQuery {
    /// `cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags`.
    BlocksPerSm,
    /// `cuOccupancyAvailableDynamicSMemPerBlock` (the block size is `num_blocks` here).
    DynamicSmemPerBlock,
    /// `cuOccupancyMaxActiveClusters` (cluster dimensions are the launch's).
    MaxActiveClusters,
}

impl OccupancyQuery {
    pub(super) fn code(self) -> u64 {
        match self {
            OccupancyQuery::BlocksPerSm => 0,
            OccupancyQuery::DynamicSmemPerBlock => 1,
            OccupancyQuery::MaxActiveClusters => 2,
        }
    }

    pub(super) fn from_code(code: u64) -> Option<OccupancyQuery> {
        Some(match code {
            0 => OccupancyQuery::BlocksPerSm,
            1 => OccupancyQuery::DynamicSmemPerBlock,
            2 => OccupancyQuery::MaxActiveClusters,
            _ => return None,
        })
    }
}

/// A launch of a function from a module the client loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ModuleLaunch {
    pub function: u64,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem_bytes: u32,
    /// Packed kernel parameters live in the data arena at this offset.
    pub params_offset: u64,
    pub params_len: u32,
}

/// Whether a launch's shape is one CUDA accepts on every GPU since compute capability 3.0:
/// no dimension zero, at most 1,024 threads a block (1,024 × 1,024 × 64 by dimension), and
/// at most (2^31 − 1) × 65,535 × 65,535 blocks.
pub fn shape_is_valid(grid: [u32; 3], block: [u32; 3]) -> bool {
    const MAX_BLOCK: [u32; 3] = [1024, 1024, 64];
    const MAX_GRID: [u32; 3] = [i32::MAX as u32, 65_535, 65_535];
    const MAX_THREADS: u64 = 1024;
    let within =
        |dims: [u32; 3], max: [u32; 3]| dims.iter().zip(max).all(|(&d, m)| d >= 1 && d <= m);
    within(grid, MAX_GRID)
        && within(block, MAX_BLOCK)
        && block.iter().map(|&b| u64::from(b)).product::<u64>() <= MAX_THREADS
}

/// The six argument words of a module launch.
pub(super) fn launch_words(launch: &ModuleLaunch) -> [u64; 6] {
    [
        launch.function,
        pack(launch.grid[0], launch.grid[1]),
        pack(launch.grid[2], launch.block[0]),
        pack(launch.block[1], launch.block[2]),
        pack(launch.shared_mem_bytes, launch.params_len),
        launch.params_offset,
    ]
}

/// A module launch from its argument words; its parameter block holds at least `header`
/// bytes before the kernel's parameters.
pub(super) fn launch_of(a: &[u64; 6], header: u32) -> Result<ModuleLaunch, ErrorCode> {
    let launch = ModuleLaunch {
        function: a[0],
        grid: [lo(a[1]), hi(a[1]), lo(a[2])],
        block: [hi(a[2]), lo(a[3]), hi(a[3])],
        shared_mem_bytes: lo(a[4]),
        params_len: hi(a[4]),
        params_offset: a[5],
    };
    if launch.params_len > MAX_LAUNCH_PARAMS + header
        || launch.params_len < header
        || !shape_is_valid(launch.grid, launch.block)
    {
        return Err(ErrorCode::InvalidArgument);
    }
    Ok(launch)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launch(params_len: u32) -> ModuleLaunch {
        ModuleLaunch {
            function: 0xf00d,
            grid: [7, 1, 3],
            block: [128, 2, 1],
            shared_mem_bytes: 4096,
            params_offset: 0x40,
            params_len,
        }
    }

    #[test]
    fn a_launch_travels_in_six_words_and_comes_back_whole() {
        let l = launch(24);
        assert_eq!(launch_of(&launch_words(&l), 0), Ok(l));
        let ex = launch(LAUNCH_ATTRIBUTES_BYTES + 8);
        assert_eq!(
            launch_of(&launch_words(&ex), LAUNCH_ATTRIBUTES_BYTES),
            Ok(ex)
        );
    }

    #[test]
    fn impossible_launches_are_refused() {
        let refused = |l: ModuleLaunch, header| {
            launch_of(&launch_words(&l), header) == Err(ErrorCode::InvalidArgument)
        };
        assert!(refused(launch(MAX_LAUNCH_PARAMS + 1), 0));
        assert!(!refused(launch(MAX_LAUNCH_PARAMS), 0));
        // A LaunchEx's block must hold its attributes.
        assert!(refused(
            launch(LAUNCH_ATTRIBUTES_BYTES - 1),
            LAUNCH_ATTRIBUTES_BYTES
        ));
        let mut empty_grid = launch(0);
        empty_grid.grid[1] = 0;
        assert!(refused(empty_grid, 0));
        let mut empty_block = launch(0);
        empty_block.block[2] = 0;
        assert!(refused(empty_block, 0));
    }

    #[test]
    fn launch_shapes_are_bounded_as_cuda_bounds_them() {
        assert!(shape_is_valid(
            [i32::MAX as u32, 65_535, 65_535],
            [1024, 1, 1]
        ));
        assert!(shape_is_valid([1, 1, 1], [1, 1, 64]));
        assert!(shape_is_valid([1, 1, 1], [32, 32, 1]));
        for (grid, block) in [
            ([1u32 << 31, 1, 1], [1, 1, 1]),
            ([1, 65_536, 1], [1, 1, 1]),
            ([1, 1, 65_536], [1, 1, 1]),
            ([1, 1, 1], [1025, 1, 1]),
            ([1, 1, 1], [1, 1, 65]),
            ([1, 1, 1], [32, 32, 2]),
            ([1, 1, 1], [u32::MAX, u32::MAX, u32::MAX]),
            ([0, 1, 1], [1, 1, 1]),
            ([1, 1, 1], [1, 0, 1]),
        ] {
            assert!(!shape_is_valid(grid, block), "{grid:?} {block:?}");
            let mut l = launch(0);
            (l.grid, l.block) = (grid, block);
            assert_eq!(
                launch_of(&launch_words(&l), 0),
                Err(ErrorCode::InvalidArgument)
            );
        }
    }

    #[test]
    fn occupancy_queries_have_stable_codes() {
        for (query, code) in [
            (OccupancyQuery::BlocksPerSm, 0),
            (OccupancyQuery::DynamicSmemPerBlock, 1),
            (OccupancyQuery::MaxActiveClusters, 2),
        ] {
            assert_eq!(query.code(), code);
            assert_eq!(OccupancyQuery::from_code(code), Some(query));
        }
        assert_eq!(OccupancyQuery::from_code(3), None);
    }
}

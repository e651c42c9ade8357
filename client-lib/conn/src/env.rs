//! The environment a launcher (`gpushare run`) hands to the programs it starts, and that the
//! client kinds inside those programs read: one list, so that both sides spell it alike.

/// The program's priority class (`high`, `normal`, `best-effort`); it may only ask for less
/// than its policy grants.
pub const CLASS_ENV: &str = "GPUSHARE_CLASS";
/// The name `gpushare status` shows for the program.
pub const NAME_ENV: &str = "GPUSHARE_NAME";
/// The GPU index the program asks to run on.
pub const GPU_ENV: &str = "GPUSHARE_GPU";
/// A fair-share weight below the one the policy grants.
pub const WEIGHT_ENV: &str = "GPUSHARE_WEIGHT";
/// Where the real libcuda is, for the governed interposer (default: `libcuda.so.1`).
pub const REAL_LIBCUDA_ENV: &str = "GPUSHARE_REAL_LIBCUDA";
/// gpushare's CUDA driver for consolidated clients (a `libcuda.so.1`): the audit library
/// that `gpushare run` puts in `LD_AUDIT` sends every search for libcuda there.
pub const CUDA_DRIVER_ENV: &str = "GPUSHARE_CUDA_DRIVER";
/// `1`: the governed interposer tells on stderr how the program reaches it.
pub const INTERPOSE_DEBUG_ENV: &str = "GPUSHARE_INTERPOSE_DEBUG";
/// Where `gpushare run` finds the interposer when `--interposer` is not given.
pub const INTERPOSER_ENV: &str = "GPUSHARE_INTERPOSER";
/// The consolidated CUDA driver's diagnostics: 1 names every failing call, 2 every call.
pub const CUDA_TRACE_ENV: &str = "GPUSHARE_CUDA_TRACE";

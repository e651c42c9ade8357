//! The environment a launcher (`gpushare run`) hands to the programs it starts, and that the
//! client kinds inside those programs read: one list, so that both sides spell it alike.

/// The program's priority class (`high`, `normal`, `best-effort`); it may only ask for less
/// than its policy grants.
pub const CLASS_ENV: &str = "GPUSHARE_CLASS";
/// The name `gpushare status` shows for the program.
pub const NAME_ENV: &str = "GPUSHARE_NAME";
/// The GPU index the program asks to run on.
pub const GPU_ENV: &str = "GPUSHARE_GPU";
/// gpushared's indices of the GPUs a program of several sees, in its device order
/// (`gpushare run --gpus N`); each of its processes runs its work on one of them.
pub const GPUS_ENV: &str = "GPUSHARE_GPUS";
/// The UUIDs of the GPUs the program runs on, in its device order: gpushare's NVML
/// (`libnvidia-ml.so.1` beside its CUDA driver) shows only these.
pub const GPU_UUIDS_ENV: &str = "GPUSHARE_GPU_UUIDS";
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
/// Seconds a call waits for gpushared without a sign of life (an answer, a completion, a
/// reply to a ping) before it fails: a stopped or wedged broker is reported, never waited on
/// forever. [`DEFAULT_TIMEOUT`] when unset.
pub const TIMEOUT_ENV: &str = "GPUSHARE_TIMEOUT";
/// `direct`: a governed program that cannot reach gpushared runs unmanaged, outside gpushare
/// (`gpushare run --fallback direct`). Anything else, or unset: it never does; its `cuInit`
/// fails without a broker, and while a broker it had is away its launches and allocations
/// wait for it (up to [`RECONNECT_ENV`]) and then fail.
pub const FALLBACK_ENV: &str = "GPUSHARE_FALLBACK";
/// Seconds a governed program waits for gpushared to come back after losing it (a restart, a
/// crash, no answer) before its calls fail. [`DEFAULT_TIMEOUT`] when unset; `0` fails at once.
pub const RECONNECT_ENV: &str = "GPUSHARE_RECONNECT_TIMEOUT";

/// Microseconds a wait for a completion spins before it sleeps, whatever the client or its
/// class would choose (for measurements).
pub const SPIN_ENV: &str = "GPUSHARE_SPIN_US";

/// How long a call waits for gpushared unless [`TIMEOUT_ENV`] says otherwise.
pub const DEFAULT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// A number of seconds from the environment variable `name` (fractions allowed), or
/// `default` when it is unset or not a number.
pub fn seconds(name: &str, default: std::time::Duration) -> std::time::Duration {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .and_then(|s| std::time::Duration::try_from_secs_f64(s).ok())
        .unwrap_or(default)
}

/// How long a call waits for gpushared without a sign of life: [`TIMEOUT_ENV`], else
/// [`DEFAULT_TIMEOUT`]. Never zero (a call could not even be answered).
pub fn broker_timeout() -> std::time::Duration {
    seconds(TIMEOUT_ENV, DEFAULT_TIMEOUT).max(std::time::Duration::from_millis(10))
}

/// How long a wait for a completion spins: [`SPIN_ENV`] if set, else `default`.
pub fn spin(default: std::time::Duration) -> std::time::Duration {
    std::env::var(SPIN_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(default, std::time::Duration::from_micros)
}

/// Whether a governed program may run unmanaged when gpushared cannot be reached.
pub fn fallback_direct() -> bool {
    std::env::var(FALLBACK_ENV).is_ok_and(|v| v.trim() == "direct")
}

/// Whether a `CUDA_VISIBLE_DEVICES` value leaves CUDA no device: empty, or its first entry is
/// no device at all (`-1`, `NoDevFiles`: CUDA stops at the first entry it cannot take). A
/// program run so uses no GPU, under gpushare as without it.
pub fn hides_every_gpu(value: &str) -> bool {
    let first = value.split(',').next().unwrap_or_default().trim();
    let uuid = |prefix: &str| first.len() > 4 && first[..4].eq_ignore_ascii_case(prefix);
    first.is_empty() || !(first.parse::<u32>().is_ok() || uuid("GPU-") || uuid("MIG-"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn seconds_read_fractions_and_fall_back_on_nonsense() {
        let name = "GPUSHARE_TEST_SECONDS_ONLY_HERE";
        let default = Duration::from_secs(7);
        for (value, want) in [
            (None, default),
            (Some("2.5"), Duration::from_millis(2500)),
            (Some(" 0 "), Duration::ZERO),
            (Some("-1"), default),
            (Some("soon"), default),
            (Some("inf"), default),
        ] {
            // SAFETY: no other test reads this variable.
            unsafe {
                match value {
                    Some(v) => std::env::set_var(name, v),
                    None => std::env::remove_var(name),
                }
            }
            assert_eq!(seconds(name, default), want, "{value:?}");
        }
        // SAFETY: as above.
        unsafe { std::env::remove_var(name) };
    }

    #[test]
    fn visible_devices_that_name_no_device_hide_every_gpu() {
        for hidden in ["", " ", "-1", "NoDevFiles", "-1,0", ",0", "none"] {
            assert!(hides_every_gpu(hidden), "{hidden:?}");
        }
        for shown in ["0", "1,0", " 2 ", "GPU-fef8089b", "MIG-1234"] {
            assert!(!hides_every_gpu(shown), "{shown:?}");
        }
    }
}

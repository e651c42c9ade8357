//! Which GPUs the program may see (`$GPUSHARE_GPU_UUIDS`), the real NVML handles they resolved
//! to, and the list operations the filtered functions (`shim.rs`) share.

use std::sync::{Mutex, OnceLock, PoisonError};

/// Environment variable listing the GPUs the program may see: NVML UUIDs, comma-separated,
/// in the program's order. Unset or empty: no filtering.
pub const GPU_UUIDS_ENV: &str = "GPUSHARE_GPU_UUIDS";

/// A real NVML device handle, as an address.
pub type Handle = usize;

/// The UUIDs of `value`, in order, each once; blanks around them and empty items dropped.
pub fn parse_uuids(value: &str) -> Vec<String> {
    let mut uuids: Vec<String> = Vec::new();
    for uuid in value.split(',').map(str::trim).filter(|u| !u.is_empty()) {
        if !uuids.iter().any(|u| u == uuid) {
            uuids.push(uuid.to_string());
        }
    }
    uuids
}

static REQUESTED: OnceLock<Option<Vec<String>>> = OnceLock::new();

/// The GPUs the program may see, read once from the environment (at its first NVML call);
/// `None`: every call passes straight through.
pub fn requested() -> Option<&'static [String]> {
    REQUESTED
        .get_or_init(|| {
            let value = std::env::var_os(GPU_UUIDS_ENV)?
                .to_string_lossy()
                .into_owned();
            let visible =
                std::env::var_os("CUDA_VISIBLE_DEVICES").map(|v| v.to_string_lossy().into_owned());
            if !placement_holds(&value, visible.as_deref()) {
                return None;
            }
            let uuids = parse_uuids(&value);
            (!uuids.is_empty()).then_some(uuids)
        })
        .as_deref()
}

/// Whether the program still runs where `gpushare run` placed it: `CUDA_VISIBLE_DEVICES` is
/// what it set (the UUIDs), or unset. A program that named other devices there since (an index,
/// as scripts that pick their GPU do) gets NVML as NVIDIA's shows it, every GPU, against which
/// CUDA_VISIBLE_DEVICES-aware programs (PyTorch's device count) map its entries; gpushare's
/// CUDA driver follows the same entry.
pub fn placement_holds(uuids: &str, visible: Option<&str>) -> bool {
    match visible.map(str::trim) {
        None | Some("") => true,
        Some(v) => v == uuids.trim(),
    }
}

/// The handles the requested UUIDs resolved to, in the program's order (NVML index = position);
/// `None` until NVML was initialized through the shim.
static RESOLVED: Mutex<Option<Vec<Handle>>> = Mutex::new(None);

/// The handles the UUIDs last resolved to.
pub fn resolved() -> Option<Vec<Handle>> {
    RESOLVED
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
}

/// Records what the UUIDs resolve to now (at every successful `nvmlInit`).
pub fn set_resolved(handles: Vec<Handle>) {
    *RESOLVED.lock().unwrap_or_else(PoisonError::into_inner) = Some(handles);
}

/// The handles of `found` that are visible, in the visible order (NVML lists a set of GPUs
/// in index order).
pub fn keep_visible(found: &[Handle], visible: &[Handle]) -> Vec<Handle> {
    visible
        .iter()
        .copied()
        .filter(|h| found.contains(h))
        .collect()
}

/// How a function returning a set of handles treats the caller's count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CountRule {
    /// A count of 0 asks for the size; any other is the array's room, filled with as many
    /// as fit (`nvmlDeviceGetTopologyNearestGpus`, `nvmlSystemGetTopologyGpuSet`).
    ZeroAsksSize,
    /// The count is the array's room; too little room is NVML_ERROR_INSUFFICIENT_SIZE with
    /// the size needed (`nvmlUnitGetDevices`).
    RoomOrTooSmall,
}

/// What to answer a caller with `room` for a set of `len` handles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// Set the count to this; write nothing; success.
    Size(usize),
    /// Write the first this-many handles and set the count to it; success.
    Fill(usize),
    /// Set the count to this (the size needed); NVML_ERROR_INSUFFICIENT_SIZE.
    TooSmall(usize),
}

/// The answer for a set of `len` handles and a caller's `room`, under `rule`.
pub fn answer(rule: CountRule, len: usize, room: u32) -> Answer {
    let room = usize::try_from(room).unwrap_or(usize::MAX);
    match rule {
        CountRule::ZeroAsksSize if room == 0 => Answer::Size(len),
        CountRule::ZeroAsksSize => Answer::Fill(len.min(room)),
        CountRule::RoomOrTooSmall if room < len => Answer::TooSmall(len),
        CountRule::RoomOrTooSmall => Answer::Fill(len),
    }
}

/// A length as NVML's `unsigned int` count.
pub fn count(len: usize) -> u32 {
    u32::try_from(len).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_program_that_names_other_devices_gets_every_gpu() {
        let uuid = "GPU-00000000-0000-0000-0000-000000000002";
        assert!(super::placement_holds(uuid, None));
        assert!(super::placement_holds(uuid, Some(uuid)));
        assert!(super::placement_holds(uuid, Some("")));
        assert!(!super::placement_holds(uuid, Some("1")));
        assert!(!super::placement_holds(
            uuid,
            Some("GPU-00000000-0000-0000-0000-000000000001")
        ));
    }
    use super::*;

    #[test]
    fn uuids_are_split_trimmed_and_kept_once_in_order() {
        assert_eq!(
            parse_uuids(" GPU-c , ,GPU-a,GPU-c,, GPU-b "),
            ["GPU-c", "GPU-a", "GPU-b"]
        );
        assert!(parse_uuids("").is_empty());
        assert!(parse_uuids(" , ,").is_empty());
        assert_eq!(parse_uuids("GPU-x"), ["GPU-x"]);
    }

    #[test]
    fn only_visible_handles_are_kept_in_the_visible_order() {
        assert_eq!(keep_visible(&[1, 2, 3, 4], &[3, 1]), [3, 1]);
        assert_eq!(keep_visible(&[2, 3], &[3, 1]), [3]);
        assert!(keep_visible(&[1, 2], &[]).is_empty());
        assert!(keep_visible(&[], &[1]).is_empty());
    }

    #[test]
    fn a_zero_count_asks_the_size_and_a_small_one_gets_what_fits() {
        use Answer::*;
        let rule = CountRule::ZeroAsksSize;
        assert_eq!(answer(rule, 3, 0), Size(3));
        assert_eq!(answer(rule, 0, 0), Size(0));
        assert_eq!(answer(rule, 3, 2), Fill(2));
        assert_eq!(answer(rule, 3, 8), Fill(3));
        assert_eq!(answer(rule, 0, 8), Fill(0));
    }

    #[test]
    fn a_unit_count_too_small_is_told_the_size() {
        use Answer::*;
        let rule = CountRule::RoomOrTooSmall;
        assert_eq!(answer(rule, 3, 2), TooSmall(3));
        assert_eq!(answer(rule, 3, 0), TooSmall(3));
        assert_eq!(answer(rule, 3, 3), Fill(3));
        assert_eq!(answer(rule, 0, 0), Fill(0));
    }
}

//! `libnvidia-ml.so.1` for consolidated clients: an NVML shim that forwards every NVML call to
//! NVIDIA's NVML, but shows only the GPUs the program may use, in the program's order, with
//! indices remapped — what a container holding only those GPUs' device nodes would show.
//!
//! A consolidated program sees one GPU through gpushare's CUDA driver; NVML alone would still
//! show every GPU of the machine, and PyTorch (which counts devices with NVML before CUDA
//! starts), nvidia-smi, pynvml and JAX would disagree with the driver.
//!
//! The environment:
//! - `GPUSHARE_GPU_UUIDS`: NVML UUIDs, comma-separated, of the GPUs the program may see; the
//!   first is NVML index 0. Unset or empty: every call passes straight through; so too when
//!   `CUDA_VISIBLE_DEVICES` holds something else (the program named its own GPU).
//! - `GPUSHARE_REAL_NVML`: the path of NVIDIA's library. Unset: it is searched for
//!   ([`real`]). Without one, every call returns NVML_ERROR_LIBRARY_NOT_FOUND (12) and the
//!   shim says why on stderr, once.
//!
//! Filtered, with `GPUSHARE_GPU_UUIDS` set ([`shim`]): `nvmlInit`, `nvmlInit_v2`,
//! `nvmlInitWithFlags` (look the UUIDs up after a successful init; a UUID NVML does not know
//! is dropped, said once); `nvmlDeviceGetCount(_v2)`; `nvmlDeviceGetHandleByIndex(_v2)`;
//! `nvmlDeviceGetHandleByUUID`, `…ByUUIDV`, `…ByPciBusId(_v2)`, `…BySerial` (a GPU not
//! visible is NVML_ERROR_NOT_FOUND); `nvmlDeviceGetIndex`; and the functions returning sets of
//! GPUs, `nvmlDeviceGetTopologyNearestGpus`, `nvmlSystemGetTopologyGpuSet`,
//! `nvmlUnitGetDevices` (only visible GPUs kept). A MIG device counts as visible when its GPU
//! is. Everything else, whatever its signature, goes to the real function through a
//! trampoline ([`table`]).
//!
//! Not filtered: calls that name a GPU by something other than a handle (the PCI-info
//! functions `nvmlDeviceQueryDrainState`, `nvmlDeviceModifyDrainState`, `nvmlDeviceRemoveGpu`,
//! `nvmlDeviceDiscoverGpus`; system events, which carry a PCI id), the driver's list of
//! excluded GPUs (`nvmlGetExcludedDevice*`), and what a handle's own queries reveal of other
//! GPUs (NVLink remote PCI info, P2P status): as in a container.
//!
//! - [`table`]: the jump table, its trampolines (generated from `symbols.txt` by build.rs) and
//!   the first call's resolver.
//! - [`real`]: finding and opening NVIDIA's library.
//! - [`visible`]: the UUID list, the handles it resolved to, the list rules.
//! - [`shim`]: the functions the shim implements.
//! - [`ret`]: NVML's return codes and their words.

pub mod real;
pub mod ret;
pub mod shim;
pub mod table;
pub mod visible;

use std::io::Write;

/// Marks this library as gpushare's shim, so that it never forwards to itself (or a copy).
#[unsafe(no_mangle)]
#[used]
pub static gpushare_nvml_shim: u8 = 1;

/// One line on stderr, `gpushare: ` first.
pub(crate) fn note(line: &str) {
    let _ = std::io::stderr()
        .lock()
        .write_all(format!("gpushare: {line}\n").as_bytes());
}

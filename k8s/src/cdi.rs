//! What a container gets, through the Container Device Interface: the allocation's socket
//! directory mounted where gpushare's clients look for the socket, gpushare's libraries
//! mounted where they are on this machine, and the environment that makes every CUDA program
//! in it consolidated (as `gpushare run` does). One spec file per allocation, written before
//! `Allocate` answers and removed when the allocation ends.

use std::path::{Path, PathBuf};

use gpushare_conn::env::{CUDA_DRIVER_ENV, GPU_UUIDS_ENV};
use gpushare_protocol::SOCKET_ENV;
use gpushare_protocol::job::POD_SOCKET_NAME;
use serde_json::json;

/// Where the container finds the allocation's socket directory: gpushare's default, so that
/// `gpushare status` in the container needs no setting.
pub const CONTAINER_SOCKET_DIR: &str = "/run/gpushare";
/// The CDI spec version written (0.6.0: the first with spec-level annotations).
pub const CDI_VERSION: &str = "0.6.0";
/// The audit library and the driver's directory in gpushare's library directory.
const AUDIT: &str = "libgpushare_audit.so";
const DRIVER: &str = "cuda/libcuda.so.1";

/// One bind mount into the container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    pub host_path: PathBuf,
    pub container_path: PathBuf,
    pub read_only: bool,
}

/// What a container holding one allocation gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edits {
    pub env: Vec<(String, String)>,
    pub mounts: Vec<Mount>,
}

/// The edits for an allocation whose socket directory is `socket_dir` on this machine, with
/// gpushare's libraries in `lib_dir`, whose programs run on the GPU of UUID `gpu_uuid` (where
/// known: NVML and `CUDA_VISIBLE_DEVICES` then show them only that GPU, as their CUDA driver
/// does). `LD_LIBRARY_PATH` is left alone (the image's own would be replaced, not extended):
/// the audit library sends every search for libcuda, by soname or by path, to gpushare's
/// driver, and every search for NVML by soname to gpushare's.
pub fn edits(socket_dir: &Path, lib_dir: &Path, gpu_uuid: Option<&str>) -> Edits {
    let socket = Path::new(CONTAINER_SOCKET_DIR).join(POD_SOCKET_NAME);
    let placed = gpu_uuid.into_iter().flat_map(|uuid| {
        [
            (GPU_UUIDS_ENV.to_string(), uuid.to_string()),
            ("CUDA_VISIBLE_DEVICES".to_string(), uuid.to_string()),
        ]
    });
    Edits {
        env: vec![
            (SOCKET_ENV.into(), socket.display().to_string()),
            ("LD_AUDIT".into(), lib_dir.join(AUDIT).display().to_string()),
            (
                CUDA_DRIVER_ENV.into(),
                lib_dir.join(DRIVER).display().to_string(),
            ),
        ]
        .into_iter()
        .chain(placed)
        .collect(),
        mounts: vec![
            Mount {
                host_path: socket_dir.into(),
                container_path: CONTAINER_SOCKET_DIR.into(),
                read_only: false,
            },
            Mount {
                host_path: lib_dir.into(),
                container_path: lib_dir.into(),
                read_only: true,
            },
        ],
    }
}

/// The fully qualified CDI device name of allocation `job`, as `Allocate` answers it.
pub fn device_name(kind: &str, job: u64) -> String {
    format!("{kind}={job}")
}

/// The spec file of allocation `job` in `cdi_dir`.
pub fn spec_path(cdi_dir: &Path, kind: &str, job: u64) -> PathBuf {
    cdi_dir.join(format!("{}-{job}.json", kind.replace('/', "-")))
}

/// The CDI spec of allocation `job` (of the kubelet's `devices`).
pub fn spec(kind: &str, job: u64, devices: &[String], edits: &Edits) -> serde_json::Value {
    let env: Vec<String> = edits.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let mounts: Vec<serde_json::Value> = edits
        .mounts
        .iter()
        .map(|m| {
            json!({
                "hostPath": m.host_path,
                "containerPath": m.container_path,
                "options": ["rbind", if m.read_only { "ro" } else { "rw" }],
            })
        })
        .collect();
    json!({
        "cdiVersion": CDI_VERSION,
        "kind": kind,
        "annotations": {
            "gpushare.io/job": job.to_string(),
            "gpushare.io/devices": devices.join(","),
        },
        "devices": [{
            "name": job.to_string(),
            "containerEdits": { "env": env, "mounts": mounts },
        }],
    })
}

/// Writes the spec whole (a runtime never reads half of one) and returns its path.
pub fn write(
    cdi_dir: &Path,
    kind: &str,
    job: u64,
    spec: &serde_json::Value,
) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(cdi_dir)?;
    let path = spec_path(cdi_dir, kind, job);
    let partial = path.with_extension("json.tmp");
    std::fs::write(&partial, serde_json::to_vec_pretty(spec)?)?;
    std::fs::rename(&partial, &path)?;
    Ok(path)
}

/// Removes allocation `job`'s spec, if it is there.
pub fn remove(cdi_dir: &Path, kind: &str, job: u64) -> std::io::Result<()> {
    match std::fs::remove_file(spec_path(cdi_dir, kind, job)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spec_names_the_allocation_and_mounts_its_socket_where_clients_look() {
        let edits = edits(
            Path::new("/run/gpushare/pods/7"),
            Path::new("/usr/lib/gpushare"),
            Some("GPU-fef8089b-4820-abfc-e83e-94318197576e"),
        );
        let spec = spec("gpushare.io/shard", 7, &["gpu0-shard1".into()], &edits);
        assert_eq!(spec["kind"], "gpushare.io/shard");
        assert_eq!(spec["devices"][0]["name"], "7");
        let edits = &spec["devices"][0]["containerEdits"];
        assert_eq!(
            edits["env"][0],
            "GPUSHARE_SOCKET=/run/gpushare/gpushare.sock"
        );
        assert_eq!(
            edits["env"][3],
            "GPUSHARE_GPU_UUIDS=GPU-fef8089b-4820-abfc-e83e-94318197576e"
        );
        assert_eq!(
            edits["env"][4],
            "CUDA_VISIBLE_DEVICES=GPU-fef8089b-4820-abfc-e83e-94318197576e"
        );
        assert_eq!(edits["mounts"][0]["hostPath"], "/run/gpushare/pods/7");
        assert_eq!(edits["mounts"][0]["containerPath"], "/run/gpushare");
        assert_eq!(edits["mounts"][1]["options"][1], "ro");
        assert_eq!(device_name("gpushare.io/shard", 7), "gpushare.io/shard=7");
        assert_eq!(
            spec_path(Path::new("/var/run/cdi"), "gpushare.io/shard", 7),
            Path::new("/var/run/cdi/gpushare.io-shard-7.json")
        );
    }
}

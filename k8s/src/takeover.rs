//! A restarted plugin takes over the allocations its predecessor made: each container's CDI
//! spec names its job and the kubelet's device ids (`cdi::spec`'s annotations), and gpushared
//! says which jobs it still holds. Those become allocations again, followed like new ones
//! (placed by their pod, ended when it goes or when no pod claims them in time); a spec whose
//! job gpushared no longer holds is removed.

use std::path::Path;
use std::time::Instant;

use tracing::{info, warn};

use crate::devices::Allocation;
use crate::plugin::Plugin;
use crate::{RESOURCE_NAME, cdi};

/// A spec's job and device ids, from its annotations; `None` for a file that is not one of
/// ours as written.
fn kept(spec: &serde_json::Value) -> Option<(u64, Vec<String>)> {
    if spec["kind"].as_str()? != RESOURCE_NAME {
        return None;
    }
    let notes = &spec["annotations"];
    let job = notes["gpushare.io/job"].as_str()?.parse().ok()?;
    let devices: Vec<String> = notes["gpushare.io/devices"]
        .as_str()?
        .split(',')
        .filter(|d| !d.is_empty())
        .map(str::to_string)
        .collect();
    (!devices.is_empty()).then_some((job, devices))
}

/// Every spec of ours in `cdi_dir`: (job, device ids).
fn specs(cdi_dir: &Path) -> Vec<(u64, Vec<String>)> {
    let Ok(entries) = std::fs::read_dir(cdi_dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .filter_map(|e| std::fs::read(e.path()).ok())
        .filter_map(|bytes| serde_json::from_slice(&bytes).ok())
        .filter_map(|spec: serde_json::Value| kept(&spec))
        .collect()
}

/// Takes over the allocations the CDI specs in the plugin's directory describe.
pub async fn take_over(plugin: &Plugin) {
    let found = specs(&plugin.config.cdi_dir);
    if found.is_empty() {
        return;
    }
    let held = match plugin.gpushared.jobs().await {
        Ok(jobs) => jobs,
        Err(e) => {
            // Nothing is removed on a failed look; the specs stay for the next start.
            warn!(
                error = format!("{e:#}"),
                "cannot ask gpushared which containers' shares it holds: the earlier allocations are not taken over"
            );
            return;
        }
    };
    for (job, devices) in found {
        if held.iter().any(|j| j.job == job) {
            info!(job, devices = ?devices, "took over a container's shares");
            plugin.allocations.insert(Allocation {
                job,
                devices,
                since: Instant::now(),
                pod: None,
            });
        } else if let Err(e) = cdi::remove(&plugin.config.cdi_dir, RESOURCE_NAME, job) {
            warn!(job, error = %e, "cannot remove the CDI spec of shares gpushared no longer holds");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spec_of_ours_names_its_job_and_devices_and_others_are_left_alone() {
        let edits = cdi::edits(
            Path::new("/run/gpushare/pods/9"),
            Path::new("/usr/lib/gpushare"),
            None,
        );
        let ids = vec!["gpu0-shard1".to_string(), "gpu0-shard2".to_string()];
        let spec = cdi::spec(RESOURCE_NAME, 9, &ids, &edits);
        assert_eq!(kept(&spec), Some((9, ids.clone())));
        let other = cdi::spec("nvidia.com/gpu", 9, &ids, &edits);
        assert_eq!(kept(&other), None);
        assert_eq!(kept(&serde_json::json!({"kind": RESOURCE_NAME})), None);

        let dir = tempfile::tempdir().expect("temp dir");
        cdi::write(dir.path(), RESOURCE_NAME, 9, &spec).expect("write");
        std::fs::write(dir.path().join("garbage.json"), b"{not json").expect("write");
        assert_eq!(specs(dir.path()), vec![(9, ids)]);
    }
}

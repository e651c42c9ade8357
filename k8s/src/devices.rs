//! The shares the plugin advertises (`gpu{G}-shard{S}`: the kubelet hands them out one by
//! one) and the allocations made of them: which job in gpushared holds which device ids, and
//! which pod, once known.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Instant;

use gpushare_protocol::job::{JobGpu, PodIdentity};

use crate::api::{HEALTHY, UNHEALTHY, v1beta1::Device};

/// The id of share `shard` of GPU `gpu`.
pub fn device_id(gpu: usize, shard: u32) -> String {
    format!("gpu{gpu}-shard{shard}")
}

/// Every share of `gpus` GPUs, healthy or not.
pub fn advertised(gpus: usize, shards_per_gpu: u32, healthy: bool) -> Vec<Device> {
    let health = if healthy { HEALTHY } else { UNHEALTHY };
    (0..gpus)
        .flat_map(|g| (0..shards_per_gpu).map(move |s| (g, s)))
        .map(|(g, s)| Device {
            id: device_id(g, s),
            health: health.into(),
            topology: None,
        })
        .collect()
}

/// The shares per GPU that `ids` are, or the id that is not one of ours.
pub fn shares_of(ids: &[String]) -> Result<Vec<JobGpu>, String> {
    let mut per_gpu: BTreeMap<u32, u32> = BTreeMap::new();
    for id in ids {
        let gpu = id
            .strip_prefix("gpu")
            .and_then(|rest| rest.split_once("-shard"))
            .and_then(|(gpu, shard)| shard.parse::<u32>().ok().and(gpu.parse::<u32>().ok()))
            .ok_or_else(|| id.clone())?;
        *per_gpu.entry(gpu).or_default() += 1;
    }
    Ok(per_gpu
        .into_iter()
        .map(|(gpu, n)| JobGpu {
            gpu,
            shards: Some(n),
        })
        .collect())
}

/// One container's shares, as gpushared holds them.
#[derive(Debug, Clone)]
pub struct Allocation {
    pub job: u64,
    pub devices: Vec<String>,
    pub since: Instant,
    /// The pod holding them, once the kubelet has listed it.
    pub pod: Option<PodIdentity>,
}

/// The allocations made, by job.
#[derive(Debug, Default)]
pub struct Allocations {
    held: Mutex<BTreeMap<u64, Allocation>>,
}

impl Allocations {
    fn held(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Allocation>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn insert(&self, allocation: Allocation) {
        self.held().insert(allocation.job, allocation);
    }

    /// The allocations holding any of `ids`: the kubelet hands a device out again only once
    /// its container is gone, so those are over.
    pub fn holding_any(&self, ids: &[String]) -> Vec<u64> {
        self.held()
            .values()
            .filter(|a| a.devices.iter().any(|d| ids.contains(d)))
            .map(|a| a.job)
            .collect()
    }

    pub fn remove(&self, job: u64) -> Option<Allocation> {
        self.held().remove(&job)
    }

    pub fn set_pod(&self, job: u64, pod: PodIdentity) {
        if let Some(a) = self.held().get_mut(&job) {
            a.pod = Some(pod);
        }
    }

    pub fn all(&self) -> Vec<Allocation> {
        self.held().values().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_gpu_advertises_its_shares_and_ids_read_back_as_shares_per_gpu() {
        let devices = advertised(2, 3, true);
        assert_eq!(devices.len(), 6);
        assert_eq!(devices[4].id, "gpu1-shard1");
        assert!(devices.iter().all(|d| d.health == HEALTHY));
        let ids: Vec<String> = ["gpu0-shard2", "gpu1-shard0", "gpu0-shard0"]
            .map(String::from)
            .into();
        assert_eq!(
            shares_of(&ids),
            Ok(vec![
                JobGpu {
                    gpu: 0,
                    shards: Some(2)
                },
                JobGpu {
                    gpu: 1,
                    shards: Some(1)
                }
            ])
        );
        assert_eq!(shares_of(&["nvidia0".into()]), Err("nvidia0".into()));
    }
}

//! `[slurm]`: what a Slurm job's GPU shards are worth on this machine.
//!
//! ```toml
//! [slurm]
//! shards_per_gpu = 8      # equal to gres.conf's shard Count for each GPU
//! class = "normal"        # a job's class unless its partition or QOS maps to another
//! jobs_only = false       # true: outside a Slurm job only root may use the GPUs here
//! [slurm.partitions]
//! interactive = "high"
//! [slurm.qos]
//! scavenger = "best-effort"
//! ```
//!
//! A job's grant: device memory `shards × GPU memory / shards_per_gpu` over every GPU it holds
//! shares of (a whole GPU is all of its shards), fair-share weight its shards, class its QOS's
//! entry, else its partition's, else `class`.

use std::collections::BTreeMap;

use gpushare_protocol::PriorityClass;
use serde::Deserialize;

use crate::jobs::Shares;

/// `[slurm]` as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SlurmFields {
    pub(super) shards_per_gpu: Option<u32>,
    pub(super) class: Option<PriorityClass>,
    #[serde(default)]
    pub(super) jobs_only: bool,
    #[serde(default)]
    pub(super) partitions: BTreeMap<String, PriorityClass>,
    #[serde(default)]
    pub(super) qos: BTreeMap<String, PriorityClass>,
}

/// Shards each GPU has unless the policy says.
pub const DEFAULT_SHARDS_PER_GPU: u32 = 8;

/// How the policy values Slurm jobs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlurmPolicy {
    pub shards_per_gpu: u32,
    pub class: PriorityClass,
    /// Outside a job, only root may start a session.
    pub jobs_only: bool,
    partitions: BTreeMap<String, PriorityClass>,
    qos: BTreeMap<String, PriorityClass>,
}

impl SlurmPolicy {
    pub(super) fn from_fields(f: &SlurmFields) -> Result<SlurmPolicy, String> {
        let shards_per_gpu = f.shards_per_gpu.unwrap_or(DEFAULT_SHARDS_PER_GPU);
        if shards_per_gpu == 0 {
            return Err("[slurm] shards_per_gpu must be at least 1".into());
        }
        Ok(SlurmPolicy {
            shards_per_gpu,
            class: f.class.unwrap_or(PriorityClass::Normal),
            jobs_only: f.jobs_only,
            partitions: f.partitions.clone(),
            qos: f.qos.clone(),
        })
    }

    /// A job's class: its QOS's entry, else its partition's, else the default.
    pub fn class_for(&self, partition: Option<&str>, qos: Option<&str>) -> PriorityClass {
        qos.and_then(|q| self.qos.get(q))
            .or_else(|| partition.and_then(|p| self.partitions.get(p)))
            .copied()
            .unwrap_or(self.class)
    }

    /// What a job's shards are worth, in its partition and QOS.
    pub fn shares(&self, partition: Option<&str>, qos: Option<&str>) -> Shares {
        Shares {
            shards_per_gpu: self.shards_per_gpu,
            class: self.class_for(partition, qos),
        }
    }

    /// Device memory `shards` of a GPU of `gpu_memory` bytes are worth.
    pub fn memory_for(&self, shards: u32, gpu_memory: u64) -> u64 {
        self.shares(None, None).memory_for(shards, gpu_memory)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(text: &str) -> SlurmPolicy {
        let f: SlurmFields = toml::from_str(text).expect("parse");
        SlurmPolicy::from_fields(&f).expect("valid")
    }

    #[test]
    fn a_job_s_class_comes_from_its_qos_then_its_partition_then_the_default() {
        let p = policy(
            "class = \"best-effort\"\n[partitions]\ninteractive = \"high\"\n[qos]\nscavenger = \"best-effort\"\nurgent = \"high\"\n",
        );
        assert_eq!(p.class_for(Some("interactive"), None), PriorityClass::High);
        assert_eq!(
            p.class_for(Some("interactive"), Some("scavenger")),
            PriorityClass::BestEffort
        );
        assert_eq!(
            p.class_for(Some("debug"), Some("urgent")),
            PriorityClass::High
        );
        assert_eq!(p.class_for(Some("debug"), None), PriorityClass::BestEffort);
        assert_eq!(p.class_for(None, None), PriorityClass::BestEffort);
    }

    #[test]
    fn shards_are_worth_their_part_of_the_gpu_and_never_more_than_all_of_it() {
        let p = policy("shards_per_gpu = 8\n");
        let gib = 1u64 << 30;
        assert_eq!(p.memory_for(2, 16 * gib), 4 * gib);
        assert_eq!(p.memory_for(8, 16 * gib), 16 * gib);
        assert_eq!(p.memory_for(80, 16 * gib), 16 * gib);
        assert_eq!(p.memory_for(0, 16 * gib), 0);
        assert_eq!(p.memory_for(1, u64::MAX), u64::MAX / 8);
    }

    #[test]
    fn no_shards_per_gpu_is_refused() {
        let f: SlurmFields = toml::from_str("shards_per_gpu = 0\n").expect("parse");
        assert!(SlurmPolicy::from_fields(&f).is_err());
    }
}

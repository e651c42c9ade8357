//! `[kubernetes]`: what a Kubernetes container's shares of a GPU are worth on this node, and
//! the class its pod's namespace maps to.
//!
//! ```toml
//! [kubernetes]
//! shards_per_gpu = 8      # the shares gpushare's kubelet plugin advertises per GPU
//! class = "normal"        # a container's class unless its namespace maps to another
//! [kubernetes.namespaces]
//! ml-prod = "high"
//! batch = "best-effort"
//! ```
//!
//! A container's grant: device memory `shares × GPU memory / shards_per_gpu` (as a Slurm
//! job's shards), fair-share weight its shares, class its namespace's entry, else `class`.
//! The class is the default until the plugin has learnt which pod holds the shares.

use std::collections::BTreeMap;

use gpushare_protocol::PriorityClass;
use serde::Deserialize;

use super::slurm::DEFAULT_SHARDS_PER_GPU;
use crate::jobs::Shares;

/// `[kubernetes]` as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct KubernetesFields {
    pub(super) shards_per_gpu: Option<u32>,
    pub(super) class: Option<PriorityClass>,
    #[serde(default)]
    pub(super) namespaces: BTreeMap<String, PriorityClass>,
}

/// How the policy values Kubernetes containers' shares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubernetesPolicy {
    pub shards_per_gpu: u32,
    pub class: PriorityClass,
    namespaces: BTreeMap<String, PriorityClass>,
}

impl KubernetesPolicy {
    pub(super) fn from_fields(f: &KubernetesFields) -> Result<KubernetesPolicy, String> {
        let shards_per_gpu = f.shards_per_gpu.unwrap_or(DEFAULT_SHARDS_PER_GPU);
        if shards_per_gpu == 0 {
            return Err("[kubernetes] shards_per_gpu must be at least 1".into());
        }
        Ok(KubernetesPolicy {
            shards_per_gpu,
            class: f.class.unwrap_or(PriorityClass::Normal),
            namespaces: f.namespaces.clone(),
        })
    }

    /// A pod's class: its namespace's entry, else the default (also before the pod is known).
    pub fn class_for(&self, namespace: Option<&str>) -> PriorityClass {
        namespace
            .and_then(|n| self.namespaces.get(n))
            .copied()
            .unwrap_or(self.class)
    }

    /// What a container's shares are worth, in a pod of `namespace` (if known yet).
    pub fn shares(&self, namespace: Option<&str>) -> Shares {
        Shares {
            shards_per_gpu: self.shards_per_gpu,
            class: self.class_for(namespace),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_s_class_comes_from_its_namespace_else_the_default() {
        let f: KubernetesFields =
            toml::from_str("class = \"best-effort\"\n[namespaces]\nml-prod = \"high\"\n")
                .expect("parse");
        let p = KubernetesPolicy::from_fields(&f).expect("valid");
        assert_eq!(p.class_for(Some("ml-prod")), PriorityClass::High);
        assert_eq!(p.class_for(Some("default")), PriorityClass::BestEffort);
        assert_eq!(p.class_for(None), PriorityClass::BestEffort);
        assert_eq!(p.shards_per_gpu, DEFAULT_SHARDS_PER_GPU);
    }

    #[test]
    fn no_shards_per_gpu_is_refused() {
        let f: KubernetesFields = toml::from_str("shards_per_gpu = 0\n").expect("parse");
        assert!(KubernetesPolicy::from_fields(&f).is_err());
    }
}

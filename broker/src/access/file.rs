//! The policy file's shape, as written: every field optional; [`super::Policy`] decides what
//! an absent one means.

use gpushare_protocol::PriorityClass;
use serde::Deserialize;

use super::quota::Quota;

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Fields {
    pub(super) class: Option<PriorityClass>,
    pub(super) weight: Option<u32>,
    pub(super) memory_quota: Option<Quota>,
    pub(super) gpu_memory_quota: Option<Quota>,
    pub(super) allow: Option<bool>,
    pub(super) max_sessions: Option<u32>,
    pub(super) max_pinned_memory: Option<Quota>,
    pub(super) max_connections: Option<u32>,
    pub(super) max_module_memory: Option<Quota>,
    pub(super) trust_domain: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct UserEntry {
    pub(super) name: Option<String>,
    pub(super) uid: Option<u32>,
    pub(super) class: Option<PriorityClass>,
    pub(super) weight: Option<u32>,
    pub(super) memory_quota: Option<Quota>,
    pub(super) gpu_memory_quota: Option<Quota>,
    pub(super) allow: Option<bool>,
    pub(super) max_sessions: Option<u32>,
    pub(super) max_pinned_memory: Option<Quota>,
    pub(super) max_connections: Option<u32>,
    pub(super) max_module_memory: Option<Quota>,
    pub(super) trust_domain: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct GroupEntry {
    pub(super) name: Option<String>,
    pub(super) gid: Option<u32>,
    pub(super) class: Option<PriorityClass>,
    pub(super) weight: Option<u32>,
    pub(super) memory_quota: Option<Quota>,
    pub(super) gpu_memory_quota: Option<Quota>,
    pub(super) allow: Option<bool>,
    pub(super) max_sessions: Option<u32>,
    pub(super) max_pinned_memory: Option<Quota>,
    pub(super) max_connections: Option<u32>,
    pub(super) max_module_memory: Option<Quota>,
    pub(super) trust_domain: Option<String>,
}

/// `[faults]`: how often a user's programs may fault the GPU.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FaultFields {
    pub(super) max_faults: Option<u32>,
    pub(super) window_s: Option<u64>,
    pub(super) refuse_s: Option<u64>,
}

/// `[fair]`: the fair policy's tunables.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FairFields {
    pub(super) quantum_us: Option<u64>,
    pub(super) anticipate_us: Option<u64>,
    pub(super) lag_us: Option<u64>,
    pub(super) share_sms: Option<bool>,
    pub(super) side_by_side: Option<bool>,
    pub(super) per_user: Option<bool>,
    pub(super) hungry_us: Option<u64>,
    pub(super) waited_us: Option<u64>,
    pub(super) bank_unused: Option<bool>,
    pub(super) free_lead_us: Option<u64>,
}

/// `[priority]`: the priority policy's tunables.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PriorityFields {
    pub(super) lower_sm_share: Option<f64>,
    pub(super) lower_depth: Option<u32>,
    pub(super) lower_queue_us: Option<u64>,
    pub(super) beside_other_contexts: Option<bool>,
    pub(super) lower_by_weight: Option<bool>,
    pub(super) gate: Option<bool>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PolicyFile {
    /// Members of this group (and root) may change and evict live clients.
    #[serde(default)]
    pub(super) admin_group: Option<String>,
    /// Whether one user's process may take device memory another user's exported
    /// (`cuMemExportToShareableHandle`); off unless set, whoever holds the descriptor.
    #[serde(default)]
    pub(super) share_memory_between_users: bool,
    /// The scheduling policy: fifo (default), priority, fair, srtf, pack or job-fifo.
    #[serde(default)]
    pub(super) scheduler: Option<String>,
    #[serde(default)]
    pub(super) priority: PriorityFields,
    #[serde(default)]
    pub(super) fair: FairFields,
    #[serde(default)]
    pub(super) faults: FaultFields,
    #[serde(default)]
    pub(super) slurm: Option<super::slurm::SlurmFields>,
    #[serde(default)]
    pub(super) kubernetes: Option<super::kubernetes::KubernetesFields>,
    #[serde(default)]
    pub(super) defaults: Fields,
    #[serde(default)]
    pub(super) users: Vec<UserEntry>,
    #[serde(default)]
    pub(super) groups: Vec<GroupEntry>,
}

impl UserEntry {
    pub(super) fn fields(&self) -> Fields {
        Fields {
            class: self.class,
            weight: self.weight,
            memory_quota: self.memory_quota,
            gpu_memory_quota: self.gpu_memory_quota,
            allow: self.allow,
            max_sessions: self.max_sessions,
            max_pinned_memory: self.max_pinned_memory,
            max_connections: self.max_connections,
            max_module_memory: self.max_module_memory,
            trust_domain: self.trust_domain.clone(),
        }
    }
}

impl GroupEntry {
    pub(super) fn fields(&self) -> Fields {
        Fields {
            class: self.class,
            weight: self.weight,
            memory_quota: self.memory_quota,
            gpu_memory_quota: self.gpu_memory_quota,
            allow: self.allow,
            max_sessions: self.max_sessions,
            max_pinned_memory: self.max_pinned_memory,
            max_connections: self.max_connections,
            max_module_memory: self.max_module_memory,
            trust_domain: self.trust_domain.clone(),
        }
    }
}

//! `[kubernetes]`: what a Kubernetes container's shares of a GPU are worth on this node, and
//! which of the policy's users (or else which class) its pod's namespace and service account
//! map to.
//!
//! ```toml
//! [kubernetes]
//! shards_per_gpu = 8      # the shares gpushare's kubelet plugin advertises per GPU
//! class = "normal"        # a container's class unless an identity or its namespace says
//! [kubernetes.namespaces] # namespace -> class
//! ml-prod = "high"
//! batch = "best-effort"
//! [[kubernetes.identities]]   # a pod's namespace (and service account) -> a policy user
//! namespace = "ml-prod"
//! service_account = "trainer" # any service account of the namespace if left out
//! user = "alice"              # or uid = 1000
//! ```
//!
//! A container's grant: device memory `shares × GPU memory / shards_per_gpu` (as a Slurm
//! job's shards) and fair-share weight its shares, whoever it is. Its class, once the plugin
//! has learnt which pod holds the shares (the default `class` until then): the first identity
//! naming the pod's namespace and service account, else the first naming its namespace and no
//! service account; the policy's grant for that identity's user (`[[users]]`, `[[groups]]`,
//! `[defaults]`, as for a session of theirs) gives the class, and the job counts as that user
//! in status. No identity: the namespace's class, else `class`. A user name the machine's
//! user database lacks matches `[[users]]` entries by name only (uid `NO_UID`). The service
//! account is known only where the plugin found the pod's projected token.

use std::collections::BTreeMap;

use gpushare_protocol::PriorityClass;
use gpushare_protocol::job::PodIdentity;
use serde::Deserialize;

use super::slurm::DEFAULT_SHARDS_PER_GPU;
use super::{Identity, Policy};
use crate::jobs::Shares;

/// `[kubernetes]` as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct KubernetesFields {
    pub(super) shards_per_gpu: Option<u32>,
    pub(super) class: Option<PriorityClass>,
    #[serde(default)]
    pub(super) namespaces: BTreeMap<String, PriorityClass>,
    #[serde(default)]
    pub(super) identities: Vec<PodUser>,
}

/// `[[kubernetes.identities]]`: the pods of `namespace` (of `service_account` only, if set)
/// count as the policy's user `user` (or `uid`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PodUser {
    pub namespace: String,
    pub service_account: Option<String>,
    pub user: Option<String>,
    pub uid: Option<u32>,
}

impl PodUser {
    /// The user as the policy's lookups see them.
    fn identity(&self) -> Identity {
        let who = match (&self.user, self.uid) {
            (Some(name), _) => Identity::of_name(name),
            (None, uid) => Identity::of_uid(uid.unwrap_or(super::identity::NO_UID)),
        };
        // Never an administrator, whoever it names.
        Identity {
            in_pod: true,
            ..who
        }
    }
}

/// Where a pod's container is placed: its class, and the user it counts as (if an identity
/// matched).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodPlacement {
    pub class: PriorityClass,
    /// Uid and name.
    pub user: Option<(u32, String)>,
}

/// How the policy values Kubernetes containers' shares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubernetesPolicy {
    pub shards_per_gpu: u32,
    pub class: PriorityClass,
    namespaces: BTreeMap<String, PriorityClass>,
    identities: Vec<PodUser>,
}

impl KubernetesPolicy {
    pub(super) fn from_fields(f: &KubernetesFields) -> Result<KubernetesPolicy, String> {
        let shards_per_gpu = f.shards_per_gpu.unwrap_or(DEFAULT_SHARDS_PER_GPU);
        if shards_per_gpu == 0 {
            return Err("[kubernetes] shards_per_gpu must be at least 1".into());
        }
        for (i, id) in f.identities.iter().enumerate() {
            let n = i + 1;
            if id.namespace.is_empty() {
                return Err(format!(
                    "[[kubernetes.identities]] entry {n} needs a `namespace`"
                ));
            }
            if id.user.is_none() == id.uid.is_none() {
                return Err(format!(
                    "[[kubernetes.identities]] entry {n} (namespace `{}`) needs exactly one of `user` or `uid`",
                    id.namespace
                ));
            }
            if id.service_account.as_deref() == Some("") || id.user.as_deref() == Some("") {
                return Err(format!(
                    "[[kubernetes.identities]] entry {n} (namespace `{}`) has an empty name",
                    id.namespace
                ));
            }
        }
        Ok(KubernetesPolicy {
            shards_per_gpu,
            class: f.class.unwrap_or(PriorityClass::Normal),
            namespaces: f.namespaces.clone(),
            identities: f.identities.clone(),
        })
    }

    /// The identity a pod of `namespace` running as `service_account` (if known) counts as:
    /// the first naming both, else the first naming the namespace alone.
    pub fn identity_for(&self, namespace: &str, service_account: Option<&str>) -> Option<&PodUser> {
        let in_namespace = || self.identities.iter().filter(|i| i.namespace == namespace);
        service_account
            .and_then(|sa| in_namespace().find(|i| i.service_account.as_deref() == Some(sa)))
            .or_else(|| in_namespace().find(|i| i.service_account.is_none()))
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

impl Policy {
    /// Where `pod`'s container is placed (`None`: no `[kubernetes]`): as the user its
    /// identity names, with the class the policy grants that user, else by namespace.
    pub fn place_pod(&self, pod: &PodIdentity) -> Option<PodPlacement> {
        let k = self.kubernetes()?;
        let Some(entry) = k.identity_for(&pod.namespace, pod.service_account.as_deref()) else {
            return Some(PodPlacement {
                class: k.class_for(Some(&pod.namespace)),
                user: None,
            });
        };
        let who = entry.identity();
        let name = who.user.clone().unwrap_or_else(|| who.uid.to_string());
        Some(PodPlacement {
            class: self.grant_for(&who).class,
            user: Some((who.uid, name)),
        })
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

    const IDENTITIES: &str = r#"
[kubernetes]
class = "normal"
[kubernetes.namespaces]
ml-prod = "high"
[[kubernetes.identities]]
namespace = "ml-prod"
user = "gpushare-test-team"
[[kubernetes.identities]]
namespace = "ml-prod"
service_account = "trainer"
user = "gpushare-test-alice"
[[kubernetes.identities]]
namespace = "ml-prod"
service_account = "trainer"
user = "gpushare-test-bob"
[[kubernetes.identities]]
namespace = "batch"
service_account = "runner"
uid = 4242
[[users]]
name = "gpushare-test-alice"
class = "best-effort"
[[users]]
uid = 4242
class = "high"
"#;

    fn pod(namespace: &str, service_account: Option<&str>) -> PodIdentity {
        PodIdentity {
            namespace: namespace.into(),
            pod: "p-0".into(),
            container: "main".into(),
            service_account: service_account.map(str::to_owned),
        }
    }

    #[test]
    fn a_service_account_s_identity_wins_over_its_namespace_s_whatever_the_order() {
        let p = Policy::parse(IDENTITIES, "test").expect("valid");
        let k = p.kubernetes().expect("[kubernetes]");
        let user = |ns, sa| k.identity_for(ns, sa).and_then(|i| i.user.clone());
        assert_eq!(
            user("ml-prod", Some("trainer")).as_deref(),
            Some("gpushare-test-alice"),
            "the first entry for the account, before the namespace-wide one"
        );
        assert_eq!(
            user("ml-prod", Some("other")).as_deref(),
            Some("gpushare-test-team")
        );
        assert_eq!(user("ml-prod", None).as_deref(), Some("gpushare-test-team"));
        assert_eq!(
            k.identity_for("batch", None),
            None,
            "the entry names an account"
        );
        assert_eq!(k.identity_for("default", Some("trainer")), None);
    }

    #[test]
    fn a_pod_is_placed_as_its_identity_s_user_with_their_class_else_by_namespace() {
        let p = Policy::parse(IDENTITIES, "test").expect("valid");
        let alice = p
            .place_pod(&pod("ml-prod", Some("trainer")))
            .expect("placed");
        assert_eq!(
            alice.class,
            PriorityClass::BestEffort,
            "alice's [[users]] entry"
        );
        assert_eq!(
            alice.user,
            Some((super::super::identity::NO_UID, "gpushare-test-alice".into())),
            "a name the user database lacks"
        );
        let team = p.place_pod(&pod("ml-prod", None)).expect("placed");
        assert_eq!(
            team.class,
            PriorityClass::Normal,
            "[defaults] for an entry-less user"
        );
        let by_uid = p.place_pod(&pod("batch", Some("runner"))).expect("placed");
        assert_eq!(
            by_uid.class,
            PriorityClass::High,
            "the uid's [[users]] entry"
        );
        assert_eq!(by_uid.user.map(|(uid, _)| uid), Some(4242));
        let unmapped = p.place_pod(&pod("batch", Some("other"))).expect("placed");
        assert_eq!(
            (unmapped.class, unmapped.user),
            (PriorityClass::Normal, None)
        );
        let without = Policy::parse("", "test").expect("valid");
        assert_eq!(without.place_pod(&pod("ml-prod", None)), None);
    }

    #[test]
    fn an_identity_needs_a_namespace_and_one_user() {
        for bad in [
            "[[kubernetes.identities]]\nuser = \"alice\"\n",
            "[[kubernetes.identities]]\nnamespace = \"\"\nuser = \"alice\"\n",
            "[[kubernetes.identities]]\nnamespace = \"a\"\n",
            "[[kubernetes.identities]]\nnamespace = \"a\"\nuser = \"alice\"\nuid = 1\n",
            "[[kubernetes.identities]]\nnamespace = \"a\"\nservice_account = \"\"\nuid = 1\n",
            "[[kubernetes.identities]]\nnamespace = \"a\"\nuid = 1\ngroup = \"g\"\n",
        ] {
            assert!(Policy::parse(bad, "test").is_err(), "{bad}");
        }
    }
}

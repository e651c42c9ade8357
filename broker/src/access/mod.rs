//! The policy file (`/etc/gpushare/gpushare.toml`): who gets which class, weight, quota and
//! trust domain.
//!
//! ```toml
//! [defaults]
//! class = "normal"            # high | normal | best-effort
//! weight = 1
//! memory_quota = "unlimited"  # or "8 GiB", or a number of bytes: over all GPUs together
//! gpu_memory_quota = "unlimited" # the same, on any one GPU
//! allow = true                # false: only users/groups with `allow = true` may connect
//! max_sessions = 64           # sessions one user may have open at once
//! max_pinned_memory = "2 GiB" # host memory one user's sessions may make gpushared lock
//! max_connections = 128       # connections one user may have open (sessions, monitors such
//!                             # as `gpushare status`, handshakes under way); max_sessions + 64
//!                             # unless set
//! max_module_memory = "1 GiB" # module images one user's sessions may make gpushared hold
//! trust_domain = "default"    # who shares a GPU context (and so memory); "default" if unset
//!
//! [[users]]
//! name = "alice"              # or uid = 1000
//! class = "high"
//! weight = 4
//! memory_quota = "20 GiB"
//! trust_domain = "alice"      # alone: no one else's kernels can touch her memory
//!
//! [[users]]
//! name = "mallory"
//! allow = false               # refused at the handshake (PermissionDenied)
//!
//! [[groups]]
//! name = "students"           # or gid = 2000
//! class = "best-effort"
//! memory_quota = "4 GiB"
//! trust_domain = "students"   # 1-32 of a-z, 0-9, `_`, `-`; starts with a letter or digit
//! ```
//!
//! A trust domain is a set of users who trust each other's programs: each domain gets its own
//! GPU context, so kernels of one domain cannot read or write another's memory, and a GPU fault
//! in one domain leaves the others running. The cost: contexts of different domains time-slice
//! on the GPU instead of running side by side, and each costs its context's memory. Put users
//! whose work must overlap on the GPU in one domain; one scheduler spans all domains.
//!
//! A top-level `scheduler = "priority"` picks the scheduling policy (fifo, priority, fair,
//! srtf, pack or job-fifo; fifo by default); a SIGHUP switches it for running clients too.
//! The priority policy's tunables, while a high-priority client is connected:
//!
//! ```toml
//! [priority]
//! lower_sm_share = 0.5   # lower classes run on this share of the SMs (a hardware partition)
//! lower_depth = 8        # kernels each lower-priority client may have on the GPU (8 with
//!                        # the gate, 2 without; 2 favours the high tail) ...
//! lower_queue_us = 0     # ... or more, while the estimated times of all lower kernels on
//!                        # the GPU stay within this (0: off; 100 with lower_by_weight)
//! lower_by_weight = false  # true: lower classes share what high work leaves by weight (FAIR
//!                        # among each class, with the [fair] tunables) instead of oldest first
//! beside_other_contexts = false  # true: lower kernels of another GPU context (another trust
//!                                # domain, a governed program) may be granted beside high work
//! gate = true            # lower kernels queued on the GPU wait while high-priority kernels
//!                        # are in flight (5 ms at most at a stretch)
//!
//! [fair]
//! quantum_us = 5000      # GPU time a client may run ahead of the least served one (5 ms
//!                        # side by side; in turns a turn's length, 1 ms; 0: one kernel at
//!                        # a time)
//! share_sms = false      # true (experimental): clients' kernels side by side while their
//!                        # SMs fit, each charged its share of the SMs for its time
//! lag_us = 20000         # GPU time a client may be owed at most: a newcomer's, or one that
//!                        # cannot use its share (a quantum at or above it holds nobody)
//! anticipate_us = 500    # a client owed GPU time whose work just completed is waited for
//!                        # this long before another is granted (0: never)
//! side_by_side = true    # clients within a quantum of the least served run at once, not
//!                        # in exclusive turns (those further ahead wait), each charged its
//!                        # measured device time (the default under scheduler = "fair" with
//!                        # a quantum; false under priority's lower classes)
//! per_user = false       # true: a user's programs share the user's weight (one virtual
//!                        # time per user) instead of each program having it
//! hungry_us = 0          # side by side: a client behind its share holds back those of its
//!                        # weight or more only while this much estimated GPU time of its work
//!                        # is in flight or queued (0, the default: always). A program held
//!                        # back by its own CPU loop gains nothing from the others' waiting;
//!                        # one waiting for each small kernel loses the protection it had.
//!                        # Lighter clients it holds back whatever
//! waited_us = 0          # with hungry_us: a client whose oldest kernel in flight has waited
//!                        # this long on the device past its estimate (behind the others'
//!                        # work) is hungry too, as is one whose latest kernel seen done had
//!                        # (0, the default: never)
//! bank_unused = true     # with hungry_us: GPU time a client left unused while not hungry is
//!                        # owed to it when it turns hungry; false: after a quantum of
//!                        # asking for less, it starts level with the hungry clients of its
//!                        # weight (`sched/policy/fair/hunger.rs`)
//! free_lead_us = 0       # side by side: while no active account leads the least served by
//!                        # more than this, launches skip the scheduler as under FIFO and
//!                        # only device time is charged; past it they are gated again until
//!                        # the policy has held nobody for 50 ms and no lead passes half of
//!                        # it (0, the default: always gated; `sched/policy/fair/free.rs`)
//! ```
//!
//! On a Slurm node, `[slurm]` says what a job's GPU shards are worth (`slurm.rs`; the
//! administrator's guide is docs/slurm.md); on a Kubernetes node, `[kubernetes]` says what a
//! container's shares are worth, and which user or class a pod's namespace and service account
//! map to (`kubernetes.rs`, docs/kubernetes.md).
//!
//! A top-level `admin_group = "gpushare-admin"` names the group whose members (besides root)
//! may change and evict live clients.
//!
//! A user whose programs keep faulting the GPU is refused new sessions for a while, so one
//! user's fault storm cannot keep the others' GPU resetting:
//!
//! ```toml
//! [faults]
//! max_faults = 3         # faults (the culprit's, each evicted) ...
//! window_s = 600         # ... within this many seconds ...
//! refuse_s = 600         # ... refuse the user's new sessions this long (max_faults = 0: never)
//! ```
//!
//! Root is never refused for its faults.
//!
//! The bounds (`max_sessions`, `max_pinned_memory`, `max_connections`, `max_module_memory`)
//! hold for all of a user's sessions and connections together, as the memory quota does; past
//! them a new session or connection (or page-locked host memory a consolidated program shares,
//! or a module image) is refused with a sentence naming the bound. Each session's shared region
//! (rings and arena; page-locked on CUDA) and the host memory consolidated programs share for
//! DMA count as pinned memory; a module image counts once per user however many of their
//! sessions load it, until the last of them unloads it. Root's connections are not counted
//! (an administrator can always look).
//!
//! A user entry wins over group entries; among groups the first in file order that the user
//! belongs to wins; fields an entry leaves out come from `[defaults]`. `allow` follows the
//! same rule: with `[defaults] allow = false`, a `[[users]]` entry for alice that does not say
//! `allow = true` refuses her even when a group she is in is allowed. Root is always allowed,
//! and otherwise placed like anyone else (a user entry for root may give it a trust domain).

use std::collections::BTreeSet;
use std::path::Path;

mod file;
mod identity;
mod kubernetes;
mod quota;
mod sched_tunables;
mod slurm;
mod trust_domain;
use file::{Fields, GroupEntry, PolicyFile};
pub use identity::Identity;
pub use kubernetes::{KubernetesPolicy, PodPlacement};
use quota::Quota;
pub use slurm::SlurmPolicy;
pub use trust_domain::{TrustDomain, TrustDomainError};

use gpushare_protocol::PriorityClass;

/// What one client is granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    pub class: PriorityClass,
    pub weight: u32,
    /// `None` means unlimited.
    pub memory_quota: Option<u64>,
}

impl Default for Grant {
    fn default() -> Self {
        Grant {
            class: PriorityClass::Normal,
            weight: 1,
            memory_quota: None,
        }
    }
}

/// Sessions one user may have open at once, unless the policy says otherwise.
pub const DEFAULT_MAX_SESSIONS: u32 = 64;
/// Host memory one user's sessions may make gpushared lock, unless the policy says otherwise.
pub const DEFAULT_MAX_PINNED: u64 = 2 << 30;

/// Connections one user may have open to gpushared at once besides their sessions (monitors
/// such as `gpushare status`, and connections still saying hello), unless the policy sets
/// `max_connections` (which counts sessions too).
pub const CONNECTIONS_BESIDE_SESSIONS: u32 = 64;
/// Module image bytes one user's sessions may make gpushared hold, unless the policy says
/// otherwise.
pub const DEFAULT_MAX_MODULE_MEMORY: u64 = 1 << 30;

/// What one user may hold at once, over all of their sessions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    pub max_sessions: u32,
    /// `None` means unlimited.
    pub max_pinned: Option<u64>,
    /// Connections of every kind.
    pub max_connections: u32,
    /// Module images held, each distinct image counted once. `None` means unlimited.
    pub max_module_memory: Option<u64>,
    /// Device memory held on any one GPU (besides the total the grant's quota bounds).
    /// `None` means unlimited.
    pub gpu_memory_quota: Option<u64>,
}

impl Default for Bounds {
    fn default() -> Self {
        Bounds {
            max_sessions: DEFAULT_MAX_SESSIONS,
            max_pinned: Some(DEFAULT_MAX_PINNED),
            max_connections: DEFAULT_MAX_SESSIONS + CONNECTIONS_BESIDE_SESSIONS,
            max_module_memory: Some(DEFAULT_MAX_MODULE_MEMORY),
            gpu_memory_quota: None,
        }
    }
}

impl Bounds {
    /// No bound at all (unit tests, and whoever the bounds do not apply to).
    pub fn unbounded() -> Bounds {
        Bounds {
            max_sessions: u32::MAX,
            max_pinned: None,
            max_connections: u32::MAX,
            max_module_memory: None,
            gpu_memory_quota: None,
        }
    }
}

/// A user whose programs fault the GPU `max_faults` times within `window` is refused new
/// sessions for `refuse` (`max_faults` 0: never).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FaultLimit {
    pub max_faults: u32,
    pub window: std::time::Duration,
    pub refuse: std::time::Duration,
}

impl Default for FaultLimit {
    fn default() -> Self {
        FaultLimit {
            max_faults: 3,
            window: std::time::Duration::from_secs(600),
            refuse: std::time::Duration::from_secs(600),
        }
    }
}

/// The parsed policy.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    file: PolicyFile,
    defaults: Grant,
    /// Where the file was read from (named when it refuses someone).
    path: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("cannot read policy file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("policy file {path} is not valid: {message}")]
    Parse { path: String, message: String },
}

impl Policy {
    pub fn parse(text: &str, path: &str) -> Result<Policy, PolicyError> {
        let file: PolicyFile = toml::from_str(text).map_err(|e| PolicyError::Parse {
            path: path.to_string(),
            message: e.to_string(),
        })?;
        for u in &file.users {
            if u.name.is_none() == u.uid.is_none() {
                return Err(PolicyError::Parse {
                    path: path.into(),
                    message: "each [[users]] entry needs exactly one of `name` or `uid`".into(),
                });
            }
        }
        for g in &file.groups {
            if g.name.is_none() == g.gid.is_none() {
                return Err(PolicyError::Parse {
                    path: path.into(),
                    message: "each [[groups]] entry needs exactly one of `name` or `gid`".into(),
                });
            }
        }
        check_trust_domains(&file, path)?;
        let counts = std::iter::once((file.defaults.max_sessions, file.defaults.max_connections))
            .chain(
                file.users
                    .iter()
                    .map(|u| (u.max_sessions, u.max_connections)),
            )
            .chain(
                file.groups
                    .iter()
                    .map(|g| (g.max_sessions, g.max_connections)),
            );
        for (sessions, connections) in counts {
            for (field, value) in [("max_sessions", sessions), ("max_connections", connections)] {
                if value == Some(0) {
                    return Err(PolicyError::Parse {
                        path: path.into(),
                        message: format!(
                            "{field} must be at least 1 (refuse a user with `allow = false`)"
                        ),
                    });
                }
            }
        }
        if let Some(kind) = &file.scheduler {
            kind.parse::<crate::sched::PolicyKind>()
                .map_err(|message| PolicyError::Parse {
                    path: path.into(),
                    message,
                })?;
        }
        if let Some(share) = file.priority.lower_sm_share
            && !(share > 0.0 && share <= 1.0)
        {
            return Err(PolicyError::Parse {
                path: path.into(),
                message: format!(
                    "[priority] lower_sm_share must be above 0 and at most 1 (the share of the SMs), not {share}"
                ),
            });
        }
        if file.priority.lower_depth == Some(0) {
            return Err(PolicyError::Parse {
                path: path.into(),
                message: "[priority] lower_depth must be at least 1".into(),
            });
        }
        if let Some(slurm) = &file.slurm {
            SlurmPolicy::from_fields(slurm).map_err(|message| PolicyError::Parse {
                path: path.into(),
                message,
            })?;
        }
        if let Some(kubernetes) = &file.kubernetes {
            KubernetesPolicy::from_fields(kubernetes).map_err(|message| PolicyError::Parse {
                path: path.into(),
                message,
            })?;
        }
        let defaults = apply(Grant::default(), &file.defaults);
        Ok(Policy {
            file,
            defaults,
            path: Some(path.to_string()),
        })
    }

    pub fn load(path: &Path) -> Result<Policy, PolicyError> {
        let text = std::fs::read_to_string(path).map_err(|source| PolicyError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Policy::parse(&text, &path.display().to_string())
    }

    /// Whether `who` may change or evict other clients: root, or a member of `admin_group`.
    pub fn is_admin(&self, who: &Identity) -> bool {
        // A pod's socket admits the container's programs, whatever uid they run as.
        !who.in_pod && who.uid == 0
            || self
                .file
                .admin_group
                .as_ref()
                .is_some_and(|g| who.group_names.contains(g))
    }

    pub fn admin_group(&self) -> Option<&str> {
        self.file.admin_group.as_deref()
    }

    /// How Slurm jobs' GPU shards are granted here (`[slurm]`), if the machine is a Slurm node.
    pub fn slurm(&self) -> Option<SlurmPolicy> {
        self.file
            .slurm
            .as_ref()
            .and_then(|f| SlurmPolicy::from_fields(f).ok())
    }

    /// How Kubernetes containers' GPU shares are granted here (`[kubernetes]`), if the
    /// machine is a Kubernetes node with gpushare's kubelet plugin.
    pub fn kubernetes(&self) -> Option<KubernetesPolicy> {
        self.file
            .kubernetes
            .as_ref()
            .and_then(|f| KubernetesPolicy::from_fields(f).ok())
    }

    /// Whether users may take each other's exported device memory.
    pub fn shares_memory_between_users(&self) -> bool {
        self.file.share_memory_between_users
    }

    /// The grant for `who`.
    pub fn grant_for(&self, who: &Identity) -> Grant {
        apply(self.defaults, &self.entry_for(who))
    }

    /// What `who` may hold at once over all of their sessions: their entry's bounds, else
    /// `[defaults]`', else [`Bounds::default`].
    pub fn bounds_for(&self, who: &Identity) -> Bounds {
        let entry = self.entry_for(who);
        let defaults = &self.file.defaults;
        let base = Bounds::default();
        let max_sessions = entry
            .max_sessions
            .or(defaults.max_sessions)
            .unwrap_or(base.max_sessions);
        Bounds {
            max_sessions,
            max_pinned: match entry.max_pinned_memory.or(defaults.max_pinned_memory) {
                Some(Quota(q)) => q,
                None => base.max_pinned,
            },
            // Unless set: room for every session and as many monitors and handshakes more.
            max_connections: entry
                .max_connections
                .or(defaults.max_connections)
                .unwrap_or(max_sessions.saturating_add(CONNECTIONS_BESIDE_SESSIONS)),
            max_module_memory: match entry.max_module_memory.or(defaults.max_module_memory) {
                Some(Quota(q)) => q,
                None => base.max_module_memory,
            },
            gpu_memory_quota: entry
                .gpu_memory_quota
                .or(defaults.gpu_memory_quota)
                .and_then(|Quota(q)| q),
        }
    }

    /// How often a user's programs may fault the GPU before new sessions are refused.
    pub fn fault_limit(&self) -> FaultLimit {
        let f = &self.file.faults;
        let base = FaultLimit::default();
        FaultLimit {
            max_faults: f.max_faults.unwrap_or(base.max_faults),
            window: f
                .window_s
                .map_or(base.window, std::time::Duration::from_secs),
            refuse: f
                .refuse_s
                .map_or(base.refuse, std::time::Duration::from_secs),
        }
    }

    /// The trust domain `who` works in: their entry's `trust_domain`, else `[defaults]`', else
    /// [`TrustDomain::default`]. Root follows the same rule.
    pub fn trust_domain(&self, who: &Identity) -> TrustDomain {
        match self
            .entry_for(who)
            .trust_domain
            .or_else(|| self.file.defaults.trust_domain.clone())
        {
            Some(name) => TrustDomain(name),
            None => TrustDomain::default(),
        }
    }

    /// Every trust domain the file names, and the default one, sorted: the domains the broker
    /// may need a GPU context for.
    pub fn trust_domains(&self) -> Vec<TrustDomain> {
        let file = &self.file;
        let named = std::iter::once(&file.defaults.trust_domain)
            .chain(file.users.iter().map(|u| &u.trust_domain))
            .chain(file.groups.iter().map(|g| &g.trust_domain))
            .flatten()
            .map(|name| TrustDomain(name.clone()));
        let all: BTreeSet<TrustDomain> = named.chain([TrustDomain::default()]).collect();
        all.into_iter().collect()
    }

    /// Whether the policy lets `who` connect at all: root always; anyone else by `allow` of
    /// their user entry, else of their first group entry, else of `[defaults]` (true when
    /// nothing says).
    pub fn allows(&self, who: &Identity) -> bool {
        who.uid == 0
            || self
                .entry_for(who)
                .allow
                .or(self.file.defaults.allow)
                .unwrap_or(true)
    }

    /// Why `who` is refused, as a sentence for them, or `None` when allowed.
    pub fn refusal(&self, who: &Identity) -> Option<String> {
        if self.allows(who) {
            return None;
        }
        let user = match &who.user {
            Some(name) => format!("user `{name}` (uid {})", who.uid),
            None => format!("uid {}", who.uid),
        };
        let file = match &self.path {
            Some(path) => format!("the policy file {path}"),
            None => "the policy file".to_string(),
        };
        Some(format!(
            "{file} does not allow {user} to use gpushare; ask the administrator"
        ))
    }

    /// The fields of the entry that applies to `who`: their `[[users]]` entry, else the first
    /// `[[groups]]` entry they belong to, else none (all empty).
    fn entry_for(&self, who: &Identity) -> Fields {
        let user_match = self.file.users.iter().find(|u| {
            u.uid == Some(who.uid) || (u.name.is_some() && u.name.as_deref() == who.user.as_deref())
        });
        if let Some(u) = user_match {
            return u.fields();
        }
        let group_match = self.file.groups.iter().find(|g| {
            g.gid.is_some_and(|gid| who.gids.contains(&gid))
                || g.name.as_ref().is_some_and(|n| who.group_names.contains(n))
        });
        group_match.map(GroupEntry::fields).unwrap_or_default()
    }
}

/// Refuses a `trust_domain` that breaks the naming rule, naming the entry it is in.
fn check_trust_domains(file: &PolicyFile, path: &str) -> Result<(), PolicyError> {
    let users = file.users.iter().map(|u| {
        let who = match (&u.name, u.uid) {
            (Some(name), _) => format!("`{name}`"),
            (None, uid) => format!("uid {}", uid.unwrap_or_default()),
        };
        (format!("[[users]] entry {who}"), &u.trust_domain)
    });
    let groups = file.groups.iter().map(|g| {
        let who = match (&g.name, g.gid) {
            (Some(name), _) => format!("`{name}`"),
            (None, gid) => format!("gid {}", gid.unwrap_or_default()),
        };
        (format!("[[groups]] entry {who}"), &g.trust_domain)
    });
    let entries = std::iter::once(("[defaults]".to_string(), &file.defaults.trust_domain))
        .chain(users)
        .chain(groups);
    for (entry, name) in entries {
        if let Some(name) = name
            && let Err(e) = TrustDomain::new(name)
        {
            return Err(PolicyError::Parse {
                path: path.into(),
                message: format!("{entry}: trust_domain {e}"),
            });
        }
    }
    Ok(())
}

fn apply(base: Grant, f: &Fields) -> Grant {
    Grant {
        class: f.class.unwrap_or(base.class),
        weight: f.weight.unwrap_or(base.weight).max(1),
        memory_quota: match f.memory_quota {
            Some(Quota(q)) => q,
            None => base.memory_quota,
        },
    }
}

#[cfg(test)]
mod tests;

//! The policy file (`/etc/gpushare/gpushare.toml`): who gets which class, weight and quota.
//!
//! ```toml
//! [defaults]
//! class = "normal"            # high | normal | best-effort
//! weight = 1
//! memory_quota = "unlimited"  # or "8 GiB", or a number of bytes
//! allow = true                # false: only users/groups with `allow = true` may connect
//!
//! [[users]]
//! name = "alice"              # or uid = 1000
//! class = "high"
//! weight = 4
//! memory_quota = "20 GiB"
//!
//! [[users]]
//! name = "mallory"
//! allow = false               # refused at the handshake (PermissionDenied)
//!
//! [[groups]]
//! name = "students"           # or gid = 2000
//! class = "best-effort"
//! memory_quota = "4 GiB"
//! ```
//!
//! A top-level `scheduler = "priority"` picks the scheduling policy (fifo, priority, fair,
//! srtf, pack or job-fifo; fifo by default); a SIGHUP switches it for running clients too.
//! The priority policy's tunables, while a high-priority client is connected:
//!
//! ```toml
//! [priority]
//! lower_sm_share = 0.5   # lower classes run on this share of the SMs (a hardware partition)
//! lower_depth = 2        # kernels each lower-priority client may have on the GPU
//! ```
//!
//! A top-level `admin_group = "gpushare-admin"` names the group whose members (besides root)
//! may change and evict live clients.
//!
//! A user entry wins over group entries; among groups the first in file order that the user
//! belongs to wins; fields an entry leaves out come from `[defaults]`. `allow` follows the
//! same rule: with `[defaults] allow = false`, a `[[users]]` entry for alice that does not say
//! `allow = true` refuses her even when a group she is in is allowed. Root is always allowed.

use std::path::Path;

use gpushare_protocol::PriorityClass;
use serde::Deserialize;

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

/// A memory size in the file: bytes, a string with units, or "unlimited".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota(pub Option<u64>);

impl<'de> Deserialize<'de> for Quota {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Bytes(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Bytes(b) => Ok(Quota(Some(b))),
            Raw::Text(t) if t.trim().eq_ignore_ascii_case("unlimited") => Ok(Quota(None)),
            Raw::Text(t) => t
                .trim()
                .parse::<bytesize::ByteSize>()
                .map(|b| Quota(Some(b.as_u64())))
                .map_err(|e| serde::de::Error::custom(format!("bad memory size `{t}`: {e}"))),
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Fields {
    class: Option<PriorityClass>,
    weight: Option<u32>,
    memory_quota: Option<Quota>,
    allow: Option<bool>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct UserEntry {
    name: Option<String>,
    uid: Option<u32>,
    class: Option<PriorityClass>,
    weight: Option<u32>,
    memory_quota: Option<Quota>,
    allow: Option<bool>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct GroupEntry {
    name: Option<String>,
    gid: Option<u32>,
    class: Option<PriorityClass>,
    weight: Option<u32>,
    memory_quota: Option<Quota>,
    allow: Option<bool>,
}

/// `[priority]`: the priority policy's tunables.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct PriorityFields {
    lower_sm_share: Option<f64>,
    lower_depth: Option<u32>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyFile {
    /// Members of this group (and root) may change and evict live clients.
    #[serde(default)]
    admin_group: Option<String>,
    /// The scheduling policy: fifo (default), priority, fair, srtf, pack or job-fifo.
    #[serde(default)]
    scheduler: Option<String>,
    #[serde(default)]
    priority: PriorityFields,
    #[serde(default)]
    defaults: Fields,
    #[serde(default)]
    users: Vec<UserEntry>,
    #[serde(default)]
    groups: Vec<GroupEntry>,
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

/// Who is asking, as the kernel told us.
#[derive(Debug, Clone)]
pub struct Identity {
    pub uid: u32,
    pub user: Option<String>,
    /// Every group the user is in (primary included).
    pub gids: Vec<u32>,
    pub group_names: Vec<String>,
}

impl Identity {
    /// Looks up name and groups for a uid/gid from the system's user database.
    pub fn lookup(uid: u32, gid: u32) -> Identity {
        let user = nix::unistd::User::from_uid(uid.into()).ok().flatten();
        let mut gids = vec![gid];
        if let Some(u) = &user
            && let Ok(name) = std::ffi::CString::new(u.name.clone())
            && let Ok(groups) = nix::unistd::getgrouplist(&name, gid.into())
        {
            gids = groups.into_iter().map(|g| g.as_raw()).collect();
        }
        let group_names = gids
            .iter()
            .filter_map(|g| nix::unistd::Group::from_gid((*g).into()).ok().flatten())
            .map(|g| g.name)
            .collect();
        Identity {
            uid,
            user: user.map(|u| u.name),
            gids,
            group_names,
        }
    }
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
        let defaults = apply(Grant::default(), &file.defaults);
        Ok(Policy {
            file,
            defaults,
            path: Some(path.to_string()),
        })
    }

    /// The scheduling policy the file asks for (FIFO when it names none).
    pub fn scheduler(&self) -> crate::sched::PolicyKind {
        self.file
            .scheduler
            .as_deref()
            .and_then(|s| s.parse().ok())
            .unwrap_or(crate::sched::PolicyKind::Fifo)
    }

    /// The priority policy's tunables: the file's `[priority]` over the defaults.
    pub fn priority_config(&self) -> crate::sched::PriorityConfig {
        let base = crate::sched::PriorityConfig::default();
        let p = &self.file.priority;
        crate::sched::PriorityConfig {
            lower_sm_share: p.lower_sm_share.or(base.lower_sm_share),
            lower_depth_beside_high: p.lower_depth.or(base.lower_depth_beside_high),
            ..base
        }
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
        who.uid == 0
            || self
                .file
                .admin_group
                .as_ref()
                .is_some_and(|g| who.group_names.contains(g))
    }

    pub fn admin_group(&self) -> Option<&str> {
        self.file.admin_group.as_deref()
    }

    /// The grant for `who`.
    pub fn grant_for(&self, who: &Identity) -> Grant {
        apply(self.defaults, &self.entry_for(who))
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
            return Fields {
                class: u.class,
                weight: u.weight,
                memory_quota: u.memory_quota,
                allow: u.allow,
            };
        }
        let group_match = self.file.groups.iter().find(|g| {
            g.gid.is_some_and(|gid| who.gids.contains(&gid))
                || g.name.as_ref().is_some_and(|n| who.group_names.contains(n))
        });
        match group_match {
            Some(g) => Fields {
                class: g.class,
                weight: g.weight,
                memory_quota: g.memory_quota,
                allow: g.allow,
            },
            None => Fields::default(),
        }
    }
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
mod tests {
    use super::*;

    fn who(uid: u32, user: &str, groups: &[(u32, &str)]) -> Identity {
        Identity {
            uid,
            user: Some(user.into()),
            gids: groups.iter().map(|g| g.0).collect(),
            group_names: groups.iter().map(|g| g.1.to_string()).collect(),
        }
    }

    const FILE: &str = r#"
        [defaults]
        class = "normal"
        weight = 2
        memory_quota = "1 GiB"

        [[users]]
        name = "alice"
        class = "high"
        memory_quota = "unlimited"

        [[users]]
        uid = 1234
        weight = 9

        [[groups]]
        name = "students"
        class = "best-effort"
        memory_quota = 1048576

        [[groups]]
        gid = 50
        class = "high"
    "#;

    #[test]
    fn users_beat_groups_and_defaults_fill_in() {
        let p = Policy::parse(FILE, "test").expect("valid");
        let alice = p.grant_for(&who(1000, "alice", &[(100, "students")]));
        assert_eq!(
            alice,
            Grant {
                class: PriorityClass::High,
                weight: 2,
                memory_quota: None
            }
        );
        let by_uid = p.grant_for(&who(1234, "bob", &[]));
        assert_eq!(
            by_uid,
            Grant {
                class: PriorityClass::Normal,
                weight: 9,
                memory_quota: Some(1 << 30)
            }
        );
        let student = p.grant_for(&who(1001, "carol", &[(50, "staff"), (100, "students")]));
        assert_eq!(
            student.class,
            PriorityClass::BestEffort,
            "first group in file order wins"
        );
        assert_eq!(student.memory_quota, Some(1 << 20));
        let staff = p.grant_for(&who(1002, "dave", &[(50, "staff")]));
        assert_eq!(staff.class, PriorityClass::High);
        let nobody = p.grant_for(&who(1003, "erin", &[]));
        assert_eq!(
            nobody,
            Grant {
                class: PriorityClass::Normal,
                weight: 2,
                memory_quota: Some(1 << 30)
            }
        );
    }

    #[test]
    fn priority_tunables_come_from_the_file_and_bad_ones_are_refused() {
        let p = Policy::parse(
            "scheduler = \"priority\"\n[priority]\nlower_sm_share = 0.5\nlower_depth = 1\n",
            "t.toml",
        )
        .expect("valid policy");
        let cfg = p.priority_config();
        assert_eq!(cfg.lower_sm_share, Some(0.5));
        assert_eq!(cfg.lower_depth_beside_high, Some(1));
        let none = Policy::parse("", "t.toml").expect("empty policy is valid");
        assert_eq!(
            none.priority_config(),
            crate::sched::PriorityConfig::default()
        );
        for bad in [
            "lower_sm_share = 0.0",
            "lower_sm_share = 1.5",
            "lower_depth = 0",
        ] {
            let e = Policy::parse(&format!("[priority]\n{bad}\n"), "t.toml")
                .expect_err("out-of-range tunable");
            assert!(e.to_string().contains("[priority]"), "{e}");
        }
    }

    #[test]
    fn mistakes_are_reported_with_the_path() {
        let err = Policy::parse("[defaults]\nclass = \"urgent\"\n", "/etc/x.toml")
            .expect_err("bad class");
        assert!(err.to_string().contains("/etc/x.toml"), "{err}");
        let err =
            Policy::parse("[defaults]\nmemory_quota = \"lots\"\n", "p").expect_err("bad size");
        assert!(err.to_string().contains("lots"), "{err}");
        assert!(
            Policy::parse("[[users]]\nclass = \"high\"\n", "p").is_err(),
            "no name nor uid"
        );
        assert!(
            Policy::parse("[defaults]\ncolour = 1\n", "p").is_err(),
            "unknown key"
        );
        assert!(Policy::parse("", "p").is_ok(), "empty file = defaults");
        let p = Policy::parse("admin_group = \"ops\"\n", "p").expect("valid");
        assert!(p.is_admin(&who(0, "root", &[])));
        assert!(p.is_admin(&who(1000, "alice", &[(10, "ops")])));
        assert!(!p.is_admin(&who(1001, "bob", &[(11, "users")])));
        assert!(!Policy::default().is_admin(&who(1000, "alice", &[(10, "ops")])));
    }

    #[test]
    fn allow_refuses_users_and_groups_like_any_other_field() {
        // Everyone allowed unless the file says otherwise.
        assert!(Policy::default().allows(&who(1000, "alice", &[])));
        assert!(
            Policy::parse(FILE, "p")
                .expect("valid")
                .allows(&who(1000, "alice", &[]))
        );

        let deny_one = Policy::parse(
            "[[users]]\nname = \"mallory\"\nallow = false\n",
            "/etc/gpushare/gpushare.toml",
        )
        .expect("valid");
        assert!(deny_one.allows(&who(1000, "alice", &[])));
        assert!(!deny_one.allows(&who(1001, "mallory", &[])));
        assert_eq!(deny_one.refusal(&who(1000, "alice", &[])), None);
        assert_eq!(
            deny_one.refusal(&who(1001, "mallory", &[])).as_deref(),
            Some(
                "the policy file /etc/gpushare/gpushare.toml does not allow user `mallory` (uid 1001) to use gpushare; ask the administrator"
            )
        );

        let closed = Policy::parse(
            r#"
            [defaults]
            allow = false

            [[users]]
            uid = 1002
            class = "high"

            [[users]]
            name = "bob"
            allow = true

            [[groups]]
            name = "gpu"
            allow = true

            [[groups]]
            gid = 60
            allow = false
            "#,
            "p",
        )
        .expect("valid");
        assert!(!closed.allows(&who(1000, "alice", &[])), "defaults refuse");
        assert!(closed.allows(&who(1001, "bob", &[])), "user entry allows");
        assert!(
            closed.allows(&who(1003, "carol", &[(50, "gpu")])),
            "group allows"
        );
        assert!(
            closed.allows(&who(1003, "carol", &[(50, "gpu"), (60, "banned")])),
            "first group in file order wins"
        );
        assert!(!closed.allows(&who(1004, "dave", &[(60, "banned")])));
        assert!(
            !closed.allows(&who(1002, "erin", &[(50, "gpu")])),
            "a user entry without allow takes the default, not the group's"
        );
        assert!(
            closed.allows(&who(0, "root", &[])),
            "root is always allowed"
        );
        let nameless = Identity {
            uid: 4242,
            user: None,
            gids: vec![],
            group_names: vec![],
        };
        assert_eq!(
            closed.refusal(&nameless).as_deref(),
            Some(
                "the policy file p does not allow uid 4242 to use gpushare; ask the administrator"
            )
        );
        // Allow does not change what the allowed are granted.
        assert_eq!(
            closed.grant_for(&who(1002, "erin", &[])).class,
            PriorityClass::High
        );
        assert!(
            Policy::parse("[defaults]\nallow = \"no\"\n", "p").is_err(),
            "allow is a boolean"
        );
    }
}

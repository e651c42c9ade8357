//! The policy file's unit tests: who gets what, and the mistakes it refuses (the scheduling
//! tunables' tests are beside them, in `sched_tunables.rs`).

use super::*;

fn who(uid: u32, user: &str, groups: &[(u32, &str)]) -> Identity {
    Identity {
        uid,
        user: Some(user.into()),
        gids: groups.iter().map(|g| g.0).collect(),
        group_names: groups.iter().map(|g| g.1.to_string()).collect(),
        in_pod: false,
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
fn mistakes_are_reported_with_the_path() {
    let err =
        Policy::parse("[defaults]\nclass = \"urgent\"\n", "/etc/x.toml").expect_err("bad class");
    assert!(err.to_string().contains("/etc/x.toml"), "{err}");
    let err = Policy::parse("[defaults]\nmemory_quota = \"lots\"\n", "p").expect_err("bad size");
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
        in_pod: false,
    };
    assert_eq!(
        closed.refusal(&nameless).as_deref(),
        Some("the policy file p does not allow uid 4242 to use gpushare; ask the administrator")
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

#[test]
fn bounds_come_from_the_users_entry_then_the_defaults_then_the_built_in_ones() {
    let none = Policy::parse("", "p").expect("empty policy");
    assert_eq!(
        none.bounds_for(&who(1000, "alice", &[])),
        Bounds {
            max_sessions: 64,
            max_pinned: Some(2 << 30),
            max_connections: 128,
            max_module_memory: Some(1 << 30),
            gpu_memory_quota: None,
        }
    );
    let p = Policy::parse(
        r#"
        [defaults]
        max_sessions = 8
        max_connections = 20
        gpu_memory_quota = "16 GiB"

        [[users]]
        name = "alice"
        max_pinned_memory = "unlimited"
        max_module_memory = "unlimited"
        gpu_memory_quota = "unlimited"

        [[groups]]
        name = "students"
        max_sessions = 2
        max_pinned_memory = "256 MiB"
        max_connections = 4
        max_module_memory = "64 MiB"
        "#,
        "p",
    )
    .expect("valid");
    assert_eq!(
        p.bounds_for(&who(1000, "alice", &[(100, "students")])),
        Bounds {
            max_sessions: 8,
            max_pinned: None,
            max_connections: 20,
            max_module_memory: None,
            gpu_memory_quota: None,
        },
        "the user entry wins; what it leaves out comes from [defaults]"
    );
    assert_eq!(
        p.bounds_for(&who(1001, "bob", &[(100, "students")])),
        Bounds {
            max_sessions: 2,
            max_pinned: Some(256 << 20),
            max_connections: 4,
            max_module_memory: Some(64 << 20),
            gpu_memory_quota: Some(16 << 30),
        }
    );
    assert_eq!(
        p.bounds_for(&who(1002, "carol", &[])).max_pinned,
        Some(2 << 30)
    );
    let many = Policy::parse("[defaults]\nmax_sessions = 1000\n", "p").expect("valid");
    assert_eq!(
        many.bounds_for(&who(1000, "alice", &[])).max_connections,
        1064,
        "unless set, connections follow sessions"
    );
    let e = Policy::parse("[[users]]\nuid = 5\nmax_sessions = 0\n", "p").expect_err("zero");
    assert!(e.to_string().contains("max_sessions"), "{e}");
    let e = Policy::parse("[defaults]\nmax_connections = 0\n", "p").expect_err("zero");
    assert!(e.to_string().contains("max_connections"), "{e}");
    let e =
        Policy::parse("[defaults]\nmemory_quota = \"20000000 PiB\"\n", "p").expect_err("too large");
    assert!(e.to_string().contains("`20000000 PiB` does not fit"), "{e}");
}

#[test]
fn everyone_is_in_the_default_domain_when_the_file_says_nothing() {
    for p in [
        Policy::default(),
        Policy::parse("", "p").expect("empty policy"),
        Policy::parse(FILE, "p").expect("valid"),
    ] {
        assert_eq!(
            p.trust_domain(&who(1000, "alice", &[(100, "students")])),
            TrustDomain::default()
        );
        assert_eq!(p.trust_domain(&who(0, "root", &[])).as_str(), "default");
        assert_eq!(p.trust_domains(), vec![TrustDomain::default()]);
    }
    assert_eq!(TrustDomain::default().to_string(), TrustDomain::DEFAULT);
}

const DOMAINS: &str = r#"
    [defaults]
    trust_domain = "shared"

    [[users]]
    name = "alice"
    trust_domain = "alice"

    [[users]]
    name = "bob"
    class = "high"

    [[users]]
    uid = 0
    trust_domain = "ops"

    [[groups]]
    name = "students"
    trust_domain = "teaching"

    [[groups]]
    gid = 50
    trust_domain = "ops"

    [[groups]]
    name = "lab"
    class = "best-effort"
"#;

#[test]
fn trust_domains_follow_the_same_precedence_as_every_other_field() {
    let p = Policy::parse(DOMAINS, "p").expect("valid");
    let domain = |w: &Identity| p.trust_domain(w).to_string();
    assert_eq!(
        domain(&who(1000, "alice", &[(100, "students")])),
        "alice",
        "user beats group"
    );
    assert_eq!(
        domain(&who(1001, "bob", &[(100, "students")])),
        "shared",
        "a user entry without the field takes [defaults], not the group's"
    );
    assert_eq!(
        domain(&who(1002, "carol", &[(100, "students")])),
        "teaching"
    );
    assert_eq!(
        domain(&who(1003, "dave", &[(50, "staff"), (100, "students")])),
        "teaching",
        "first group in file order wins"
    );
    assert_eq!(domain(&who(1004, "erin", &[(50, "staff")])), "ops");
    assert_eq!(
        domain(&who(1005, "frank", &[(60, "lab"), (50, "staff")])),
        "ops",
        "file order, not the user's group order"
    );
    assert_eq!(
        domain(&who(1006, "grace", &[(70, "lab")])),
        "shared",
        "a group entry without the field takes [defaults]"
    );
    assert_eq!(domain(&who(1007, "heidi", &[])), "shared");
    assert_eq!(
        domain(&who(0, "root", &[])),
        "ops",
        "root's user entry places it"
    );
    // The domain comes from the same entry as the grant, and changes nothing in it.
    assert_eq!(
        p.grant_for(&who(1006, "grace", &[(70, "lab")])).class,
        PriorityClass::BestEffort
    );
    assert_eq!(
        p.grant_for(&who(1005, "frank", &[(60, "lab"), (50, "staff")]))
            .class,
        PriorityClass::Normal,
        "frank's entry is gid 50's, which names no class"
    );
}

#[test]
fn root_without_an_entry_is_placed_by_the_defaults() {
    let p = Policy::parse("[defaults]\ntrust_domain = \"shared\"\n", "p").expect("valid");
    assert_eq!(
        p.trust_domain(&who(0, "root", &[(0, "root")])).as_str(),
        "shared"
    );
}

#[test]
fn the_domains_list_names_each_domain_once_sorted_with_the_default() {
    let p = Policy::parse(DOMAINS, "p").expect("valid");
    let names: Vec<String> = p.trust_domains().iter().map(|d| d.to_string()).collect();
    assert_eq!(names, ["alice", "default", "ops", "shared", "teaching"]);
    let only_default =
        Policy::parse("[[users]]\nuid = 7\ntrust_domain = \"default\"\n", "p").expect("valid");
    assert_eq!(only_default.trust_domains(), vec![TrustDomain::default()]);
}

#[test]
fn bad_trust_domain_names_are_refused_naming_the_entry_and_the_rule() {
    for good in ["a", "0", "gpu-team_2", &"x".repeat(32)] {
        let text = format!("[defaults]\ntrust_domain = \"{good}\"\n");
        let p = Policy::parse(&text, "p").unwrap_or_else(|e| panic!("{good}: {e}"));
        assert_eq!(p.trust_domain(&who(1000, "alice", &[])).as_str(), good);
    }
    let cases = [
        (
            "[defaults]\ntrust_domain = \"\"\n",
            "[defaults]",
            "is empty",
        ),
        (
            "[[users]]\nname = \"alice\"\ntrust_domain = \"GPU\"\n",
            "[[users]] entry `alice`",
            "`GPU` has 'G'",
        ),
        (
            "[[users]]\nuid = 1000\ntrust_domain = \"a b\"\n",
            "[[users]] entry uid 1000",
            "has ' '",
        ),
        (
            "[[groups]]\nname = \"lab\"\ntrust_domain = \"-lab\"\n",
            "[[groups]] entry `lab`",
            "does not start with a letter or digit",
        ),
        (
            "[[groups]]\ngid = 50\ntrust_domain = \"é\"\n",
            "[[groups]] entry gid 50",
            "has 'é'",
        ),
        (
            &format!("[defaults]\ntrust_domain = \"{}\"\n", "x".repeat(33)),
            "[defaults]",
            "longer than 32 characters",
        ),
    ];
    for (text, entry, why) in cases {
        let e = Policy::parse(text, "/etc/gpushare/gpushare.toml").expect_err(text);
        let e = e.to_string();
        assert!(e.contains("/etc/gpushare/gpushare.toml"), "{e}");
        assert!(e.contains(&format!("{entry}: trust_domain ")), "{e}");
        assert!(e.contains(why), "{e}");
        assert!(
            e.contains(
                "1 to 32 characters of a-z, 0-9, `_` and `-`, starting with a letter or digit"
            ),
            "the rule: {e}"
        );
    }
    assert!(
        Policy::parse("[defaults]\ntrust_domain = 3\n", "p").is_err(),
        "a name is a string"
    );
}

#[test]
fn the_shipped_policy_files_parse_and_the_slurm_example_grants_as_it_says() {
    let main = include_str!("../../../packaging/gpushare.toml");
    Policy::parse(main, "packaging/gpushare.toml").expect("the packaged policy file");
    let example = include_str!("../../../packaging/slurm/gpushare.toml.example");
    let policy =
        Policy::parse(example, "packaging/slurm/gpushare.toml.example").expect("the Slurm example");
    let slurm = policy.slurm().expect("[slurm]");
    assert_eq!(slurm.shards_per_gpu, 8);
    assert_eq!(
        slurm.class_for(Some("interactive"), None),
        PriorityClass::High
    );
    assert_eq!(
        slurm.class_for(Some("interactive"), Some("scavenger")),
        PriorityClass::BestEffort
    );
    assert!(!slurm.jobs_only);
}

//! Real accounts of this machine to run test processes as, and what a test that needs root
//! does without it: skip, or fail where the environment says it must run.

use std::process::Command;

/// A real account of this machine to run test processes as. Tests look accounts up; they
/// never create any.
#[derive(Debug, Clone)]
pub struct SystemUser {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    /// Every group of the account (primary included), as a login would set them.
    pub groups: Vec<u32>,
}

impl SystemUser {
    /// Looks `name` up in the system's user database.
    pub fn lookup(name: &str) -> Option<SystemUser> {
        let user = nix::unistd::User::from_name(name).ok().flatten()?;
        let cname = std::ffi::CString::new(name).ok()?;
        let groups = nix::unistd::getgrouplist(&cname, user.gid)
            .map(|g| g.into_iter().map(|g| g.as_raw()).collect())
            .unwrap_or_else(|_| vec![user.gid.as_raw()]);
        Some(SystemUser {
            name: name.to_string(),
            uid: user.uid.as_raw(),
            gid: user.gid.as_raw(),
            groups,
        })
    }

    /// Makes `cmd` run as this user: real and effective uid and gid and the account's groups,
    /// nothing left of the caller's (root's) groups. Needs root.
    pub fn apply<'c>(&self, cmd: &'c mut Command) -> &'c mut Command {
        use std::os::unix::process::CommandExt;
        let (uid, gid, groups) = (self.uid, self.gid, self.groups.clone());
        // SAFETY: the closure runs in the forked child before exec. It only makes the
        // async-signal-safe system calls setgroups, setgid and setuid (in that order: groups
        // and gid while still root) on data prepared before the fork; it neither allocates nor
        // takes locks (`last_os_error` only reads errno).
        unsafe {
            cmd.pre_exec(move || {
                if libc::setgroups(groups.len(), groups.as_ptr()) != 0
                    || libc::setgid(gid) != 0
                    || libc::setuid(uid) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            })
        }
    }
}

/// Whether tests that need root must run: in CI (`CI` set, as CI services set it, and CI runs
/// the suite as root) or where `GPUSHARE_REQUIRE_ROOT` is set. There a test that cannot run
/// fails instead of saying SKIPPED, as `GPUSHARE_REQUIRE_GPU` and `GPUSHARE_REQUIRE_BPF` do
/// for the GPU and eBPF tests.
pub fn root_required() -> bool {
    std::env::var_os("GPUSHARE_REQUIRE_ROOT").is_some() || std::env::var_os("CI").is_some()
}

/// Says loudly (straight to stderr, which the test harness does not capture) that `test` is
/// skipped and why, or fails it where tests needing root must run ([`root_required`]).
pub fn skip_or_fail(test: &str, why: &str) {
    if root_required() {
        panic!(
            "{test} cannot run ({why}), and GPUSHARE_REQUIRE_ROOT or CI says it must: run the suite as root, on a machine with the `daemon` and `nobody` accounts"
        );
    }
    let _ = std::io::Write::write_all(
        &mut std::io::stderr(),
        format!("SKIPPED {test}: {why}\n").as_bytes(),
    );
}

/// Whether this process runs as root; if not, `test` is skipped ([`skip_or_fail`]).
pub fn root_or_skip(test: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    skip_or_fail(
        test,
        "not root (needs root to run processes as other users)",
    );
    false
}

/// Two real accounts of this machine to run test processes as (`daemon` and `nobody`), when
/// this process is root; otherwise `test` is skipped ([`skip_or_fail`]). As root, a missing
/// account fails the test: it could run, and must.
pub fn other_users(test: &str) -> Option<(SystemUser, SystemUser)> {
    if !root_or_skip(test) {
        return None;
    }
    match (SystemUser::lookup("daemon"), SystemUser::lookup("nobody")) {
        (Some(a), Some(b)) => Some((a, b)),
        _ => panic!("{test} runs as root but this machine has no `daemon` or `nobody` account"),
    }
}

//! Who is asking: a uid and gid as the kernel told them, with names and groups from the
//! system's user database.

/// Who is asking, as the kernel told us.
#[derive(Debug, Clone)]
pub struct Identity {
    pub uid: u32,
    pub user: Option<String>,
    /// Every group the user is in (primary included).
    pub gids: Vec<u32>,
    pub group_names: Vec<String>,
    /// It came through a Kubernetes container's socket: never an administrator, whatever
    /// its uid (a container's root is not this machine's).
    pub in_pod: bool,
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
            in_pod: false,
        }
    }

    /// The user the policy names `name` (a Kubernetes identity's `user`): uid and groups from
    /// the user database; a name it lacks matches `[[users]]` entries by name only, as
    /// [`NO_UID`].
    pub fn of_name(name: &str) -> Identity {
        match nix::unistd::User::from_name(name).ok().flatten() {
            Some(u) => Identity::lookup(u.uid.as_raw(), u.gid.as_raw()),
            None => Identity {
                uid: NO_UID,
                user: Some(name.to_string()),
                gids: Vec::new(),
                group_names: Vec::new(),
                in_pod: false,
            },
        }
    }

    /// The user of `uid` (a Kubernetes identity's `uid`), with groups where the user database
    /// has the uid.
    pub fn of_uid(uid: u32) -> Identity {
        match nix::unistd::User::from_uid(uid.into()).ok().flatten() {
            Some(u) => Identity::lookup(uid, u.gid.as_raw()),
            None => Identity {
                uid,
                user: None,
                gids: Vec::new(),
                group_names: Vec::new(),
                in_pod: false,
            },
        }
    }
}

/// The uid of a user the policy names but this machine's user database lacks: `(uid_t)-1`,
/// which is no one's.
pub const NO_UID: u32 = u32::MAX;

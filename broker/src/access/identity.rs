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
}

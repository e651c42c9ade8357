//! Admin requests: who may change or evict a connected client, and what a change does.

use gpushare_protocol::error::WireError;
use gpushare_protocol::{ErrorCode, PriorityClass};
use tracing::{info, warn};

use super::Broker;
use crate::access::{Grant, Identity};
use crate::session::SessionInfo;

impl Broker {
    /// Applies an admin action to client `id` if `who` may administer clients.
    fn admin(
        &self,
        who: &Identity,
        id: u64,
        act: impl FnOnce(&SessionInfo),
    ) -> Result<(), WireError> {
        self.may_administer(who, "change or evict clients")?;
        let info = self.registry.get(id).ok_or_else(|| {
            WireError::new(
                ErrorCode::InvalidHandle,
                format!("no client {id} is connected"),
            )
        })?;
        act(&info);
        Ok(())
    }

    /// Refuses `who` unless they may administer gpushared: `what` names what they tried.
    pub(super) fn may_administer(&self, who: &Identity, what: &str) -> Result<(), WireError> {
        let (allowed, group) = match self.policy.read() {
            Ok(p) => (p.is_admin(who), p.admin_group().map(str::to_string)),
            Err(_) => (who.uid == 0, None),
        };
        if allowed {
            return Ok(());
        }
        let msg = match group {
            Some(g) => format!("only root or members of the admin group `{g}` may {what}"),
            None => {
                format!("only root may {what} (set admin_group in the policy file to delegate)")
            }
        };
        Err(WireError::new(ErrorCode::PermissionDenied, msg))
    }

    /// Changes client `client`'s live grant (`None` keeps a field as it is), and its place
    /// in its GPU's scheduler.
    pub(super) fn admin_set(
        &self,
        who: &Identity,
        client: u64,
        class: Option<PriorityClass>,
        weight: Option<u32>,
        memory_quota: Option<Option<u64>>,
    ) -> Result<(), WireError> {
        self.admin(who, client, |info| {
            let g = changed_grant(info.grant(), class, weight, memory_quota);
            info.set_grant(g);
            if let Some(d) = self.gpus.get(info.gpu as usize).map(|g| &g.scheduler) {
                d.update_client(info.id, g.class, g.weight);
            }
            info!(client, class = %g.class, weight = g.weight, quota = ?g.memory_quota, by = who.uid, "admin changed a client's grant");
        })
    }

    /// Evicts client `client`, which is told `reason`.
    pub(super) fn admin_evict(
        &self,
        who: &Identity,
        client: u64,
        reason: String,
    ) -> Result<(), WireError> {
        self.admin(who, client, |info| {
            warn!(client, %reason, by = who.uid, "admin evicted a client");
            info.evict(reason);
        })
    }
}

/// `grant` with what an admin changed (`None` keeps a field as it is); a weight is at least 1.
fn changed_grant(
    mut grant: Grant,
    class: Option<PriorityClass>,
    weight: Option<u32>,
    memory_quota: Option<Option<u64>>,
) -> Grant {
    grant.class = class.unwrap_or(grant.class);
    grant.weight = weight.unwrap_or(grant.weight).max(1);
    grant.memory_quota = memory_quota.unwrap_or(grant.memory_quota);
    grant
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::Policy;
    use crate::server::testing::{identity, register, sim_broker};

    fn denied(msg: &str) -> Result<(), WireError> {
        Err(WireError::new(ErrorCode::PermissionDenied, msg))
    }

    #[test]
    fn only_admins_change_or_evict_clients() {
        let broker = sim_broker(1);
        let target = register(&broker, 100, 0, false);
        let evict = |who| broker.admin_evict(&who, target.id, "make room".into());

        assert_eq!(
            evict(identity(1000, &["ops"])),
            denied(
                "only root may change or evict clients (set admin_group in the policy file to delegate)"
            )
        );
        broker.set_policy(Policy::parse("admin_group = \"ops\"\n", "test.toml").expect("valid"));
        assert_eq!(
            evict(identity(1000, &["staff"])),
            denied("only root or members of the admin group `ops` may change or evict clients")
        );
        assert_eq!(
            broker.admin_set(&identity(1000, &["staff"]), target.id, None, Some(9), None),
            denied("only root or members of the admin group `ops` may change or evict clients")
        );
        assert_eq!(target.eviction(), None, "a refused admin changes nothing");
        assert_eq!(target.grant(), Grant::default());

        assert_eq!(evict(identity(1000, &["ops"])), Ok(()));
        assert_eq!(target.eviction().as_deref(), Some("make room"));
        assert!(
            target.stopping(),
            "an evicted session's data thread is told to stop"
        );
    }

    #[test]
    fn root_changes_a_live_grant_of_a_connected_client() {
        let broker = sim_broker(1);
        let target = register(&broker, 100, 0, false);
        let root = identity(0, &[]);

        let set = broker.admin_set(
            &root,
            target.id,
            Some(PriorityClass::High),
            Some(4),
            Some(Some(1 << 30)),
        );
        assert_eq!(set, Ok(()));
        assert_eq!(
            target.grant(),
            Grant {
                class: PriorityClass::High,
                weight: 4,
                memory_quota: Some(1 << 30)
            }
        );
        assert_eq!(
            broker.admin_set(&root, 999, None, Some(2), None),
            Err(WireError::new(
                ErrorCode::InvalidHandle,
                "no client 999 is connected"
            ))
        );
    }

    #[test]
    fn an_admin_change_keeps_what_it_does_not_name() {
        let before = Grant {
            class: PriorityClass::Normal,
            weight: 3,
            memory_quota: Some(1 << 20),
        };
        assert_eq!(changed_grant(before, None, None, None), before);
        let after = changed_grant(before, Some(PriorityClass::BestEffort), Some(0), Some(None));
        assert_eq!(
            after,
            Grant {
                class: PriorityClass::BestEffort,
                weight: 1,
                memory_quota: None
            },
            "a weight of 0 becomes 1; Some(None) lifts the quota"
        );
    }
}

//! Each user's account over all of their sessions: the device memory they hold against their
//! quota, and how many sessions they have open. Library, governed and consolidated sessions
//! of one user share one account, so a user with N connections gets one quota, not N.
//!
//! The quota is the policy's for the user as of their latest new session (a SIGHUP's new
//! quota applies to a user from their next session on), or what an administrator set since
//! (`gpushare set ID --memory-quota`, which changes the quota of client ID's user).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use gpushare_protocol::ErrorCode;
use gpushare_protocol::stats::UserStats;

/// One user's account.
#[derive(Debug)]
pub struct UserAccount {
    pub uid: u32,
    pub user: String,
    /// Device memory held by all of the user's sessions.
    memory_used: AtomicU64,
    /// `u64::MAX` means unlimited.
    quota: AtomicU64,
    /// Sessions open; changed only under the accounts' lock.
    sessions: AtomicU32,
}

impl UserAccount {
    fn new(uid: u32, user: String, quota: Option<u64>) -> UserAccount {
        UserAccount {
            uid,
            user,
            memory_used: AtomicU64::new(0),
            quota: AtomicU64::new(quota.unwrap_or(u64::MAX)),
            sessions: AtomicU32::new(0),
        }
    }

    /// The user's memory quota; `None` means unlimited.
    pub fn quota(&self) -> Option<u64> {
        Some(self.quota.load(Ordering::Relaxed)).filter(|&q| q != u64::MAX)
    }

    pub fn set_quota(&self, quota: Option<u64>) {
        self.quota
            .store(quota.unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// Device memory held by all of the user's sessions.
    pub fn memory_used(&self) -> u64 {
        self.memory_used.load(Ordering::Relaxed)
    }

    pub fn sessions(&self) -> u32 {
        self.sessions.load(Ordering::Relaxed)
    }

    /// Counts `bytes` more against the quota if the user's sessions together stay within it
    /// (else `OutOfQuota`, and nothing changes). Sessions of one user charge from their own
    /// threads at once: the check and the charge are one atomic step.
    pub fn charge(&self, bytes: u64) -> Result<(), ErrorCode> {
        let quota = self.quota.load(Ordering::Relaxed);
        self.memory_used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|&now| now <= quota)
            })
            .map(drop)
            .map_err(|_| ErrorCode::OutOfQuota)
    }

    /// Counts `bytes` more whatever the quota: memory the user already holds (a governed
    /// program registering again after a reconnect).
    pub fn charge_held(&self, bytes: u64) {
        let _ = self
            .memory_used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                Some(used.saturating_add(bytes))
            });
    }

    /// Gives `bytes` back (never below zero).
    pub fn release(&self, bytes: u64) {
        let _ = self
            .memory_used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                Some(used.saturating_sub(bytes))
            });
    }

    pub fn stats(&self) -> UserStats {
        UserStats {
            uid: self.uid,
            user: self.user.clone(),
            sessions: self.sessions(),
            memory_used: self.memory_used(),
            memory_quota: self.quota(),
        }
    }
}

/// Every user with a session (or memory not yet given back), by uid.
#[derive(Debug, Default)]
pub struct Accounts {
    users: Mutex<BTreeMap<u32, Arc<UserAccount>>>,
}

/// A session's place in its user's account; leaving it (dropping) counts the session out.
#[derive(Debug)]
pub struct Seat<'a> {
    accounts: &'a Accounts,
    account: Arc<UserAccount>,
}

impl Seat<'_> {
    pub fn account(&self) -> &Arc<UserAccount> {
        &self.account
    }
}

impl Drop for Seat<'_> {
    fn drop(&mut self) {
        let mut users = self.accounts.lock();
        self.account.sessions.fetch_sub(1, Ordering::Relaxed);
        self.accounts.forget_if_idle(&mut users, self.account.uid);
    }
}

impl Accounts {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<u32, Arc<UserAccount>>> {
        self.users.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts a new session of `uid` in, with the quota the policy grants the user now.
    pub fn join(&self, uid: u32, user: &str, quota: Option<u64>) -> Seat<'_> {
        let mut users = self.lock();
        let account = users
            .entry(uid)
            .or_insert_with(|| Arc::new(UserAccount::new(uid, user.to_string(), quota)))
            .clone();
        account.set_quota(quota);
        account.sessions.fetch_add(1, Ordering::Relaxed);
        Seat {
            accounts: self,
            account,
        }
    }

    /// The account of `uid`, if the user has one.
    pub fn get(&self, uid: u32) -> Option<Arc<UserAccount>> {
        self.lock().get(&uid).cloned()
    }

    /// Drops an account nobody uses any more: no session, no memory.
    fn forget_if_idle(&self, users: &mut BTreeMap<u32, Arc<UserAccount>>, uid: u32) {
        if users
            .get(&uid)
            .is_some_and(|a| a.sessions() == 0 && a.memory_used() == 0)
        {
            users.remove(&uid);
        }
    }

    /// After a session's memory came back: an account left without sessions goes.
    pub fn tidy(&self, uid: u32) {
        let mut users = self.lock();
        self.forget_if_idle(&mut users, uid);
    }

    /// Per-user totals, by uid.
    pub fn snapshot(&self) -> Vec<UserStats> {
        self.lock().values().map(|a| a.stats()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_of_one_user_share_one_quota() {
        let accounts = Accounts::default();
        let one = accounts.join(1000, "alice", Some(100));
        let two = accounts.join(1000, "alice", Some(100));
        assert!(Arc::ptr_eq(one.account(), two.account()));
        one.account().charge(60).expect("within the quota");
        assert_eq!(
            two.account().charge(60),
            Err(ErrorCode::OutOfQuota),
            "the first session's 60 bytes count for the second"
        );
        two.account().charge(40).expect("what is left");
        assert_eq!(one.account().memory_used(), 100);
        let other = accounts.join(1001, "bob", Some(100));
        other
            .account()
            .charge(100)
            .expect("another user's quota is untouched");
        let users = accounts.snapshot();
        assert_eq!(users.len(), 2);
        assert_eq!(
            (
                users[0].user.as_str(),
                users[0].sessions,
                users[0].memory_used
            ),
            ("alice", 2, 100)
        );
    }

    #[test]
    fn a_failed_charge_changes_nothing_and_release_never_goes_below_zero() {
        let account = UserAccount::new(1, "u".into(), Some(10));
        assert_eq!(account.charge(11), Err(ErrorCode::OutOfQuota));
        assert_eq!(account.charge(u64::MAX), Err(ErrorCode::OutOfQuota));
        assert_eq!(account.memory_used(), 0);
        account.charge_held(20);
        assert_eq!(
            account.memory_used(),
            20,
            "held memory counts past the quota"
        );
        assert_eq!(account.charge(1), Err(ErrorCode::OutOfQuota));
        account.release(30);
        assert_eq!(account.memory_used(), 0);
        let unlimited = UserAccount::new(2, "v".into(), None);
        unlimited.charge(u64::MAX - 1).expect("no quota");
        assert_eq!(unlimited.quota(), None);
    }

    #[test]
    fn the_latest_session_brings_the_policys_quota_and_idle_accounts_go() {
        let accounts = Accounts::default();
        let first = accounts.join(7, "carol", Some(100));
        let second = accounts.join(7, "carol", Some(300));
        assert_eq!(first.account().quota(), Some(300));
        first.account().charge(5).expect("charge");
        drop(first);
        drop(second);
        assert!(
            accounts.get(7).is_some(),
            "memory not yet given back keeps the account"
        );
        if let Some(a) = accounts.get(7) {
            a.release(5);
        }
        accounts.tidy(7);
        assert!(accounts.get(7).is_none());
        assert!(accounts.snapshot().is_empty());
    }
}

//! Each user's account over all of their sessions: the device memory they hold against their
//! quota, how many sessions they have open, and the host memory gpushared locks for them, each
//! against the policy's bounds. Library, governed and consolidated sessions of one user share
//! one account, so a user with N connections gets one quota, not N, and cannot open sessions
//! (each a thread, descriptors and a shared region) or pin host memory without bound.
//!
//! The quota is the policy's for the user as of their latest new session (a SIGHUP's new
//! quota applies to a user from their next session on), or what an administrator set since
//! (`gpushare set ID --memory-quota`, which changes the quota of client ID's user).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use bytesize::ByteSize;
use gpushare_protocol::ErrorCode;
use gpushare_protocol::stats::UserStats;

use crate::access::{Bounds, FaultLimit};

/// Why a user's account refuses more: each a sentence for the user.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error(
        "{who} has {open} sessions open, the most the policy's max_sessions allows: end one, or ask the administrator"
    )]
    TooManySessions { who: String, open: u32 },
    #[error(
        "{who}'s programs faulted the GPU {faults} times lately, past the policy's [faults] limit: new sessions are refused for {} s more",
        .left.as_secs() + 1
    )]
    FaultStorm {
        who: String,
        faults: usize,
        left: std::time::Duration,
    },
    #[error(
        "{who} holds {} of page-locked host memory in gpushared (each session's rings and arena, and host memory consolidated programs share); {} more would pass the policy's max_pinned_memory of {}: end a session, or ask the administrator",
        ByteSize(*.held),
        ByteSize(*.asked),
        ByteSize(*.max)
    )]
    PinnedMemory {
        who: String,
        held: u64,
        asked: u64,
        max: u64,
    },
}

impl Refusal {
    /// What the client is refused with.
    pub fn code(&self) -> ErrorCode {
        match self {
            Refusal::FaultStorm { .. } => ErrorCode::PermissionDenied,
            Refusal::TooManySessions { .. } | Refusal::PinnedMemory { .. } => {
                ErrorCode::TooManyHandles
            }
        }
    }
}

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
    /// Host memory gpushared holds locked for the user: every session's shared region and
    /// the host memory consolidated programs share.
    pinned: AtomicU64,
    /// The policy's bounds for the user, as of their latest new session.
    max_sessions: AtomicU32,
    /// `u64::MAX` means unlimited.
    max_pinned: AtomicU64,
    /// When the user's programs faulted the GPU lately, and until when new sessions are
    /// refused for it.
    faults: Mutex<Faults>,
}

/// A user's recent GPU faults.
#[derive(Debug, Default)]
struct Faults {
    limit: FaultLimit,
    at: std::collections::VecDeque<Instant>,
    refused_until: Option<Instant>,
}

impl Faults {
    fn forget_old(&mut self, now: Instant) {
        let window = self.limit.window;
        self.at.retain(|&t| now.duration_since(t) < window);
        if self.refused_until.is_some_and(|u| u <= now) {
            self.refused_until = None;
        }
    }
}

impl UserAccount {
    fn new(uid: u32, user: String, quota: Option<u64>) -> UserAccount {
        UserAccount {
            uid,
            user,
            memory_used: AtomicU64::new(0),
            quota: AtomicU64::new(quota.unwrap_or(u64::MAX)),
            sessions: AtomicU32::new(0),
            pinned: AtomicU64::new(0),
            max_sessions: AtomicU32::new(u32::MAX),
            max_pinned: AtomicU64::new(u64::MAX),
            faults: Mutex::default(),
        }
    }

    /// Names the user in refusals: user `alice` (uid 1000).
    fn who(&self) -> String {
        format!("user `{}` (uid {})", self.user, self.uid)
    }

    /// One of the user's programs faulted the GPU (it was evicted as the culprit): past the
    /// policy's `[faults]` limit the user's new sessions are refused for a while. Returns how
    /// long, if so.
    pub fn note_fault(&self) -> Option<std::time::Duration> {
        // Root is always allowed (the administrator's own tests fault on purpose).
        if self.uid == 0 {
            return None;
        }
        let now = Instant::now();
        let mut f = self.faults.lock().unwrap_or_else(|e| e.into_inner());
        f.forget_old(now);
        f.at.push_back(now);
        let limit = f.limit;
        if limit.max_faults == 0 || (f.at.len() as u32) < limit.max_faults {
            return None;
        }
        f.refused_until = Some(now + limit.refuse);
        tracing::warn!(user = %self.who(), faults = f.at.len(), refused = ?limit.refuse, "a user's programs keep faulting the GPU: new sessions refused for a while");
        Some(limit.refuse)
    }

    /// How long the user's new sessions are still refused for faulting the GPU, and the
    /// faults that did it.
    fn refused_for_faults(&self) -> Option<(usize, std::time::Duration)> {
        let now = Instant::now();
        let mut f = self.faults.lock().unwrap_or_else(|e| e.into_inner());
        f.forget_old(now);
        f.refused_until.map(|u| (f.at.len(), u - now))
    }

    /// Whether the account remembers faults (it must outlive its sessions then).
    fn remembers_faults(&self) -> bool {
        let mut f = self.faults.lock().unwrap_or_else(|e| e.into_inner());
        f.forget_old(Instant::now());
        !f.at.is_empty() || f.refused_until.is_some()
    }

    fn set_fault_limit(&self, limit: FaultLimit) {
        self.faults.lock().unwrap_or_else(|e| e.into_inner()).limit = limit;
    }

    fn set_bounds(&self, bounds: Bounds) {
        self.max_sessions
            .store(bounds.max_sessions, Ordering::Relaxed);
        self.max_pinned
            .store(bounds.max_pinned.unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// Host memory gpushared holds locked for the user.
    pub fn pinned(&self) -> u64 {
        self.pinned.load(Ordering::Relaxed)
    }

    /// Counts `bytes` more of locked host memory if the user stays within the policy's
    /// `max_pinned_memory`; else says why not, and nothing changes.
    pub fn pin(&self, bytes: u64) -> Result<(), Refusal> {
        let max = self.max_pinned.load(Ordering::Relaxed);
        self.pinned
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_add(bytes).filter(|&now| now <= max)
            })
            .map(drop)
            .map_err(|held| Refusal::PinnedMemory {
                who: self.who(),
                held,
                asked: bytes,
                max,
            })
    }

    /// Gives back `bytes` of locked host memory.
    pub fn unpin(&self, bytes: u64) {
        let _ = self
            .pinned
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                Some(held.saturating_sub(bytes))
            });
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
        if quota == u64::MAX {
            self.charge_held(bytes);
            return Ok(());
        }
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
            pinned_bytes: self.pinned(),
            max_sessions: self.max_sessions.load(Ordering::Relaxed),
            max_pinned_bytes: Some(self.max_pinned.load(Ordering::Relaxed))
                .filter(|&m| m != u64::MAX),
        }
    }
}

/// Every user with a session (or memory not yet given back), by uid.
#[derive(Debug, Default)]
pub struct Accounts {
    users: Mutex<BTreeMap<u32, Arc<UserAccount>>>,
}

/// A session's place in its user's account, with the host memory its shared region pins;
/// dropping it counts the session out and gives that memory back.
#[derive(Debug)]
pub struct Seat {
    accounts: Arc<Accounts>,
    account: Arc<UserAccount>,
    region_bytes: u64,
}

impl Seat {
    pub fn account(&self) -> &Arc<UserAccount> {
        &self.account
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        let mut users = self.accounts.lock();
        self.account.unpin(self.region_bytes);
        self.account.sessions.fetch_sub(1, Ordering::Relaxed);
        forget_if_idle(&mut users, self.account.uid);
    }
}

/// What a new session brings to its user's account.
#[derive(Debug, Clone, Copy)]
pub struct Joining<'a> {
    pub uid: u32,
    pub user: &'a str,
    /// The user's memory quota as the policy grants it now.
    pub quota: Option<u64>,
    pub bounds: Bounds,
    /// The session's shared region, locked in host memory.
    pub region_bytes: u64,
    /// How often the user's programs may fault the GPU.
    pub faults: FaultLimit,
}

impl Accounts {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<u32, Arc<UserAccount>>> {
        self.users.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts a new session of a user in, with the quota and bounds the policy gives the
    /// user now; or says why not (too many sessions, too much pinned memory).
    pub fn join(self: &Arc<Self>, joining: Joining<'_>) -> Result<Seat, Refusal> {
        let mut users = self.lock();
        let account = users
            .entry(joining.uid)
            .or_insert_with(|| {
                Arc::new(UserAccount::new(
                    joining.uid,
                    joining.user.to_string(),
                    joining.quota,
                ))
            })
            .clone();
        account.set_quota(joining.quota);
        account.set_bounds(joining.bounds);
        account.set_fault_limit(joining.faults);
        let refused = if let Some((faults, left)) = account.refused_for_faults() {
            Err(Refusal::FaultStorm {
                who: account.who(),
                faults,
                left,
            })
        } else if account.sessions() >= joining.bounds.max_sessions {
            Err(Refusal::TooManySessions {
                who: account.who(),
                open: account.sessions(),
            })
        } else {
            account.pin(joining.region_bytes)
        };
        if let Err(why) = refused {
            forget_if_idle(&mut users, joining.uid);
            return Err(why);
        }
        account.sessions.fetch_add(1, Ordering::Relaxed);
        Ok(Seat {
            accounts: self.clone(),
            account,
            region_bytes: joining.region_bytes,
        })
    }

    /// The account of `uid`, if the user has one.
    pub fn get(&self, uid: u32) -> Option<Arc<UserAccount>> {
        self.lock().get(&uid).cloned()
    }

    /// After a session's memory came back: an account left without sessions goes.
    pub fn tidy(&self, uid: u32) {
        forget_if_idle(&mut self.lock(), uid);
    }

    /// Per-user totals, by uid.
    pub fn snapshot(&self) -> Vec<UserStats> {
        self.lock().values().map(|a| a.stats()).collect()
    }

    /// A seat for unit tests: no quota, no bounds, no region.
    #[cfg(test)]
    pub fn seat_for_tests(self: &Arc<Self>, uid: u32, user: &str) -> Seat {
        let joining = Joining {
            uid,
            user,
            quota: None,
            bounds: Bounds {
                max_sessions: u32::MAX,
                max_pinned: None,
            },
            region_bytes: 0,
            faults: FaultLimit::default(),
        };
        match self.join(joining) {
            Ok(seat) => seat,
            Err(why) => panic!("an unbounded account refused a session: {why}"),
        }
    }
}

/// Drops an account nobody uses any more: no session, no memory, nothing pinned.
fn forget_if_idle(users: &mut BTreeMap<u32, Arc<UserAccount>>, uid: u32) {
    if users.get(&uid).is_some_and(|a| {
        a.sessions() == 0 && a.memory_used() == 0 && a.pinned() == 0 && !a.remembers_faults()
    }) {
        users.remove(&uid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn joining(uid: u32, user: &str, quota: Option<u64>) -> Joining<'_> {
        Joining {
            uid,
            user,
            quota,
            bounds: Bounds {
                max_sessions: 3,
                max_pinned: Some(1000),
            },
            region_bytes: 100,
            faults: FaultLimit::default(),
        }
    }

    #[test]
    fn sessions_of_one_user_share_one_quota() {
        let accounts = Arc::new(Accounts::default());
        let one = accounts
            .join(joining(1000, "alice", Some(100)))
            .expect("join");
        let two = accounts
            .join(joining(1000, "alice", Some(100)))
            .expect("join");
        assert!(Arc::ptr_eq(one.account(), two.account()));
        one.account().charge(60).expect("within the quota");
        assert_eq!(
            two.account().charge(60),
            Err(ErrorCode::OutOfQuota),
            "the first session's 60 bytes count for the second"
        );
        two.account().charge(40).expect("what is left");
        assert_eq!(one.account().memory_used(), 100);
        let other = accounts
            .join(joining(1001, "bob", Some(100)))
            .expect("join");
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
                users[0].memory_used,
                users[0].pinned_bytes
            ),
            ("alice", 2, 100, 200)
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
        unlimited
            .charge(u64::MAX)
            .expect("no quota refuses nothing");
        assert_eq!(unlimited.quota(), None);
    }

    #[test]
    fn the_latest_session_brings_the_policys_quota_and_idle_accounts_go() {
        let accounts = Arc::new(Accounts::default());
        let first = accounts.join(joining(7, "carol", Some(100))).expect("join");
        let second = accounts.join(joining(7, "carol", Some(300))).expect("join");
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
            assert_eq!(a.pinned(), 0, "the seats gave their regions back");
        }
        accounts.tidy(7);
        assert!(accounts.get(7).is_none());
        assert!(accounts.snapshot().is_empty());
    }

    #[test]
    fn a_user_whose_programs_keep_faulting_is_refused_for_a_while() {
        let accounts = Arc::new(Accounts::default());
        let limit = FaultLimit {
            max_faults: 2,
            window: std::time::Duration::from_secs(60),
            refuse: std::time::Duration::from_secs(30),
        };
        let with_limit = |uid, user| Joining {
            faults: limit,
            ..joining(uid, user, None)
        };
        let root = accounts.join(with_limit(0, "root")).expect("joins");
        for _ in 0..3 {
            assert_eq!(root.account().note_fault(), None, "root is never refused");
        }
        let seat = accounts.join(with_limit(9, "mallory")).expect("joins");
        let account = seat.account().clone();
        assert_eq!(account.note_fault(), None, "one fault is not a storm");
        drop(seat);
        assert!(accounts.get(9).is_some(), "the fault is remembered");
        let seat = accounts.join(with_limit(9, "mallory")).expect("joins");
        let refused = seat.account().note_fault().expect("the second fault");
        assert_eq!(refused, limit.refuse);
        drop(seat);
        let e = accounts
            .join(with_limit(9, "mallory"))
            .expect_err("refused meanwhile");
        assert_eq!(e.code(), ErrorCode::PermissionDenied);
        assert!(e.to_string().contains("faulted the GPU 2 times"), "{e}");
        assert!(
            accounts.join(with_limit(10, "alice")).is_ok(),
            "others are not"
        );
        let off = FaultLimit {
            max_faults: 0,
            ..limit
        };
        let seat = accounts
            .join(Joining {
                faults: off,
                ..joining(11, "bob", None)
            })
            .expect("joins");
        assert_eq!(seat.account().note_fault(), None);
        assert_eq!(seat.account().note_fault(), None, "never, when off");
    }

    #[test]
    fn sessions_and_pinned_memory_past_the_bounds_are_refused_with_the_reason() {
        let accounts = Arc::new(Accounts::default());
        let seats: Vec<Seat> = (0..3)
            .map(|_| {
                accounts
                    .join(joining(5, "dave", None))
                    .expect("within max_sessions")
            })
            .collect();
        let refused = accounts
            .join(joining(5, "dave", None))
            .expect_err("a fourth session");
        assert_eq!(
            refused.to_string(),
            "user `dave` (uid 5) has 3 sessions open, the most the policy's max_sessions allows: end one, or ask the administrator"
        );
        let account = seats[0].account().clone();
        assert_eq!((account.sessions(), account.pinned()), (3, 300));
        account.pin(700).expect("up to max_pinned_memory");
        let why = account.pin(1).expect_err("one byte past it").to_string();
        assert!(why.contains("max_pinned_memory of 1000 B"), "{why}");
        account.unpin(700);
        drop(seats);
        let big = Joining {
            region_bytes: 1001,
            ..joining(5, "dave", None)
        };
        let why = accounts
            .join(big)
            .expect_err("a region past the bound")
            .to_string();
        assert!(why.starts_with("user `dave` (uid 5) holds 0 B"), "{why}");
        assert!(accounts.get(5).is_none(), "a refused join leaves nothing");
        let other = accounts.join(joining(6, "erin", None));
        assert!(other.is_ok(), "other users are not held back");
    }
}

//! Each user's account over all of their sessions: the device memory they hold against their
//! quota, how many sessions and connections they have open, the host memory gpushared locks
//! for them and the module images it holds for them, each against the policy's bounds. Library, governed and consolidated sessions of one user share
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

use gpushare_protocol::ErrorCode;
use gpushare_protocol::control::ImageHash;
use gpushare_protocol::stats::UserStats;

use crate::access::{Bounds, FaultLimit};

mod gpus;
mod holds;
mod leaving;
mod refusal;
mod tally;

pub use gpus::GpuTallies;
pub use holds::{ImageHold, Visit};
pub use leaving::{LEAVING_WAIT, Leaving, NOTICE_WAIT};
pub use refusal::Refusal;
pub use tally::MemoryTally;

/// One user's account.
#[derive(Debug)]
pub struct UserAccount {
    pub uid: u32,
    pub user: String,
    /// Device memory held by all of the user's sessions, against their quota.
    memory: MemoryTally,
    /// The same on each GPU, against the policy's `gpu_memory_quota`.
    gpus: GpuTallies,
    /// Sessions open; changed only under the accounts' lock.
    sessions: AtomicU32,
    /// Host memory gpushared holds locked for the user: every session's shared region and
    /// the host memory consolidated programs share.
    pinned: AtomicU64,
    /// The policy's bounds for the user, as of their latest new session.
    max_sessions: AtomicU32,
    /// `u64::MAX` means unlimited.
    max_pinned: AtomicU64,
    /// Connections open (sessions, monitors, handshakes); changed only under the accounts'
    /// lock.
    connections: AtomicU32,
    max_connections: AtomicU32,
    /// Module images gpushared holds for the user, each counted once: by hash, how many of
    /// the user's modules hold it and its size.
    images: Mutex<std::collections::HashMap<ImageHash, (u32, u64)>>,
    image_bytes: AtomicU64,
    /// `u64::MAX` means unlimited.
    max_image_bytes: AtomicU64,
    /// When the user's programs faulted the GPU lately, and until when new sessions are
    /// refused for it.
    faults: Mutex<Faults>,
    /// The user's sessions that are giving back what they held.
    leavers: leaving::Leavers,
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
            memory: MemoryTally::new(quota),
            gpus: GpuTallies::default(),
            sessions: AtomicU32::new(0),
            pinned: AtomicU64::new(0),
            max_sessions: AtomicU32::new(u32::MAX),
            max_pinned: AtomicU64::new(u64::MAX),
            connections: AtomicU32::new(0),
            max_connections: AtomicU32::new(u32::MAX),
            images: Mutex::default(),
            image_bytes: AtomicU64::new(0),
            max_image_bytes: AtomicU64::new(u64::MAX),
            faults: Mutex::default(),
            leavers: leaving::Leavers::default(),
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
        self.max_connections
            .store(bounds.max_connections, Ordering::Relaxed);
        self.max_image_bytes.store(
            bounds.max_module_memory.unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        self.gpus.set_quota(bounds.gpu_memory_quota);
    }

    /// The user's memory on GPU `gpu`: a session there charges it besides the total.
    pub fn gpu_tally(&self, gpu: u32) -> Arc<MemoryTally> {
        self.gpus.tally(gpu)
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
        self.memory.quota()
    }

    pub fn set_quota(&self, quota: Option<u64>) {
        self.memory.set_quota(quota);
    }

    /// Device memory held by all of the user's sessions.
    pub fn memory_used(&self) -> u64 {
        self.memory.used()
    }

    pub fn sessions(&self) -> u32 {
        self.sessions.load(Ordering::Relaxed)
    }

    /// Counts `bytes` more against the quota if the user's sessions together stay within it
    /// (else `OutOfQuota`, and nothing changes). Sessions of one user charge from their own
    /// threads at once: the check and the charge are one atomic step.
    /// A refusal while another of the user's sessions is ending (or, for a user with other
    /// sessions, starts to within [`NOTICE_WAIT`]) waits for that session to give its memory
    /// back (at most [`LEAVING_WAIT`]) and tries again.
    pub fn charge(&self, bytes: u64) -> Result<(), ErrorCode> {
        self.try_charge(bytes).or_else(|refused| {
            if self.leavers.wait(self.sessions() > 1) {
                self.try_charge(bytes)
            } else {
                Err(refused)
            }
        })
    }

    /// Marks one of the user's sessions as ending until the guard drops.
    pub fn leaving(self: &Arc<Self>) -> Leaving {
        Leaving::new(self.clone())
    }

    fn try_charge(&self, bytes: u64) -> Result<(), ErrorCode> {
        self.memory.charge(bytes)
    }

    /// Counts `bytes` more whatever the quota: memory the user already holds (a governed
    /// program registering again after a reconnect).
    pub fn charge_held(&self, bytes: u64) {
        self.memory.charge_held(bytes);
    }

    /// Gives `bytes` back (never below zero).
    pub fn release(&self, bytes: u64) {
        self.memory.release(bytes);
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
            connections: self.connections(),
            max_connections: self.max_connections.load(Ordering::Relaxed),
            module_bytes: self.image_bytes(),
            gpu_memory: self.gpus.stats(),
            gpu_memory_quota: self.gpus.quota(),
            max_module_bytes: Some(self.max_image_bytes.load(Ordering::Relaxed))
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
        let account = account_of(&mut users, joining.uid, joining.user, joining.quota);
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
            bounds: Bounds::unbounded(),
            region_bytes: 0,
            faults: FaultLimit::default(),
        };
        match self.join(joining) {
            Ok(seat) => seat,
            Err(why) => panic!("an unbounded account refused a session: {why}"),
        }
    }
}

/// The account of `uid`, made (with `quota`) if the user has none yet.
fn account_of(
    users: &mut BTreeMap<u32, Arc<UserAccount>>,
    uid: u32,
    user: &str,
    quota: Option<u64>,
) -> Arc<UserAccount> {
    users
        .entry(uid)
        .or_insert_with(|| Arc::new(UserAccount::new(uid, user.to_string(), quota)))
        .clone()
}

/// Drops an account nobody uses any more: no session, no memory, nothing pinned.
fn forget_if_idle(users: &mut BTreeMap<u32, Arc<UserAccount>>, uid: u32) {
    if users.get(&uid).is_some_and(|a| {
        a.sessions() == 0
            && a.connections() == 0
            && a.memory_used() == 0
            && a.pinned() == 0
            && a.image_bytes() == 0
            && !a.remembers_faults()
    }) {
        users.remove(&uid);
    }
}

#[cfg(test)]
mod tests;

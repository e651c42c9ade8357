//! What the rest of the broker knows about a session: who it is, what it is granted, its
//! usage counters, and the flags and notices other tasks use to reach its data thread.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use gpushare_protocol::control::BrokerMessage;
use gpushare_protocol::stats::ClientStats;
use gpushare_protocol::{ErrorCode, PriorityClass};

use crate::access::Grant;
use crate::accounts::UserAccount;
use crate::gpu::health::{FaultWatch, Member};
use gpushare_protocol::wake::Wakeup;

/// Usage counters, updated by the data thread and read by status queries.
#[derive(Default)]
pub struct Counters {
    pub memory_used: AtomicU64,
    pub memory_peak: AtomicU64,
    pub allocations: AtomicU64,
    pub streams: AtomicU64,
    pub commands: AtomicU64,
    pub kernels: AtomicU64,
    pub bytes_htod: AtomicU64,
    pub bytes_dtoh: AtomicU64,
    pub bytes_dtod: AtomicU64,
    pub gpu_time_ns: AtomicU64,
    pub errors: AtomicU64,
    pub queue_depth: AtomicU64,
    /// Published by the data thread from its latency histogram; 0 = no data yet.
    pub latency_p50_ns: AtomicU64,
    pub latency_p99_ns: AtomicU64,
    /// How long the data thread spins for the client's next request.
    pub spin_ns: AtomicU64,
    /// Time a governed client waited for launch tokens.
    pub throttled_ns: AtomicU64,
}

impl Counters {
    /// Adds device time. A client's work may claim any duration (a sim kernel runs for as
    /// long as its parameter says): the total stops at the largest value, never wraps.
    pub fn add_gpu_time(&self, ns: u64) {
        let _ = self
            .gpu_time_ns
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
                Some(t.saturating_add(ns))
            });
    }
}

/// What the rest of the broker knows about a session.
pub struct SessionInfo {
    pub id: u64,
    pub pid: i32,
    pub uid: u32,
    pub user: String,
    pub name: String,
    /// Index of the device the session runs on.
    pub gpu: u32,
    /// An unmodified program under `gpushare run` (it runs on its own CUDA context and asks
    /// only for admission).
    pub governed: bool,
    /// An unmodified program under `gpushare run` whose CUDA driver is gpushare's: its work
    /// runs here like a client's, with CUDA's stream semantics.
    pub consolidated: bool,
    /// The trust domain whose GPU context it shares.
    pub trust_domain: String,
    /// Host memory the client shares for DMA (`ShareHostMemory`); the control task adds, the
    /// data thread copies.
    pub hosts: Mutex<super::hosts::HostRegions>,
    /// Host functions' release words (`StreamHostPoint`'s `go`) and the most a stream waits
    /// for at each: written from gpushared when the session stops, so that no stream (and no
    /// thread waiting for one) waits forever for a program that is gone.
    pub host_points: Mutex<std::collections::HashMap<u64, u32>>,
    /// Physical memory of the virtual memory API the client holds handles of (the data
    /// thread makes and maps it; the control task exports and imports it).
    pub vmm: Mutex<super::vmm::Handles>,
    /// The other GPUs' contexts whose memory is mapped into this session's context at its
    /// asking (`EnablePeerAccess`): let go of when it ends.
    pub peers: Mutex<Vec<Arc<crate::device::Device>>>,
    /// What the client is granted now (an admin may change it while it runs); its memory
    /// quota is its user's, in `account`.
    grant: LiveGrant,
    /// The account of the client's user: the memory quota all of their sessions share.
    account: Arc<UserAccount>,
    /// The user's memory on this session's GPU, against the policy's `gpu_memory_quota`.
    gpu_memory: Arc<crate::accounts::MemoryTally>,
    /// The batch scheduler job its process is in, whose quota it holds memory against
    /// instead of its user's (the user's account still counts that memory).
    pub job: Option<Arc<crate::jobs::Job>>,
    pub connected_at: Instant,
    pub counters: Counters,
    stop: AtomicBool,
    evicted: Mutex<Option<String>>,
    /// The submission eventfd, so that others can wake the data thread.
    submit_wake: Wakeup,
    /// In-flight stamps for the fault watchdog.
    pub fault_watch: FaultWatch,
    /// A message for the client that the data thread posts and the control task sends
    /// (a device reset notice).
    notice: Mutex<Option<BrokerMessage>>,
    pub notice_posted: tokio::sync::Notify,
}

/// Who a session belongs to and where it runs.
pub struct Peer {
    pub id: u64,
    pub pid: i32,
    pub uid: u32,
    pub user: String,
    pub name: String,
    pub gpu: u32,
    pub governed: bool,
    pub consolidated: bool,
    /// The trust domain whose GPU context it shares.
    pub trust_domain: String,
    /// The batch scheduler job its process is in.
    pub job: Option<Arc<crate::jobs::Job>>,
}

impl Member for SessionInfo {
    fn id(&self) -> u64 {
        self.id
    }

    fn pid(&self) -> i32 {
        self.pid
    }

    fn uid(&self) -> u32 {
        self.uid
    }

    fn watch(&self) -> &FaultWatch {
        &self.fault_watch
    }

    fn wake(&self) {
        self.submit_wake.signal();
    }
}

impl SessionInfo {
    pub fn new(
        peer: Peer,
        grant: Grant,
        account: Arc<UserAccount>,
        submit_wake: Wakeup,
    ) -> SessionInfo {
        let Peer {
            id,
            pid,
            uid,
            user,
            name,
            gpu,
            governed,
            consolidated,
            trust_domain,
            job,
        } = peer;
        SessionInfo {
            id,
            pid,
            uid,
            user,
            name,
            gpu,
            governed,
            consolidated,
            trust_domain,
            hosts: Mutex::new(super::hosts::HostRegions::default()),
            host_points: Mutex::default(),
            vmm: Mutex::new(super::vmm::Handles::default()),
            peers: Mutex::default(),
            grant: LiveGrant::new(grant),
            gpu_memory: account.gpu_tally(gpu),
            account,
            job,
            connected_at: Instant::now(),
            counters: Counters::default(),
            stop: AtomicBool::new(false),
            evicted: Mutex::new(None),
            submit_wake,
            fault_watch: FaultWatch::default(),
            notice: Mutex::new(None),
            notice_posted: tokio::sync::Notify::new(),
        }
    }

    /// The live class alone (cheap: no lock).
    pub fn class(&self) -> PriorityClass {
        self.grant.get().0
    }

    pub fn grant(&self) -> Grant {
        let (class, weight) = self.grant.get();
        let memory_quota = match &self.job {
            Some(job) => Some(job.quota()),
            None => self.account.quota(),
        };
        Grant {
            class,
            weight,
            memory_quota,
        }
    }

    /// Changes the live grant: allocations of every session of the client's user check the
    /// new quota from now on, and streams created from now on get the new class's priority.
    pub fn set_grant(&self, grant: Grant) {
        self.grant.set(grant.class, grant.weight);
        match &self.job {
            Some(job) => job.set_quota(grant.memory_quota),
            None => self.account.set_quota(grant.memory_quota),
        }
    }

    /// The account of the client's user.
    pub fn account(&self) -> &Arc<UserAccount> {
        &self.account
    }

    /// Counts `bytes` of device memory to this session, if its quota (its job's, else its
    /// user's) has room for them beside the other sessions that share it (else `OutOfQuota`,
    /// and nothing changes).
    /// Only the session's data thread changes the session's figure.
    pub fn charge_memory(&self, bytes: u64) -> Result<(), ErrorCode> {
        match &self.job {
            // A job's grant is its share of one GPU: the user's bounds do not apply.
            Some(job) => {
                job.charge(bytes)?;
                self.account.charge_held(bytes);
                self.gpu_memory.charge_held(bytes);
            }
            None => {
                self.account.charge(bytes)?;
                if let Err(code) = self.gpu_memory.charge(bytes) {
                    self.account.release(bytes);
                    return Err(code);
                }
            }
        }
        let c = &self.counters;
        let now = c.memory_used.load(Ordering::Relaxed).saturating_add(bytes);
        c.memory_used.store(now, Ordering::Relaxed);
        c.memory_peak.fetch_max(now, Ordering::Relaxed);
        Ok(())
    }

    /// Counts `bytes` the session already holds, whatever the quota (a governed program that
    /// connected again).
    pub fn hold_memory(&self, bytes: u64) {
        self.charge_held(bytes);
        let c = &self.counters;
        let now = c.memory_used.load(Ordering::Relaxed).saturating_add(bytes);
        c.memory_used.store(now, Ordering::Relaxed);
        c.memory_peak.fetch_max(now, Ordering::Relaxed);
    }

    /// Gives back `bytes` this session held.
    pub fn release_memory(&self, bytes: u64) {
        let c = &self.counters;
        let held = c.memory_used.load(Ordering::Relaxed);
        let bytes = bytes.min(held);
        c.memory_used.store(held - bytes, Ordering::Relaxed);
        self.account.release(bytes);
        self.gpu_memory.release(bytes);
        if let Some(job) = &self.job {
            job.release(bytes);
        }
    }

    /// Counts `bytes` the session holds already, whatever the quota.
    fn charge_held(&self, bytes: u64) {
        self.account.charge_held(bytes);
        self.gpu_memory.charge_held(bytes);
        if let Some(job) = &self.job {
            job.charge_held(bytes);
        }
    }

    /// The session now holds `bytes` (a reset took the rest, or it ended).
    pub fn set_memory_used(&self, bytes: u64) {
        let held = self.counters.memory_used.load(Ordering::Relaxed);
        if bytes < held {
            self.release_memory(held - bytes);
        } else {
            self.charge_held(bytes - held);
            self.counters.memory_used.store(bytes, Ordering::Relaxed);
        }
    }

    /// Removes the client: its data thread stops and the client is told `reason`.
    pub fn evict(&self, reason: String) {
        if let Ok(mut r) = self.evicted.lock() {
            r.get_or_insert(reason);
        }
        self.request_stop();
    }

    /// Why the client was evicted, if it was.
    pub fn eviction(&self) -> Option<String> {
        self.evicted.lock().ok().and_then(|r| r.clone())
    }

    /// Asks the data thread to finish and reclaim.
    pub fn request_stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.release_host_points();
        self.submit_wake.signal();
    }

    /// Lets every stream waiting for one of the client's host functions go on.
    pub fn release_host_points(&self) {
        let points =
            std::mem::take(&mut *self.host_points.lock().unwrap_or_else(|p| p.into_inner()));
        if points.is_empty() {
            return;
        }
        let hosts = self.hosts.lock().unwrap_or_else(|p| p.into_inner());
        for (go, value) in points {
            hosts.write_u32(go, value);
        }
    }

    pub fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// Hands a message to the control task for the client.
    pub fn post_notice(&self, msg: BrokerMessage) {
        *self.notice.lock().unwrap_or_else(|e| e.into_inner()) = Some(msg);
        self.notice_posted.notify_one();
    }

    pub fn take_notice(&self) -> Option<BrokerMessage> {
        self.notice.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    pub fn submit_wake(&self) -> &Wakeup {
        &self.submit_wake
    }

    pub fn stats(&self, streams: u32) -> ClientStats {
        let c = &self.counters;
        let grant = self.grant();
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ClientStats {
            client_id: self.id,
            pid: self.pid,
            uid: self.uid,
            user: self.user.clone(),
            name: self.name.clone(),
            gpu: self.gpu,
            class: grant.class,
            weight: grant.weight,
            memory_used: get(&c.memory_used),
            memory_peak: get(&c.memory_peak),
            memory_quota: grant.memory_quota,
            allocations: get(&c.allocations),
            streams,
            commands: get(&c.commands),
            kernels: get(&c.kernels),
            bytes_htod: get(&c.bytes_htod),
            bytes_dtoh: get(&c.bytes_dtoh),
            bytes_dtod: get(&c.bytes_dtod),
            gpu_time_ns: get(&c.gpu_time_ns),
            errors: get(&c.errors),
            connected_ms: self.connected_at.elapsed().as_millis() as u64,
            bypassing: false, // set from telemetry when the report is built
            queue_depth: get(&c.queue_depth) as u32,
            latency_p50_ns: Some(get(&c.latency_p50_ns)).filter(|&v| v > 0),
            latency_p99_ns: Some(get(&c.latency_p99_ns)).filter(|&v| v > 0),
            spin_ns: get(&c.spin_ns),
            governed: self.governed,
            consolidated: self.consolidated,
            throttled_ns: get(&c.throttled_ns),
            trust_domain: self.trust_domain.clone(),
            job: self.job.as_ref().map(|j| j.id),
        }
    }
}

/// The class and weight an admin may change while the client runs: read on every launch, so
/// kept in atomics rather than behind a lock.
struct LiveGrant {
    class: AtomicU8,
    weight: AtomicU32,
}

impl LiveGrant {
    fn new(g: Grant) -> LiveGrant {
        let l = LiveGrant {
            class: AtomicU8::new(0),
            weight: AtomicU32::new(0),
        };
        l.set(g.class, g.weight);
        l
    }

    fn set(&self, class: PriorityClass, weight: u32) {
        let class = match class {
            PriorityClass::High => 0,
            PriorityClass::Normal => 1,
            PriorityClass::BestEffort => 2,
        };
        self.class.store(class, Ordering::Relaxed);
        self.weight.store(weight, Ordering::Relaxed);
    }

    fn get(&self) -> (PriorityClass, u32) {
        let class = match self.class.load(Ordering::Relaxed) {
            0 => PriorityClass::High,
            1 => PriorityClass::Normal,
            _ => PriorityClass::BestEffort,
        };
        (class, self.weight.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info() -> SessionInfo {
        let peer = Peer {
            id: 7,
            pid: 1234,
            uid: 1000,
            user: "alice".into(),
            name: "train".into(),
            gpu: 0,
            governed: false,
            consolidated: false,
            trust_domain: "default".into(),
            job: None,
        };
        let wake = Wakeup::new().expect("an eventfd for the test");
        let accounts = Arc::new(crate::accounts::Accounts::default());
        let account = accounts.seat_for_tests(1000, "alice").account().clone();
        SessionInfo::new(peer, Grant::default(), account, wake)
    }

    #[test]
    fn device_time_stops_at_the_largest_value() {
        let counters = Counters::default();
        counters.add_gpu_time(5);
        counters.add_gpu_time(u64::MAX);
        counters.add_gpu_time(u64::MAX);
        assert_eq!(counters.gpu_time_ns.load(Ordering::Relaxed), u64::MAX);
    }

    #[test]
    fn a_live_grant_reads_back_what_was_set() {
        let classes = [
            PriorityClass::High,
            PriorityClass::Normal,
            PriorityClass::BestEffort,
        ];
        let info = info();
        for class in classes {
            for weight in [1, 3, u32::MAX] {
                for memory_quota in [None, Some(0), Some(1 << 30)] {
                    let g = Grant {
                        class,
                        weight,
                        memory_quota,
                    };
                    info.set_grant(g);
                    assert_eq!(info.grant(), g);
                }
            }
        }
    }

    #[test]
    fn memory_counts_for_the_session_and_its_user() {
        let info = info();
        info.set_grant(Grant {
            memory_quota: Some(100),
            ..Grant::default()
        });
        info.charge_memory(70).expect("within the quota");
        assert_eq!(info.charge_memory(31), Err(ErrorCode::OutOfQuota));
        assert_eq!(info.account().memory_used(), 70);
        info.release_memory(100);
        assert_eq!(info.counters.memory_used.load(Ordering::Relaxed), 0);
        assert_eq!(info.account().memory_used(), 0, "never more than it held");
        info.charge_memory(50).expect("room again");
        info.set_memory_used(20);
        assert_eq!(info.account().memory_used(), 20);
        assert_eq!(info.counters.memory_peak.load(Ordering::Relaxed), 70);
    }

    #[test]
    fn memory_on_one_gpu_stays_within_the_users_quota_there_and_in_total() {
        let info = info();
        info.set_grant(Grant {
            memory_quota: Some(100),
            ..Grant::default()
        });
        let on_gpu = info.account().gpu_tally(0);
        on_gpu.set_quota(Some(60));
        info.charge_memory(60).expect("within both");
        assert_eq!(
            info.charge_memory(1),
            Err(ErrorCode::OutOfQuota),
            "the GPU's"
        );
        assert_eq!(
            info.account().memory_used(),
            60,
            "a refusal changes nothing"
        );
        // Another GPU of the same user's: its own 60, but the total is 100.
        let other = info.account().gpu_tally(1);
        assert_eq!(other.charge(40), Ok(()));
        info.account().charge_held(40);
        on_gpu.set_quota(None);
        assert_eq!(
            info.charge_memory(1),
            Err(ErrorCode::OutOfQuota),
            "the total"
        );
        assert_eq!(on_gpu.used(), 60, "a refusal changes nothing");
        info.release_memory(60);
        assert_eq!((on_gpu.used(), info.account().memory_used()), (0, 40));
    }

    #[test]
    fn a_changed_grant_shows_in_status() {
        let info = info();
        let g = Grant {
            class: PriorityClass::BestEffort,
            weight: 5,
            memory_quota: Some(4096),
        };
        info.set_grant(g);
        assert_eq!(info.grant(), g);
        let stats = info.stats(1);
        assert_eq!(stats.class, PriorityClass::BestEffort);
        assert_eq!(stats.weight, 5);
        assert_eq!(stats.memory_quota, Some(4096));
    }

    #[test]
    fn eviction_keeps_the_first_reason_and_stops_the_session() {
        let info = info();
        assert!(!info.stopping());
        assert_eq!(info.eviction(), None);
        info.evict("over quota".into());
        info.evict("later reason".into());
        assert!(info.stopping());
        assert_eq!(info.eviction().as_deref(), Some("over quota"));
    }

    #[test]
    fn a_notice_is_taken_once() {
        let info = info();
        assert!(info.take_notice().is_none());
        let notice = BrokerMessage::Evicted {
            reason: "test".into(),
        };
        info.post_notice(notice.clone());
        assert_eq!(info.take_notice(), Some(notice));
        assert!(info.take_notice().is_none());
    }

    #[test]
    fn latency_shows_only_once_measured() {
        let info = info();
        assert_eq!(info.stats(1).latency_p50_ns, None);
        info.counters.latency_p50_ns.store(800, Ordering::Relaxed);
        info.counters.latency_p99_ns.store(2_000, Ordering::Relaxed);
        let stats = info.stats(1);
        assert_eq!(stats.latency_p50_ns, Some(800));
        assert_eq!(stats.latency_p99_ns, Some(2_000));
    }
}

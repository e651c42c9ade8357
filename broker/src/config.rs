//! Broker settings that are not policy: sizes, spin time, socket.

use std::path::PathBuf;
use std::time::Duration;

use gpushare_protocol::ring::{MAX_ARENA_SIZE, MAX_RING_ENTRIES, PAGE, ShmLayout};

#[derive(Debug, Clone)]
pub struct BrokerConfig {
    pub socket: PathBuf,
    /// Permission bits of the socket file.
    pub socket_mode: u32,
    /// Group that owns the socket file, if any.
    pub socket_group: Option<String>,
    /// Default and largest submission ring a client gets.
    pub sq_entries: u32,
    pub max_sq_entries: u32,
    /// Default and largest data arena a client gets.
    pub arena_size: u64,
    pub max_arena_size: u64,
    /// How long a data thread spins on an empty ring before sleeping.
    pub spin: Duration,
    /// The longest that spin grows to for a client whose requests keep coming closer
    /// together than this.
    pub spin_ceiling: Duration,
    /// The same for a high-priority client's data thread.
    pub high_spin: Duration,
    /// What the nice value of the threads that serve a high-priority client is moved by
    /// (`crate::thread_nice`; 0 leaves them as the process is).
    pub high_nice: i32,
    /// How long a client may leave its completion ring full before it is evicted.
    pub stall_limit: Duration,
    /// How long a monitor connection may ask nothing before it is closed.
    pub monitor_idle: Duration,
    /// Path of the policy file in use, for status.
    pub policy_path: Option<PathBuf>,
    /// Where to serve Prometheus metrics, if anywhere.
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// GPU fault containment: hang timeout, probation, fault injection.
    pub faults: crate::gpu::health::FaultConfig,
}

impl Default for BrokerConfig {
    fn default() -> Self {
        BrokerConfig {
            socket: PathBuf::from(gpushare_protocol::DEFAULT_SOCKET_PATH),
            socket_mode: 0o660,
            socket_group: None,
            sq_entries: 256,
            max_sq_entries: 4096,
            arena_size: 16 << 20,
            max_arena_size: 512 << 20,
            spin: Duration::from_micros(50),
            spin_ceiling: Duration::from_micros(500),
            high_spin: Duration::from_millis(10),
            high_nice: 0,
            stall_limit: Duration::from_secs(30),
            monitor_idle: Duration::from_secs(300),
            policy_path: None,
            metrics_listen: None,
            faults: crate::gpu::health::FaultConfig::default(),
        }
    }
}

impl BrokerConfig {
    /// The layout for a client that asked for `sq_entries` and `arena_size` (0 = default):
    /// rounded up to valid values and clamped to the broker's limits.
    pub fn layout_for(&self, sq_entries: u32, arena_size: u64) -> ShmLayout {
        let sq = if sq_entries == 0 {
            self.sq_entries
        } else {
            sq_entries
        };
        let sq = sq
            .clamp(2, self.max_sq_entries.min(MAX_RING_ENTRIES / 2))
            .next_power_of_two();
        let arena = if arena_size == 0 {
            self.arena_size
        } else {
            arena_size
        };
        let arena = arena
            .clamp(PAGE as u64, self.max_arena_size.min(MAX_ARENA_SIZE))
            .div_ceil(PAGE as u64)
            * PAGE as u64;
        ShmLayout {
            sq_entries: sq,
            cq_entries: sq * 2,
            arena_size: arena,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requested_sizes_are_rounded_and_clamped() {
        let c = BrokerConfig::default();
        let d = c.layout_for(0, 0);
        assert_eq!(
            (d.sq_entries, d.cq_entries, d.arena_size),
            (256, 512, 16 << 20)
        );
        let odd = c.layout_for(100, 5000);
        assert_eq!((odd.sq_entries, odd.arena_size), (128, 8192));
        let huge = c.layout_for(u32::MAX, u64::MAX);
        assert_eq!((huge.sq_entries, huge.arena_size), (4096, 512 << 20));
        for l in [d, odd, huge] {
            l.validate().expect("always valid");
        }
    }
}

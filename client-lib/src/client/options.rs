//! How a client connects: [`ConnectOptions`] and their defaults.

use std::path::PathBuf;
use std::time::Duration;

use gpushare_protocol::PriorityClass;

/// How a client connects.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// Broker socket; defaults to `$GPUSHARE_SOCKET` or `/run/gpushare/gpushare.sock`.
    pub socket: PathBuf,
    /// Name shown in `gpushare status`; defaults to the process name.
    pub name: String,
    /// Ask for a less important class than the policy grants (never more).
    pub class: Option<PriorityClass>,
    /// Submission ring entries (0 = broker default).
    pub sq_entries: u32,
    /// Data arena bytes (0 = broker default, or the default staging area plus
    /// `host_buffers`).
    pub arena_size: u64,
    /// Bytes of the arena set aside for [`HostBuffer`](crate::HostBuffer)s: host memory the
    /// device copies to and from directly (page-locked on a GPU), like CUDA's pinned memory.
    /// The rest of the arena stages ordinary copies.
    pub host_buffers: u64,
    /// How long to spin for a completion before sleeping.
    pub spin: Duration,
    /// The GPU to run on (index); `None` lets the broker pick the least loaded.
    pub gpu: Option<u32>,
    /// Rebuild this client's device state by itself after a GPU reset caused by another
    /// client (or a restart of gpushared after one): its buffers come back at the same device
    /// addresses holding what was uploaded into them, its modules, functions, streams and
    /// events come back too, and every handle keeps working. The call that meets the reset
    /// fails once with [`Error::Rebuilt`] (the work submitted before the fault was lost and
    /// is not run again: submit it again); the calls after it work. With several threads,
    /// each thread whose work was lost hears it once: in the call it meets the rebuild
    /// with, or in the first call that waits for that work.
    ///
    /// Costs host memory: a copy of every byte uploaded from the host into a device buffer
    /// (the whole buffer, from its first upload) and of every module image, and one host
    /// copy more per upload. Buffers only the device wrote come back without their contents.
    ///
    /// [`Error::Rebuilt`]: crate::Error::Rebuilt
    pub rebuild: bool,
    /// With `rebuild`: how long to wait for gpushared to come back after it restarted.
    pub rebuild_timeout: Duration,
    /// How long any call waits for gpushared without a sign of life (an answer, a
    /// completion, a reply to a ping) before it fails with
    /// [`Error::BrokerUnresponsive`](crate::Error::BrokerUnresponsive) and the session is
    /// over: a stopped or wedged broker is reported, never waited on forever. A long
    /// synchronization on a busy GPU is not cut short (the broker answers meanwhile).
    /// `$GPUSHARE_TIMEOUT` seconds, or 30 s.
    pub timeout: Duration,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        let name = std::fs::read_to_string("/proc/self/comm")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "client".into());
        ConnectOptions {
            socket: gpushare_protocol::socket_path_from_env(),
            name,
            class: None,
            sq_entries: 0,
            arena_size: 0,
            host_buffers: 0,
            spin: Duration::from_micros(50),
            gpu: None,
            rebuild: false,
            rebuild_timeout: Duration::from_secs(30),
            timeout: gpushare_conn::env::broker_timeout(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn by_default_a_client_asks_for_nothing_special_and_rebuilds_nothing() {
        let o = ConnectOptions::default();
        assert!(!o.name.is_empty(), "named after the process");
        assert_eq!(o.class, None);
        assert_eq!((o.sq_entries, o.arena_size, o.host_buffers), (0, 0, 0));
        assert_eq!(o.gpu, None);
        assert!(!o.rebuild);
        assert!(o.spin > Duration::ZERO && o.spin < o.rebuild_timeout);
        assert!(!o.socket.as_os_str().is_empty());
    }
}

//! The status snapshot the broker serves to `gpushare status` and friends.

use serde::{Deserialize, Serialize};

use crate::PriorityClass;
use crate::control::DeviceInfo;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatusReport {
    pub broker_version: String,
    pub protocol_version: u32,
    pub backend: String,
    pub device: DeviceInfo,
    pub uptime_ms: u64,
    pub policy: String,
    /// Device memory held by all clients.
    pub memory_used: u64,
    pub clients: Vec<ClientStats>,
}

/// One connected client and what it has used.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClientStats {
    pub client_id: u64,
    pub pid: i32,
    pub uid: u32,
    pub user: String,
    pub name: String,
    pub class: PriorityClass,
    pub weight: u32,
    pub memory_used: u64,
    pub memory_peak: u64,
    pub memory_quota: Option<u64>,
    pub allocations: u64,
    pub streams: u32,
    pub commands: u64,
    pub kernels: u64,
    pub bytes_htod: u64,
    pub bytes_dtoh: u64,
    pub bytes_dtod: u64,
    /// Device time of this client's kernels and copies: modelled on `sim`, measured on `cuda`.
    pub gpu_time_ns: u64,
    pub errors: u64,
    pub connected_ms: u64,
}

//! For the server's unit tests: a broker on sim devices, and sessions registered in it as if
//! clients were connected.

use std::sync::Arc;

use gpushare_protocol::stats::TelemetryStatus;

use super::Broker;
use crate::config::BrokerConfig;
use crate::device::sim::{SimDevice, SimOptions};
use crate::policy::{Grant, Policy};
use crate::session::{Peer, SessionInfo};
use crate::wake::Wakeup;

/// A broker serving `gpus` sim devices, with the default policy and telemetry off.
pub(super) fn sim_broker(gpus: u32) -> Arc<Broker<SimDevice>> {
    let devices = (0..gpus)
        .map(|index| {
            Arc::new(SimDevice::new(SimOptions {
                index,
                ..SimOptions::default()
            }))
        })
        .collect();
    Broker::new(
        devices,
        BrokerConfig::default(),
        Policy::default(),
        None,
        TelemetryStatus {
            enabled: false,
            reason: Some("unit test".into()),
            dev_prefix: "/dev/nvidia".into(),
            uprobes: false,
        },
    )
}

/// Registers a session of process `pid` on `gpu`, as a connected client's would be.
pub(super) fn register(
    broker: &Broker<SimDevice>,
    pid: i32,
    gpu: u32,
    governed: bool,
) -> Arc<SessionInfo> {
    let peer = Peer {
        id: broker.registry.next_id(),
        pid,
        uid: 1000,
        user: "alice".into(),
        name: format!("client{pid}"),
        gpu,
        governed,
    };
    let wake = Wakeup::new().expect("eventfd");
    let info = Arc::new(SessionInfo::new(peer, Grant::default(), wake));
    broker.registry.insert(info.clone());
    info
}

//! Helpers for hostile-input tests: a broker on the sim device, a hostile client in the
//! consolidated role, a bystander whose data must come through, one command's outcome, and
//! noise submitted raw.

use std::time::Duration;

use gpushare::{DeviceBuffer, ErrorCode};
use gpushare_protocol::Command;
use gpushare_protocol::control::Role;
use gpushare_protocol::ring::SubmissionEntry;

use crate::raw::RawClient;
use crate::{Broker, BrokerOptions, wait_until};

/// A broker on the sim device (the checks read its process's mappings and rely on the sim's
/// placement of host memory).
pub fn sim_broker() -> Broker {
    Broker::start_with(BrokerOptions {
        backend: Some("sim".into()),
        ..Default::default()
    })
}

/// A raw client in the consolidated role.
pub fn consolidated(broker: &Broker) -> RawClient {
    RawClient::connect_as(&broker.socket, Role::Consolidated)
}

/// A well-behaved client holding data, checked after the hostile one is done.
pub struct Bystander {
    _client: gpushare::Client,
    buf: DeviceBuffer<f32>,
}

impl Bystander {
    pub fn new(broker: &Broker) -> Bystander {
        let client = broker.client_named("bystander");
        let buf = client.alloc::<f32>(4096).expect("alloc");
        buf.copy_from_host(&[5.0; 4096]).expect("copy");
        Bystander {
            _client: client,
            buf,
        }
    }

    /// Its data is intact, and a client that connects now is served correctly.
    pub fn assert_unharmed(&self, broker: &Broker) {
        assert_eq!(self.buf.to_vec().expect("read back"), vec![5.0; 4096]);
        let fresh = broker.client_named("fresh");
        let buf = fresh.alloc::<u32>(1000).expect("alloc");
        let data: Vec<u32> = (0..1000).collect();
        buf.copy_from_host(&data).expect("copy");
        assert_eq!(buf.to_vec().expect("read back"), data);
    }
}

/// Submits `cmd` and returns its status.
pub fn status_of(raw: &RawClient, cmd: Command) -> u32 {
    raw.submit_one(cmd)
        .unwrap_or_else(|| panic!("no completion for {cmd:?}"))
        .status
}

pub fn assert_fails(raw: &RawClient, cmd: Command, want: ErrorCode) {
    assert_eq!(status_of(raw, cmd), want.as_u32(), "{cmd:?}");
}

/// Submits a raw entry (one no client library would encode) and returns its status.
pub fn raw_status(raw: &RawClient, entry: SubmissionEntry) -> u32 {
    raw.submit_all(&[entry])
        .first()
        .unwrap_or_else(|| panic!("no completion for {entry:?}"))
        .status
}

/// Submits `noise`: every entry is answered, the hostile session is still served, the
/// bystander is unharmed, and the session ends with its client.
pub fn submit_noise(
    broker: &Broker,
    bystander: &Bystander,
    raw: RawClient,
    noise: &[SubmissionEntry],
) {
    let done = raw.submit_all(noise);
    assert_eq!(done.len(), noise.len(), "one completion per entry");
    assert!(raw.status_ok(), "the hostile session is still answered");
    bystander.assert_unharmed(broker);
    drop(raw);
    assert!(
        wait_until(Duration::from_secs(5), || broker.status().clients.len()
            == 1),
        "the hostile client's session ended with it"
    );
}

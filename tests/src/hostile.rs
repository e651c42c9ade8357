//! Helpers for hostile-input tests: a broker on the sim device, a hostile client in the
//! consolidated role, a bystander whose data must come through, and one command's outcome.

use gpushare::DeviceBuffer;
use gpushare_protocol::Command;
use gpushare_protocol::control::Role;

use crate::raw::RawClient;
use crate::{Broker, BrokerOptions};

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

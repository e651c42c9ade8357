//! A monitor connection: asks the broker for status without holding a GPU session.

use std::path::Path;

use gpushare_protocol::PROTOCOL_VERSION;
use gpushare_protocol::control::{BrokerMessage, ClientMessage, Hello, Role, Welcome};
use gpushare_protocol::stats::StatusReport;

use crate::control::ControlSocket;
use crate::error::{Error, Result};

pub struct Monitor {
    socket: ControlSocket,
    welcome: Welcome,
    next_request: u64,
}

impl Monitor {
    pub fn connect(path: &Path) -> Result<Monitor> {
        let socket = ControlSocket::connect(path)?;
        socket.send(
            &ClientMessage::Hello(Hello {
                protocol_version: PROTOCOL_VERSION,
                role: Role::Monitor,
                client_name: "gpushare".into(),
                requested_class: None,
                sq_entries: 0,
                arena_size: 0,
                gpu: None,
            }),
            &[],
        )?;
        match socket.recv()?.0 {
            BrokerMessage::Welcome(welcome) => Ok(Monitor {
                socket,
                welcome: *welcome,
                next_request: 1,
            }),
            BrokerMessage::Rejected(e) => Err(Error::Rejected(e)),
            BrokerMessage::ShuttingDown { reason } => Err(Error::BrokerShutdown(reason)),
            other => Err(Error::Protocol(format!("expected Welcome, got {other:?}"))),
        }
    }

    pub fn welcome(&self) -> &Welcome {
        &self.welcome
    }

    pub fn status(&mut self) -> Result<StatusReport> {
        let request = self.next_request;
        self.next_request += 1;
        self.socket.send(&ClientMessage::Status { request }, &[])?;
        loop {
            match self.socket.recv()?.0 {
                BrokerMessage::Status { report, .. } => return Ok(*report),
                BrokerMessage::ShuttingDown { reason } => {
                    return Err(Error::BrokerShutdown(reason));
                }
                BrokerMessage::RequestFailed { error, .. } => return Err(Error::Request(error)),
                _ => continue,
            }
        }
    }
}

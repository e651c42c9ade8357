//! gpushare's connection core: the client side of the broker protocol, one copy for every
//! client kind (the client library, the governed interposer, the consolidated CUDA driver).
//!
//! - [`socket`]: connect, one control message at a time, the handshake.
//! - [`session`]: a [`Session`]: the shared region mapped, its rings attached; reconnecting.
//! - [`ring`]: submit, reap and wait (spin, then sleep on the eventfd); errors of commands
//!   nobody waited for, reported at the next synchronization.
//! - [`news`]: requests on the control socket, and what the broker says unasked.
//! - [`notices`]: the device-reset notices the broker sent, kept until taken.
//! - [`arena`]: the arena as a ring of payloads (launch parameters, staged copies) that come
//!   free once the broker has consumed them, or once the caller waited for the device.
//! - [`error`]: what can go wrong, for all of them.
//! - [`env`]: the environment a launcher hands to the programs it starts.
//! - `state` (private, at the bottom): why a session ended, the rings' bookkeeping, the lock.

pub mod arena;
pub mod env;
pub mod error;
pub mod news;
pub mod notices;
pub mod ring;
pub mod session;
pub mod socket;
mod state;

pub use arena::{Held, Payload, Payloads};
pub use error::{Error, RebuildError, Result};
pub use notices::{DeviceReset, Notices};
pub use ring::{command_name, op_name};
pub use session::{Session, SessionOptions, process_name};
pub use socket::ControlSocket;

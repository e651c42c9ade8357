//! The C ABI: `libgpushare.so` and `include/gpushare.h`.
//!
//! Every function returns an `int` status: [`GPUSHARE_OK`] (0), the broker's [`ErrorCode`]
//! value (1..=19, wire-stable), or a library-side code from 100 up (`GPUSHARE_E_CONNECT`, …).
//! The failing call's sentence is kept per thread for [`gpushare_last_error_message`].
//!
//! Rules every function here keeps:
//! - no panic crosses the boundary: each body runs under [`std::panic::catch_unwind`] and a
//!   panic becomes [`GPUSHARE_E_INTERNAL`];
//! - every pointer argument is checked for NULL before anything is sent to the broker, so a
//!   NULL out-pointer never leaks a broker-side object ([`GPUSHARE_E_NULL`]);
//! - out-parameters are written only on success.
//!
//! Handles are plain numbers (streams and events `uint32_t`, device pointers, modules and
//! functions `uint64_t`) owned by the caller: nothing is freed behind its back, and the broker
//! reclaims everything a session still holds when it ends.
//!
//! Where each part lives: `codes.rs` (the status codes and flag values C sees, and which
//! error becomes which code), `guard.rs` (the rules above: the panic guard, the last error,
//! NULL checks and C buffers), `session.rs` (connect, disconnect, session info, iterations and
//! declarations), `memory.rs` (allocations and copies), `streams.rs` (streams and events),
//! `kernels.rs` (built-in kernels, modules and their launches).
//!
//! [`ErrorCode`]: gpushare_protocol::ErrorCode

mod codes;
mod guard;
mod kernels;
mod memory;
mod session;
mod streams;

pub use self::codes::*;
pub use self::guard::gpushare_last_error_message;
pub use self::kernels::*;
pub use self::memory::*;
pub use self::session::*;
pub use self::streams::*;

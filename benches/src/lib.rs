//! Shared helpers for gpushare's benchmarks, which run against a real `gpushared`.
//!
//! The broker binary is looked up like the integration tests do (see
//! [`gpushare_tests::binary`]); `cargo bench` runs from `target/release/deps`, so build the
//! broker in release first: `cargo build --release -p gpushare-broker`.

use gpushare_tests::{Broker, BrokerOptions};

/// Starts a `gpushared` on a private socket with the sim backend, after checking that the
/// binary can be found, with a hint on how to build it if not.
pub fn start_sim_broker() -> Broker {
    start_broker("sim")
}

/// [`start_sim_broker`] with another backend (`cuda` on a GPU machine).
pub fn start_broker(backend: &str) -> Broker {
    start_broker_with_policy(backend, None)
}

/// [`start_broker`] with a policy file of `policy`'s contents.
pub fn start_broker_with_policy(backend: &str, policy: Option<String>) -> Broker {
    let found = std::panic::catch_unwind(|| gpushare_tests::binary("gpushared"));
    if found.is_err() {
        eprintln!(
            "gpushare-benches: `gpushared` not found next to the benchmark executable; \
             run `cargo build --release -p gpushare-broker` first (or set GPUSHARE_BIN_DIR)"
        );
        std::process::exit(2);
    }
    Broker::start_with(BrokerOptions {
        backend: Some(backend.into()),
        policy,
        ..BrokerOptions::default()
    })
}

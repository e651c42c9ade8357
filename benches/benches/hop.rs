//! One synchronous round trip through a real `gpushared` (sim backend), piece by piece: a
//! no-op (client ↔ data thread), a sync of an idle stream (… ↔ device worker), and a launch
//! followed by a stream sync (the `launch` scenario's latency). Each figure is the median of
//! its pairs, on a line of its own (`name value unit`), so that two builds can be run in turn.
//!
//! `HOP_SECONDS=n` instead loops launch + sync for n seconds and prints how many it made, for
//! `strace -c -f -p <gpushared>` or `perf` beside it; with `HOP_BURST=k`, k launches per sync.
//!
//! `HOP_BACKEND=cuda` runs the same against a GPU (the default is the sim device).
//!
//! Build the broker first: `cargo build --release -p gpushare-broker`, then
//! `cargo bench -p gpushare-benches --bench hop`.

use std::time::{Duration, Instant};

use anyhow::Result;
use gpushare::{Kernel, Stream};

/// Round trips timed per figure.
const PAIRS: usize = 20_000;

fn main() -> Result<()> {
    let broker = match std::env::var("HOP_BACKEND") {
        Ok(backend) if !backend.is_empty() => gpushare_benches::start_broker(&backend),
        _ => gpushare_benches::start_sim_broker(),
    };
    let client = broker.client_named("bench-hop");
    let stream = client.create_stream()?;
    let launch = |s: &Stream| {
        s.launch(Kernel::Spin {
            micros: 0,
            blocks: 1,
        })
    };
    for _ in 0..1_000 {
        launch(&stream)?;
        stream.synchronize()?;
    }
    if let Some(secs) = std::env::var("HOP_SECONDS")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
    {
        let burst: u64 = std::env::var("HOP_BURST")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(1);
        println!("gpushared pid {}", broker.pid());
        let until = Instant::now() + Duration::from_secs(secs);
        let mut n = 0u64;
        while Instant::now() < until {
            for _ in 0..burst {
                launch(&stream)?;
            }
            stream.synchronize()?;
            n += burst;
        }
        println!("launch_sync_loop {n} launches, {burst} per sync, in {secs} s");
        return Ok(());
    }
    let time = |f: &dyn Fn() -> Result<()>| -> Result<f64> {
        let mut v: Vec<Duration> = Vec::with_capacity(PAIRS);
        for _ in 0..PAIRS {
            let t = Instant::now();
            f()?;
            v.push(t.elapsed());
        }
        v.sort_unstable();
        Ok(v.get(v.len() / 2)
            .copied()
            .unwrap_or_default()
            .as_secs_f64()
            * 1e6)
    };
    let nop = time(&|| Ok(client.nop()?))?;
    println!("nop {nop:.2} us");
    let idle_sync = time(&|| Ok(stream.synchronize()?))?;
    println!("idle_stream_sync {idle_sync:.2} us");
    let launch_sync = time(&|| {
        launch(&stream)?;
        Ok(stream.synchronize()?)
    })?;
    println!("launch_sync {launch_sync:.2} us");
    Ok(())
}

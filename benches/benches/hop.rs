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
//! `HOP_POLICY` is a policy file for gpushared (e.g. `scheduler = "fair"` and a `[fair]`
//! section); with it a second, idle client connects first, so that the bench client's kernels
//! go through the scheduler as any of several clients' do (a lone client's skip it). A last
//! figure, `burst_launch`, is the time per launch of 64 launches and their sync.
//!
//! Build the broker first: `cargo build --release -p gpushare-broker`, then
//! `cargo bench -p gpushare-benches --bench hop`.

use std::time::{Duration, Instant};

use anyhow::Result;
use gpushare::{Kernel, Stream};

/// Round trips timed per figure.
const PAIRS: usize = 20_000;
/// Launches per sync in the `burst_launch` figure.
const BURST: usize = 64;

fn main() -> Result<()> {
    let backend = std::env::var("HOP_BACKEND")
        .ok()
        .filter(|b| !b.is_empty())
        .unwrap_or_else(|| "sim".into());
    let policy = std::env::var("HOP_POLICY").ok().filter(|p| !p.is_empty());
    let gated = policy.is_some();
    let broker = gpushare_benches::start_broker_with_policy(&backend, policy);
    // Another client on the GPU: the bench client's kernels are then scheduled.
    let _other = gated.then(|| broker.client_named("bench-hop-idle"));
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
    let burst = time(&|| {
        for _ in 0..BURST {
            launch(&stream)?;
        }
        Ok(stream.synchronize()?)
    })?;
    println!("burst_launch {:.3} us", burst / BURST as f64);
    Ok(())
}

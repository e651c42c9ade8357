//! The `trace` scenario, Salus-style: jobs arrive online and the mean job completion time
//! (JCT) is compared across gpushared's scheduling policies.
//!
//! The trace is the one the scheduler's simulator uses (`sched/policy/srtf.rs`): Poisson
//! arrivals with a mean gap of 30 ms, two thirds of the jobs short (5–30 iterations) and a third
//! long (100–300). An iteration is ten 100 µs spin kernels that fill the GPU, then a
//! synchronization. Each job is its own client: it connects when it arrives, declares its
//! expected GPU time (iterations × 1 ms), and marks each iteration's end, as a training job
//! using the client API would.

use std::time::{Duration, Instant};

use anyhow::{Result, anyhow};
use gpushare::{Client, ConnectOptions};
use gpushare_protocol::Kernel;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

use crate::workload;

const KERNELS_PER_ITERATION: usize = 10;
const KERNEL_MICROS: u64 = 100;
/// Spin blocks per SM: the spin kernel's blocks are one warp, and an SM holds at most 32
/// resident blocks (compute capability 9.0, and most others). A kernel of this many blocks
/// per SM leaves no room beside it, so, as with the DL training jobs Salus ran, two jobs'
/// kernels cannot overlap and sharing the GPU does not make it faster.
const BLOCKS_PER_SM: u32 = 32;

/// One job of the trace.
struct Job {
    arrival: Duration,
    iterations: u32,
}

fn jobs(seed: u64, count: usize) -> Vec<Job> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut t = 0.0f64;
    (0..count)
        .map(|_| {
            let u: f64 = rng.random();
            t += -(1.0 - u).ln() * 0.030;
            let iterations = if rng.random_bool(2.0 / 3.0) {
                rng.random_range(5..=30)
            } else {
                rng.random_range(100..=300)
            };
            Job {
                arrival: Duration::from_secs_f64(t),
                iterations,
            }
        })
        .collect()
}

/// Where one iteration's time went, in µs: issuing its launches, waiting in the
/// synchronization (the GPU work, and any wait for the GPU), and declaring its end.
#[derive(Clone, Copy)]
struct IterationTimes {
    launch_us: f64,
    sync_us: f64,
    end_us: f64,
}

/// Runs one job from its arrival; returns its completion time in ms and its iterations'
/// times.
fn run_job(
    job: &Job,
    start: Instant,
    sms: u32,
    spin: Option<Duration>,
) -> Result<(f64, Vec<IterationTimes>)> {
    let arrival = start + job.arrival;
    if let Some(wait) = arrival.checked_duration_since(Instant::now()) {
        std::thread::sleep(wait);
    }
    let defaults = ConnectOptions::default();
    let client = Client::connect_with(ConnectOptions {
        name: format!("trace-job-{}", job.iterations),
        spin: spin.unwrap_or(defaults.spin),
        ..defaults
    })?;
    let per_iteration = Duration::from_micros(KERNEL_MICROS * KERNELS_PER_ITERATION as u64);
    client.declare_job(per_iteration * job.iterations, 0, 0)?;
    let stream = client.create_stream()?;
    let kernel = Kernel::Spin {
        micros: KERNEL_MICROS,
        blocks: sms.saturating_mul(BLOCKS_PER_SM),
    };
    let mut times = Vec::with_capacity(job.iterations as usize);
    let us = |from: Instant, to: Instant| to.duration_since(from).as_secs_f64() * 1e6;
    for _ in 0..job.iterations {
        let began = Instant::now();
        for _ in 0..KERNELS_PER_ITERATION {
            stream.launch(kernel)?;
        }
        let launched = Instant::now();
        stream.synchronize()?;
        let synced = Instant::now();
        client.end_iteration()?;
        times.push(IterationTimes {
            launch_us: us(began, launched),
            sync_us: us(launched, synced),
            end_us: us(synced, Instant::now()),
        });
    }
    Ok((arrival.elapsed().as_secs_f64() * 1e3, times))
}

/// The worker process: every job of the trace on its own thread and client, against the
/// broker at `$GPUSHARE_SOCKET`; `spin` is how long each client spins for a completion.
pub fn worker(seed: u64, count: usize, spin: Option<Duration>) -> Result<Value> {
    let sms = {
        let probe = Client::connect()?;
        probe.session().device.sm_count.max(1)
    };
    let jobs = jobs(seed, count);
    let start = Instant::now() + Duration::from_millis(200);
    let results: Vec<Result<(f64, Vec<IterationTimes>)>> = std::thread::scope(|s| {
        let handles: Vec<_> = jobs
            .iter()
            .map(|job| s.spawn(move || run_job(job, start, sms, spin)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().map_err(|_| anyhow!("a job's thread panicked"))?)
            .collect()
    });
    let results: Vec<(f64, Vec<IterationTimes>)> = results.into_iter().collect::<Result<_>>()?;
    let mut jct: Vec<f64> = results.iter().map(|(t, _)| *t).collect();
    let iterations: Vec<IterationTimes> = results.iter().flat_map(|(_, i)| i).copied().collect();
    let p50 = |f: fn(&IterationTimes) -> f64| {
        let mut v: Vec<f64> = iterations.iter().map(f).collect();
        workload::percentile(&mut v, 50.0)
    };
    let (launch_us, sync_us, end_us) =
        (p50(|i| i.launch_us), p50(|i| i.sync_us), p50(|i| i.end_us));
    let iteration_us = p50(|i| i.launch_us + i.sync_us + i.end_us);
    let short: Vec<f64> = jobs
        .iter()
        .zip(&jct)
        .filter(|(j, _)| j.iterations <= 30)
        .map(|(_, t)| *t)
        .collect();
    let makespan = start.elapsed().as_secs_f64() * 1e3;
    Ok(json!({
        "jobs": count as f64,
        "mean_jct_ms": workload::mean(&jct),
        "mean_jct_short_ms": workload::mean(&short),
        "p50_jct_ms": workload::percentile(&mut jct, 50.0),
        "max_jct_ms": workload::percentile(&mut jct, 100.0),
        "makespan_ms": makespan,
        // Medians over every iteration of every job (most run with the GPU held, so these
        // show the cost of an iteration boundary: GPU work is 1,000 µs of each).
        "iteration_p50_us": iteration_us,
        "launch_p50_us": launch_us,
        "sync_p50_us": sync_us,
        "end_iteration_p50_us": end_us,
        "gpu_work_ms": jobs.iter().map(|j| j.iterations as f64).sum::<f64>()
            * (KERNEL_MICROS * KERNELS_PER_ITERATION as u64) as f64 / 1e3,
    }))
}

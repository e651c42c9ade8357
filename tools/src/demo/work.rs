//! The demo client's workloads. Each checks every result it computes: vector adds and GEMMs
//! (the multi-client tests, the package's smoke test), and the tour's two roles: an
//! interactive client that times each small request, and a trainer that keeps the device busy
//! and counts its steps.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use clap::ValueEnum;
use gpushare::{Client, DeviceBuffer, Kernel, Stream};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Workload {
    /// c = a + b, then c += 2·a, checked element by element.
    Vecadd,
    /// C = A·B checked against a host reference.
    Gemm,
    /// Both, alternating.
    Mixed,
    /// Small requests with think time between them, each timed from its first copy to its
    /// checked result: an inference server or a notebook.
    Interactive,
    /// Steps of long kernels, each step ending with a checked vector update: a training job.
    Trainer,
    /// Nothing: holds its session until stopped (with `--until-eof`), as a notebook left
    /// open does.
    Idle,
}

/// How much work, and how long.
#[derive(Debug, Clone)]
pub struct Plan {
    pub workload: Workload,
    /// Iterations (requests, steps) to run, unless `stop` ends the run first.
    pub iterations: u64,
    /// Vector length; GEMMs are about sqrt(size) on a side.
    pub size: usize,
    /// Interactive: the pause between two requests.
    pub think: Duration,
    /// Trainer: the length of each of its kernels, and how many a step launches.
    pub kernel: Duration,
    pub kernels_per_step: u32,
}

/// What a run did, printed as one line or as JSON (the tour reads the JSON).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Summary {
    pub name: String,
    pub client_id: u64,
    pub class: String,
    pub backend: String,
    pub iterations: u64,
    pub vecadds: u64,
    pub gemms: u64,
    /// Interactive requests served and checked.
    pub requests: u64,
    /// Trainer steps done and checked.
    pub steps: u64,
    pub mismatches: u64,
    pub wall_s: f64,
    pub device_time_ns: u64,
    pub device_time: String,
    /// Interactive: the median and 99th percentile of a request's latency.
    pub latency_p50_ms: Option<f64>,
    pub latency_p99_ms: Option<f64>,
    /// Trainer: steps per second of wall time.
    pub steps_per_s: Option<f64>,
    /// CPU time, user and system, this client process used during the run.
    #[serde(default)]
    pub cpu_s: f64,
}

impl Summary {
    /// The one-line form.
    pub fn line(&self) -> String {
        let work = match (self.requests, self.steps) {
            (0, 0) => format!(
                "{} vector adds and {} GEMMs verified",
                self.vecadds, self.gemms
            ),
            (r, 0) => format!(
                "{r} requests verified, latency p50 {} p99 {}",
                ms(self.latency_p50_ms),
                ms(self.latency_p99_ms)
            ),
            (_, s) => format!(
                "{s} steps verified, {:.1} steps/s",
                self.steps_per_s.unwrap_or(0.0)
            ),
        };
        format!(
            "{} (client {}, class {}): {} iterations, {work}, {} mismatches, {:.2} s wall, {} device elapsed",
            self.name,
            self.client_id,
            self.class,
            self.iterations,
            self.mismatches,
            self.wall_s,
            self.device_time
        )
    }
}

pub fn ms(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.2} ms"))
}

/// The nearest-rank percentile `p` (0–100) of `sorted`, which must be in ascending order.
pub fn percentile(sorted: &[Duration], p: f64) -> Option<Duration> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted.get(rank.clamp(1, sorted.len()) - 1).copied()
}

/// Exponentially distributed pauses of mean `mean` (Poisson arrivals, as requests to a server
/// come), the same sequence every run. A fixed pause would lock the requests in step with the
/// trainer's kernels and measure one phase of them only.
pub fn think_time(mean: Duration, n: u64) -> Duration {
    // splitmix64 of the request number: a uniform draw in [0, 1).
    let mut z = n.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    let u = (z >> 11) as f64 / (1u64 << 53) as f64;
    mean.mul_f64((-(1.0 - u).ln()).min(8.0))
}

pub fn pattern(n: usize, seed: u64) -> Vec<f32> {
    (0..n)
        .map(|i| ((i as u64).wrapping_mul(2654435761).wrapping_add(seed) % 1000) as f32 / 100.0)
        .collect()
}

/// Tallies of a run in progress.
#[derive(Default)]
struct Tally {
    iterations: u64,
    vecadds: u64,
    gemms: u64,
    mismatches: u64,
    latencies: Vec<Duration>,
}

/// Runs `plan` on `client` until its iterations are done or `stop` is set.
pub fn run(client: &Client, name: &str, plan: &Plan, stop: &AtomicBool) -> anyhow::Result<Summary> {
    let session = client.session();
    let stream = client.create_stream()?;
    let start_event = client.create_event()?;
    let end_event = client.create_event()?;
    let started = Instant::now();
    start_event.record(&stream)?;

    let cpu_before = cpu_time();
    let n = plan.size.max(1);
    let mut t = Tally::default();
    let buffers = Buffers::new(client, n)?;
    // 32 blocks of 32 threads on each SM: every block slot of the device is taken, so a
    // trainer kernel holds the whole GPU while it runs, as a big training kernel does.
    let trainer_blocks = session.device.sm_count.clamp(1, 1 << 16) * 32;
    while t.iterations < plan.iterations && !stop.load(Ordering::Relaxed) {
        let it = t.iterations;
        match plan.workload {
            Workload::Vecadd => buffers.vecadd(&stream, it, &mut t)?,
            Workload::Gemm => buffers.gemm(&stream, it, &mut t)?,
            Workload::Mixed if it % 2 == 0 => buffers.vecadd(&stream, it, &mut t)?,
            Workload::Mixed => buffers.gemm(&stream, it, &mut t)?,
            Workload::Interactive => {
                let begun = Instant::now();
                buffers.vecadd(&stream, it, &mut t)?;
                t.latencies.push(begun.elapsed());
                client.end_iteration()?;
                std::thread::sleep(think_time(plan.think, it));
            }
            Workload::Idle => {
                // Counts no iterations: it does nothing but wait to be stopped.
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
            Workload::Trainer => {
                for _ in 0..plan.kernels_per_step {
                    stream.launch(Kernel::Spin {
                        micros: plan.kernel.as_micros() as u64,
                        blocks: trainer_blocks,
                    })?;
                }
                buffers.vecadd(&stream, it, &mut t)?;
                client.end_iteration()?;
            }
        }
        t.iterations += 1;
    }
    end_event.record(&stream)?;
    stream.synchronize()?;
    let wall = started.elapsed();
    let device_ns = end_event.elapsed_since(&start_event)?.as_nanos() as u64;
    t.latencies.sort_unstable();
    let as_ms = |d: Duration| d.as_secs_f64() * 1e3;
    let interactive = plan.workload == Workload::Interactive;
    let trainer = plan.workload == Workload::Trainer;
    Ok(Summary {
        name: name.into(),
        client_id: session.client_id,
        class: session.class.as_str().into(),
        backend: session.backend.clone(),
        iterations: t.iterations,
        vecadds: t.vecadds,
        gemms: t.gemms,
        requests: if interactive { t.iterations } else { 0 },
        steps: if trainer { t.iterations } else { 0 },
        mismatches: t.mismatches,
        wall_s: wall.as_secs_f64(),
        device_time_ns: device_ns,
        device_time: format!("{:.2} ms", device_ns as f64 / 1e6),
        latency_p50_ms: percentile(&t.latencies, 50.0).map(as_ms),
        latency_p99_ms: percentile(&t.latencies, 99.0).map(as_ms),
        steps_per_s: trainer.then(|| t.iterations as f64 / wall.as_secs_f64().max(1e-9)),
        cpu_s: (cpu_time() - cpu_before).max(0.0),
    })
}

/// CPU time, user and system, this process has used, in seconds.
fn cpu_time() -> f64 {
    nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF).map_or(0.0, |u| {
        let secs = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
        secs(u.user_time()) + secs(u.system_time())
    })
}

/// The device buffers a run works on.
struct Buffers {
    n: usize,
    side: usize,
    a: DeviceBuffer<f32>,
    b: DeviceBuffer<f32>,
    c: DeviceBuffer<f32>,
    ga: DeviceBuffer<f32>,
    gb: DeviceBuffer<f32>,
    gc: DeviceBuffer<f32>,
}

impl Buffers {
    fn new(client: &Client, n: usize) -> anyhow::Result<Buffers> {
        let side = ((n as f64).sqrt() as usize).clamp(1, 256);
        Ok(Buffers {
            n,
            side,
            a: client.alloc::<f32>(n)?,
            b: client.alloc::<f32>(n)?,
            c: client.alloc::<f32>(n)?,
            ga: client.alloc::<f32>(side * side)?,
            gb: client.alloc::<f32>(side * side)?,
            gc: client.alloc::<f32>(side * side)?,
        })
    }

    /// c = a + b, c += 2·a; every element checked.
    fn vecadd(&self, stream: &Stream, it: u64, t: &mut Tally) -> anyhow::Result<()> {
        let n = self.n;
        let (ha, hb) = (pattern(n, it), pattern(n, it + 7));
        self.a.copy_from_host(&ha)?;
        self.b.copy_from_host(&hb)?;
        stream.launch(Kernel::VecAddF32 {
            a: self.a.ptr(),
            b: self.b.ptr(),
            c: self.c.ptr(),
            n: n as u64,
        })?;
        stream.launch(Kernel::AxpyF32 {
            x: self.a.ptr(),
            y: self.c.ptr(),
            n: n as u64,
            alpha: 2.0,
        })?;
        stream.synchronize()?;
        let got = self.c.to_vec()?;
        t.mismatches += got
            .iter()
            .zip(ha.iter().zip(&hb))
            .filter(|(g, (x, y))| **g != *x + *y + 2.0 * *x)
            .count() as u64;
        t.vecadds += 1;
        Ok(())
    }

    /// C = A·B, every element checked against a host reference.
    fn gemm(&self, stream: &Stream, it: u64, t: &mut Tally) -> anyhow::Result<()> {
        let side = self.side;
        let (ha, hb) = (pattern(side * side, it), pattern(side * side, it + 3));
        self.ga.copy_from_host(&ha)?;
        self.gb.copy_from_host(&hb)?;
        let s = side as u32;
        stream.launch(Kernel::GemmF32 {
            a: self.ga.ptr(),
            b: self.gb.ptr(),
            c: self.gc.ptr(),
            m: s,
            n: s,
            k: s,
            alpha: 1.0,
            beta: 0.0,
        })?;
        stream.synchronize()?;
        let got = self.gc.to_vec()?;
        for i in 0..side {
            for j in 0..side {
                let want: f64 = (0..side)
                    .map(|p| ha[i * side + p] as f64 * hb[p * side + j] as f64)
                    .sum();
                let g = got[i * side + j] as f64;
                if (g - want).abs() > 1e-3 * want.abs().max(1.0) {
                    t.mismatches += 1;
                }
            }
        }
        t.gemms += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn think_times_average_their_mean() {
        let mean = Duration::from_millis(2);
        let total: Duration = (0..10_000).map(|n| think_time(mean, n)).sum();
        let average = total.as_secs_f64() / 10_000.0;
        assert!((average - 0.002).abs() < 0.0002, "{average}");
        assert_ne!(think_time(mean, 1), think_time(mean, 2));
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let ms: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&ms, 50.0), Some(Duration::from_millis(50)));
        assert_eq!(percentile(&ms, 99.0), Some(Duration::from_millis(99)));
        assert_eq!(percentile(&ms[..1], 99.0), Some(Duration::from_millis(1)));
        assert_eq!(percentile(&[], 50.0), None);
    }
}

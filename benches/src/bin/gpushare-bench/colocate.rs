//! The `colocate` scenario: a high-priority inference client with Poisson request arrivals
//! beside one and then four best-effort clients, every client its own process, under each
//! way of sharing the GPU — dedicated (the high-priority client alone), time-slicing
//! (separate processes, direct CUDA), MPS (the same under the MPS daemon) and gpushare (every
//! client through one `gpushared` running the priority policy).
//!
//! The orchestrator starts a setup's workers, waits until each has set up and warmed up
//! (`ready` on its stdout), then tells them all to go at once (a line on their stdin); each
//! runs for the same wall-clock window and prints its JSON.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use gpushare::{Client, ConnectOptions};
use gpushare_broker::device::Backend;
use gpushare_broker::device::cuda::{CudaDevice, CudaStream};
use gpushare_protocol::control::ModuleFormat;
use gpushare_protocol::{Kernel, PriorityClass};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

use crate::workload;

/// The high-priority client's request: an inference-like iteration.
pub const HIGH_WORKLOAD: &str = "mlp_infer";

/// What one colocate worker does.
#[derive(Debug, Clone)]
pub struct WorkerSpec {
    pub role: Role,
    pub workload: String,
    pub seconds: f64,
    /// High priority only: mean gap between request arrivals.
    pub mean_gap_ms: f64,
    pub seed: u64,
    /// gpushare only: how long the client library spins for a completion before sleeping
    /// (`None`: the library's default).
    pub spin_us: Option<u64>,
    /// Best-effort only: every this many iterations, do `churn` once (0: never).
    pub churn_every: u64,
    pub churn: Churn,
}

/// What a best-effort client does now and then between iterations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Churn {
    /// Allocates a buffer of a size it has not used lately (over 1 MiB: a chunk of its own,
    /// made for it) and frees it, as a trainer whose shapes keep changing does.
    Alloc,
    /// Loads a small PTX module, looks its kernel up and unloads it, as a framework that
    /// compiles or loads kernels as it goes does (the same PTX each time: after the first,
    /// the driver's compute cache spares the compilation).
    Module,
}

/// The module `Churn::Module` loads.
const CHURN_PTX: &str =
    ".version 7.0\n.target sm_50\n.address_size 64\n.visible .entry churn() { ret; }\n";

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Role {
    /// Requests arrive as a Poisson process; each request's latency counts from its arrival.
    High,
    /// Runs iterations back to back; its throughput counts.
    BestEffort,
}

/// How a worker reaches the GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// Its own CUDA context (time-slicing, or an MPS client when the daemon runs).
    Direct,
    /// Through gpushared.
    Broker,
}

/// Runs one iteration of a workload to completion.
enum Engine {
    Direct {
        // Boxed: the device and stream handles are large beside the other variant.
        dev: Box<CudaDevice>,
        stream: Box<CudaStream>,
        kernels: Vec<Kernel>,
    },
    Broker {
        client: Client,
        stream: gpushare::Stream,
        // Kept alive for the kernels' pointers.
        _buffers: Vec<gpushare::DeviceBuffer<f32>>,
        kernels: Vec<Kernel>,
    },
}

impl Engine {
    fn open(via: Via, spec: &WorkerSpec) -> Result<Engine> {
        let (role, name) = (spec.role, spec.workload.as_str());
        let it = workload::by_name(name).ok_or_else(|| anyhow!("no workload named {name}"))?;
        match via {
            Via::Direct => {
                let dev = Box::new(CudaDevice::open(0).map_err(|e| anyhow!("{e}"))?);
                let mut stream = dev
                    .create_stream(PriorityClass::Normal)
                    .map_err(|e| anyhow!("{e}"))?;
                let (_, kernels) = crate::direct::prepare_iteration(&dev, &mut stream, &it)?;
                Ok(Engine::Direct {
                    dev,
                    stream: Box::new(stream),
                    kernels,
                })
            }
            Via::Broker => {
                let opts = ConnectOptions {
                    name: format!("colocate-{name}"),
                    // The policy grants this user `high`; best-effort workers ask for less.
                    class: (role == Role::BestEffort).then_some(PriorityClass::BestEffort),
                    ..ConnectOptions::default()
                };
                let client = Client::connect_with(match spec.spin_us {
                    Some(us) => ConnectOptions {
                        spin: Duration::from_micros(us),
                        ..opts
                    },
                    None => opts,
                })?;
                let stream = client.create_stream()?;
                let (buffers, kernels) = crate::brokered::prepare_iteration(&client, &stream, &it)?;
                Ok(Engine::Broker {
                    client,
                    stream,
                    _buffers: buffers,
                    kernels,
                })
            }
        }
    }

    fn iterate(&mut self) -> Result<()> {
        match self {
            Engine::Direct {
                dev,
                stream,
                kernels,
            } => {
                for k in kernels.iter() {
                    dev.launch(stream, k).map_err(|e| anyhow!("{e}"))?;
                }
                dev.sync_stream(stream).map_err(|e| anyhow!("{e}"))
            }
            Engine::Broker {
                stream, kernels, ..
            } => {
                for k in kernels.iter() {
                    stream.launch(*k)?;
                }
                Ok(stream.synchronize()?)
            }
        }
    }

    /// Does `churn` for the `n`th time. An allocation takes the next of a cycle of sizes, 2 MiB
    /// more each time over 512 sizes, so that no size comes back within gpushare's idle-chunk
    /// time (2 s) at the rates these workers allocate.
    fn churn(&mut self, churn: Churn, n: u64) -> Result<()> {
        let elems = (1 + (n % 512) as usize) * (2 << 20) / 4;
        let ptx = CHURN_PTX.as_bytes();
        match (self, churn) {
            (Engine::Direct { dev, .. }, Churn::Alloc) => {
                let p = dev.alloc(elems as u64 * 4).map_err(|e| anyhow!("{e}"))?;
                dev.free(p).map_err(|e| anyhow!("{e}"))
            }
            (Engine::Direct { dev, .. }, Churn::Module) => {
                let m = dev
                    .load_module(ModuleFormat::Ptx, ptx)
                    .map_err(|e| anyhow!("{e}"))?;
                dev.get_function(&m, "churn").map_err(|e| anyhow!("{e}"))?;
                Ok(())
            }
            (Engine::Broker { client, .. }, Churn::Alloc) => {
                drop(client.alloc::<f32>(elems)?);
                Ok(())
            }
            (Engine::Broker { client, .. }, Churn::Module) => {
                let m = client.load_module(ModuleFormat::Ptx, ptx)?;
                m.function("churn")?;
                Ok(())
            }
        }
    }

    /// Tells the scheduler a request ended (gpushare only: the priority policy sizes its
    /// budget for best-effort work from the high-priority request latency).
    fn end_request(&self) -> Result<()> {
        if let Engine::Broker { client, .. } = self {
            client.end_iteration()?;
        }
        Ok(())
    }
}

/// Busy-waits until `t`. The high-priority worker never sleeps between requests, in every
/// setup: waking a sleeping thread on this kind of machine (a VM) costs up to milliseconds,
/// which would measure the host's wake-up latency instead of the GPU sharing.
fn wait_until(t: Instant) {
    while Instant::now() < t {
        std::hint::spin_loop();
    }
}

/// The worker process: set up, say `ready`, wait for `go`, run, print JSON.
pub fn worker(via: Via, spec: &WorkerSpec) -> Result<Value> {
    let mut engine = Engine::open(via, spec)?;
    for _ in 0..20 {
        engine.iterate()?;
    }
    let mut out = std::io::stdout().lock();
    writeln!(out, "ready")?;
    out.flush()?;
    drop(out);
    let mut go = String::new();
    std::io::stdin().lock().read_line(&mut go)?;
    if go.trim() != "go" {
        bail!("told `{}` instead of go", go.trim());
    }
    let window = Duration::from_secs_f64(spec.seconds);
    let start = Instant::now();
    let end = start + window;
    match spec.role {
        Role::High => {
            let mut rng = StdRng::seed_from_u64(spec.seed);
            let mean = spec.mean_gap_ms / 1e3;
            let mut gap = || Duration::from_secs_f64(-(1.0 - rng.random::<f64>()).ln() * mean);
            let mut arrival = start + gap();
            let mut latencies_ms = Vec::new();
            // (service ms, latency ms, arrival offset ms, idle ms before it) of each request,
            // for the tail report: a request after a long idle finds threads asleep; one with
            // none waited for the one before.
            let mut samples: Vec<(f64, f64, f64, f64)> = Vec::new();
            let mut offered = 0u64;
            let mut last_end = start;
            while arrival < end {
                offered += 1;
                if Instant::now() >= end {
                    // Behind at the end of the window: the rest count as offered, not served.
                    arrival += gap();
                    continue;
                }
                wait_until(arrival);
                let began = Instant::now();
                engine.iterate()?;
                let latency = arrival.elapsed().as_secs_f64() * 1e3;
                latencies_ms.push(latency);
                samples.push((
                    began.elapsed().as_secs_f64() * 1e3,
                    latency,
                    (arrival - start).as_secs_f64() * 1e3,
                    arrival.saturating_duration_since(last_end).as_secs_f64() * 1e3,
                ));
                last_end = Instant::now();
                engine.end_request()?;
                arrival += gap();
            }
            let served = latencies_ms.len() as f64;
            let mut service: Vec<f64> = samples.iter().map(|s| s.0).collect();
            samples.sort_by(|a, b| b.1.total_cmp(&a.1));
            let worst: Vec<Value> = samples
                .iter()
                .take(8)
                .map(|s| {
                    json!(format!(
                        "{:.3} ms at {:.0} ms (service {:.3}, idle {:.2} before)",
                        s.1, s.2, s.0, s.3
                    ))
                })
                .collect();
            Ok(json!({
                "service_p50_ms": workload::percentile(&mut service, 50.0),
                "service_p99_ms": workload::percentile(&mut service, 99.0),
                "p90_ms": workload::percentile(&mut latencies_ms, 90.0),
                "max_ms": workload::percentile(&mut latencies_ms, 100.0),
                "worst": worst,
                "p50_ms": workload::percentile(&mut latencies_ms, 50.0),
                "p99_ms": workload::percentile(&mut latencies_ms, 99.0),
                "mean_ms": workload::mean(&latencies_ms),
                "requests": served,
                "requests_per_s": served / start.elapsed().as_secs_f64(),
                "offered": offered as f64,
            }))
        }
        Role::BestEffort => {
            let mut iterations = 0u64;
            let mut churns = 0u64;
            while Instant::now() < end {
                engine.iterate()?;
                iterations += 1;
                if spec.churn_every > 0 && iterations.is_multiple_of(spec.churn_every) {
                    engine.churn(spec.churn, churns)?;
                    churns += 1;
                }
            }
            Ok(json!({
                "churns": churns as f64,
                "iterations": iterations as f64,
                "it_per_s": iterations as f64 / start.elapsed().as_secs_f64(),
            }))
        }
    }
}

/// A running worker process, killed if dropped before it finished.
struct Running {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    label: String,
}

impl Drop for Running {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// One process of a setup: its label in the results, and what it runs.
pub struct Member {
    pub label: String,
    pub via: Via,
    pub spec: WorkerSpec,
}

/// Starts every member, waits until all are ready, starts them together and collects each
/// one's JSON under its label.
pub fn run_group(
    me: &Path,
    members: &[Member],
    envs: &[(&str, &std::ffi::OsStr)],
) -> Result<Value> {
    let mut running = Vec::new();
    for m in members {
        let mut cmd = Command::new(me);
        cmd.args([
            "colocate-worker",
            "--via",
            match m.via {
                Via::Direct => "direct",
                Via::Broker => "broker",
            },
            "--role",
            match m.spec.role {
                Role::High => "high",
                Role::BestEffort => "best-effort",
            },
            "--workload",
            &m.spec.workload,
            "--seconds",
            &m.spec.seconds.to_string(),
            "--mean-gap-ms",
            &m.spec.mean_gap_ms.to_string(),
            "--seed",
            &m.spec.seed.to_string(),
        ]);
        if let Some(us) = m.spec.spin_us {
            cmd.arg(format!("--spin-us={us}"));
        }
        if m.spec.churn_every > 0 {
            cmd.arg(format!("--churn-every={}", m.spec.churn_every));
            cmd.arg(match m.spec.churn {
                Churn::Alloc => "--churn=alloc",
                Churn::Module => "--churn=module",
            });
        }
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("cannot start a colocate worker")?;
        let stdin = child.stdin.take();
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| anyhow!("worker has no stdout"))?;
        running.push(Running {
            child,
            stdin,
            stdout: BufReader::new(stdout),
            label: m.label.clone(),
        });
    }
    for r in &mut running {
        let mut line = String::new();
        r.stdout.read_line(&mut line)?;
        if line.trim() != "ready" {
            bail!("worker {} failed while setting up", r.label);
        }
    }
    for r in &mut running {
        let mut stdin = r
            .stdin
            .take()
            .ok_or_else(|| anyhow!("worker {} has no stdin", r.label))?;
        writeln!(stdin, "go")?;
    }
    let mut out = serde_json::Map::new();
    for mut r in running {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut r.stdout, &mut text)?;
        let status = r.child.wait()?;
        if !status.success() {
            bail!("worker {} exited with {status}", r.label);
        }
        let v = crate::harness::last_json_line(&text, &format!("worker {}", r.label))?;
        out.insert(r.label.clone(), v);
    }
    Ok(Value::Object(out))
}

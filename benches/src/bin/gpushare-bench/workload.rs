//! The work each scenario does, described once and run by every mode.

use gpushare_protocol::{DevicePtr, Kernel};

/// Copy sizes of the `copy` scenario.
pub const COPY_SIZES: [(&str, usize); 6] = [
    ("4 KiB", 4 << 10),
    ("64 KiB", 64 << 10),
    ("1 MiB", 1 << 20),
    ("16 MiB", 16 << 20),
    ("64 MiB", 64 << 20),
    ("256 MiB", 256 << 20),
];

/// How many times to repeat a copy of `bytes` (more for small copies), at least 3.
pub fn copy_reps(bytes: usize, quick: bool) -> usize {
    let target = if quick { 256usize << 20 } else { 2usize << 30 };
    (target / bytes).clamp(3, if quick { 200 } else { 2000 })
}

/// A device buffer the iteration workloads need, in f32 elements (names are for readers).
pub struct BufferSpec {
    pub elems: usize,
}

/// A DNN-like iteration: buffers to allocate and the kernel sequence over them.
pub struct Iteration {
    pub name: &'static str,
    pub what: &'static str,
    pub buffers: Vec<BufferSpec>,
    /// Builds the kernel list from the buffers' device pointers (same order as `buffers`).
    pub kernels: fn(&[DevicePtr]) -> Vec<Kernel>,
}

const T: u32 = 1024; // tokens: batch 8 × sequence 128
const H: u32 = 768; // hidden size (BERT-base)
const F: u32 = 3072; // feed-forward size
const HEADS: u32 = 12;
const D: u32 = H / HEADS; // head size

fn gemm(a: DevicePtr, b: DevicePtr, c: DevicePtr, m: u32, n: u32, k: u32) -> Kernel {
    Kernel::GemmF32 {
        a,
        b,
        c,
        m,
        n,
        k,
        alpha: 1.0,
        beta: 0.0,
    }
}

fn f32_offset(p: DevicePtr, elems: u32) -> DevicePtr {
    p + 4 * elems as u64
}

/// A BERT-base-layer-shaped forward pass: QKV projection, 12 heads of scores and context
/// GEMMs with a scaling kernel between, output projection, residual, feed-forward up, an
/// element-wise activation stand-in, feed-forward down, residual: 43 kernels, ~17.7 GFLOP.
fn transformer_kernels(p: &[DevicePtr]) -> Vec<Kernel> {
    let [x, wqkv, qkv, scores, ctx, wo, out, y, w1, ffn, w2] = [
        p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9], p[10],
    ];
    let mut k = vec![gemm(x, wqkv, qkv, T, 3 * H, H)];
    for h in 0..HEADS {
        let q = f32_offset(qkv, h * T * D);
        let kt = f32_offset(qkv, (HEADS + h) * T * D);
        let v = f32_offset(qkv, (2 * HEADS + h) * T * D);
        k.push(gemm(q, kt, scores, T, T, D));
        k.push(Kernel::AxpyF32 {
            x: scores,
            y: scores,
            n: (T * T) as u64,
            alpha: -0.875,
        });
        k.push(gemm(scores, v, f32_offset(ctx, h * T * D), T, D, T));
    }
    k.push(gemm(ctx, wo, out, T, H, H));
    k.push(Kernel::VecAddF32 {
        a: out,
        b: x,
        c: y,
        n: (T * H) as u64,
    });
    k.push(gemm(y, w1, ffn, T, F, H));
    k.push(Kernel::AxpyF32 {
        x: ffn,
        y: ffn,
        n: (T * F) as u64,
        alpha: -0.5,
    });
    k.push(gemm(ffn, w2, out, T, H, F));
    k.push(Kernel::VecAddF32 {
        a: out,
        b: y,
        c: y,
        n: (T * H) as u64,
    });
    k
}

const MLP_WIDTH: u32 = 2048;
const MLP_LAYERS: usize = 6;

fn mlp_kernels(p: &[DevicePtr], batch: u32) -> Vec<Kernel> {
    let (a, b, w) = (p[0], p[1], p[2]);
    let mut k = Vec::new();
    for layer in 0..MLP_LAYERS {
        let (src, dst) = if layer % 2 == 0 { (a, b) } else { (b, a) };
        let wl = f32_offset(w, layer as u32 * MLP_WIDTH * MLP_WIDTH);
        k.push(gemm(src, wl, dst, batch, MLP_WIDTH, MLP_WIDTH));
        k.push(Kernel::AxpyF32 {
            x: dst,
            y: dst,
            n: (batch * MLP_WIDTH) as u64,
            alpha: -0.5,
        });
    }
    k
}

fn mlp_train(p: &[DevicePtr]) -> Vec<Kernel> {
    mlp_kernels(p, 512)
}

fn mlp_infer(p: &[DevicePtr]) -> Vec<Kernel> {
    mlp_kernels(p, 8)
}

/// Spin blocks: 32 one-warp blocks per SM of an H100 (132 SMs) fill every block slot.
const SPIN_BLOCKS: u32 = 132 * 32;
/// Elements of each `stream` buffer: 128 MiB of f32, far beyond the 50 MiB L2.
const STREAM_ELEMS: u32 = 32 << 20;

/// Occupies SMs and moves no memory: four 100 µs spin kernels.
fn spin(_p: &[DevicePtr]) -> Vec<Kernel> {
    vec![
        Kernel::Spin {
            micros: 100,
            blocks: SPIN_BLOCKS,
        };
        4
    ]
}

/// Moves memory and computes next to nothing: four `y += a·x` over 128 MiB vectors.
fn stream(p: &[DevicePtr]) -> Vec<Kernel> {
    vec![
        Kernel::AxpyF32 {
            x: p[0],
            y: p[1],
            n: u64::from(STREAM_ELEMS),
            alpha: 0.5,
        };
        4
    ]
}

/// Workloads for probing what slows a colocated client (colocate's `--be-workloads` and
/// `--hp-workload` take them; the `iteration` scenario does not run them).
pub fn probes() -> Vec<Iteration> {
    let b = |elems: u32| BufferSpec {
        elems: elems as usize,
    };
    vec![
        Iteration {
            name: "spin",
            what: "4 × 100 µs spin kernels filling every SM, no memory traffic (a probe)",
            buffers: vec![b(1)],
            kernels: spin,
        },
        Iteration {
            name: "stream",
            what: "4 × axpy over 128 MiB vectors, memory-bound (a probe)",
            buffers: vec![b(STREAM_ELEMS), b(STREAM_ELEMS)],
            kernels: stream,
        },
    ]
}

/// A workload of either list, by name.
pub fn by_name(name: &str) -> Option<Iteration> {
    iterations()
        .into_iter()
        .chain(probes())
        .find(|i| i.name == name)
}

pub fn iterations() -> Vec<Iteration> {
    let b = |_name: &str, elems: u32| BufferSpec {
        elems: elems as usize,
    };
    let mlp_buffers = |batch: u32| {
        vec![
            b("act_a", batch * MLP_WIDTH),
            b("act_b", batch * MLP_WIDTH),
            BufferSpec {
                elems: MLP_LAYERS * (MLP_WIDTH * MLP_WIDTH) as usize,
            }, // weights
        ]
    };
    vec![
        Iteration {
            name: "mlp_infer",
            what: "MLP 6×Linear(2048) batch 8 (inference-like, latency-bound): 12 kernels",
            buffers: mlp_buffers(8),
            kernels: mlp_infer,
        },
        Iteration {
            name: "mlp_train",
            what: "MLP 6×Linear(2048) batch 512 (training-like forward): 12 kernels, 25.8 GFLOP",
            buffers: mlp_buffers(512),
            kernels: mlp_train,
        },
        Iteration {
            name: "transformer",
            what: "BERT-base layer shape, 8×128 tokens: 43 kernels, 17.7 GFLOP",
            buffers: vec![
                b("x", T * H),
                b("wqkv", H * 3 * H),
                b("qkv", T * 3 * H),
                b("scores", T * T),
                b("ctx", T * H),
                b("wo", H * H),
                b("out", T * H),
                b("y", T * H),
                b("w1", H * F),
                b("ffn", T * F),
                b("w2", F * H),
            ],
            kernels: transformer_kernels,
        },
    ]
}

/// The `launch` scenario, the same for every mode: warm up, time `n` back-to-back launches
/// then one sync (the asynchronous rate), then time launch + sync pairs (the latency).
pub fn measure_launches(
    quick: bool,
    launch: impl Fn() -> anyhow::Result<()>,
    sync: impl Fn() -> anyhow::Result<()>,
) -> anyhow::Result<serde_json::Value> {
    let (n_async, n_sync) = if quick {
        (20_000, 2_000)
    } else {
        (100_000, 10_000)
    };
    for _ in 0..1000 {
        launch()?;
    }
    sync()?;
    // For a profiler beside it: asynchronous launches for this many seconds instead.
    let at_least =
        gpushare_conn::env::seconds("GPUSHARE_BENCH_LAUNCH_SECONDS", std::time::Duration::ZERO);
    let t = std::time::Instant::now();
    let mut launched = 0u64;
    loop {
        for _ in 0..n_async {
            launch()?;
        }
        launched += n_async as u64;
        if t.elapsed() >= at_least {
            break;
        }
    }
    sync()?;
    let async_rate = launched as f64 / t.elapsed().as_secs_f64();
    let mut lat = Vec::with_capacity(n_sync);
    for _ in 0..n_sync {
        let t = std::time::Instant::now();
        launch()?;
        sync()?;
        lat.push(t.elapsed().as_secs_f64() * 1e6);
    }
    Ok(serde_json::json!({
        "async_launches_per_s": async_rate,
        "sync_mean_us": mean(&lat),
        "sync_p50_us": percentile(&mut lat, 50.0),
        "sync_p99_us": percentile(&mut lat, 99.0),
    }))
}

/// The `iteration` scenario's timing, the same for every mode: warm up, then time
/// repetitions of `run` (which returns one iteration's milliseconds).
pub fn time_iterations(
    quick: bool,
    mut run: impl FnMut() -> anyhow::Result<f64>,
) -> anyhow::Result<serde_json::Value> {
    let (warm, reps) = if quick { (5, 30) } else { (20, 200) };
    for _ in 0..warm {
        run()?;
    }
    let mut ms: Vec<f64> = (0..reps).map(|_| run()).collect::<anyhow::Result<_>>()?;
    Ok(serde_json::json!({"mean_ms": mean(&ms), "p50_ms": percentile(&mut ms, 50.0)}))
}

/// p-th percentile (0..=100) of unsorted samples.
pub fn percentile(samples: &mut [f64], p: f64) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    samples.sort_by(|a, b| a.total_cmp(b));
    let idx = ((p / 100.0) * (samples.len() - 1) as f64).round() as usize;
    samples[idx.min(samples.len() - 1)]
}

/// The median: the middle sample, or the mean of the two middle ones (so two rounds give
/// their mean, not the larger).
pub fn median(samples: &mut [f64]) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    samples.sort_by(|a, b| a.total_cmp(b));
    let mid = samples.len() / 2;
    if samples.len() % 2 == 1 {
        samples[mid]
    } else {
        (samples[mid - 1] + samples[mid]) / 2.0
    }
}

pub fn mean(samples: &[f64]) -> f64 {
    samples.iter().sum::<f64>() / samples.len().max(1) as f64
}

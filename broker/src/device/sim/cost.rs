//! The sim device's cost model: how much modelled GPU time each command takes.
//!
//! A kernel costs a fixed launch overhead plus the larger of its compute time and its memory
//! time (a roofline), where both peaks are scaled by the fraction of SMs its grid can occupy:
//!
//! ```text
//! occupancy = min(1, blocks / sm_count)
//! kernel    = launch + max(flops / (peak × occupancy), bytes / (memory_bw × occupancy))
//!             (peak: fp32_flops, or bf16_flops for the bf16 GEMM)
//! copy h↔d  = copy_latency + bytes / host_bw
//! copy d→d  = launch + 2 × bytes / memory_bw
//! memset    = launch + bytes / memory_bw
//! spin(µs)  = exactly the requested time
//! ```
//!
//! A kernel's FLOPs, bytes and blocks are the kernel's own ([`Kernel::work`]); the peaks are
//! the sim's alone: nothing outside the sim device reads this model (the scheduler learns
//! what each device measures). The sim runs one command at a time: a command starts when
//! both its stream and the device are free. This is deterministic, which is what the
//! scheduler tests need.

use gpushare_protocol::Kernel;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostModel {
    pub sm_count: u32,
    /// FLOP/s at full occupancy.
    pub fp32_flops: f64,
    /// Dense bf16 tensor-core FLOP/s at full occupancy.
    pub bf16_flops: f64,
    /// Device memory bytes/s at full occupancy.
    pub memory_bw: f64,
    /// Host↔device bytes/s.
    pub host_bw: f64,
    pub launch_ns: u64,
    pub copy_latency_ns: u64,
}

impl CostModel {
    /// Figures of an H100 SXM, rounded: 132 SMs, 60 TFLOP/s FP32, 800 TFLOP/s dense bf16,
    /// 3.35 TB/s HBM3, 25 GB/s
    /// effective PCIe, 3 µs launch, 5 µs copy set-up.
    pub const H100_LIKE: CostModel = CostModel {
        sm_count: 132,
        fp32_flops: 60e12,
        bf16_flops: 800e12,
        memory_bw: 3.35e12,
        host_bw: 25e9,
        launch_ns: 3_000,
        copy_latency_ns: 5_000,
    };

    fn occupancy(&self, blocks: u64) -> f64 {
        (blocks as f64 / self.sm_count.max(1) as f64).clamp(1e-9, 1.0)
    }

    /// Modelled time of a built-in kernel, in ns.
    pub fn kernel_ns(&self, kernel: &Kernel) -> u64 {
        if let Kernel::Spin { micros, .. } = *kernel {
            return micros.saturating_mul(1_000);
        }
        let work = kernel.work();
        let (flops, bytes) = (work.flops, work.bytes);
        let occ = self.occupancy(work.blocks);
        let peak = if matches!(kernel, Kernel::GemmBf16 { .. }) {
            self.bf16_flops
        } else {
            self.fp32_flops
        };
        let compute = flops / (peak * occ);
        let memory = bytes / (self.memory_bw * occ);
        self.launch_ns + secs_to_ns(compute.max(memory))
    }

    pub fn host_copy_ns(&self, bytes: u64) -> u64 {
        self.copy_latency_ns + secs_to_ns(bytes as f64 / self.host_bw)
    }

    pub fn device_copy_ns(&self, bytes: u64) -> u64 {
        self.launch_ns + secs_to_ns(2.0 * bytes as f64 / self.memory_bw)
    }

    pub fn memset_ns(&self, bytes: u64) -> u64 {
        self.launch_ns + secs_to_ns(bytes as f64 / self.memory_bw)
    }
}

fn secs_to_ns(s: f64) -> u64 {
    (s * 1e9).round().min(u64::MAX as f64) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: CostModel = CostModel::H100_LIKE;

    #[test]
    fn spin_costs_exactly_what_it_asks() {
        assert_eq!(
            M.kernel_ns(&Kernel::Spin {
                micros: 250,
                blocks: 1
            }),
            250_000
        );
    }

    #[test]
    fn big_vector_add_is_memory_bound_at_hbm_speed() {
        let n = 1u64 << 26; // 64 Mi elements, 768 MiB moved
        let ns = M.kernel_ns(&Kernel::VecAddF32 {
            a: 0,
            b: 0,
            c: 0,
            n,
        });
        let expected = 3_000.0 + 12.0 * n as f64 / 3.35e12 * 1e9;
        assert!((ns as f64 - expected).abs() < 2.0, "{ns} vs {expected}");
    }

    #[test]
    fn big_gemm_is_compute_bound_and_small_grids_run_slower() {
        let g = |m, n, k| Kernel::GemmF32 {
            a: 0,
            b: 0,
            c: 0,
            m,
            n,
            k,
            alpha: 1.0,
            beta: 0.0,
        };
        let big = M.kernel_ns(&g(4096, 4096, 4096));
        let flops_ns = 2.0 * 4096f64.powi(3) / 60e12 * 1e9;
        assert!((big as f64 - 3_000.0 - flops_ns).abs() < 2.0);
        // A 16×16 output is one tile, one block on one of 132 SMs: both peaks shrink 132×,
        // and with k = 4096 it streams 512 KiB, so it is memory-bound there.
        let tiny = M.kernel_ns(&g(16, 16, 4096)) - 3_000;
        let flops_ns = 2.0 * 16.0 * 16.0 * 4096.0 / (60e12 / 132.0) * 1e9;
        let bytes_ns = 4.0 * (2.0 * 16.0 * 4096.0 + 256.0) / (3.35e12 / 132.0) * 1e9;
        assert!(bytes_ns > flops_ns);
        assert!((tiny as f64 - bytes_ns).abs() < 2.0, "{tiny} vs {bytes_ns}");
    }

    #[test]
    fn copies_follow_bandwidth() {
        assert_eq!(M.host_copy_ns(25_000_000), 5_000 + 1_000_000);
        assert_eq!(M.memset_ns(0), 3_000);
    }
}

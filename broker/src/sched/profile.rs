//! Kernel profiles: how long a kernel runs, what bounds it, how many SMs its grid occupies.
//!
//! Orion (EuroSys'24) schedules best-effort kernels around high-priority ones from per-kernel
//! profiles: duration, compute- vs memory-bound, SM needs. Orion profiles offline; here a
//! profile is declared by the client or learned online from the device's own measurements,
//! an EWMA per [`KernelKey`], from a neutral prior (the table's default duration; for a
//! built-in kernel, the bound its arithmetic intensity gives on any current GPU). A declared
//! profile always wins over a learned one. Durations are learned from runs that had the GPU to
//! themselves when there are any, so that `est_ns` stays the kernel's solo time and the rate
//! controller can read slowdown as `est / measured`.

use std::collections::HashMap;

use gpushare_protocol::Kernel;

/// What identifies "the same kernel" for learning: the function and its grid size.
///
/// `function` must be unique across clients (session-local handles are not): use
/// [`KernelKey::client_function`] or a digest of module and name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KernelKey {
    pub function: u64,
    /// Thread blocks in the grid.
    pub blocks: u32,
}

impl KernelKey {
    /// A key for a client's own function handle (handles start at 1 in every session).
    pub fn client_function(client: u64, handle: u64, blocks: u32) -> KernelKey {
        // 24 bits of client and 39 of handle keep the built-in range (top bit) free.
        let function = ((client & 0xff_ffff) << 39) | (handle & ((1 << 39) - 1));
        KernelKey { function, blocks }
    }
}

/// Which resource limits a kernel (Orion's profile classes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Bound {
    Compute,
    Memory,
    Unknown,
}

impl Bound {
    /// A dense index of the kind (0, 1, 2), for tables by kind.
    pub fn index(self) -> usize {
        match self {
            Bound::Compute => 0,
            Bound::Memory => 1,
            Bound::Unknown => 2,
        }
    }

    /// Classifies by arithmetic intensity (FLOP per byte) against the device's ridge point
    /// (peak FLOP/s ÷ memory bytes/s): at or above the ridge the roofline is flat, so the
    /// kernel is compute-bound.
    pub fn from_intensity(flops: f64, bytes: f64, ridge_flop_per_byte: f64) -> Bound {
        if !(flops.is_finite() && bytes.is_finite()) || (flops <= 0.0 && bytes <= 0.0) {
            return Bound::Unknown;
        }
        if bytes <= 0.0 || flops / bytes >= ridge_flop_per_byte {
            Bound::Compute
        } else {
            Bound::Memory
        }
    }

    /// Orion's interference test: two kernels collide when both stress the same resource.
    pub fn collides(self, other: Bound) -> bool {
        matches!(
            (self, other),
            (Bound::Compute, Bound::Compute) | (Bound::Memory, Bound::Memory)
        )
    }
}

/// One kernel launch as the scheduler sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelProfile {
    pub key: KernelKey,
    /// Expected duration when the kernel has the GPU to itself.
    pub est_ns: u64,
    pub bound: Bound,
    /// SMs the grid occupies: its block count, capped at the device's SMs.
    pub sm_need: u32,
}

impl KernelProfile {
    pub fn new(key: KernelKey, est_ns: u64, bound: Bound, sms: u32) -> KernelProfile {
        KernelProfile {
            key,
            est_ns,
            bound,
            sm_need: sm_need(key.blocks, sms),
        }
    }
}

/// SMs a grid of `blocks` occupies on a device of `sms` SMs (one wave: at most all of them).
pub fn sm_need(blocks: u32, sms: u32) -> u32 {
    blocks.clamp(1, sms.max(1))
}

/// The top bit marks built-in kernels so they never meet a client's function handle.
pub const BUILTIN_FUNCTION_BASE: u64 = 1 << 63;

/// The function id of a built-in kernel: its name hashed (FNV-1a), so new kernels get ids
/// without a table to keep in step.
pub fn builtin_function_id(kernel: &Kernel) -> u64 {
    let hash = kernel
        .name()
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
    BUILTIN_FUNCTION_BASE | (hash >> 1)
}

/// The lowest ridge points (peak FLOP/s ÷ memory bytes/s) among current data-centre GPUs, for
/// FP32 (A100: 19.5 TFLOP/s over 2.0 TB/s) and dense bf16 tensor-core work (V100's fp16:
/// 125 TFLOP/s over 0.9 TB/s): a kernel below is memory-bound on every one of them. The
/// prior for a built-in kernel's bound, whatever the device.
pub const PRIOR_RIDGE_FP32: f64 = 10.0;
pub const PRIOR_RIDGE_BF16: f64 = 140.0;

/// The key of a built-in kernel: its function id and grid.
pub fn builtin_key(kernel: &Kernel) -> KernelKey {
    KernelKey {
        function: builtin_function_id(kernel),
        blocks: u32::try_from(kernel.work().blocks).unwrap_or(u32::MAX),
    }
}

/// The side of the roofline a built-in kernel sits on, from its arithmetic intensity against
/// the prior ridge points.
pub fn builtin_bound(kernel: &Kernel) -> Bound {
    match kernel {
        // Spin does no work but holds its SMs: it competes for SMs, not bandwidth.
        Kernel::Spin { .. } => Bound::Compute,
        Kernel::GemmBf16 { .. } => {
            let w = kernel.work();
            Bound::from_intensity(w.flops, w.bytes, PRIOR_RIDGE_BF16)
        }
        _ => {
            let w = kernel.work();
            Bound::from_intensity(w.flops, w.bytes, PRIOR_RIDGE_FP32)
        }
    }
}

/// Most distinct kernels remembered; a client inventing keys cannot grow the broker past it.
pub const MAX_PROFILES: usize = 16_384;

/// A kernel's profile is young until this many of its times were observed.
const YOUNG_OBSERVATIONS: u32 = 8;
/// About one launch in this many of a young kernel is timed, and of a high-priority client's
/// kernels (the rate controller compares each with its estimate). Never each launch: a
/// program whose grids keep changing has kernels that stay young.
const TIME_OFTEN_EVERY: u32 = 8;
/// About one launch in this many of a settled kernel is timed. Each time is two events, calls
/// the worker issues through the one CUDA context: at one in 8, about 0.6 µs a launch on the
/// H200 (docs/benchmarks.md, run H3).
const TIME_SETTLED_EVERY: u32 = 64;

#[derive(Debug, Clone)]
struct Entry {
    declared: Option<KernelProfile>,
    learned_ns: f64,
    samples: u64,
    /// Times observed, kept or not (overlapped ones are not once a solo one is).
    observed: u32,
    /// Whether `learned_ns` comes from solo runs (then overlapped ones are ignored).
    solo: bool,
    hint: Bound,
}

/// Per-kernel profiles: declared ones, plus EWMA durations learned from measurements.
#[derive(Debug, Clone)]
pub struct ProfileTable {
    sms: u32,
    alpha: f64,
    default_est_ns: u64,
    entries: HashMap<KernelKey, Entry>,
}

impl ProfileTable {
    /// `alpha` is the EWMA weight of a new sample; `default_est_ns` what an unseen kernel is
    /// assumed to take.
    pub fn new(sms: u32, alpha: f64, default_est_ns: u64) -> ProfileTable {
        ProfileTable {
            sms: sms.max(1),
            alpha: alpha.clamp(0.01, 1.0),
            default_est_ns,
            entries: HashMap::new(),
        }
    }

    fn entry(&mut self, key: KernelKey) -> Option<&mut Entry> {
        if !self.entries.contains_key(&key) && self.entries.len() >= MAX_PROFILES {
            return None;
        }
        Some(self.entries.entry(key).or_insert(Entry {
            declared: None,
            learned_ns: 0.0,
            samples: 0,
            observed: 0,
            solo: false,
            hint: Bound::Unknown,
        }))
    }

    /// A declared profile: overrides whatever was learned for its key.
    pub fn declare(&mut self, profile: KernelProfile) {
        let sms = self.sms;
        if let Some(e) = self.entry(profile.key) {
            e.declared = Some(KernelProfile {
                sm_need: profile.sm_need.clamp(1, sms),
                ..profile
            });
        }
    }

    /// A hint of the kernel's bound, for kernels whose duration is learned.
    pub fn hint(&mut self, key: KernelKey, bound: Bound) {
        if let Some(e) = self.entry(key) {
            e.hint = bound;
        }
    }

    /// A hint as arithmetic intensity: FLOPs and bytes per launch against the ridge point.
    pub fn hint_intensity(&mut self, key: KernelKey, flops: f64, bytes: f64, ridge: f64) {
        self.hint(key, Bound::from_intensity(flops, bytes, ridge));
    }

    /// A measured duration. `solo`: nothing else ran beside it. Once a solo sample exists,
    /// overlapped ones are ignored (they include other clients' interference).
    pub fn observe(&mut self, key: KernelKey, measured_ns: u64, solo: bool) {
        let alpha = self.alpha;
        let Some(e) = self.entry(key) else { return };
        e.observed = e.observed.saturating_add(1);
        let m = measured_ns as f64;
        if e.samples == 0 || (solo && !e.solo) {
            e.learned_ns = m;
            e.samples = 1;
            e.solo = solo;
        } else if solo || !e.solo {
            e.learned_ns += alpha * (m - e.learned_ns);
            e.samples += 1;
        }
    }

    /// About one in how many launches of `key` to time: often while its profile is young
    /// (not declared, fewer than [`YOUNG_OBSERVATIONS`] times seen, and room to learn it) or
    /// for a `high` client, then seldom.
    pub fn time_every(&self, key: KernelKey, high: bool) -> u32 {
        let young = match self.entries.get(&key) {
            Some(e) => e.declared.is_none() && e.observed < YOUNG_OBSERVATIONS,
            None => self.entries.len() < MAX_PROFILES,
        };
        match young || high {
            true => TIME_OFTEN_EVERY,
            false => TIME_SETTLED_EVERY,
        }
    }

    /// What is known of `key`: the declared profile, else the learned one, else `None`.
    pub fn get(&self, key: KernelKey) -> Option<KernelProfile> {
        let e = self.entries.get(&key)?;
        if let Some(p) = e.declared {
            return Some(p);
        }
        (e.samples > 0)
            .then(|| KernelProfile::new(key, e.learned_ns.round() as u64, e.hint, self.sms))
    }

    /// The profile of a built-in kernel: what its device measured of it (or the default
    /// estimate until then), with its prior bound; a spin takes the time it asks for.
    pub fn builtin(&mut self, kernel: &Kernel) -> KernelProfile {
        let key = builtin_key(kernel);
        if let Kernel::Spin { micros, .. } = *kernel {
            return KernelProfile::new(key, micros.saturating_mul(1_000), Bound::Compute, self.sms);
        }
        if !self
            .entries
            .get(&key)
            .is_some_and(|e| e.hint != Bound::Unknown)
        {
            self.hint(key, builtin_bound(kernel));
        }
        self.profile(key)
    }

    /// The profile to submit `key` with: known, or the default estimate with an unknown bound
    /// (or the hinted one).
    pub fn profile(&self, key: KernelKey) -> KernelProfile {
        self.get(key).unwrap_or_else(|| {
            let hint = self.entries.get(&key).map_or(Bound::Unknown, |e| e.hint);
            KernelProfile::new(key, self.default_est_ns, hint, self.sms)
        })
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An H100's FP32 ridge point (60 TFLOP/s over 3.35 TB/s).
    const RIDGE: f64 = 60e12 / 3.35e12;

    fn key(f: u64) -> KernelKey {
        KernelKey {
            function: f,
            blocks: 64,
        }
    }

    #[test]
    fn learns_an_ewma_and_declared_overrides() {
        let mut t = ProfileTable::new(132, 0.5, 10_000);
        assert_eq!(t.profile(key(1)).est_ns, 10_000);
        t.observe(key(1), 100, true);
        t.observe(key(1), 200, true);
        assert_eq!(t.get(key(1)).map(|p| p.est_ns), Some(150));
        assert_eq!(t.get(key(1)).map(|p| p.sm_need), Some(64));
        t.declare(KernelProfile::new(key(1), 7, Bound::Memory, 132));
        t.observe(key(1), 1_000, true);
        let p = t.profile(key(1));
        assert_eq!((p.est_ns, p.bound), (7, Bound::Memory));
    }

    #[test]
    fn solo_samples_replace_overlapped_ones() {
        let mut t = ProfileTable::new(132, 0.5, 0);
        t.observe(key(2), 900, false);
        assert_eq!(t.profile(key(2)).est_ns, 900);
        t.observe(key(2), 300, true);
        t.observe(key(2), 5_000, false); // slowed by a neighbour: ignored
        assert_eq!(t.profile(key(2)).est_ns, 300);
    }

    #[test]
    fn a_kernel_is_timed_often_while_young_then_seldom() {
        let mut t = ProfileTable::new(132, 0.5, 0);
        assert_eq!(t.time_every(key(4), false), TIME_OFTEN_EVERY);
        // A solo time locks the profile, and overlapped ones after it still count as seen.
        t.observe(key(4), 300, true);
        for _ in 1..YOUNG_OBSERVATIONS {
            assert_eq!(t.time_every(key(4), false), TIME_OFTEN_EVERY);
            t.observe(key(4), 5_000, false);
        }
        assert_eq!(t.time_every(key(4), false), TIME_SETTLED_EVERY);
        assert_eq!(t.time_every(key(4), true), TIME_OFTEN_EVERY);
        t.declare(KernelProfile::new(key(5), 7, Bound::Memory, 132));
        assert_eq!(t.time_every(key(5), false), TIME_SETTLED_EVERY);
    }

    #[test]
    fn a_kernel_that_cannot_be_learned_is_timed_seldom() {
        let mut t = ProfileTable::new(132, 0.5, 0);
        for f in 0..MAX_PROFILES as u64 {
            t.observe(key(1_000 + f), 1, true);
        }
        assert_eq!(t.time_every(key(1), false), TIME_SETTLED_EVERY);
    }

    #[test]
    fn classifies_by_intensity() {
        let ridge = RIDGE;
        assert_eq!(Bound::from_intensity(1e9, 1e6, ridge), Bound::Compute);
        assert_eq!(Bound::from_intensity(1e6, 1e9, ridge), Bound::Memory);
        assert_eq!(Bound::from_intensity(0.0, 0.0, ridge), Bound::Unknown);
        let mut t = ProfileTable::new(132, 0.5, 0);
        t.hint_intensity(key(3), 1e6, 1e9, ridge);
        t.observe(key(3), 50, true);
        assert_eq!(t.profile(key(3)).bound, Bound::Memory);
        assert!(Bound::Compute.collides(Bound::Compute));
        assert!(!Bound::Compute.collides(Bound::Memory));
        assert!(!Bound::Unknown.collides(Bound::Unknown));
    }

    #[test]
    fn builtin_kernels_start_from_a_neutral_prior_and_learn_what_the_device_measures() {
        let gemm = Kernel::GemmF32 {
            a: 0,
            b: 0,
            c: 0,
            m: 4096,
            n: 4096,
            k: 4096,
            alpha: 1.0,
            beta: 0.0,
        };
        let mut t = ProfileTable::new(132, 0.5, 10_000);
        let p = t.builtin(&gemm);
        assert_eq!(
            (p.est_ns, p.bound, p.sm_need),
            (10_000, Bound::Compute, 132)
        );
        t.observe(p.key, 2_500_000, true);
        assert_eq!(
            t.builtin(&gemm).est_ns,
            2_500_000,
            "what the device measured"
        );
        assert_eq!(t.builtin(&gemm).bound, Bound::Compute);
        let add = Kernel::VecAddF32 {
            a: 0,
            b: 0,
            c: 0,
            n: 1 << 20,
        };
        let p = t.builtin(&add);
        assert_eq!((p.bound, p.key.blocks), (Bound::Memory, 4096));
        // A small bf16 product sits below every GPU's ridge: memory-bound.
        let small = Kernel::GemmBf16 {
            a: 0,
            b: 0,
            c: 0,
            m: 64,
            n: 64,
            k: 64,
            alpha: 1.0,
            beta: 0.0,
        };
        assert_eq!(t.builtin(&small).bound, Bound::Memory);
        let spin = Kernel::Spin {
            micros: 10,
            blocks: 8,
        };
        let p = t.builtin(&spin);
        assert_eq!((p.est_ns, p.sm_need, p.bound), (10_000, 8, Bound::Compute));
        assert_ne!(builtin_function_id(&gemm), builtin_function_id(&add));
    }

    #[test]
    fn client_keys_do_not_collide() {
        let a = KernelKey::client_function(1, 1, 8);
        let b = KernelKey::client_function(2, 1, 8);
        assert_ne!(a, b);
        assert_eq!(a.function & BUILTIN_FUNCTION_BASE, 0);
    }

    #[test]
    fn the_table_is_bounded() {
        let mut t = ProfileTable::new(132, 0.5, 0);
        for f in 0..(MAX_PROFILES as u64 + 10) {
            t.observe(key(f), 1, true);
        }
        assert_eq!(t.len(), MAX_PROFILES);
    }
}

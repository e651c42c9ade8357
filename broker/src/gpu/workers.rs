//! How gpushared starts its device workers: one per GPU served (CUDA, or a sim GPU), each
//! with a spare beside it, and one per trust domain on a GPU when its first client comes.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;

use super::DomainMaker;
use super::restart::Handover;
use crate::cli::{Args, Gpus};
use crate::device::Device;
use crate::device::remote::{Remote, WorkerBackend, WorkerSpec};

/// How gpushared starts its device workers (one per GPU, each with a spare).
#[derive(Clone)]
pub struct Workers {
    gpu: Gpus,
    sim_gpus: u32,
    sim_memory: u64,
    sim_realtime: bool,
    fault_injection: bool,
    spare: bool,
    /// The spare maps clients' memory as it is made (else when it takes over).
    map_ahead: bool,
    log: String,
    /// Where an earlier image of gpushared had each GPU's clients' memory.
    handover: Vec<Option<Handover>>,
}

impl Workers {
    pub fn from_args(args: &Args) -> Workers {
        Workers {
            gpu: args.gpu,
            sim_gpus: args.sim_gpus,
            sim_memory: args.sim_memory.as_u64(),
            sim_realtime: args.sim_realtime,
            fault_injection: args.allow_fault_injection,
            spare: !args.no_spare_worker,
            map_ahead: !args.spare_maps_at_takeover,
            log: args.log.clone(),
            handover: Handover::inherited(),
        }
    }

    /// GPU `index`'s spec, where its clients' memory was before a restart.
    fn gpu_spec(&self, index: usize, backend: WorkerBackend, label: String) -> WorkerSpec {
        let mut spec = self.spec(backend, label);
        spec.space = self.handed(index).map(|h| h.space);
        spec
    }

    fn handed(&self, index: usize) -> Option<Handover> {
        self.handover.get(index).copied().flatten()
    }

    fn spec(&self, backend: WorkerBackend, label: String) -> WorkerSpec {
        WorkerSpec {
            backend,
            fault_injection: self.fault_injection,
            log: self.log.clone(),
            label,
            builtins: None,
            space: None,
            prefer_base: None,
        }
    }

    /// Starts every worker at once and waits for all (each opens its device in parallel).
    fn open(&self, specs: Vec<WorkerSpec>) -> anyhow::Result<Vec<Arc<Device>>> {
        let exe = PathBuf::from("/proc/self/exe");
        std::thread::scope(|scope| {
            let starting: Vec<_> = specs
                .into_iter()
                .map(|spec| {
                    let (exe, spare, ahead) = (exe.clone(), self.spare, self.map_ahead);
                    // Fresh memory goes above what the image before handed out.
                    let floor = self
                        .handover
                        .iter()
                        .flatten()
                        .find(|h| Some(h.space) == spec.space)
                        .map_or(0, |h| h.floor);
                    scope.spawn(move || {
                        let label = spec.label.clone();
                        Remote::open(exe, spec, spare, ahead)
                            .map(|r| Device::remote(r, floor))
                            .with_context(|| format!("cannot open {label}"))
                    })
                })
                .collect();
            starting
                .into_iter()
                .map(|h| {
                    h.join()
                        .map_err(|_| anyhow::anyhow!("a device worker's starter panicked"))?
                        .map(Arc::new)
                })
                .collect()
        })
    }

    /// One worker per GPU of `specs`. Each GPU's clients' memory gets addresses no other GPU's
    /// has, as under CUDA's unified addressing: a program using two GPUs, or memory shared
    /// from another GPU, must not find one address on both. Workers started alike would
    /// reserve the same range, so the first GPU's worker starts alone and the others ask for
    /// ranges beside its own, one after another ([`preferred_base`]; a restart reuses the
    /// ranges it was handed).
    fn open_gpus(&self, mut specs: Vec<WorkerSpec>) -> anyhow::Result<Vec<Arc<Device>>> {
        if specs.len() < 2 || specs.iter().any(|s| s.space.is_some()) {
            return self.open(specs);
        }
        let rest = specs.split_off(1);
        let mut devices = self.open(specs)?;
        let first = devices
            .first()
            .map(|d| d.space())
            .ok_or_else(|| anyhow::anyhow!("no device worker"))?;
        let rest = rest
            .into_iter()
            .enumerate()
            .map(|(k, spec)| WorkerSpec {
                prefer_base: preferred_base(first.base, first.size, k as u64 + 1),
                ..spec
            })
            .collect();
        devices.extend(self.open(rest)?);
        warn_of_shared_addresses(&devices);
        Ok(devices)
    }

    /// A worker per GPU served (CUDA); this process initialises the driver but holds no
    /// context.
    pub fn gpus(&self) -> anyhow::Result<Vec<Arc<Device>>> {
        let count = crate::device::cuda::device_count()?;
        let ordinals: Vec<i32> = match self.gpu {
            Gpus::All => (0..count).collect(),
            Gpus::One(n) if n < count => vec![n],
            Gpus::One(n) => {
                return Err(crate::device::cuda::ProbeError::NoSuchGpu { asked: n, count }.into());
            }
        };
        self.open_gpus(
            ordinals
                .into_iter()
                .enumerate()
                .map(|(i, ordinal)| {
                    let label = format!("GPU {ordinal}");
                    self.gpu_spec(i, WorkerBackend::Cuda { ordinal }, label)
                })
                .collect(),
        )
    }

    /// Makes a trust domain's device on a GPU: a worker of its own, like the GPU's first.
    pub fn domain_maker(&self, cuda: bool, first: &[Arc<Device>]) -> DomainMaker {
        let workers = self.clone();
        let ordinals: Vec<u32> = first.iter().map(|d| d.info().index).collect();
        Box::new(move |gpu, domain| {
            let index = ordinals.get(gpu as usize).copied().unwrap_or(gpu);
            let backend = if cuda {
                WorkerBackend::Cuda {
                    ordinal: index as i32,
                }
            } else {
                WorkerBackend::Sim {
                    index,
                    memory: workers.sim_memory,
                    realtime: workers.sim_realtime,
                }
            };
            let label = format!("GPU {index}, trust domain {domain}");
            workers
                .open(vec![workers.spec(backend, label)])
                .map_err(|e| format!("{e:#}"))?
                .pop()
                .ok_or_else(|| "no device worker".to_string())
        })
    }

    /// A worker per sim GPU.
    pub fn sims(&self) -> anyhow::Result<Vec<Arc<Device>>> {
        self.open_gpus(
            (0..self.sim_gpus)
                .map(|index| {
                    let backend = WorkerBackend::Sim {
                        index,
                        memory: self.sim_memory,
                        realtime: self.sim_realtime,
                    };
                    self.gpu_spec(index as usize, backend, format!("GPU {index} (sim)"))
                })
                .collect(),
        )
    }
}

/// Where a GPU's range of client addresses may start (1 GiB: above what any driver aligns to).
const RANGE_ALIGN: u64 = 1 << 30;
/// No range asked for below 1 TiB: a program's heap and executable live down there.
const LOWEST_RANGE: u64 = 1 << 40;
/// No range asked for past where a worker's zone begins (64 TiB); above it lie gpushared's
/// tests' mappings and, without address randomisation, the programs.
const HIGHEST_RANGE_END: u64 = crate::device::remote::worker::ZONE_START;

/// Where the `k`-th GPU after the first (1, 2, …) asks for its range, when the first GPU's
/// worker reserved `size` bytes at `base`: below the first's while there is room above 1 TiB
/// (a worker's own reservations grow up from where its range was put), then above it, under
/// the workers' zone; `None` (the driver's choice) when neither has room. The CUDA driver puts
/// the first range at 1 TiB (H200, driver 580), so there every other GPU's goes above.
fn preferred_base(base: u64, size: u64, k: u64) -> Option<u64> {
    let stride = size.next_multiple_of(RANGE_ALIGN);
    if stride == 0 || k == 0 {
        return None;
    }
    let below = base / RANGE_ALIGN * RANGE_ALIGN;
    let room_below = below.saturating_sub(LOWEST_RANGE) / stride;
    let at = if k <= room_below {
        below - stride * k
    } else {
        let above = base
            .checked_add(size)?
            .checked_next_multiple_of(RANGE_ALIGN)?;
        above.checked_add(stride.checked_mul(k - room_below - 1)?)?
    };
    (at >= LOWEST_RANGE && at.checked_add(stride)? <= HIGHEST_RANGE_END).then_some(at)
}

/// Whether two address ranges, (start, length) each, share an address.
fn overlap(a: (u64, u64), b: (u64, u64)) -> bool {
    a.0 < b.0 + b.1 && b.0 < a.0 + a.1
}

/// Says so where two GPUs' client address ranges overlap (a GPU's driver would not reserve
/// the range asked for): programs then cannot use both GPUs, or share memory between them.
fn warn_of_shared_addresses(devices: &[Arc<Device>]) {
    for (i, a) in devices.iter().enumerate() {
        for b in &devices[i + 1..] {
            let (x, y) = (a.space(), b.space());
            if overlap((x.base, x.size), (y.base, y.size)) {
                tracing::warn!(
                    first = a.info().index,
                    second = b.info().index,
                    "two GPUs' clients' memory lies at the same device addresses: a program cannot use both, nor share memory between them"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ranges of GPUs 0..n when the first is `size` bytes at `base`.
    fn ranges(base: u64, size: u64, n: u64) -> Vec<(u64, u64)> {
        let mut all = vec![(base, size)];
        for k in 1..n {
            let at = preferred_base(base, size, k).expect("room for every GPU");
            all.push((at, size));
        }
        all
    }

    fn disjoint(all: &[(u64, u64)]) -> bool {
        all.iter()
            .enumerate()
            .all(|(i, &a)| all[i + 1..].iter().all(|&b| !overlap(a, b)))
    }

    #[test]
    fn every_gpu_s_range_lies_clear_of_the_others_where_the_driver_put_the_first_at_1_tib() {
        // What the H200's driver gave the first worker: 1 TiB, for 139.8 GiB of memory.
        let size = crate::device::Space::size_for(150_119_792_640);
        let all = ranges(1 << 40, size, 4);
        assert!(disjoint(&all), "{all:x?}");
        assert!(all[1..].iter().all(|&(at, len)| at >= 1 << 40
            && at % RANGE_ALIGN == 0
            && at + len <= HIGHEST_RANGE_END));
    }

    #[test]
    fn ranges_go_below_the_first_while_there_is_room_then_above() {
        let size = 4 << 40;
        let all = ranges(20 << 40, size, 7);
        assert!(disjoint(&all), "{all:x?}");
        assert_eq!(all[1].0, 16 << 40, "the room below is used first");
        assert_eq!(all[4].0, 4 << 40, "down to 1 TiB");
        assert_eq!(all[5].0, 24 << 40, "then above");
        assert!(all.iter().all(|&(at, _)| at >= LOWEST_RANGE));
    }

    #[test]
    fn no_address_is_asked_for_when_neither_side_has_room() {
        assert_eq!(preferred_base(1 << 40, 40 << 40, 1), None);
        assert_eq!(preferred_base(1 << 40, 8 << 40, 0), None);
        assert_eq!(preferred_base(u64::MAX - 10, 8 << 40, 1), None);
    }
}

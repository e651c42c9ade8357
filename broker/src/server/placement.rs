//! Where a client that names no GPU runs: the GPU with the least measured load.
//!
//! A GPU's load is the device time its clients' work took per second lately (what
//! `gpu_time_ns` counts: kernels and copies), then the device memory they hold, then how many
//! they are. Busy figures within `BUSY_STEP` of each other count as equal, so that noise does
//! not outweigh memory. "Lately" needs no timer: each look (a placement, a status request)
//! keeps a sample of every client's GPU time, and the next look measures against the newest
//! sample at least `MIN_WINDOW` old; a client that sample does not hold (or with none at all)
//! counts at its average since it connected.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use gpushare_protocol::stats::{ClientStats, GpuLoad};

/// A window shorter than this says more about one kernel than about the load.
const MIN_WINDOW: Duration = Duration::from_millis(200);
/// Samples older than this are dropped: the load they measure is old news.
const MAX_AGE: Duration = Duration::from_secs(10);
/// Most samples kept (looks closer together than `MIN_WINDOW` replace the newest).
const KEPT: usize = 16;

struct Sample {
    at: Instant,
    /// Each client's GPU time then, by client id.
    gpu_time: HashMap<u64, u64>,
}

#[derive(Default)]
pub(super) struct LoadHistory {
    samples: Mutex<VecDeque<Sample>>,
}

impl LoadHistory {
    /// Each of `gpus` GPUs' load now, from the clients' figures; keeps them as a sample.
    pub(super) fn loads(&self, clients: &[ClientStats], gpus: usize, now: Instant) -> Vec<GpuLoad> {
        let mut samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        samples.retain(|s| now.saturating_duration_since(s.at) <= MAX_AGE);
        let reference = samples
            .iter()
            .rev()
            .find(|s| now.saturating_duration_since(s.at) >= MIN_WINDOW);
        let mut loads: Vec<GpuLoad> = (0..gpus)
            .map(|g| GpuLoad {
                gpu: g as u32,
                ..GpuLoad::default()
            })
            .collect();
        for c in clients {
            let Some(load) = loads.get_mut(c.gpu as usize) else {
                continue;
            };
            load.memory_used = load.memory_used.saturating_add(c.memory_used);
            load.clients += 1;
            load.busy += rate(c, reference, now);
        }
        let sample = Sample {
            at: now,
            gpu_time: clients
                .iter()
                .map(|c| (c.client_id, c.gpu_time_ns))
                .collect(),
        };
        // Looks in quick succession: the newest stands for them all.
        if samples
            .back()
            .is_some_and(|s| now.saturating_duration_since(s.at) < MIN_WINDOW)
        {
            samples.pop_back();
        }
        samples.push_back(sample);
        while samples.len() > KEPT {
            samples.pop_front();
        }
        loads
    }
}

/// A client's device time per second: since `reference` where that holds it, else since it
/// connected.
fn rate(c: &ClientStats, reference: Option<&Sample>, now: Instant) -> f64 {
    if let Some(r) = reference
        && let Some(&then) = r.gpu_time.get(&c.client_id)
    {
        let window = now
            .saturating_duration_since(r.at)
            .max(MIN_WINDOW)
            .as_secs_f64();
        return c.gpu_time_ns.saturating_sub(then) as f64 / 1e9 / window;
    }
    if c.connected_ms == 0 {
        return 0.0;
    }
    c.gpu_time_ns as f64 / 1e6 / c.connected_ms as f64
}

/// The index of the least loaded GPU (the first of equals); 0 with none.
pub(super) fn least_loaded(loads: &[GpuLoad]) -> usize {
    gpushare_protocol::stats::by_load(loads)
        .first()
        .copied()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(id: u64, gpu: u32, memory: u64, gpu_time_ns: u64, connected_ms: u64) -> ClientStats {
        ClientStats {
            client_id: id,
            gpu,
            memory_used: memory,
            gpu_time_ns,
            connected_ms,
            ..crate::metrics::testing::client(id, 1, "c")
        }
    }

    #[test]
    fn busy_comes_first_then_memory_then_clients() {
        let loads = |busy: [f64; 2], memory: [u64; 2], clients: [u32; 2]| {
            (0..2)
                .map(|g| GpuLoad {
                    gpu: g as u32,
                    busy: busy[g],
                    memory_used: memory[g],
                    clients: clients[g],
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(
            least_loaded(&loads([0.0; 2], [0; 2], [0; 2])),
            0,
            "equals: the first"
        );
        assert_eq!(least_loaded(&loads([0.9, 0.1], [0, 1 << 30], [1, 3])), 1);
        assert_eq!(
            least_loaded(&loads([0.51, 0.49], [1 << 30, 0], [1, 1])),
            1,
            "busy within a step: memory decides"
        );
        assert_eq!(least_loaded(&loads([0.2, 0.2], [5, 5], [2, 1])), 1);
        assert_eq!(least_loaded(&[]), 0);
    }

    #[test]
    fn a_client_counts_at_its_average_until_a_sample_measures_it_lately() {
        let history = LoadHistory::default();
        let t0 = Instant::now();
        // 2 s connected, 1 s of GPU time: half busy on average.
        let first = [
            client(1, 1, 0, 1_000_000_000, 2_000),
            client(2, 0, 0, 0, 2_000),
        ];
        let loads = history.loads(&first, 2, t0);
        assert!((loads[1].busy - 0.5).abs() < 1e-9, "{loads:?}");
        assert_eq!(loads[0].busy, 0.0);
        assert_eq!((loads[0].clients, loads[1].clients), (1, 1));
        // Client 1 has done nothing since, client 2 kept the GPU busy: the window shows it.
        let later = t0 + Duration::from_secs(1);
        let second = [
            client(1, 1, 0, 1_000_000_000, 3_000),
            client(2, 0, 0, 900_000_000, 3_000),
        ];
        let loads = history.loads(&second, 2, later);
        assert!(loads[1].busy < 0.05, "{loads:?}");
        assert!(loads[0].busy > 0.5, "{loads:?}");
        assert_eq!(least_loaded(&loads), 1);
    }

    #[test]
    fn clients_of_a_gpu_that_is_not_there_are_left_out() {
        let history = LoadHistory::default();
        let loads = history.loads(&[client(1, 7, 10, 0, 1)], 2, Instant::now());
        assert_eq!(loads.len(), 2);
        assert!(loads.iter().all(|l| l.clients == 0 && l.memory_used == 0));
    }
}

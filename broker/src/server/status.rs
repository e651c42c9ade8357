//! What the broker reports: its latest eBPF sample of the processes that use the GPU (and the
//! outside load derived from it), joined with its own clients into the status report.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpushare_protocol::PROTOCOL_VERSION;
use gpushare_protocol::stats::{
    ClientStats, FreeRunning, OutsideLoad, ProcessActivity, ProcessKind, StatusReport,
};

use super::Broker;

/// How often telemetry maps are read (this also sweeps exited processes from them).
const TELEMETRY_SAMPLE: Duration = Duration::from_secs(1);

/// The last telemetry sample.
#[derive(Default)]
pub(super) struct Observed {
    processes: Vec<ProcessActivity>,
    load: OutsideLoad,
    /// Per pid: (ioctls, launches) at the previous sample, and when it was taken.
    previous: HashMap<i32, (u64, u64)>,
    at: Option<Instant>,
}

impl Observed {
    /// Keeps `processes`, sampled at `now`; the outside-load rates are what their counters grew
    /// by since the previous sample (a process seen for the first time adds nothing yet).
    fn record(&mut self, processes: Vec<ProcessActivity>, now: Instant) {
        let secs = self
            .at
            .map(|t| now.duration_since(t).as_secs_f64())
            .unwrap_or(0.0);
        let (mut ioctls, mut launches) = (0u64, 0u64);
        let mut previous = HashMap::new();
        for p in &processes {
            let now_counts = (p.total_ioctls(), p.launches);
            if let Some(&(i, l)) = self.previous.get(&p.pid) {
                ioctls += now_counts.0.saturating_sub(i);
                launches += now_counts.1.saturating_sub(l);
            }
            previous.insert(p.pid, now_counts);
        }
        self.load = OutsideLoad {
            processes: processes.len() as u32,
            ioctls_per_s: if secs > 0.0 {
                ioctls as f64 / secs
            } else {
                0.0
            },
            launches_per_s: if secs > 0.0 {
                launches as f64 / secs
            } else {
                0.0
            },
        };
        self.previous = previous;
        self.processes = processes;
        self.at = Some(now);
    }
}

/// Marks each process eBPF sees that is also a client: it bypasses the broker, unless it is
/// governed (it uses the GPU directly by design, with the broker's admission).
fn join_clients(clients: &mut [ClientStats], processes: &mut [ProcessActivity]) {
    for p in processes {
        if let Some(c) = clients.iter_mut().find(|c| c.pid == p.pid) {
            if c.governed {
                p.kind = ProcessKind::Governed;
            } else {
                c.bypassing = true;
                p.kind = ProcessKind::Both;
            }
            p.client_id = Some(c.client_id);
        }
    }
}

impl Broker {
    /// Samples telemetry every second until the broker stops: caches the processes for
    /// status and derives the outside-load rates the scheduler uses.
    pub async fn watch_telemetry(self: Arc<Self>) {
        let me = std::process::id() as i32;
        let mut tick = tokio::time::interval(TELEMETRY_SAMPLE);
        loop {
            tick.tick().await;
            // (Until telemetry has started, or for good if it is off.)
            let Some(t) = self.telemetry.get().cloned() else {
                continue;
            };
            let Ok(mut processes) = tokio::task::spawn_blocking(move || {
                let _ = t.take_exited();
                t.snapshot()
            })
            .await
            else {
                continue;
            };
            // The broker's own processes show up too (its device workers hold its GPU
            // contexts); they are not outside load.
            processes.retain(|p| p.pid != me && super::usage::parent_of(p.pid) != Some(me));
            let now = Instant::now();
            self.observed
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .record(processes, now);
        }
    }

    /// GPU activity outside the broker (the scheduler's outside-load signal).
    pub fn outside_load(&self) -> OutsideLoad {
        self.observed.lock().map(|o| o.load).unwrap_or_default()
    }

    pub fn status(&self) -> StatusReport {
        let mut clients = self.registry.snapshot();
        let (mut processes, outside_load) = match self.observed.lock() {
            Ok(o) => (o.processes.clone(), o.load),
            Err(_) => (Vec::new(), OutsideLoad::default()),
        };
        join_clients(&mut clients, &mut processes);
        let gpu_loads = self.gpu_loads(&clients);
        StatusReport {
            next_gpu: super::placement::least_loaded(&gpu_loads) as u32,
            gpu_loads,
            peers: self.peers().to_vec(),
            free_running: self
                .gpus
                .iter()
                .enumerate()
                .filter_map(|(gpu, g)| {
                    let (now, total_ns) = g.scheduler.free_running()?;
                    Some(FreeRunning {
                        gpu: gpu as u32,
                        now,
                        total_ns,
                    })
                })
                .collect(),
            broker_version: env!("CARGO_PKG_VERSION").into(),
            protocol_version: PROTOCOL_VERSION,
            backend: self.gpus[0].device().backend().into(),
            device: self.gpus[0].device().info().clone(),
            devices: self
                .gpus
                .iter()
                .map(|g| g.device().info().clone())
                .collect(),
            uptime_ms: self.started.elapsed().as_millis() as u64,
            policy: self.gpus[0].scheduler.policy_name().into(),
            memory_used: clients.iter().map(|c| c.memory_used).sum(),
            jobs: self.job_stats(&clients),
            clients,
            telemetry: self
                .telemetry_status
                .lock()
                .map(|s| s.clone())
                .unwrap_or_else(|e| e.into_inner().clone()),
            processes,
            outside_load,
            users: self.accounts.snapshot(),
            usage: super::usage::broker_usage(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use gpushare_protocol::stats::IoctlStats;

    use super::*;
    use crate::server::testing::{register, sim_broker};

    fn process(pid: i32, ioctls: u64, launches: u64) -> ProcessActivity {
        ProcessActivity {
            pid,
            comm: format!("proc{pid}"),
            uid: 1000,
            first_seen_ns: 0,
            last_seen_ns: 0,
            ioctls: vec![IoctlStats {
                cmd: 0x2a,
                name: "RM_CONTROL".into(),
                count: ioctls,
                errors: 0,
                total_ns: 0,
                arg_bytes: 0,
            }],
            launches,
            allocs: 0,
            frees: 0,
            ctx_creates: 0,
            gpu_fds: 1,
            kind: ProcessKind::Observed,
            client_id: None,
        }
    }

    #[test]
    fn outside_load_is_the_growth_since_the_previous_sample() {
        let mut obs = Observed::default();
        let t0 = Instant::now();
        obs.record(vec![process(10, 100, 50)], t0);
        assert_eq!(obs.load.processes, 1);
        assert_eq!(obs.load.ioctls_per_s, 0.0, "no rate from a first sample");
        assert_eq!(obs.load.launches_per_s, 0.0);

        // Two seconds later pid 10 made 40 more ioctls and 10 more launches; pid 11 is new
        // and adds nothing until it has a baseline.
        obs.record(
            vec![process(10, 140, 60), process(11, 1_000, 1_000)],
            t0 + Duration::from_secs(2),
        );
        assert_eq!(obs.load.processes, 2);
        assert_eq!(obs.load.ioctls_per_s, 20.0);
        assert_eq!(obs.load.launches_per_s, 5.0);
    }

    #[test]
    fn a_counter_that_went_back_counts_as_no_growth() {
        // The pid was reused by a new process, whose counters start again.
        let mut obs = Observed::default();
        let t0 = Instant::now();
        obs.record(vec![process(10, 500, 500)], t0);
        obs.record(vec![process(10, 3, 1)], t0 + Duration::from_secs(1));
        assert_eq!(obs.load.ioctls_per_s, 0.0);
        assert_eq!(obs.load.launches_per_s, 0.0);
        // And the new counters are the baseline from now on.
        obs.record(vec![process(10, 13, 2)], t0 + Duration::from_secs(2));
        assert_eq!(obs.load.ioctls_per_s, 10.0);
        assert_eq!(obs.load.launches_per_s, 1.0);
    }

    #[test]
    fn status_joins_clients_with_the_processes_ebpf_sees() {
        let broker = sim_broker(2);
        let brokered = register(&broker, 100, 0, false);
        let governed = register(&broker, 200, 1, true);
        brokered
            .counters
            .memory_used
            .store(1 << 20, Ordering::Relaxed);
        governed
            .counters
            .memory_used
            .store(2 << 20, Ordering::Relaxed);
        broker.observed.lock().expect("not poisoned").record(
            vec![process(100, 1, 0), process(200, 1, 0), process(300, 1, 0)],
            Instant::now(),
        );

        let report = broker.status();
        assert_eq!(report.protocol_version, PROTOCOL_VERSION);
        assert_eq!(report.backend, "sim");
        assert_eq!(report.devices.len(), 2);
        assert_eq!(report.memory_used, 3 << 20);
        let client = |id| {
            report
                .clients
                .iter()
                .find(|c| c.client_id == id)
                .expect("listed")
        };
        assert!(
            client(brokered.id).bypassing,
            "a client that also uses the GPU directly bypasses"
        );
        assert!(
            !client(governed.id).bypassing,
            "a governed client uses it directly by design"
        );
        let seen = |pid| {
            report
                .processes
                .iter()
                .find(|p| p.pid == pid)
                .expect("listed")
        };
        assert_eq!(seen(100).kind, ProcessKind::Both);
        assert_eq!(seen(100).client_id, Some(brokered.id));
        assert_eq!(seen(200).kind, ProcessKind::Governed);
        assert_eq!(seen(200).client_id, Some(governed.id));
        assert_eq!(seen(300).kind, ProcessKind::Observed);
        assert_eq!(seen(300).client_id, None);
        assert_eq!(report.outside_load.processes, 3);
    }
}

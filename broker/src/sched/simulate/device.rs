//! The model's GPU: how fast each client's running kernel goes beside the others (SMs shared
//! when they are oversubscribed, memory bandwidth among memory-bound kernels, load from
//! outside), and its progress over time.

use super::{Bound, Exec, Simulation};

impl Simulation {
    /// Speed of each client's running kernel (0 where none runs).
    pub(super) fn speeds(&self) -> Vec<f64> {
        let sms = f64::from(self.cfg.sms.max(1));
        let eff = |e: &Exec| {
            let need = e.profile.sm_need.max(1);
            f64::from(e.sm_limit.map_or(need, |l| need.min(l.max(1))))
        };
        let mut total = 0.0;
        let mut mem = 0.0;
        for e in self.clients.iter().filter_map(|c| c.exec.as_ref()) {
            let s = eff(e);
            total += s;
            if e.profile.bound == Bound::Memory {
                mem += (2.0 * s / sms).min(1.0);
            }
        }
        let free = sms * (1.0 - self.outside);
        let sm_factor = if total > free { free / total } else { 1.0 };
        let mem_factor = if mem > 1.0 { 1.0 / mem } else { 1.0 };
        self.clients
            .iter()
            .map(|c| match &c.exec {
                Some(e) => {
                    let waves = eff(e) / f64::from(e.profile.sm_need.max(1));
                    let m = if e.profile.bound == Bound::Memory {
                        mem_factor
                    } else {
                        1.0
                    };
                    waves * sm_factor * m
                }
                None => 0.0,
            })
            .collect()
    }

    pub(super) fn progress(&mut self, dt: u64, speeds: &[f64]) {
        if dt == 0 {
            return;
        }
        for (c, &s) in self.clients.iter_mut().zip(speeds) {
            if let Some(e) = c.exec.as_mut() {
                e.left -= s * dt as f64;
            }
        }
    }
}

//! The sim device made, its state and fault flags locked, and one command run in modelled
//! time (the [`super::Backend`] methods in `mod.rs` go through these).

use std::sync::Mutex;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use gpushare_protocol::control::DeviceInfo;

use super::memory::SimMemory;
use super::{SimDevice, SimOptions, SimState, SimStream, attributes};
use crate::device::{DeviceError, DeviceResult};

/// A stable UUID per sim device ("gpushare-sim" and the index).
fn sim_uuid(index: u32) -> [u8; 16] {
    let mut u = *b"gpushare-sim\0\0\0\0";
    u[12..].copy_from_slice(&index.to_le_bytes());
    u
}

impl SimDevice {
    pub fn new(options: SimOptions) -> SimDevice {
        let c = options.cost;
        SimDevice {
            info: DeviceInfo {
                index: options.index,
                name: "gpushare sim (H100-like cost model)".into(),
                total_memory: options.memory,
                sm_count: c.sm_count,
                compute_capability: (9, 0),
                fp32_flops: c.fp32_flops,
                memory_bandwidth: c.memory_bw,
                host_bandwidth: c.host_bw,
                uuid: sim_uuid(options.index),
                pci: (0, options.index + 1, 6),
                driver_version: 13000,
                attributes: attributes::for_sim(c.sm_count, options.index),
            },
            options,
            state: Mutex::new(SimState {
                memory: SimMemory::new(options.memory),
                busy_until_ns: 0,
                epoch: 0,
            }),
            poisoned: Mutex::new(None),
            unseen: Mutex::new(None),
            interrupted: AtomicBool::new(false),
            origin: Instant::now(),
            marks: std::sync::Arc::default(),
        }
    }

    pub(super) fn state(&self) -> std::sync::MutexGuard<'_, SimState> {
        // A panic while holding the lock cannot leave the memory map half-updated in a way
        // that matters more than refusing all further work would; keep serving.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Runs `body` as one stream-ordered command costing `cost_ns` of modelled time.
    /// Work accepted after an unseen fault does nothing (`T::default()`).
    pub(super) fn run_on<T: Default>(
        &self,
        stream: &mut SimStream,
        cost_ns: u64,
        body: impl FnOnce(&mut SimMemory) -> DeviceResult<T>,
    ) -> DeviceResult<T> {
        let mut st = self.state();
        self.check_healthy()?;
        if self.unseen().is_some() {
            return Ok(T::default());
        }
        let out = body(&mut st.memory)?;
        let start = stream.ready_ns.max(st.busy_until_ns).max(self.now_ns());
        let end = start.saturating_add(cost_ns);
        st.busy_until_ns = end;
        stream.ready_ns = end;
        if self.reached(end) {
            stream.busy_ns = stream.busy_ns.saturating_add(cost_ns);
        } else {
            stream.running.push_back((end, cost_ns));
        }
        Ok(out)
    }

    /// An error once a fault has been reported (the device is poisoned until it is reset).
    pub(super) fn check_healthy(&self) -> DeviceResult<()> {
        match &*self.poisoned() {
            Some(why) => Err(DeviceError::Fault(why.clone())),
            None => Ok(()),
        }
    }

    pub(super) fn poisoned(&self) -> std::sync::MutexGuard<'_, Option<String>> {
        self.poisoned.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn unseen(&self) -> std::sync::MutexGuard<'_, Option<String>> {
        self.unseen.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A synchronization: an unseen fault is reported from here on.
    pub(super) fn see_faults(&self) -> DeviceResult<()> {
        if let Some(why) = self.unseen().take() {
            *self.poisoned() = Some(why);
        }
        self.check_healthy()
    }

    /// Bytes of device memory in use.
    pub fn memory_used(&self) -> u64 {
        self.state().memory.used()
    }
}

//! Trust domains: who shares a GPU context. Kernels in one context can read and write each
//! other's memory, so the policy file puts users and groups into domains (`trust_domain`),
//! and each domain gets a device of its own on each GPU (a device worker, so a context of its
//! own: the hardware keeps domains' memory apart, and a fault in one leaves the others'
//! contexts alone). The default domain's devices are the broker's own; another domain's are
//! made when its first client comes. One scheduler per GPU still spans every domain.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use super::Broker;
use crate::device::Device;
use crate::fault::DeviceHealth;
use crate::policy::TrustDomain;

/// Makes the device of a trust domain on a GPU (index).
pub type DomainMaker =
    Box<dyn Fn(u32, &TrustDomain) -> Result<Arc<Device>, String> + Send + Sync + 'static>;

/// One domain's device on one GPU, and its fault containment.
pub(super) struct DomainDevice {
    pub(super) device: Arc<Device>,
    pub(super) health: Arc<DeviceHealth>,
}

impl Clone for DomainDevice {
    fn clone(&self) -> Self {
        DomainDevice {
            device: self.device.clone(),
            health: self.health.clone(),
        }
    }
}

/// The domains other than the default, per GPU, and how to make one.
pub(super) struct Domains {
    maker: OnceLock<DomainMaker>,
    by_gpu: Vec<Mutex<HashMap<TrustDomain, DomainDevice>>>,
    /// Set when the broker stops: the guardians of domains' devices end with it.
    pub(super) guardians_stop: Arc<AtomicBool>,
}

impl Domains {
    pub(super) fn new(gpus: usize) -> Domains {
        Domains {
            maker: OnceLock::new(),
            by_gpu: (0..gpus).map(|_| Mutex::default()).collect(),
            guardians_stop: Arc::new(AtomicBool::new(false)),
        }
    }
}

impl Broker {
    /// Lets clients of trust domains other than the default have devices of their own (made
    /// by `maker`). Without it, such clients are refused: the devices are in gpushared's own
    /// process, where a second context would neither keep memory apart nor survive another
    /// domain's fault.
    pub fn set_domain_maker(&self, maker: DomainMaker) {
        let _ = self.domains.maker.set(maker);
    }

    /// The device serving `domain` on `gpu`, made on first use (which can take a while: a
    /// worker opens the GPU). Blocking.
    pub(super) fn domain_device(
        &self,
        gpu: usize,
        domain: &TrustDomain,
    ) -> Result<DomainDevice, String> {
        if *domain == TrustDomain::default() {
            return Ok(DomainDevice {
                device: self.devices[gpu].clone(),
                health: self.health[gpu].clone(),
            });
        }
        let slot = self
            .domains
            .by_gpu
            .get(gpu)
            .ok_or_else(|| format!("no GPU {gpu}"))?;
        let mut made = slot.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(d) = made.get(domain) {
            return Ok(d.clone());
        }
        let maker = self.domains.maker.get().ok_or_else(|| {
            format!(
                "your trust domain `{domain}` needs a GPU context of its own, which gpushared can only give in a device worker; it runs with --in-process-device, so only the default domain is served"
            )
        })?;
        let device = maker(gpu as u32, domain)
            .map_err(|e| format!("cannot open GPU {gpu} for trust domain `{domain}`: {e}"))?;
        let health = DeviceHealth::new(self.config.faults, self.stuck.clone());
        {
            let (health, device, stop) = (
                health.clone(),
                device.clone(),
                self.domains.guardians_stop.clone(),
            );
            let name = format!("gpushare-guard-{gpu}-{domain}");
            if let Err(e) = std::thread::Builder::new()
                .name(name)
                .spawn(move || health.guard(device, gpu as u32, stop))
            {
                tracing::warn!(gpu, %domain, error = %e, "cannot start the fault guardian; GPU faults of this domain will not be contained");
            }
        }
        tracing::info!(gpu, %domain, "trust domain: a GPU context of its own");
        let made_now = DomainDevice { device, health };
        made.insert(domain.clone(), made_now.clone());
        Ok(made_now)
    }

    /// Stops the guardians of the domains' devices (the broker is stopping).
    pub(super) fn stop_domain_guardians(&self) {
        self.domains.guardians_stop.store(true, Ordering::Release);
    }
}

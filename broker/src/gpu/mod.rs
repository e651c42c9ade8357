//! One GPU's home: its scheduler, and the GPU contexts that serve it — the default trust
//! domain's, and each other domain's, made when its first client comes — each a [`Device`]
//! (a device worker with its spare behind it) watched by a guardian that contains its faults.
//!
//! Trust domains: kernels in one context can read and write each other's memory, so the policy
//! file puts users and groups into domains (`trust_domain`), and each domain gets a context of
//! its own on each GPU (the hardware keeps domains' memory apart, and a fault in one leaves the
//! others alone). One scheduler per GPU still spans every domain.
//!
//! - `scheduler`: the GPU's scheduler as sessions meet it (kernels wait for their turn);
//! - `health`: a context's health, shared by its sessions and its guardian;
//! - `guardian`: the guardian thread: faults, hangs, resets, culprits, probation;
//! - `restart`: what happens when a GPU cannot be recovered in place;
//! - `workers`: how gpushared starts the device workers of each GPU and domain;
//! - here: [`Gpu`] and its contexts.

pub mod guardian;
pub mod health;
pub mod restart;
pub mod scheduler;
pub mod workers;

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use self::health::{DeviceHealth, FaultConfig};
use self::restart::Stuck;
use self::scheduler::GpuScheduler;
use crate::access::TrustDomain;
use crate::device::Device;

/// Makes the device of a trust domain on a GPU (index).
pub type DomainMaker =
    Box<dyn Fn(u32, &TrustDomain) -> Result<Arc<Device>, String> + Send + Sync + 'static>;

/// Why a client's GPU context cannot be had.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ContextError {
    #[error("no GPU {0}")]
    NoGpu(usize),
    /// gpushared holds the device itself (`--in-process-device`): no context but the
    /// default domain's.
    #[error(
        "your trust domain `{0}` needs a GPU context of its own, which gpushared can only give in a device worker; it runs with --in-process-device, so only the default domain is served"
    )]
    NeedsWorker(TrustDomain),
    #[error("cannot open GPU {gpu} for trust domain `{domain}`: {why}")]
    Open {
        gpu: u32,
        domain: TrustDomain,
        why: String,
    },
}

impl ContextError {
    /// What the client is refused with.
    pub fn code(&self) -> gpushare_protocol::ErrorCode {
        use gpushare_protocol::ErrorCode;
        match self {
            ContextError::NoGpu(_) => ErrorCode::InvalidArgument,
            ContextError::NeedsWorker(_) => ErrorCode::NotSupported,
            ContextError::Open { .. } => ErrorCode::DeviceError,
        }
    }
}

/// One GPU context: its device, and its fault containment.
#[derive(Clone)]
pub struct Context {
    pub device: Arc<Device>,
    pub health: Arc<DeviceHealth>,
}

/// One GPU.
pub struct Gpu {
    pub index: u32,
    pub scheduler: Arc<GpuScheduler>,
    /// The default trust domain's context.
    default: Context,
    /// Other domains' contexts, made on first use.
    domains: Mutex<HashMap<TrustDomain, Context>>,
    faults: FaultConfig,
    stuck: Arc<Stuck>,
    /// Set when the broker stops: every guardian of this GPU ends with it.
    guardians_stop: Arc<AtomicBool>,
}

impl Gpu {
    pub fn new(
        index: u32,
        device: Arc<Device>,
        scheduler: GpuScheduler,
        faults: FaultConfig,
        stuck: Arc<Stuck>,
        guardians_stop: Arc<AtomicBool>,
    ) -> Gpu {
        Gpu {
            index,
            scheduler: Arc::new(scheduler),
            default: Context {
                device,
                health: DeviceHealth::new(faults, stuck.clone()),
            },
            domains: Mutex::default(),
            faults,
            stuck,
            guardians_stop,
        }
    }

    /// The default trust domain's device.
    pub fn device(&self) -> &Arc<Device> {
        &self.default.device
    }

    /// Starts the default context's guardian.
    pub fn start_guardian(&self) {
        self.guard(&self.default, &TrustDomain::default());
    }

    fn guard(&self, context: &Context, domain: &TrustDomain) {
        let (health, device, stop) = (
            context.health.clone(),
            context.device.clone(),
            self.guardians_stop.clone(),
        );
        let gpu = self.index;
        let name = if *domain == TrustDomain::default() {
            format!("gpushare-guard-{gpu}")
        } else {
            format!("gpushare-guard-{gpu}-{domain}")
        };
        if let Err(e) = std::thread::Builder::new()
            .name(name)
            .spawn(move || health.guard(device, gpu, stop))
        {
            tracing::warn!(gpu, %domain, error = %e, "cannot start the fault guardian; GPU faults of this context will not be contained");
        }
    }

    /// The context serving `domain`, made on first use by `maker` (which can take a while: a
    /// worker opens the GPU). Blocking. Without a maker only the default domain is served: the
    /// devices are in gpushared's own process, where a second context would neither keep
    /// memory apart nor survive another domain's fault.
    pub fn context(
        &self,
        domain: &TrustDomain,
        maker: Option<&DomainMaker>,
    ) -> Result<Context, ContextError> {
        if *domain == TrustDomain::default() {
            return Ok(self.default.clone());
        }
        let gpu = self.index;
        let mut made = self.domains.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = made.get(domain) {
            return Ok(c.clone());
        }
        let maker = maker.ok_or_else(|| ContextError::NeedsWorker(domain.clone()))?;
        let device = maker(gpu, domain).map_err(|why| ContextError::Open {
            gpu,
            domain: domain.clone(),
            why,
        })?;
        let context = Context {
            device,
            health: DeviceHealth::new(self.faults, self.stuck.clone()),
        };
        self.guard(&context, domain);
        tracing::info!(gpu, %domain, "trust domain: a GPU context of its own");
        made.insert(domain.clone(), context.clone());
        Ok(context)
    }
}

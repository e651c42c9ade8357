//! `gpushared`: the gpushare broker daemon.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use gpushare_broker::access::Policy;
use gpushare_broker::cli::{Args, Backend, Gpus};
use gpushare_broker::config::BrokerConfig;
use gpushare_broker::device::Device;
use gpushare_broker::device::cuda::CudaDevice;
use gpushare_broker::device::sim::{SimDevice, SimOptions};
use gpushare_broker::gpu::DomainMaker;
use gpushare_broker::gpu::health::FaultConfig;
use gpushare_broker::gpu::restart::{CARRY_ENV, Carry, Handover, MEMORY_HANDOVER_ENV};
use gpushare_broker::gpu::workers::Workers;
use gpushare_broker::server::{self, Broker, Stop};
use gpushare_broker::telemetry::{Telemetry, TelemetryOptions, TelemetryStatus};
use tracing::{info, warn};

const DEFAULT_POLICY: &str = "/etc/gpushare/gpushare.toml";

/// Opens the GPUs; then, unless `no_holder`, starts (or keeps) the helper that keeps the CUDA
/// driver initialised across a restart.
fn open_gpus(
    which: Gpus,
    fault_injection: bool,
    no_holder: bool,
) -> anyhow::Result<Vec<Arc<Device>>> {
    let devices = match which {
        Gpus::All => CudaDevice::open_all()?,
        Gpus::One(n) => vec![CudaDevice::open(n)?],
    };
    if fault_injection {
        // Before serving, as in every image: the flag it allocates then takes the same place
        // in each, so clients rebuilding after a restart find their addresses free.
        for d in &devices {
            if let Err(e) = d.prepare_fault_injection() {
                warn!(gpu = d.ordinal(), error = %e, "cannot load the fault-injection kernels");
            }
        }
    }
    if !no_holder {
        gpushare_broker::device::cuda::keep_driver_warm();
    }
    let handover = Handover::inherited();
    devices
        .into_iter()
        .enumerate()
        .map(|(i, d)| {
            let handed = handover.get(i).copied().flatten();
            Device::local(d, handed.map(|h| (h.space.base, h.floor)))
                .map(Arc::new)
                .with_context(|| format!("cannot reserve GPU {i}'s address range"))
        })
        .collect()
}

fn main() -> std::process::ExitCode {
    let ended = real_main();
    gpushare_broker::timeline::flush();
    match ended {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpushared: {}", sentence(&e));
            std::process::ExitCode::FAILURE
        }
    }
}

/// The error and its causes, each said once: an error whose message already holds its cause
/// (`cannot read policy file …: No such file or directory`) does not repeat it.
fn sentence(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let part = cause.to_string();
        if !text.contains(&part) {
            if !text.is_empty() {
                text.push_str(": ");
            }
            text.push_str(&part);
        }
    }
    text
}

fn real_main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.hold_cuda_driver {
        gpushare_broker::device::cuda::run_holder();
    }
    if args.device_worker {
        gpushare_broker::device::remote::worker::run();
    }
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(&args.log))
        .context("bad --log filter")?;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colours only on a terminal: a log file or the journal gets plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();

    tracing::debug!(
        restarted = std::env::var_os(CARRY_ENV).is_some(),
        "gpushared starting"
    );
    let (policy, policy_path) = load_policy(args.config.as_deref())?;
    let config = BrokerConfig {
        socket: args.socket.clone(),
        socket_mode: args.socket_mode,
        socket_group: args.socket_group.clone(),
        spin: Duration::from_micros(args.spin_us),
        spin_ceiling: Duration::from_micros(args.spin_max_us),
        high_spin: Duration::from_micros(args.high_spin_us),
        high_nice: args.high_nice,
        stall_limit: Duration::from_secs_f64(args.stalled_client_timeout),
        monitor_idle: Duration::from_secs_f64(args.monitor_idle_timeout),
        arena_size: args.arena_size.as_u64(),
        metrics_listen: args.metrics_listen,
        max_arena_size: args.max_arena_size.as_u64(),
        policy_path,
        faults: FaultConfig {
            kernel_timeout: Duration::from_secs_f64(args.kernel_timeout),
            probation: Duration::from_secs_f64(args.fault_probation),
            allow_injection: args.allow_fault_injection,
        },
        ..BrokerConfig::default()
    };
    if args.allow_fault_injection {
        tracing::warn!("fault injection is on: any client may fault the GPU on purpose");
    }

    let sims = || -> anyhow::Result<Vec<Arc<Device>>> {
        let handover = Handover::inherited();
        (0..args.sim_gpus)
            .map(|index| {
                let sim = SimDevice::new(SimOptions {
                    index,
                    memory: args.sim_memory.as_u64(),
                    realtime: args.sim_realtime,
                    restart_on_fault: args.sim_restart_on_fault,
                    ..SimOptions::default()
                });
                let handed = handover.get(index as usize).copied().flatten();
                Device::local(sim, handed.map(|h| (h.space.base, h.floor)))
                    .map(Arc::new)
                    .with_context(|| format!("cannot reserve sim GPU {index}'s address range"))
            })
            .collect()
    };
    let which = match args.gpu {
        Gpus::All => "all GPUs".to_string(),
        Gpus::One(n) => format!("GPU {n}"),
    };
    let telemetry = TelemetryPlan::from_args(&args);
    // The sim's restart-on-fault mode exists to test the restart of gpushared itself, which
    // only a device held in gpushared's own process needs.
    if !(args.in_process_device || args.sim_restart_on_fault) {
        let workers = Workers::from_args(&args);
        let (devices, cuda) = match args.backend {
            Backend::Sim => (workers.sims()?, false),
            Backend::Cuda => (
                workers
                    .gpus()
                    .with_context(|| format!("cannot use {which} with --backend cuda"))?,
                true,
            ),
            Backend::Auto => match workers.gpus() {
                Ok(gpus) => {
                    info!("backend auto: serving {which} through CUDA");
                    (gpus, true)
                }
                Err(e) => {
                    info!("backend auto: no usable GPU ({e}); using the sim device");
                    (workers.sims()?, false)
                }
            },
        };
        let maker = workers.domain_maker(cuda, &devices);
        return run(devices, Some(maker), config, policy, telemetry);
    }
    match args.backend {
        Backend::Sim => run(sims()?, None, config, policy, telemetry),
        Backend::Cuda => {
            let gpus = open_gpus(args.gpu, args.allow_fault_injection, args.no_cuda_holder)
                .with_context(|| format!("cannot use {which} with --backend cuda"))?;
            run(gpus, None, config, policy, telemetry)
        }
        Backend::Auto => match open_gpus(args.gpu, args.allow_fault_injection, args.no_cuda_holder)
        {
            Ok(gpus) => {
                info!("backend auto: serving {which} through CUDA");
                run(gpus, None, config, policy, telemetry)
            }
            Err(e) => {
                info!("backend auto: no usable GPU ({e}); using the sim device");
                run(sims()?, None, config, policy, telemetry)
            }
        },
    }
}

fn load_policy(path: Option<&std::path::Path>) -> anyhow::Result<(Policy, Option<PathBuf>)> {
    match path {
        Some(p) => Ok((Policy::load(p)?, Some(p.to_path_buf()))),
        None if std::path::Path::new(DEFAULT_POLICY).exists() => {
            let p = PathBuf::from(DEFAULT_POLICY);
            Ok((Policy::load(&p)?, Some(p)))
        }
        None => {
            info!("no policy file; every client gets class normal, weight 1, no memory quota");
            Ok((Policy::default(), None))
        }
    }
}

/// Whether and how to start eBPF telemetry.
struct TelemetryPlan {
    opts: TelemetryOptions,
    off: bool,
}

impl TelemetryPlan {
    fn from_args(args: &Args) -> TelemetryPlan {
        TelemetryPlan {
            opts: TelemetryOptions {
                dev_prefix: args.telemetry_dev_prefix.clone(),
                uprobes: !args.no_uprobes,
                libcuda: args.libcuda.clone(),
            },
            off: args.no_telemetry,
        }
    }

    /// What status says until telemetry has started (or said why not).
    fn pending(&self) -> TelemetryStatus {
        if self.off {
            self.opts.off("disabled with --no-telemetry")
        } else {
            self.opts.off(gpushare_protocol::stats::TELEMETRY_STARTING)
        }
    }
}

/// Starts eBPF telemetry for `broker`, or says once, clearly, why it is off (after status
/// says so too).
fn start_telemetry(plan: &TelemetryPlan, broker: &Broker) {
    let started = std::time::Instant::now();
    match Telemetry::start(&plan.opts) {
        Ok(t) => {
            let status = t.status();
            broker.set_telemetry(Some(Arc::new(t)), status.clone());
            info!(
                dev_prefix = %status.dev_prefix,
                uprobes = status.uprobes,
                took_ms = started.elapsed().as_millis() as u64,
                "telemetry on: eBPF sees every process that uses the GPU"
            );
        }
        Err(reason) => {
            broker.set_telemetry(None, plan.opts.off(reason.clone()));
            warn!("telemetry off: {reason}");
        }
    }
}

fn run(
    devices: Vec<Arc<Device>>,
    domains: Option<DomainMaker>,
    config: BrokerConfig,
    policy: Policy,
    telemetry: TelemetryPlan,
) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("gpushared-control")
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async move {
        let listener = server::bind(&config)?;
        for d in &devices {
            let info = d.info();
            info!(
                gpu = info.index,
                device = %info.name,
                memory = %bytesize::ByteSize(info.total_memory),
                sms = info.sm_count,
                "serving device"
            );
        }
        info!(
            socket = %config.socket.display(),
            backend = devices[0].backend(),
            devices = devices.len(),
            "gpushared ready"
        );
        // Bind before serving so a busy port stops the start with a clear message.
        let metrics = match config.metrics_listen {
            Some(addr) => Some(
                tokio::net::TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("cannot listen for metrics on {addr}"))?,
            ),
            None => None,
        };
        let policy_path = config.policy_path.clone();
        let broker = Broker::new(devices, config, policy, None, telemetry.pending());
        if let Some(maker) = domains {
            broker.set_domain_maker(maker);
        }
        if let Some(text) = std::env::var_os(CARRY_ENV) {
            broker.carry_over(Carry::from_env(&text.to_string_lossy()));
        }
        // Telemetry starts beside serving, not before: loading and attaching the eBPF
        // programs (and the libcuda uprobes) takes a tenth of a second to seconds, and
        // clients, after a restart above all, should not wait for it.
        if !telemetry.off {
            let b = broker.clone();
            let started = std::thread::Builder::new()
                .name("gpushared-telemetry-start".into())
                .spawn(move || start_telemetry(&telemetry, &b));
            if let Err(e) = started {
                warn!(error = %e, "telemetry off: cannot start the thread that loads it");
            }
        }
        tokio::spawn(reload_on_sighup(broker.clone(), policy_path));
        tokio::spawn(broker.clone().watch_telemetry());
        if let Some(listener) = metrics {
            let addr = listener
                .local_addr()
                .map(|a| a.to_string())
                .unwrap_or_default();
            info!(%addr, "metrics endpoint listening: http://{addr}/metrics");
            let b = broker.clone();
            tokio::spawn(async move {
                let render = move || gpushare_broker::metrics::render(&b.status());
                if let Err(e) =
                    gpushare_broker::metrics::serve_on(listener, render, std::future::pending())
                        .await
                {
                    warn!(error = %e, "metrics endpoint stopped");
                }
            });
        }
        let stuck = broker.stuck();
        let stop = async {
            tokio::select! {
                reason = shutdown_signal() => Stop::stopping(format!("broker shutting down: {reason}")),
                reason = stuck.wait() => Stop::restarting(reason),
            }
        };
        broker.clone().serve(listener, stop).await;
        if let Some(reason) = stuck.reason() {
            restart(&reason, &stuck.carry(), &broker.memory_handover());
        }
        Ok(())
    })
}

/// Starts gpushared again in this process (same pid, same arguments), for a GPU that could
/// not be recovered in place. Every descriptor but stdin/out/err is closed first: the GPU's
/// device files must go with the old image so the driver tears the stuck context down.
fn restart(reason: &str, carry: &Carry, memory: &[Option<Handover>]) -> ! {
    use std::os::unix::process::CommandExt;
    tracing::error!(%reason, "restarting gpushared");
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    tracing::debug!("re-executing gpushared");
    // Marks them close-on-exec rather than closing them now: the runtime's threads still use
    // theirs until exec replaces the process. (CLOSE_RANGE_CLOEXEC, Linux 5.11.)
    const CLOSE_RANGE_CLOEXEC: u32 = 1 << 2;
    // SAFETY: only changes descriptor flags of this process.
    unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, CLOSE_RANGE_CLOEXEC) };
    // The compiled built-in kernels go along (in a descriptor made after the call above), so
    // the new image starts without compiling them again.
    let mut next = std::process::Command::new("/proc/self/exe");
    next.args(args);
    if let Some(fd) = gpushare_broker::device::cuda::hand_over_builtins() {
        next.env(
            gpushare_broker::device::cuda::BUILTINS_HANDOVER_ENV,
            fd.to_string(),
        );
    }
    next.env(CARRY_ENV, carry.to_env());
    // Clients rebuilding their state place their memory again where it was.
    next.env(MEMORY_HANDOVER_ENV, Handover::to_env(memory));
    // The CUDA driver holder goes on to the next image, so its cuInit is quick.
    if let Some(fd) = gpushare_broker::device::cuda::hand_over_holder() {
        next.env(gpushare_broker::device::cuda::HOLDER_ENV, fd);
    }
    // The sim device's fresh allocations go on above the old image's, as a new CUDA
    // context's land elsewhere: clients rebuilding their state find their addresses free.
    next.env(
        gpushare_broker::device::sim::memory::ADDRESS_HANDOVER_ENV,
        gpushare_broker::device::sim::memory::next_address().to_string(),
    );
    let err = next.exec();
    eprintln!("gpushared: cannot restart: {err}");
    std::process::exit(1)
}

/// `systemctl reload`: SIGHUP re-reads the policy file; a broken file keeps the old policy.
async fn reload_on_sighup(broker: Arc<Broker>, path: Option<PathBuf>) {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut hup) = signal(SignalKind::hangup()) else {
        warn!("cannot install the SIGHUP handler; policy reload is unavailable");
        return;
    };
    while hup.recv().await.is_some() {
        let Some(path) = &path else {
            warn!("SIGHUP: no policy file was given (--config), nothing to reload");
            continue;
        };
        match Policy::load(path) {
            Ok(policy) => {
                broker.set_policy(policy);
                info!(policy = %path.display(), "policy reloaded; it applies to clients that connect from now on");
            }
            Err(e) => tracing::error!("SIGHUP: {e}; keeping the previous policy"),
        }
    }
}

async fn shutdown_signal() -> String {
    use tokio::signal::unix::{SignalKind, signal};
    let (mut term, mut int) = match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(t), Ok(i)) => (t, i),
        _ => {
            warn!("cannot install signal handlers; stop the broker with SIGKILL");
            return std::future::pending().await;
        }
    };
    tokio::select! {
        _ = term.recv() => "SIGTERM".into(),
        _ = int.recv() => "SIGINT".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_cause_is_said_once() {
        let io = std::io::Error::from(std::io::ErrorKind::NotFound);
        let read = gpushare_broker::access::PolicyError::Read {
            path: "/etc/x.toml".into(),
            source: io,
        };
        let e = anyhow::Error::new(read).context("starting");
        let text = sentence(&e);
        assert_eq!(text.matches("not found").count(), 1, "{text}");
        assert!(
            text.starts_with("starting: cannot read policy file /etc/x.toml"),
            "{text}"
        );
    }
}

//! `gpushared`: the gpushare broker daemon.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, ValueEnum};
use gpushare_broker::config::BrokerConfig;
use gpushare_broker::device::Device;
use gpushare_broker::device::cuda::CudaDevice;
use gpushare_broker::device::sim::{SimDevice, SimOptions};
use gpushare_broker::policy::Policy;
use gpushare_broker::server::{self, Broker};
use tracing::{info, warn};

const DEFAULT_POLICY: &str = "/etc/gpushare/gpushare.toml";

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Backend {
    /// cuda when a GPU is usable, else sim.
    Auto,
    /// A real NVIDIA GPU through the CUDA driver.
    Cuda,
    /// The CPU model of a GPU (tests, CI, demos).
    Sim,
}

/// The gpushare broker: owns the GPU and shares it among many client processes.
#[derive(Debug, Parser)]
#[command(name = "gpushared", version, about)]
struct Args {
    /// Control socket path.
    #[arg(long, env = "GPUSHARE_SOCKET", default_value = gpushare_protocol::DEFAULT_SOCKET_PATH)]
    socket: PathBuf,
    /// Device backend.
    #[arg(long, value_enum, default_value_t = Backend::Auto)]
    backend: Backend,
    /// GPUs to serve (cuda backend): `all`, or one index.
    #[arg(long, default_value = "all", value_parser = parse_gpus)]
    gpu: Gpus,
    /// Sim backend: how many simulated GPUs to serve.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    sim_gpus: u32,
    /// Policy file (TOML). Defaults to /etc/gpushare/gpushare.toml when that exists.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Permission bits of the socket, in octal.
    #[arg(long, default_value = "660", value_parser = parse_octal)]
    socket_mode: u32,
    /// Group that owns the socket (its members may connect when the mode allows).
    #[arg(long)]
    socket_group: Option<String>,
    /// Microseconds a client's data thread spins on an empty ring before sleeping.
    #[arg(long, default_value_t = 50)]
    spin_us: u64,
    /// Default data arena per client (e.g. "16 MiB").
    #[arg(long, default_value = "16 MiB")]
    arena_size: bytesize::ByteSize,
    /// Largest data arena a client may ask for.
    #[arg(long, default_value = "512 MiB")]
    max_arena_size: bytesize::ByteSize,
    /// Sim device: memory size.
    #[arg(long, default_value = "16 GiB")]
    sim_memory: bytesize::ByteSize,
    /// Sim device: also take the modelled time on the wall clock.
    #[arg(long)]
    sim_realtime: bool,
    /// Log filter (tracing's env-filter syntax); RUST_LOG overrides.
    #[arg(long, default_value = "info")]
    log: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Gpus {
    All,
    One(i32),
}

fn parse_gpus(s: &str) -> Result<Gpus, String> {
    match s {
        "all" => Ok(Gpus::All),
        n => n
            .parse::<i32>()
            .ok()
            .filter(|n| *n >= 0)
            .map(Gpus::One)
            .ok_or_else(|| format!("`{s}` is neither `all` nor a GPU index")),
    }
}

fn open_gpus(
    which: Gpus,
) -> Result<Vec<Arc<CudaDevice>>, gpushare_broker::device::cuda::ProbeError> {
    let devices = match which {
        Gpus::All => CudaDevice::open_all()?,
        Gpus::One(n) => vec![CudaDevice::open(n)?],
    };
    Ok(devices.into_iter().map(Arc::new).collect())
}

fn parse_octal(s: &str) -> Result<u32, String> {
    u32::from_str_radix(s.trim_start_matches("0o"), 8)
        .map_err(|e| format!("`{s}` is not an octal mode: {e}"))
}

fn main() -> std::process::ExitCode {
    match real_main() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpushared: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn real_main() -> anyhow::Result<()> {
    let args = Args::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(&args.log))
        .context("bad --log filter")?;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();

    let (policy, policy_path) = load_policy(args.config.as_deref())?;
    let config = BrokerConfig {
        socket: args.socket.clone(),
        socket_mode: args.socket_mode,
        socket_group: args.socket_group.clone(),
        spin: Duration::from_micros(args.spin_us),
        arena_size: args.arena_size.as_u64(),
        max_arena_size: args.max_arena_size.as_u64(),
        policy_path,
        ..BrokerConfig::default()
    };

    let sims = || -> Vec<Arc<SimDevice>> {
        (0..args.sim_gpus)
            .map(|index| {
                Arc::new(SimDevice::new(SimOptions {
                    index,
                    memory: args.sim_memory.as_u64(),
                    realtime: args.sim_realtime,
                    ..SimOptions::default()
                }))
            })
            .collect()
    };
    let which = match args.gpu {
        Gpus::All => "all GPUs".to_string(),
        Gpus::One(n) => format!("GPU {n}"),
    };
    match args.backend {
        Backend::Sim => run(sims(), config, policy),
        Backend::Cuda => {
            let gpus = open_gpus(args.gpu)
                .with_context(|| format!("cannot use {which} with --backend cuda"))?;
            run(gpus, config, policy)
        }
        Backend::Auto => match open_gpus(args.gpu) {
            Ok(gpus) => {
                info!("backend auto: serving {which} through CUDA");
                run(gpus, config, policy)
            }
            Err(e) => {
                info!("backend auto: no usable GPU ({e}); using the sim device");
                run(sims(), config, policy)
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

fn run<D: Device>(
    devices: Vec<Arc<D>>,
    config: BrokerConfig,
    policy: Policy,
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
        let policy_path = config.policy_path.clone();
        let broker = Broker::new(devices, config, policy);
        tokio::spawn(reload_on_sighup(broker.clone(), policy_path));
        broker.serve(listener, shutdown_signal()).await;
        Ok(())
    })
}

/// `systemctl reload`: SIGHUP re-reads the policy file; a broken file keeps the old policy.
async fn reload_on_sighup<D: Device>(broker: Arc<Broker<D>>, path: Option<PathBuf>) {
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

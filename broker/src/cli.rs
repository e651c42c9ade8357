//! `gpushared`'s command line. `main.rs` parses it; `packaging/gen` writes the man page and
//! shell completions from it (`<Args as clap::CommandFactory>::command()`).

use std::path::PathBuf;

use clap::{Parser, ValueEnum};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    /// cuda when a GPU is usable, else sim.
    Auto,
    /// A real NVIDIA GPU through the CUDA driver.
    Cuda,
    /// The CPU model of a GPU (tests, CI, demos).
    Sim,
}

/// The gpushare broker: owns the GPU and shares it among many client processes.
#[derive(Debug, Parser)]
#[command(name = "gpushared", version)]
pub struct Args {
    /// Internal: run as the helper that keeps the CUDA driver initialised while gpushared
    /// restarts after a GPU fault.
    #[arg(long, hide = true)]
    pub hold_cuda_driver: bool,
    /// Internal: run as a device worker (the process that holds one GPU context for
    /// gpushared).
    #[arg(long = "device-worker", hide = true)]
    pub device_worker: bool,
    /// Hold the GPU context in gpushared's own process instead of a device worker per GPU.
    /// A GPU fault then restarts gpushared and ends every session (with workers, only the
    /// faulting client's session ends). For comparisons and as a fallback.
    #[arg(long)]
    pub in_process_device: bool,
    /// Do not keep a spare device worker per GPU with its context made ahead of a fault
    /// (saves a context's GPU memory; recovery after a fault then waits for a new one).
    #[arg(long)]
    pub no_spare_worker: bool,
    /// Map clients' memory into the spare device worker only when it takes over after a
    /// fault, not as it is made (for measuring the two; the default maps it ahead).
    #[arg(long, hide = true)]
    pub spare_maps_at_takeover: bool,
    /// Do not start that helper (a restart after a GPU fault then takes longer).
    #[arg(long, env = "GPUSHARE_NO_CUDA_HOLDER", value_parser = clap::builder::FalseyValueParser::new())]
    pub no_cuda_holder: bool,
    /// Control socket path.
    #[arg(long, env = "GPUSHARE_SOCKET", default_value = gpushare_protocol::DEFAULT_SOCKET_PATH)]
    pub socket: PathBuf,
    /// Device backend.
    #[arg(long, value_enum, default_value_t = Backend::Auto)]
    pub backend: Backend,
    /// GPUs to serve (cuda backend): `all`, or one index.
    #[arg(long, default_value = "all", value_parser = parse_gpus)]
    pub gpu: Gpus,
    /// Sim backend: how many simulated GPUs to serve.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub sim_gpus: u32,
    /// Policy file (TOML). Defaults to /etc/gpushare/gpushare.toml when that exists.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Permission bits of the socket, in octal.
    #[arg(long, default_value = "660", value_parser = parse_octal)]
    pub socket_mode: u32,
    /// Group that owns the socket (its members may connect when the mode allows).
    #[arg(long)]
    pub socket_group: Option<String>,
    /// Microseconds a client's data thread spins on an empty ring before sleeping.
    #[arg(long, default_value_t = 50)]
    pub spin_us: u64,
    /// Microseconds that spin grows to, at most, for a client whose recent requests came
    /// closer together than this: it spins about as long as they took to come (at or below
    /// --spin-us, it never grows).
    #[arg(long, default_value_t = 500)]
    pub spin_max_us: u64,
    /// Microseconds the data thread of a high-priority client spins on an empty ring before
    /// sleeping: a request that arrives within it finds the broker awake (it costs a core
    /// while such a client is active).
    #[arg(long, default_value_t = 10_000)]
    pub high_spin_us: u64,
    /// What the nice value of the threads that serve a high-priority client (its data
    /// thread, its device worker's thread) is moved by: negative is ahead of the rest on a
    /// machine whose cores are all wanted (needs CAP_SYS_NICE; without it they stay as the
    /// process is); 0 leaves them.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true, value_parser = clap::value_parser!(i32).range(-39..=39))]
    pub high_nice: i32,
    /// Default data arena per client (e.g. "16 MiB").
    #[arg(long, default_value = "16 MiB")]
    pub arena_size: bytesize::ByteSize,
    /// Largest data arena a client may ask for.
    #[arg(long, default_value = "512 MiB")]
    pub max_arena_size: bytesize::ByteSize,
    /// Sim device: memory size.
    #[arg(long, default_value = "16 GiB")]
    pub sim_memory: bytesize::ByteSize,
    /// Sim device: also take the modelled time on the wall clock.
    #[arg(long)]
    pub sim_realtime: bool,
    /// Sim device: after a fault, behave like the CUDA driver in gpushared's own process (no
    /// recovery in place, so gpushared restarts), to test that path without a GPU. Implies
    /// --in-process-device.
    #[arg(long)]
    pub sim_restart_on_fault: bool,
    /// Don't load the eBPF telemetry programs.
    #[arg(long)]
    pub no_telemetry: bool,
    /// Telemetry: file descriptors whose path starts with this are GPU descriptors.
    #[arg(long, default_value = crate::telemetry::DEFAULT_DEV_PREFIX)]
    pub telemetry_dev_prefix: String,
    /// Telemetry: don't attach uprobes to libcuda (launch and allocation counts of processes
    /// that bypass the broker; attached to each such process, never to the broker).
    #[arg(long)]
    pub no_uprobes: bool,
    /// Telemetry: the libcuda to probe (found in the usual places otherwise).
    #[arg(long, value_name = "PATH")]
    pub libcuda: Option<PathBuf>,
    /// Serve Prometheus metrics at http://ADDR/metrics (e.g. 127.0.0.1:9400).
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// Queued GPU work that makes no progress for this many seconds counts as a hung kernel:
    /// the context is recreated and the client that queued it evicted.
    #[arg(long, value_name = "SECONDS", default_value_t = 10.0, value_parser = parse_seconds)]
    pub kernel_timeout: f64,
    /// A client that leaves its completion ring full (does not read what it submitted) for
    /// this many seconds is evicted. Meanwhile it holds nothing in the scheduler.
    #[arg(long, value_name = "SECONDS", default_value_t = 30.0, value_parser = parse_seconds)]
    pub stalled_client_timeout: f64,
    /// A monitor connection (`gpushare status`, `top`) that asks nothing for this many seconds
    /// is closed (`gpushare top` reconnects on its next refresh).
    #[arg(long, value_name = "SECONDS", default_value_t = 300.0, value_parser = parse_seconds)]
    pub monitor_idle_timeout: f64,
    /// After a fault that cannot be pinned on one client, the clients whose work was in
    /// flight run one at a time for this many seconds, so that a second fault names the
    /// culprit.
    #[arg(long, value_name = "SECONDS", default_value_t = 60.0, value_parser = parse_seconds)]
    pub fault_probation: f64,
    /// Let clients launch the fault-injection kernel (an illegal address or a kernel that never
    /// ends), to test fault containment. Never on a shared machine in production.
    #[arg(long)]
    pub allow_fault_injection: bool,
    /// Log filter (tracing's env-filter syntax); RUST_LOG overrides.
    #[arg(long, default_value = "info")]
    pub log: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gpus {
    All,
    One(i32),
}

pub fn parse_gpus(s: &str) -> Result<Gpus, String> {
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

pub fn parse_seconds(s: &str) -> Result<f64, String> {
    s.parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v > 0.0 && *v <= 86_400.0)
        .ok_or_else(|| format!("`{s}` is not a number of seconds between 0 and 86400"))
}

pub fn parse_octal(s: &str) -> Result<u32, String> {
    u32::from_str_radix(s.trim_start_matches("0o"), 8)
        .map_err(|e| format!("`{s}` is not an octal mode: {e}"))
}

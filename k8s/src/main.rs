//! `gpushare-k8s-plugin`: gpushare's kubelet plugin (docs/kubernetes.md).

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use gpushare_k8s::{Config, Edits};

/// Advertises this node's GPU shares to the kubelet and gives each container that holds some
/// its grant in gpushared.
#[derive(Debug, Parser)]
#[command(name = "gpushare-k8s-plugin", version)]
struct Args {
    /// gpushared's control socket.
    #[arg(long, env = "GPUSHARE_SOCKET", default_value = gpushare_protocol::DEFAULT_SOCKET_PATH)]
    socket: PathBuf,
    /// The kubelet's device plugin directory.
    #[arg(long, default_value = "/var/lib/kubelet/device-plugins")]
    device_plugin_dir: PathBuf,
    /// This plugin's socket name in that directory.
    #[arg(long, default_value = "gpushare-shard.sock")]
    endpoint: String,
    /// The kubelet's pod resources socket.
    #[arg(long, default_value = "/var/lib/kubelet/pod-resources/kubelet.sock")]
    pod_resources: PathBuf,
    /// The kubelet's pods directory, read for each pod's service-account token.
    #[arg(long, default_value = "/var/lib/kubelet/pods")]
    kubelet_pods_dir: PathBuf,
    /// Where the container runtime reads CDI specs.
    #[arg(long, default_value = "/var/run/cdi")]
    cdi_dir: PathBuf,
    /// gpushare's libraries on this node (`libgpushare_audit.so`, `cuda/libcuda.so.1`).
    #[arg(long, default_value = "/usr/lib/gpushare")]
    lib_dir: PathBuf,
    /// Shares advertised per GPU: equal to the policy's `[kubernetes] shards_per_gpu`.
    #[arg(long, default_value_t = 8)]
    shards_per_gpu: u32,
    /// How a container is given the socket, driver and environment.
    #[arg(long, value_enum, default_value = "cdi")]
    edits: Edits,
    /// Milliseconds between looks at gpushared, the pods and the kubelet's socket.
    #[arg(long, default_value_t = 2000)]
    interval_ms: u64,
    /// Seconds an allocation no pod has claimed is kept before it is ended.
    #[arg(long, default_value_t = 120)]
    unclaimed_s: u64,
}

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let args = Args::parse();
    let config = Config {
        gpushared: args.socket,
        device_plugin_dir: args.device_plugin_dir,
        endpoint: args.endpoint,
        pod_resources: args.pod_resources,
        kubelet_pods: args.kubelet_pods_dir,
        cdi_dir: args.cdi_dir,
        lib_dir: args.lib_dir,
        shards_per_gpu: args.shards_per_gpu.max(1),
        edits: args.edits,
        interval: Duration::from_millis(args.interval_ms.max(10)),
        unclaimed: Duration::from_secs(args.unclaimed_s),
    };
    gpushare_k8s::run::run(config).await;
}

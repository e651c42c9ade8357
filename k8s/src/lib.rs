//! gpushare's kubelet plugin (`gpushare-k8s-plugin`): it advertises each GPU's shares to the
//! kubelet through the device plugin API, turns each container's shares into a grant in
//! gpushared with a socket of its own, hands the container that socket, gpushare's driver and
//! the environment through CDI, and learns from the kubelet's pod resources API which pod
//! holds them (its namespace and service account pick the policy's identity or class) and when it is gone (docs/kubernetes.md).
//!
//! - `api/`: the kubelet's gRPC APIs (generated, checked in);
//! - `uds.rs`: gRPC over Unix sockets;
//! - `cdi.rs`: what a container gets, as a CDI spec;
//! - `gpushared.rs`: the plugin's requests to gpushared;
//! - `devices.rs`: the shares advertised, and which allocation holds which;
//! - `plugin.rs`: the `DevicePlugin` service the kubelet calls;
//! - `pods.rs`: following pods through the pod resources API;
//! - `token.rs`: a pod's service account, from the token the kubelet projects into it;
//! - `run.rs`: registering with the kubelet, and again after it restarts.

// tonic's service traits answer with its `Status`, which is large: not ours to box.
#![allow(clippy::result_large_err)]

use std::path::PathBuf;
use std::time::Duration;

pub mod api;
pub mod cdi;
pub mod devices;
pub mod gpushared;
pub mod plugin;
pub mod pods;
pub mod run;
pub mod takeover;
pub mod token;
pub mod uds;

/// The extended resource a pod asks for.
pub const RESOURCE_NAME: &str = "gpushare.io/shard";

/// How a container is given what it needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Edits {
    /// CDI device names in `Allocate`'s answer (kubelet 1.28 with `DevicePluginCDIDevices`,
    /// on by default from 1.29; containerd 1.7 or CRI-O with CDI enabled).
    Cdi,
    /// Mounts and environment in `Allocate`'s answer, for runtimes without CDI (the spec
    /// files are written as well).
    Mounts,
}

/// Where everything is, and how often to look.
#[derive(Debug, Clone)]
pub struct Config {
    pub gpushared: PathBuf,
    /// The kubelet's device plugin directory: its `kubelet.sock`, and our socket.
    pub device_plugin_dir: PathBuf,
    /// Our socket's name in it.
    pub endpoint: String,
    pub pod_resources: PathBuf,
    /// The kubelet's `pods/` directory, where it projects each pod's service-account token.
    pub kubelet_pods: PathBuf,
    pub cdi_dir: PathBuf,
    /// gpushare's libraries on this machine (mounted at the same path in containers).
    pub lib_dir: PathBuf,
    pub shards_per_gpu: u32,
    pub edits: Edits,
    /// How often gpushared's health, the pods and the kubelet's socket are looked at.
    pub interval: Duration,
    /// How long an allocation no pod has shown up with is kept (the container may still be
    /// starting).
    pub unclaimed: Duration,
}

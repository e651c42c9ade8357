//! The plugin's life: serving `DevicePlugin` on its socket in the kubelet's device plugin
//! directory, registering it, and doing both again when the kubelet restarts (a starting
//! kubelet removes every socket there, ours included); beside that, gpushared's health as the
//! devices' and the pods followed.

use std::sync::Arc;

use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::Server;
use tracing::{info, warn};

use crate::api::DEVICE_PLUGIN_VERSION;
use crate::api::v1beta1::device_plugin_server::DevicePluginServer;
use crate::api::v1beta1::registration_client::RegistrationClient;
use crate::api::v1beta1::{DevicePluginOptions, RegisterRequest};
use crate::devices::advertised;
use crate::plugin::{Plugin, Service};
use crate::{Config, RESOURCE_NAME, pods, takeover, uds};

/// Runs the plugin until the process is stopped.
pub async fn run(config: Config) {
    let plugin = Plugin::new(config);
    takeover::take_over(&plugin).await;
    tokio::spawn(health(plugin.clone()));
    tokio::spawn(pods::follow(plugin.clone()));
    loop {
        serve_once(&plugin).await;
    }
}

/// Serves and registers once, until the kubelet removes our socket (it restarted).
async fn serve_once(plugin: &Arc<Plugin>) {
    let config = &plugin.config;
    let endpoint = config.device_plugin_dir.join(&config.endpoint);
    let listener = match uds::listen(&endpoint) {
        Ok(l) => l,
        Err(e) => {
            warn!(socket = %endpoint.display(), error = %e, "cannot listen for the kubelet; trying again");
            tokio::time::sleep(config.interval).await;
            return;
        }
    };
    let server = tokio::spawn(
        Server::builder()
            .add_service(DevicePluginServer::new(Service(plugin.clone())))
            .serve_with_incoming(UnixListenerStream::new(listener)),
    );
    loop {
        match register(config).await {
            Ok(()) => break,
            Err(e) => {
                warn!(
                    error = format!("{e:#}"),
                    "cannot register with the kubelet; trying again"
                );
                tokio::time::sleep(config.interval).await;
            }
        }
        if !endpoint.exists() {
            server.abort();
            return;
        }
    }
    info!(resource = RESOURCE_NAME, socket = %endpoint.display(), "registered with the kubelet");
    while endpoint.exists() && !server.is_finished() {
        tokio::time::sleep(config.interval).await;
    }
    info!("our socket is gone (the kubelet restarted): registering again");
    server.abort();
}

/// Tells the kubelet our resource and socket.
async fn register(config: &Config) -> anyhow::Result<()> {
    let kubelet = config.device_plugin_dir.join("kubelet.sock");
    let channel = uds::connect(&kubelet).await?;
    RegistrationClient::new(channel)
        .register(RegisterRequest {
            version: DEVICE_PLUGIN_VERSION.into(),
            endpoint: config.endpoint.clone(),
            resource_name: RESOURCE_NAME.into(),
            options: Some(DevicePluginOptions::default()),
        })
        .await?;
    Ok(())
}

/// The devices on offer: every GPU's shares, healthy while gpushared answers.
async fn health(plugin: Arc<Plugin>) {
    let config = &plugin.config;
    loop {
        match plugin.gpushared.gpus().await {
            Ok(gpus) => {
                let now = advertised(gpus, config.shards_per_gpu, true);
                plugin.devices.send_if_modified(|d| {
                    let changed = *d != now;
                    *d = now;
                    changed
                });
            }
            Err(e) => {
                warn!(
                    error = format!("{e:#}"),
                    "gpushared does not answer: its shares are unhealthy"
                );
                plugin.devices.send_if_modified(|d| {
                    let healthy = d.iter().any(|d| d.health == crate::api::HEALTHY);
                    d.iter_mut()
                        .for_each(|d| d.health = crate::api::UNHEALTHY.into());
                    healthy
                });
            }
        }
        tokio::time::sleep(config.interval).await;
    }
}

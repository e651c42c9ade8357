//! Following the pods that hold our shares, through the kubelet's pod resources API: the
//! device plugin API never says which pod `Allocate` is for, but `List` does once the
//! container holds the devices. Each allocation's pod is told to gpushared (its namespace
//! picks the class); an allocation whose pod is gone, or that no pod has claimed within
//! `Config::unclaimed`, is ended.

use std::sync::Arc;

use gpushare_protocol::job::PodIdentity;
use tracing::{info, warn};

use crate::api::v1::ListPodResourcesRequest;
use crate::api::v1::pod_resources_lister_client::PodResourcesListerClient;
use crate::plugin::Plugin;
use crate::{RESOURCE_NAME, uds};

/// Each container holding our devices, and which.
async fn holders(plugin: &Plugin) -> anyhow::Result<Vec<(PodIdentity, Vec<String>)>> {
    let channel = uds::connect(&plugin.config.pod_resources).await?;
    let listed = PodResourcesListerClient::new(channel)
        .list(ListPodResourcesRequest {})
        .await?
        .into_inner();
    let mut out = Vec::new();
    for pod in listed.pod_resources {
        for container in pod.containers {
            let ids: Vec<String> = container
                .devices
                .into_iter()
                .filter(|d| d.resource_name == RESOURCE_NAME)
                .flat_map(|d| d.device_ids)
                .collect();
            if !ids.is_empty() {
                let who = PodIdentity {
                    namespace: pod.namespace.clone(),
                    pod: pod.name.clone(),
                    container: container.name,
                    service_account: None,
                };
                out.push((who, ids));
            }
        }
    }
    Ok(out)
}

/// One look at the pods: places new holders, ends what no pod holds.
pub async fn reconcile(plugin: &Plugin) {
    let holders = match holders(plugin).await {
        Ok(h) => h,
        Err(e) => {
            // Nothing is ended on a failed look: the kubelet may be restarting.
            warn!(error = format!("{e:#}"), socket = %plugin.config.pod_resources.display(), "cannot list the pods' resources");
            return;
        }
    };
    for allocation in plugin.allocations.all() {
        let holder = holders
            .iter()
            .find(|(_, ids)| allocation.devices.iter().all(|d| ids.contains(d)));
        match holder {
            Some((pod, _)) if allocation.pod.as_ref() != Some(pod) => {
                match plugin.gpushared.identify(allocation.job, pod.clone()).await {
                    Ok(stats) => {
                        info!(job = allocation.job, namespace = %pod.namespace, pod = %pod.pod, class = %stats.class, "a container's shares are its pod's");
                        plugin.allocations.set_pod(allocation.job, pod.clone());
                    }
                    Err(e) => warn!(
                        job = allocation.job,
                        error = format!("{e:#}"),
                        "cannot tell gpushared which pod holds a container's shares"
                    ),
                }
            }
            Some(_) => {}
            None if allocation.pod.is_some()
                || allocation.since.elapsed() >= plugin.config.unclaimed =>
            {
                info!(job = allocation.job, pod = ?allocation.pod, "a container's shares are no pod's any more: ending them");
                plugin.end(allocation.job).await;
            }
            None => {}
        }
    }
}

/// Looks at the pods every `Config::interval`, for ever.
pub async fn follow(plugin: Arc<Plugin>) {
    loop {
        reconcile(&plugin).await;
        tokio::time::sleep(plugin.config.interval).await;
    }
}

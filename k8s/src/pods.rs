//! Following the pods that hold our shares, through the kubelet's pod resources API: the
//! device plugin API never says which pod `Allocate` is for, but `List` does once the
//! container holds the devices. Each allocation's pod is told to gpushared, with its service
//! account where the pod's token says it (`token.rs`): gpushared's policy maps them to a user
//! or a class. An allocation whose pod is gone, or that no pod has claimed within
//! `Config::unclaimed`, is ended.

use std::sync::Arc;

use gpushare_protocol::job::PodIdentity;
use tracing::{info, warn};

use crate::api::v1::ListPodResourcesRequest;
use crate::api::v1::pod_resources_lister_client::PodResourcesListerClient;
use crate::plugin::Plugin;
use crate::token::ServiceAccounts;
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
    // The pods' tokens, read once per look and only while some holder's account is unknown.
    let mut accounts: Option<ServiceAccounts> = None;
    for allocation in plugin.allocations.all() {
        let holder = holders
            .iter()
            .find(|(_, ids)| allocation.devices.iter().all(|d| ids.contains(d)));
        match holder {
            Some((pod, _)) if !known(allocation.pod.as_ref(), pod) => {
                if accounts.is_none() {
                    accounts = Some(scan(plugin).await);
                }
                let pod = PodIdentity {
                    service_account: accounts
                        .as_ref()
                        .and_then(|a| a.of(&pod.namespace, &pod.pod))
                        .map(str::to_owned),
                    ..pod.clone()
                };
                if allocation.pod.as_ref() == Some(&pod) {
                    continue;
                }
                match plugin.gpushared.identify(allocation.job, pod.clone()).await {
                    Ok(stats) => {
                        info!(job = allocation.job, namespace = %pod.namespace, pod = %pod.pod, service_account = ?pod.service_account, user = %stats.user, class = %stats.class, "a container's shares are its pod's");
                        plugin.allocations.set_pod(allocation.job, pod);
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

/// Whether gpushared knows `listed` as the holder already, service account included (a pod
/// without one is looked for again: its token may not be written yet).
fn known(told: Option<&PodIdentity>, listed: &PodIdentity) -> bool {
    told.is_some_and(|t| {
        t.service_account.is_some()
            && (&t.namespace, &t.pod, &t.container)
                == (&listed.namespace, &listed.pod, &listed.container)
    })
}

/// Every pod's service account that its token says, read off the async threads.
async fn scan(plugin: &Plugin) -> ServiceAccounts {
    let dir = plugin.config.kubelet_pods.clone();
    tokio::task::spawn_blocking(move || ServiceAccounts::scan(&dir))
        .await
        .unwrap_or_default()
}

/// Looks at the pods every `Config::interval`, for ever.
pub async fn follow(plugin: Arc<Plugin>) {
    loop {
        reconcile(&plugin).await;
        tokio::time::sleep(plugin.config.interval).await;
    }
}

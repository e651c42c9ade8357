//! The `DevicePlugin` service the kubelet calls: the shares on offer (`ListAndWatch`, healthy
//! while gpushared answers) and, for a container's shares, one grant in gpushared and what the
//! container needs to use it (`Allocate`).

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::watch;
use tokio_stream::{Stream, StreamExt, wrappers::WatchStream};
use tonic::{Request, Response, Status};
use tracing::{info, warn};

use crate::api::v1beta1::device_plugin_server::DevicePlugin;
use crate::api::v1beta1::{
    AllocateRequest, AllocateResponse, CdiDevice, ContainerAllocateResponse, Device,
    DevicePluginOptions, Empty, ListAndWatchResponse, Mount, PreStartContainerRequest,
    PreStartContainerResponse, PreferredAllocationRequest, PreferredAllocationResponse,
};
use crate::devices::{Allocation, Allocations, shares_of};
use crate::gpushared::Gpushared;
use crate::{Config, Edits, RESOURCE_NAME, cdi};

/// What the service and the plugin's other tasks share.
pub struct Plugin {
    pub config: Config,
    pub gpushared: Gpushared,
    pub allocations: Allocations,
    /// The devices advertised now; `ListAndWatch` sends each change.
    pub devices: watch::Sender<Vec<Device>>,
}

impl Plugin {
    pub fn new(config: Config) -> Arc<Plugin> {
        Arc::new(Plugin {
            gpushared: Gpushared {
                socket: config.gpushared.clone(),
            },
            config,
            allocations: Allocations::default(),
            devices: watch::Sender::new(Vec::new()),
        })
    }

    /// Ends allocation `job`: gpushared's grant (its sessions are evicted) and its CDI spec.
    pub async fn end(&self, job: u64) {
        self.allocations.remove(job);
        if let Err(e) = self.gpushared.end(job).await {
            warn!(
                job,
                error = format!("{e:#}"),
                "cannot end a container's shares in gpushared"
            );
        }
        if let Err(e) = cdi::remove(&self.config.cdi_dir, RESOURCE_NAME, job) {
            warn!(job, error = %e, "cannot remove a container's CDI spec");
        }
    }

    /// One container's shares: a grant in gpushared, its CDI spec, and the answer.
    async fn allocate(&self, ids: Vec<String>) -> Result<ContainerAllocateResponse, Status> {
        let gpus = shares_of(&ids).map_err(|id| {
            Status::invalid_argument(format!("{id} is not a device of {RESOURCE_NAME}"))
        })?;
        for earlier in self.allocations.holding_any(&ids) {
            self.end(earlier).await;
        }
        let grant = self
            .gpushared
            .start(gpus)
            .await
            .map_err(|e| Status::unavailable(format!("{e:#}")))?;
        let job = grant.stats.job;
        // A container's sessions run on its allocation's first GPU (`Job::gpu_for`).
        let uuid = match grant.stats.gpus.first() {
            Some(g) => match self.gpushared.uuid(g.gpu).await {
                Ok(uuid) => Some(uuid),
                Err(e) => {
                    warn!(job, error = %format!("{e:#}"), "cannot tell the container's GPU to NVML");
                    None
                }
            },
            None => None,
        };
        let edits = cdi::edits(
            grant.socket_dir.as_ref(),
            &self.config.lib_dir,
            uuid.as_deref(),
        );
        let spec = cdi::spec(RESOURCE_NAME, job, &ids, &edits);
        if let Err(e) = cdi::write(&self.config.cdi_dir, RESOURCE_NAME, job, &spec) {
            let _ = self.gpushared.end(job).await;
            return Err(Status::internal(format!(
                "cannot write the CDI spec in {}: {e}",
                self.config.cdi_dir.display()
            )));
        }
        info!(job, devices = ?ids, quota = grant.stats.memory_quota, "allocated a container's shares");
        self.allocations.insert(Allocation {
            job,
            devices: ids,
            since: Instant::now(),
            pod: None,
        });
        Ok(match self.config.edits {
            Edits::Cdi => ContainerAllocateResponse {
                cdi_devices: vec![CdiDevice {
                    name: cdi::device_name(RESOURCE_NAME, job),
                }],
                ..Default::default()
            },
            Edits::Mounts => ContainerAllocateResponse {
                envs: edits.env.into_iter().collect::<HashMap<_, _>>(),
                mounts: edits
                    .mounts
                    .into_iter()
                    .map(|m| Mount {
                        container_path: m.container_path.display().to_string(),
                        host_path: m.host_path.display().to_string(),
                        read_only: m.read_only,
                    })
                    .collect(),
                ..Default::default()
            },
        })
    }
}

/// The service, over the shared state.
pub struct Service(pub Arc<Plugin>);

type DeviceStream = Pin<Box<dyn Stream<Item = Result<ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl DevicePlugin for Service {
    async fn get_device_plugin_options(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<DevicePluginOptions>, Status> {
        Ok(Response::new(DevicePluginOptions::default()))
    }

    type ListAndWatchStream = DeviceStream;

    async fn list_and_watch(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let stream = WatchStream::new(self.0.devices.subscribe())
            .map(|devices| Ok(ListAndWatchResponse { devices }));
        Ok(Response::new(Box::pin(stream)))
    }

    async fn get_preferred_allocation(
        &self,
        _: Request<PreferredAllocationRequest>,
    ) -> Result<Response<PreferredAllocationResponse>, Status> {
        Err(Status::unimplemented("no preference: any shares will do"))
    }

    async fn allocate(
        &self,
        request: Request<AllocateRequest>,
    ) -> Result<Response<AllocateResponse>, Status> {
        let mut container_responses = Vec::new();
        for container in request.into_inner().container_requests {
            container_responses.push(self.0.allocate(container.devices_ids).await?);
        }
        Ok(Response::new(AllocateResponse {
            container_responses,
        }))
    }

    async fn pre_start_container(
        &self,
        _: Request<PreStartContainerRequest>,
    ) -> Result<Response<PreStartContainerResponse>, Status> {
        Ok(Response::new(PreStartContainerResponse {}))
    }
}

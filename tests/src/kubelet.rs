//! A stand-in kubelet for the kubelet plugin's tests (tests/k8s.rs): it speaks the kubelet's
//! real gRPC APIs over Unix sockets, from the same generated code the plugin uses. It serves
//! `Registration` on `kubelet.sock` in a device plugin directory and `PodResourcesLister` on a
//! socket of its own (listing the pods the test sets), calls the plugin's `DevicePlugin`, and
//! restarts as a kubelet does: every socket in the directory is removed.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use gpushare_k8s::api::v1::pod_resources_lister_server::{
    PodResourcesLister, PodResourcesListerServer,
};
use gpushare_k8s::api::v1::{
    AllocatableResourcesRequest, AllocatableResourcesResponse, GetPodResourcesRequest,
    GetPodResourcesResponse, ListPodResourcesRequest, ListPodResourcesResponse, PodResources,
};
use gpushare_k8s::api::v1beta1::device_plugin_client::DevicePluginClient;
use gpushare_k8s::api::v1beta1::registration_server::{Registration, RegistrationServer};
use gpushare_k8s::api::v1beta1::{Empty, RegisterRequest};
use gpushare_k8s::uds;
use tokio::runtime::Runtime;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::{Channel, Server};
use tonic::{Request, Response, Status};

type Shared<T> = Arc<Mutex<T>>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

struct Registry(Shared<Vec<RegisterRequest>>);

#[tonic::async_trait]
impl Registration for Registry {
    async fn register(&self, r: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        lock(&self.0).push(r.into_inner());
        Ok(Response::new(Empty {}))
    }
}

struct Lister(Shared<Vec<PodResources>>);

#[tonic::async_trait]
impl PodResourcesLister for Lister {
    async fn list(
        &self,
        _: Request<ListPodResourcesRequest>,
    ) -> Result<Response<ListPodResourcesResponse>, Status> {
        Ok(Response::new(ListPodResourcesResponse {
            pod_resources: lock(&self.0).clone(),
        }))
    }

    async fn get_allocatable_resources(
        &self,
        _: Request<AllocatableResourcesRequest>,
    ) -> Result<Response<AllocatableResourcesResponse>, Status> {
        Err(Status::unimplemented("not in the stand-in"))
    }

    async fn get(
        &self,
        _: Request<GetPodResourcesRequest>,
    ) -> Result<Response<GetPodResourcesResponse>, Status> {
        Err(Status::unimplemented("not in the stand-in"))
    }
}

/// The stand-in kubelet; its servers stop when it is dropped.
pub struct Kubelet {
    pub dir: tempfile::TempDir,
    runtime: Runtime,
    registrations: Shared<Vec<RegisterRequest>>,
    pods: Shared<Vec<PodResources>>,
    servers: Vec<JoinHandle<()>>,
}

impl Kubelet {
    pub fn start() -> Kubelet {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime");
        let mut kubelet = Kubelet {
            dir: tempfile::tempdir().expect("temp dir"),
            runtime,
            registrations: Arc::default(),
            pods: Arc::default(),
            servers: Vec::new(),
        };
        std::fs::create_dir(kubelet.device_plugin_dir()).expect("device plugin dir");
        kubelet.serve();
        kubelet
    }

    pub fn device_plugin_dir(&self) -> PathBuf {
        self.dir.path().join("device-plugins")
    }

    pub fn pod_resources_socket(&self) -> PathBuf {
        self.dir.path().join("pod-resources.sock")
    }

    fn serve(&mut self) {
        let _in = self.runtime.enter();
        let registration =
            uds::listen(&self.device_plugin_dir().join("kubelet.sock")).expect("kubelet.sock");
        let lister = uds::listen(&self.pod_resources_socket()).expect("pod resources socket");
        let (registry, pods) = (self.registrations.clone(), self.pods.clone());
        self.servers.push(self.runtime.spawn(async move {
            let _ = Server::builder()
                .add_service(RegistrationServer::new(Registry(registry)))
                .serve_with_incoming(UnixListenerStream::new(registration))
                .await;
        }));
        self.servers.push(self.runtime.spawn(async move {
            let _ = Server::builder()
                .add_service(PodResourcesListerServer::new(Lister(pods)))
                .serve_with_incoming(UnixListenerStream::new(lister))
                .await;
        }));
    }

    /// What plugins have registered, in order.
    pub fn registrations(&self) -> Vec<RegisterRequest> {
        lock(&self.registrations).clone()
    }

    /// The pods `List` answers with from now on.
    pub fn set_pods(&self, pods: Vec<PodResources>) {
        *lock(&self.pods) = pods;
    }

    /// Stops, removes every socket in the device plugin directory (the plugins' too), and
    /// starts again, as a restarting kubelet does.
    pub fn restart(&mut self) {
        self.servers.drain(..).for_each(|s| s.abort());
        for entry in std::fs::read_dir(self.device_plugin_dir())
            .expect("read dir")
            .flatten()
        {
            let _ = std::fs::remove_file(entry.path());
        }
        self.serve();
    }

    /// A client of the plugin listening on `endpoint` in the device plugin directory.
    pub fn plugin(&self, endpoint: &str) -> DevicePluginClient<Channel> {
        let path = self.device_plugin_dir().join(endpoint);
        let channel = self
            .block_on(uds::connect(&path))
            .unwrap_or_else(|e| panic!("cannot reach the plugin at {}: {e}", path.display()));
        DevicePluginClient::new(channel)
    }

    pub fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.runtime.block_on(f)
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.servers.drain(..).for_each(|s| s.abort());
    }
}

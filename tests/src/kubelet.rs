//! A stand-in kubelet for the kubelet plugin's tests (tests/k8s.rs): it speaks the kubelet's
//! real gRPC APIs over Unix sockets, from the same generated code the plugin uses. It serves
//! `Registration` on `kubelet.sock` in a device plugin directory and `PodResourcesLister` on a
//! socket of its own (listing the pods the test sets), calls the plugin's `DevicePlugin`,
//! restarts as a kubelet does (every socket in the directory is removed), and writes pods'
//! service-account tokens where and as the kubelet projects them.

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
        std::fs::create_dir(kubelet.pods_dir()).expect("pods dir");
        kubelet.serve();
        kubelet
    }

    pub fn device_plugin_dir(&self) -> PathBuf {
        self.dir.path().join("device-plugins")
    }

    pub fn pod_resources_socket(&self) -> PathBuf {
        self.dir.path().join("pod-resources.sock")
    }

    /// The kubelet's `pods/` directory (`/var/lib/kubelet/pods`).
    pub fn pods_dir(&self) -> PathBuf {
        self.dir.path().join("pods")
    }

    /// Writes pod `uid`'s service-account token with `claims` (its payload) as the kubelet
    /// projects it: `pods/UID/volumes/kubernetes.io~projected/kube-api-access-x/token`, a
    /// link into the timestamped directory that `..data` links to (the kubelet's atomic
    /// writer). The signature is none: nothing on the node checks it.
    pub fn project_token(&self, uid: &str, claims: &serde_json::Value) {
        let volume = self
            .pods_dir()
            .join(uid)
            .join("volumes/kubernetes.io~projected/kube-api-access-x");
        let stamped = volume.join("..2025_01_01_00_00_00.1");
        std::fs::create_dir_all(&stamped).expect("volume dir");
        let jwt = format!(
            "{}.{}.{}",
            base64url(br#"{"alg":"RS256","kid":"stand-in"}"#),
            base64url(claims.to_string().as_bytes()),
            base64url(b"unsigned")
        );
        std::fs::write(stamped.join("token"), jwt).expect("token");
        std::os::unix::fs::symlink("..2025_01_01_00_00_00.1", volume.join("..data"))
            .expect("..data");
        std::os::unix::fs::symlink("..data/token", volume.join("token")).expect("token link");
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

/// Unpadded base64url, as a JWT's parts are written.
fn base64url(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..=chunk.len() {
            out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
        }
    }
    out
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.servers.drain(..).for_each(|s| s.abort());
    }
}

//! gpushare's kubelet plugin (issue 33, docs/kubernetes.md) against a stand-in kubelet that
//! speaks the kubelet's real gRPC APIs (tests/src/kubelet.rs) and a sim gpushared: the plugin
//! registers and advertises each GPU's shares; `Allocate` grants the shares in gpushared and
//! answers with a CDI device whose spec gives the container its own socket, gpushare's
//! libraries and the environment; a consolidated program run as that spec says runs on the
//! shares' quota (past it, CUDA's out-of-memory error); the pod's namespace sets the class;
//! a pod whose projected service-account token names a mapped service account counts as the
//! policy's user with that user's class, one without a token falls back to its namespace; the
//! grant ends when the pod is gone; a restarted kubelet gets the plugin registered again.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use gpushare_k8s::api::v1::{ContainerDevices, ContainerResources, PodResources};
use gpushare_k8s::api::v1beta1::device_plugin_client::DevicePluginClient;
use gpushare_k8s::api::v1beta1::{AllocateRequest, ContainerAllocateRequest, Device, Empty};
use gpushare_tests::kubelet::Kubelet;
use gpushare_tests::{Broker, BrokerOptions, binary, wait_until};

const SHARDS_PER_GPU: u32 = 64;
const ENDPOINT: &str = "gpushare-shard.sock";
const WAIT: Duration = Duration::from_secs(30);
const MIB: u64 = 1 << 20;

const POLICY: &str =
    "[kubernetes]\nshards_per_gpu = 64\n[kubernetes.namespaces]\nml-prod = \"high\"\n";

/// The plugin, killed when dropped.
struct Plugin {
    child: Child,
    cdi_dir: tempfile::TempDir,
    lib_dir: tempfile::TempDir,
}

impl Drop for Plugin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// gpushare's libraries laid out as installed (`libgpushare_audit.so`, `cuda/libcuda.so.1`),
/// as links to this build's.
fn lib_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::create_dir(dir.path().join("cuda")).expect("mkdir");
    let link = |from: &str, to: &str| {
        std::os::unix::fs::symlink(binary(from), dir.path().join(to)).expect("symlink")
    };
    link("libgpushare_audit.so", "libgpushare_audit.so");
    link("libcuda.so", "cuda/libcuda.so.1");
    dir
}

fn start_plugin(broker: &Broker, kubelet: &Kubelet) -> Plugin {
    let cdi_dir = tempfile::tempdir().expect("temp dir");
    let lib_dir = lib_dir();
    Plugin {
        child: spawn_plugin(broker, kubelet, cdi_dir.path(), lib_dir.path()),
        cdi_dir,
        lib_dir,
    }
}

impl Plugin {
    /// Kills the plugin and starts another with the same directories.
    fn restart(&mut self, broker: &Broker, kubelet: &Kubelet) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.child = spawn_plugin(broker, kubelet, self.cdi_dir.path(), self.lib_dir.path());
    }
}

fn spawn_plugin(broker: &Broker, kubelet: &Kubelet, cdi_dir: &Path, lib_dir: &Path) -> Child {
    Command::new(binary("gpushare-k8s-plugin"))
        .arg("--socket")
        .arg(&broker.socket)
        .arg("--device-plugin-dir")
        .arg(kubelet.device_plugin_dir())
        .arg("--pod-resources")
        .arg(kubelet.pod_resources_socket())
        .arg("--kubelet-pods-dir")
        .arg(kubelet.pods_dir())
        .arg("--cdi-dir")
        .arg(cdi_dir)
        .arg("--lib-dir")
        .arg(lib_dir)
        .args(["--shards-per-gpu", &SHARDS_PER_GPU.to_string()])
        .args(["--interval-ms", "50"])
        .env("RUST_LOG", "warn")
        .spawn()
        .expect("start the plugin")
}

fn pod(namespace: &str, name: &str, ids: &[String]) -> PodResources {
    PodResources {
        name: name.into(),
        namespace: namespace.into(),
        containers: vec![ContainerResources {
            name: "main".into(),
            devices: vec![ContainerDevices {
                resource_name: "gpushare.io/shard".into(),
                device_ids: ids.to_vec(),
                topology: None,
            }],
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// The devices the plugin advertises, once it has some.
fn advertised(
    kubelet: &Kubelet,
    client: &mut DevicePluginClient<tonic::transport::Channel>,
) -> Vec<Device> {
    let mut watch = kubelet
        .block_on(client.list_and_watch(Empty {}))
        .expect("ListAndWatch")
        .into_inner();
    loop {
        let listed = kubelet
            .block_on(watch.message())
            .expect("a device list")
            .expect("the stream goes on");
        if !listed.devices.is_empty() {
            return listed.devices;
        }
    }
}

/// `Allocate` for one container holding `ids`: the job gpushared numbered for them.
fn allocate(
    kubelet: &Kubelet,
    client: &mut DevicePluginClient<tonic::transport::Channel>,
    ids: &[String],
) -> u64 {
    let answer = kubelet
        .block_on(client.allocate(AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: ids.to_vec(),
            }],
        }))
        .expect("Allocate")
        .into_inner();
    let name = &answer.container_responses[0].cdi_devices[0].name;
    name.split_once('=')
        .and_then(|(_, job)| job.parse().ok())
        .expect("gpushare.io/shard=JOB")
}

/// A bound service-account token's claims, as the API server issues them for a pod.
fn bound_token(namespace: &str, pod: &str, pod_uid: &str, account: &str) -> serde_json::Value {
    serde_json::json!({
        "aud": ["https://kubernetes.default.svc"],
        "iss": "https://kubernetes.default.svc",
        "sub": format!("system:serviceaccount:{namespace}:{account}"),
        "kubernetes.io": {
            "namespace": namespace,
            "pod": {"name": pod, "uid": pod_uid},
            "serviceaccount": {"name": account, "uid": "0d4691ed"}
        }
    })
}

/// The consolidated test program, built once.
fn app() -> PathBuf {
    static APP: std::sync::OnceLock<(tempfile::TempDir, PathBuf)> = std::sync::OnceLock::new();
    APP.get_or_init(|| {
        let dir = tempfile::tempdir().expect("temp dir");
        let app = dir.path().join("consolidated_app");
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("c/consolidated_app.c");
        gpushare_tests::cc::compile(&src, &["-ldl"], &app);
        (dir, app)
    })
    .1
    .clone()
}

/// The program holding `bytes` of device memory, started as the container's runtime would
/// start it under `spec`: its environment, with each mounted path read at its host path.
fn run_in_container(spec: &serde_json::Value, bytes: u64) -> Child {
    let edits = &spec["devices"][0]["containerEdits"];
    let mounts: Vec<(String, String)> = edits["mounts"]
        .as_array()
        .expect("mounts")
        .iter()
        .map(|m| {
            let s = |k: &str| m[k].as_str().expect("a path").to_string();
            (s("containerPath"), s("hostPath"))
        })
        .collect();
    let mut cmd = Command::new(app());
    cmd.args(["hold", "libcuda.so.1", &bytes.to_string()])
        .env_remove("LD_PRELOAD")
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("GPUSHARE_SOCKET")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for entry in edits["env"].as_array().expect("env") {
        let (name, value) = entry
            .as_str()
            .and_then(|e| e.split_once('='))
            .expect("NAME=VALUE");
        let host = mounts
            .iter()
            .find_map(|(inside, outside)| {
                value
                    .strip_prefix(inside.as_str())
                    .map(|rest| format!("{outside}{rest}"))
            })
            .unwrap_or_else(|| value.to_string());
        cmd.env(name, host);
    }
    cmd.spawn().expect("start the program")
}

/// The client a program run in the container is, once it said it is ready.
fn ready_client(broker: &Broker, program: &mut Child) -> gpushare::ClientStats {
    let mut line = String::new();
    BufReader::new(program.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("read");
    assert!(line.starts_with("ready"), "{line}");
    broker
        .status()
        .clients
        .into_iter()
        .find(|c| c.pid == program.id() as i32)
        .expect("the program is a client")
}

/// Lists the plugin's devices as the kubelet does and allocates `n` shares of them to one
/// container: the job, the device ids and the container's CDI spec.
fn container(
    kubelet: &Kubelet,
    plugin: &Plugin,
    n: usize,
) -> (u64, Vec<String>, serde_json::Value) {
    let mut client = kubelet.plugin(ENDPOINT);
    kubelet
        .block_on(client.get_device_plugin_options(Empty {}))
        .expect("options");
    let devices = advertised(kubelet, &mut client);
    assert_eq!(devices.len(), SHARDS_PER_GPU as usize, "one GPU's shares");
    assert!(devices.iter().all(|d| d.health == "Healthy"));
    let ids: Vec<String> = devices[..n].iter().map(|d| d.id.clone()).collect();
    let job = allocate(kubelet, &mut client, &ids);
    let spec_path = plugin
        .cdi_dir
        .path()
        .join(format!("gpushare.io-shard-{job}.json"));
    let spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&spec_path).expect("the CDI spec")).expect("json");
    assert_eq!(spec["kind"], "gpushare.io/shard");
    assert_eq!(spec["devices"][0]["name"], job.to_string());
    (job, ids, spec)
}

#[test]
fn a_container_s_shares_are_its_own_grant_through_cdi_and_end_with_its_pod() {
    let broker = Broker::start_with(BrokerOptions {
        policy: Some(POLICY.into()),
        ..BrokerOptions::default()
    });
    let kubelet = Kubelet::start();
    let plugin = start_plugin(&broker, &kubelet);

    assert!(
        wait_until(WAIT, || !kubelet.registrations().is_empty()),
        "the plugin registers"
    );
    let registered = &kubelet.registrations()[0];
    assert_eq!(
        (
            registered.version.as_str(),
            registered.resource_name.as_str(),
            registered.endpoint.as_str()
        ),
        ("v1beta1", "gpushare.io/shard", ENDPOINT)
    );

    let (job, ids, spec) = container(&kubelet, &plugin, 2);
    let spec_path = plugin
        .cdi_dir
        .path()
        .join(format!("gpushare.io-shard-{job}.json"));
    let env = &spec["devices"][0]["containerEdits"]["env"];
    assert!(
        env.as_array()
            .expect("env")
            .contains(&"GPUSHARE_SOCKET=/run/gpushare/gpushare.sock".into()),
        "{env}"
    );

    let gpu_memory = broker.status().devices[0].total_memory;
    let quota = gpu_memory * 2 / SHARDS_PER_GPU as u64;
    let held = broker
        .status()
        .jobs
        .into_iter()
        .find(|j| j.job == job)
        .expect("the job");
    assert_eq!(held.memory_quota, quota);

    // Within the shares' memory the program runs, on the job's grant.
    let mut within = run_in_container(&spec, quota / 2);
    let client = ready_client(&broker, &mut within);
    assert_eq!(client.job, Some(job));
    assert_eq!(client.memory_quota, Some(quota));
    // Past them, CUDA's out-of-memory error (2), and the broker serves on.
    let past = run_in_container(&spec, quota - quota / 2 + MIB)
        .wait_with_output()
        .expect("the second program");
    let said = String::from_utf8_lossy(&past.stderr);
    assert!(
        said.contains("cuMemAlloc") && said.trim_end().ends_with(": 2"),
        "{said}"
    );

    // The pod shows up: its namespace picks the class.
    kubelet.set_pods(vec![pod("ml-prod", "trainer-0", &ids)]);
    assert!(
        wait_until(WAIT, || broker.status().jobs.iter().any(|j| {
            j.job == job && j.pod.as_ref().is_some_and(|p| p.namespace == "ml-prod")
        })),
        "gpushare learns the pod"
    );
    let placed = broker
        .status()
        .jobs
        .into_iter()
        .find(|j| j.job == job)
        .expect("job");
    assert_eq!(placed.class.as_str(), "high");

    // The pod goes: the grant, its socket and the CDI spec go, the program is evicted.
    kubelet.set_pods(Vec::new());
    assert!(
        wait_until(WAIT, || broker.status().jobs.is_empty()),
        "the grant ends with the pod"
    );
    assert!(
        wait_until(WAIT, || !spec_path.exists()),
        "the CDI spec is removed"
    );
    let _ = within.stdin.take().map(|mut s| s.write_all(b"\n"));
    let _ = within.wait();
    assert!(
        wait_until(WAIT, || broker.status().clients.is_empty()),
        "the program's session is gone"
    );
}

#[test]
fn the_plugin_registers_again_when_the_kubelet_restarts() {
    let broker = Broker::start_with(BrokerOptions {
        policy: Some(POLICY.into()),
        ..BrokerOptions::default()
    });
    let mut kubelet = Kubelet::start();
    let _plugin = start_plugin(&broker, &kubelet);
    assert!(wait_until(WAIT, || kubelet.registrations().len() == 1));
    kubelet.restart();
    assert!(
        wait_until(WAIT, || kubelet.registrations().len() == 2),
        "registered again"
    );
    let mut client = kubelet.plugin(ENDPOINT);
    // The plugin registers before it has asked gpushared for its GPUs: its first list may be
    // empty, and the shares follow on the same stream.
    assert_eq!(
        advertised(&kubelet, &mut client).len(),
        SHARDS_PER_GPU as usize
    );
}

#[test]
fn a_pod_s_service_account_places_it_as_the_policy_s_user_and_no_token_by_namespace() {
    // alice is no user of this machine: the policy's [[users]] entry matches her by name.
    let policy = format!(
        "{POLICY}[[kubernetes.identities]]\nnamespace = \"ml-prod\"\nservice_account = \"trainer\"\nuser = \"gpushare-test-alice\"\n[[users]]\nname = \"gpushare-test-alice\"\nclass = \"best-effort\"\n"
    );
    let broker = Broker::start_with(BrokerOptions {
        policy: Some(policy),
        ..BrokerOptions::default()
    });
    let kubelet = Kubelet::start();
    let _plugin = start_plugin(&broker, &kubelet);
    assert!(wait_until(WAIT, || !kubelet.registrations().is_empty()));
    let mut client = kubelet.plugin(ENDPOINT);
    let devices = advertised(&kubelet, &mut client);
    let ids = |r: std::ops::Range<usize>| -> Vec<String> {
        devices[r].iter().map(|d| d.id.clone()).collect()
    };
    let (trainer_ids, worker_ids) = (ids(0..2), ids(2..4));
    let trainer = allocate(&kubelet, &mut client, &trainer_ids);
    let worker = allocate(&kubelet, &mut client, &worker_ids);

    kubelet.project_token(
        "uid-trainer",
        &bound_token("ml-prod", "trainer-0", "uid-trainer", "trainer"),
    );
    // worker-0 mounts no token; this one, in another pod's directory, names a pod that is
    // not that directory's.
    kubelet.project_token(
        "uid-other",
        &bound_token("ml-prod", "worker-0", "uid-elsewhere", "trainer"),
    );
    kubelet.set_pods(vec![
        pod("ml-prod", "trainer-0", &trainer_ids),
        pod("ml-prod", "worker-0", &worker_ids),
    ]);
    let placed = |job: u64| {
        broker
            .status()
            .jobs
            .into_iter()
            .find(|j| j.job == job && j.pod.is_some())
    };
    assert!(
        wait_until(WAIT, || placed(trainer).is_some()
            && placed(worker).is_some()),
        "gpushare learns both pods"
    );

    let t = placed(trainer).expect("trainer's job");
    assert_eq!(
        t.pod.and_then(|p| p.service_account).as_deref(),
        Some("trainer"),
        "read from its token"
    );
    assert_eq!(t.user, "gpushare-test-alice");
    assert_eq!(
        t.class.as_str(),
        "best-effort",
        "alice's class, not the namespace's"
    );

    let w = placed(worker).expect("worker's job");
    assert_eq!(w.pod.and_then(|p| p.service_account), None);
    assert_eq!(w.user, "kubernetes");
    assert_eq!(w.class.as_str(), "high", "the namespace's class");
}

/// A restarted gpushared takes back a container's shares, placed as its pod was, with its
/// socket in the directory the container has: the container's next program runs on them.
#[test]
fn a_restarted_gpushared_takes_back_a_container_s_shares() {
    let dir = tempfile::tempdir().expect("temp dir");
    let options = || BrokerOptions {
        policy: Some(POLICY.into()),
        socket: Some(dir.path().join("gpushare.sock")),
        ..BrokerOptions::default()
    };
    let mut broker = Broker::start_with(options());
    let kubelet = Kubelet::start();
    let plugin = start_plugin(&broker, &kubelet);
    assert!(
        wait_until(WAIT, || !kubelet.registrations().is_empty()),
        "the plugin registers"
    );
    let (job, ids, spec) = container(&kubelet, &plugin, 2);
    kubelet.set_pods(vec![pod("ml-prod", "trainer-0", &ids)]);
    let placed = |b: &Broker| {
        b.status()
            .jobs
            .iter()
            .any(|j| j.job == job && j.class.as_str() == "high" && j.pod.is_some())
    };
    assert!(wait_until(WAIT, || placed(&broker)), "placed by its pod");

    assert!(broker.terminate(WAIT).is_some(), "gpushared stops");
    broker = Broker::start_with(options());
    assert!(
        placed(&broker),
        "the same job, placed as before, from the start"
    );
    let mut program = run_in_container(&spec, MIB);
    assert_eq!(ready_client(&broker, &mut program).job, Some(job));
    let _ = program.stdin.take().map(|mut s| s.write_all(b"\n"));
    assert!(program.wait().expect("wait").success());
    // Its pod goes: the plugin ends it with the restarted gpushared too.
    kubelet.set_pods(Vec::new());
    assert!(
        wait_until(WAIT, || broker.status().jobs.is_empty()),
        "the grant ends with the pod"
    );
}

/// A restarted plugin takes over the allocations its predecessor made (from their CDI specs):
/// it places them by their pod and ends them when the pod goes.
#[test]
fn a_restarted_plugin_takes_over_its_predecessor_s_allocations() {
    let broker = Broker::start_with(BrokerOptions {
        policy: Some(POLICY.into()),
        ..BrokerOptions::default()
    });
    let kubelet = Kubelet::start();
    let mut plugin = start_plugin(&broker, &kubelet);
    assert!(
        wait_until(WAIT, || !kubelet.registrations().is_empty()),
        "the plugin registers"
    );
    let (job, ids, _spec) = container(&kubelet, &plugin, 2);
    plugin.restart(&broker, &kubelet);
    // The pod shows up only now: the new plugin places it, so it follows the allocation.
    kubelet.set_pods(vec![pod("ml-prod", "trainer-0", &ids)]);
    assert!(
        wait_until(WAIT, || broker.status().jobs.iter().any(|j| {
            j.job == job && j.pod.as_ref().is_some_and(|p| p.namespace == "ml-prod")
        })),
        "the restarted plugin places the earlier allocation by its pod"
    );
    kubelet.set_pods(Vec::new());
    assert!(
        wait_until(WAIT, || broker.status().jobs.is_empty()),
        "and ends it when its pod goes"
    );
    let spec = plugin
        .cdi_dir
        .path()
        .join(format!("gpushare.io-shard-{job}.json"));
    assert!(wait_until(WAIT, || !spec.exists()), "with its CDI spec");
}

//! Prometheus metrics: the status report in the text exposition format (version 0.0.4), and a
//! small HTTP/1.1 endpoint that serves it at `/metrics`.
//!
//! Names follow Prometheus conventions: base units (seconds, bytes), `_total` on counters,
//! one `# HELP` and `# TYPE` per family with all of its samples together. Client series are
//! labelled `client` (the broker's client id), `pid`, `user`, `name`, `class`, `kind` and `gpu`;
//! observed processes (eBPF telemetry) `pid`, `comm`, `uid` and `kind`.
//!
//! The endpoint is hyper's HTTP/1 server (request parsing, keep-alive, header limits and
//! timeouts are what hyper gets right and a hand-written parser would have to relearn), with a
//! cap on connections and on each connection's life.

use std::collections::HashSet;
use std::convert::Infallible;
use std::fmt::Write;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use gpushare_protocol::stats::{ClientStats, ProcessActivity, StatusReport, TelemetryStatus};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{ALLOW, CONTENT_TYPE, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tracing::{debug, warn};

/// The content type of the text exposition format.
pub const CONTENT_TYPE_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Connections served at once; more wait in the kernel's accept queue.
const MAX_CONNECTIONS: usize = 32;
/// Read buffer per connection, which bounds a request's head (hyper's minimum is 8 KiB).
const MAX_REQUEST_HEAD: usize = 16 * 1024;
/// A client must send a request's head within this.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// A connection is closed after this, keep-alive or not, so none holds a slot forever.
const CONNECTION_LIFETIME: Duration = Duration::from_secs(300);

/// The report as Prometheus text. Telemetry series appear once the report carries telemetry;
/// see [`render_with_telemetry`].
pub fn render(report: &StatusReport) -> String {
    render_with_telemetry(report, Some(&report.telemetry), &report.processes)
}

/// The report and the eBPF view of processes as Prometheus text.
pub fn render_with_telemetry(
    report: &StatusReport,
    telemetry: Option<&TelemetryStatus>,
    processes: &[ProcessActivity],
) -> String {
    let mut out = Exposition::default();
    let devices = if report.devices.is_empty() {
        std::slice::from_ref(&report.device)
    } else {
        &report.devices[..]
    };
    let protocol = report.protocol_version.to_string();

    out.family(
        "gpushare_build_info",
        "gauge",
        "Broker version and device backend; always 1.",
    );
    out.sample(
        "gpushare_build_info",
        &[
            ("version", &report.broker_version),
            ("backend", &report.backend),
            ("protocol", &protocol),
        ],
        1.0,
    );
    out.family(
        "gpushare_policy_info",
        "gauge",
        "The scheduling policy in force; always 1.",
    );
    out.sample("gpushare_policy_info", &[("policy", &report.policy)], 1.0);
    out.family(
        "gpushare_uptime_seconds",
        "gauge",
        "Seconds since the broker started.",
    );
    out.sample(
        "gpushare_uptime_seconds",
        &[],
        report.uptime_ms as f64 / 1e3,
    );
    out.family("gpushare_clients", "gauge", "Connected broker clients.");
    out.sample("gpushare_clients", &[], report.clients.len() as f64);
    out.family(
        "gpushare_memory_used_bytes",
        "gauge",
        "Device memory held by all clients on all devices.",
    );
    out.sample("gpushare_memory_used_bytes", &[], report.memory_used as f64);

    let gpu_labels: Vec<(String, &str)> = devices
        .iter()
        .map(|d| (d.index.to_string(), d.name.as_str()))
        .collect();
    out.family(
        "gpushare_device_info",
        "gauge",
        "A device the broker serves; always 1.",
    );
    for (d, (gpu, name)) in devices.iter().zip(&gpu_labels) {
        let cc = format!("{}.{}", d.compute_capability.0, d.compute_capability.1);
        out.sample(
            "gpushare_device_info",
            &[("gpu", gpu), ("name", name), ("compute_capability", &cc)],
            1.0,
        );
    }
    out.family(
        "gpushare_device_memory_total_bytes",
        "gauge",
        "Device memory in total.",
    );
    for (d, (gpu, _)) in devices.iter().zip(&gpu_labels) {
        out.sample(
            "gpushare_device_memory_total_bytes",
            &[("gpu", gpu)],
            d.total_memory as f64,
        );
    }
    out.family(
        "gpushare_device_memory_used_bytes",
        "gauge",
        "Device memory held by the clients on this device.",
    );
    for (d, (gpu, _)) in devices.iter().zip(&gpu_labels) {
        let used: u64 = report
            .clients
            .iter()
            .filter(|c| c.gpu == d.index)
            .map(|c| c.memory_used)
            .sum();
        out.sample(
            "gpushare_device_memory_used_bytes",
            &[("gpu", gpu)],
            used as f64,
        );
    }
    out.family(
        "gpushare_device_sms",
        "gauge",
        "Streaming multiprocessors of the device.",
    );
    for (d, (gpu, _)) in devices.iter().zip(&gpu_labels) {
        out.sample(
            "gpushare_device_sms",
            &[("gpu", gpu)],
            f64::from(d.sm_count),
        );
    }

    render_clients(&mut out, &report.clients, processes);
    if let Some(t) = telemetry {
        render_telemetry(&mut out, t, &report.clients, processes);
    }
    out.text
}

/// Per-client series: one family at a time, every client in it.
fn render_clients(out: &mut Exposition, clients: &[ClientStats], processes: &[ProcessActivity]) {
    let observed: HashSet<i32> = processes.iter().map(|p| p.pid).collect();
    let labels: Vec<[(&str, String); 7]> = clients
        .iter()
        .map(|c| {
            let kind = if c.governed {
                "governed"
            } else if observed.contains(&c.pid) {
                "both"
            } else {
                "brokered"
            };
            [
                ("client", c.client_id.to_string()),
                ("pid", c.pid.to_string()),
                ("user", c.user.clone()),
                ("name", c.name.clone()),
                ("class", c.class.as_str().to_string()),
                ("kind", kind.to_string()),
                ("gpu", c.gpu.to_string()),
            ]
        })
        .collect();
    type Get = fn(&ClientStats) -> Option<f64>;
    let families: [(&str, &str, &str, Get); 12] = [
        (
            "gpushare_client_gpu_seconds_total",
            "counter",
            "Device time of the client's kernels and copies (modelled on sim, measured on cuda).",
            |c| Some(c.gpu_time_ns as f64 / 1e9),
        ),
        (
            "gpushare_client_memory_bytes",
            "gauge",
            "Device memory the client holds.",
            |c| Some(c.memory_used as f64),
        ),
        (
            "gpushare_client_memory_peak_bytes",
            "gauge",
            "Most device memory the client has held at once.",
            |c| Some(c.memory_peak as f64),
        ),
        (
            "gpushare_client_memory_quota_bytes",
            "gauge",
            "The client's device-memory quota (absent when unlimited).",
            |c| c.memory_quota.map(|q| q as f64),
        ),
        (
            "gpushare_client_weight",
            "gauge",
            "The client's fair-share weight.",
            |c| Some(f64::from(c.weight)),
        ),
        (
            "gpushare_client_allocations_total",
            "counter",
            "Device allocations the client has made.",
            |c| Some(c.allocations as f64),
        ),
        (
            "gpushare_client_streams",
            "gauge",
            "Streams the client holds.",
            |c| Some(f64::from(c.streams)),
        ),
        (
            "gpushare_client_commands_total",
            "counter",
            "Commands the client has submitted.",
            |c| Some(c.commands as f64),
        ),
        (
            "gpushare_client_kernels_total",
            "counter",
            "Kernels the client has launched.",
            |c| Some(c.kernels as f64),
        ),
        (
            "gpushare_client_throttled_seconds_total",
            "counter",
            "Time a governed client (gpushare run) waited for launch tokens (absent for others).",
            |c| c.governed.then(|| c.throttled_ns as f64 / 1e9),
        ),
        (
            "gpushare_client_errors_total",
            "counter",
            "Commands of the client that failed.",
            |c| Some(c.errors as f64),
        ),
        (
            "gpushare_client_connected_seconds",
            "gauge",
            "Seconds since the client connected.",
            |c| Some(c.connected_ms as f64 / 1e3),
        ),
    ];
    for (name, kind, help, get) in &families {
        out.family(name, kind, help);
        for (c, l) in clients.iter().zip(&labels) {
            if let Some(v) = get(c) {
                out.sample(name, &borrow(l), v);
            }
        }
    }
    let copied = "gpushare_client_copied_bytes_total";
    out.family(
        copied,
        "counter",
        "Bytes the client has copied, by direction.",
    );
    for (c, l) in clients.iter().zip(&labels) {
        for (direction, bytes) in [
            ("htod", c.bytes_htod),
            ("dtoh", c.bytes_dtoh),
            ("dtod", c.bytes_dtod),
        ] {
            let mut labels = borrow(l);
            labels.push(("direction", direction));
            out.sample(copied, &labels, bytes as f64);
        }
    }
}

/// Series from eBPF telemetry: whether it runs, and each process's driver calls.
fn render_telemetry(
    out: &mut Exposition,
    telemetry: &TelemetryStatus,
    clients: &[ClientStats],
    processes: &[ProcessActivity],
) {
    out.family(
        "gpushare_telemetry_enabled",
        "gauge",
        "1 when eBPF telemetry runs, else 0.",
    );
    out.sample(
        "gpushare_telemetry_enabled",
        &[],
        if telemetry.enabled { 1.0 } else { 0.0 },
    );
    let brokered: HashSet<i32> = clients.iter().map(|c| c.pid).collect();
    let governed: HashSet<i32> = clients
        .iter()
        .filter(|c| c.governed)
        .map(|c| c.pid)
        .collect();
    let labels: Vec<[(&str, String); 4]> = processes
        .iter()
        .map(|p| {
            let kind = if governed.contains(&p.pid) {
                "governed"
            } else if brokered.contains(&p.pid) {
                "both"
            } else {
                "observed"
            };
            [
                ("pid", p.pid.to_string()),
                ("comm", p.comm.clone()),
                ("uid", p.uid.to_string()),
                ("kind", kind.to_string()),
            ]
        })
        .collect();
    type Get = fn(&ProcessActivity) -> f64;
    let mut families: Vec<(&str, &str, &str, Get)> = vec![(
        "gpushare_process_gpu_fds",
        "gauge",
        "GPU device descriptors the process holds.",
        |p| f64::from(p.gpu_fds),
    )];
    if telemetry.uprobes {
        families.extend([
            (
                "gpushare_process_launches_total",
                "counter",
                "Kernel launches through libcuda (uprobes).",
                (|p: &ProcessActivity| p.launches as f64) as Get,
            ),
            (
                "gpushare_process_allocs_total",
                "counter",
                "Device allocations through libcuda (uprobes).",
                |p| p.allocs as f64,
            ),
            (
                "gpushare_process_frees_total",
                "counter",
                "Device frees through libcuda (uprobes).",
                |p| p.frees as f64,
            ),
            (
                "gpushare_process_contexts_created_total",
                "counter",
                "CUDA contexts created or retained through libcuda (uprobes).",
                |p| p.ctx_creates as f64,
            ),
        ]);
    }
    for (name, kind, help, get) in &families {
        out.family(name, kind, help);
        for (p, l) in processes.iter().zip(&labels) {
            out.sample(name, &borrow(l), get(p));
        }
    }
    type GetIoctl = fn(&gpushare_protocol::stats::IoctlStats) -> f64;
    let ioctl_families: [(&str, &str, GetIoctl); 3] = [
        (
            "gpushare_process_ioctls_total",
            "NVIDIA driver ioctls of the process, by command.",
            |i| i.count as f64,
        ),
        (
            "gpushare_process_ioctl_errors_total",
            "NVIDIA driver ioctls of the process that failed, by command.",
            |i| i.errors as f64,
        ),
        (
            "gpushare_process_ioctl_seconds_total",
            "Time the process spent in NVIDIA driver ioctls, by command.",
            |i| i.total_ns as f64 / 1e9,
        ),
    ];
    for (name, help, get) in ioctl_families {
        out.family(name, "counter", help);
        for (p, l) in processes.iter().zip(&labels) {
            for i in &p.ioctls {
                let mut labels = borrow(l);
                labels.push(("ioctl", &i.name));
                out.sample(name, &labels, get(i));
            }
        }
    }
}

fn borrow<'a, const N: usize>(labels: &'a [(&'a str, String); N]) -> Vec<(&'a str, &'a str)> {
    labels.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

/// Text being built, with the format's escaping rules.
#[derive(Default)]
struct Exposition {
    text: String,
}

impl Exposition {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.text, "# HELP {name} {}", escape(help, false));
        let _ = writeln!(self.text, "# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.text.push_str(name);
        if !labels.is_empty() {
            self.text.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.text.push(',');
                }
                let _ = write!(self.text, "{k}=\"{}\"", escape(v, true));
            }
            self.text.push('}');
        }
        let _ = writeln!(self.text, " {}", number(value));
    }
}

/// Escapes per the format: `\` and newline everywhere, `"` in label values.
fn escape(s: &str, quotes: bool) -> std::borrow::Cow<'_, str> {
    if !s.contains(['\\', '\n', '"']) {
        return s.into();
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '"' if quotes => out.push_str("\\\""),
            c => out.push(c),
        }
    }
    out.into()
}

/// A sample value as the format spells it (Go's float syntax for the specials).
fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        format!("{v}")
    }
}

/// Serves `/metrics` on `addr` until `shutdown` completes.
pub async fn serve(
    addr: SocketAddr,
    snapshot: impl Fn() -> StatusReport + Send + Sync + 'static,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let listener = TcpListener::bind(addr).await?;
    serve_on(listener, move || render(&snapshot()), shutdown).await
}

/// Serves `/metrics` on a bound listener (bind first to report a busy address at start-up,
/// or to test on port 0); `body` renders the page for each scrape.
pub async fn serve_on(
    listener: TcpListener,
    body: impl Fn() -> String + Send + Sync + 'static,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let body = Arc::new(body);
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            slot = slots.clone().acquire_owned() => {
                // The semaphore is never closed, so this only fails if that changes.
                let Ok(slot) = slot else { break };
                let (stream, peer) = tokio::select! {
                    () = &mut shutdown => break,
                    accepted = listener.accept() => match accepted {
                        Ok(a) => a,
                        Err(e) => {
                            // Out of descriptors and the like: wait rather than spin.
                            warn!(error = %e, "metrics endpoint cannot accept a connection");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            continue;
                        }
                    },
                };
                let body = body.clone();
                connections.spawn(async move {
                    let _slot = slot;
                    let service = hyper::service::service_fn(move |req| {
                        let body = body.clone();
                        async move { Ok::<_, Infallible>(respond(&req, || body())) }
                    });
                    let conn = hyper::server::conn::http1::Builder::new()
                        .timer(TokioTimer::new())
                        .header_read_timeout(HEADER_TIMEOUT)
                        .max_buf_size(MAX_REQUEST_HEAD)
                        .serve_connection(TokioIo::new(stream), service);
                    match tokio::time::timeout(CONNECTION_LIFETIME, conn).await {
                        Ok(Err(e)) => debug!(%peer, error = %e, "metrics connection failed"),
                        Err(_) => debug!(%peer, "metrics connection closed at its time limit"),
                        Ok(Ok(())) => {}
                    }
                });
            }
        }
    }
    Ok(())
}

fn respond(req: &Request<Incoming>, body: impl FnOnce() -> String) -> Response<Full<Bytes>> {
    let reply = |status: StatusCode, text: &'static str| {
        let mut r = Response::new(Full::new(Bytes::from_static(text.as_bytes())));
        *r.status_mut() = status;
        r.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        r
    };
    if req.uri().path() != "/metrics" {
        return reply(
            StatusCode::NOT_FOUND,
            "not found: metrics are at /metrics\n",
        );
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut r = reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "only GET and HEAD are allowed on /metrics\n",
        );
        r.headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    let mut r = Response::new(Full::new(Bytes::from(body())));
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE_TEXT));
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpushare_protocol::PriorityClass;
    use gpushare_protocol::control::DeviceInfo;
    use gpushare_protocol::stats::IoctlStats;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn device(index: u32) -> DeviceInfo {
        DeviceInfo {
            index,
            name: "gpushare sim".into(),
            total_memory: 16 << 30,
            sm_count: 132,
            compute_capability: (9, 0),
            fp32_flops: 6e13,
            memory_bandwidth: 3.3e12,
            host_bandwidth: 5e10,
            uuid: [0; 16],
            pci: (0, 1, 0),
            driver_version: 13000,
            attributes: Vec::new(),
        }
    }

    fn client(id: u64, pid: i32, name: &str) -> ClientStats {
        ClientStats {
            client_id: id,
            pid,
            uid: 1000,
            user: "alice".into(),
            name: name.into(),
            gpu: 0,
            class: PriorityClass::High,
            weight: 4,
            memory_used: 3 << 20,
            memory_peak: 5 << 20,
            memory_quota: Some(1 << 30),
            allocations: 7,
            streams: 2,
            commands: 1_000,
            kernels: 600,
            bytes_htod: 4_096,
            bytes_dtoh: 2_048,
            bytes_dtod: 1_024,
            gpu_time_ns: 1_500_000_000,
            errors: 3,
            connected_ms: 2_500,
            bypassing: false,
            queue_depth: 0,
            latency_p50_ns: None,
            latency_p99_ns: None,
            governed: false,
            throttled_ns: 0,
            consolidated: false,
        }
    }

    fn report() -> StatusReport {
        let mut b = client(9, 200, "notebook");
        b.memory_quota = None;
        b.class = PriorityClass::BestEffort;
        b.gpu = 1;
        StatusReport {
            broker_version: "0.1.0".into(),
            protocol_version: 1,
            backend: "sim".into(),
            device: device(0),
            devices: vec![device(0), device(1)],
            uptime_ms: 65_500,
            policy: "fifo".into(),
            memory_used: 6 << 20,
            clients: vec![client(7, 100, "trainer"), b],
            telemetry: gpushare_protocol::stats::TelemetryStatus {
                enabled: false,
                reason: Some("not in this test".into()),
                dev_prefix: "/dev/nvidia".into(),
                uprobes: false,
            },
            processes: Vec::new(),
            outside_load: Default::default(),
        }
    }

    fn parse(text: &str) -> prometheus_parse::Scrape {
        let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string())))
            .expect("parse");
        // The parser skips lines it cannot read; every sample line must have become a sample.
        let lines = text.lines().filter(|l| !l.starts_with('#')).count();
        assert_eq!(scrape.samples.len(), lines, "unparsed lines in:\n{text}");
        scrape
    }

    fn value(scrape: &prometheus_parse::Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
        let found: Vec<_> = scrape
            .samples
            .iter()
            .filter(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(v)))
            .collect();
        assert_eq!(found.len(), 1, "{name} {labels:?}: {found:?}");
        match found[0].value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            ref other => panic!("{name}: unexpected {other:?}"),
        }
    }

    #[test]
    fn renders_conventional_names_types_labels_and_values() {
        let text = render(&report());
        let scrape = parse(&text);
        let trainer = [
            ("client", "7"),
            ("pid", "100"),
            ("user", "alice"),
            ("name", "trainer"),
            ("class", "high"),
            ("kind", "brokered"),
            ("gpu", "0"),
        ];
        assert_eq!(
            value(&scrape, "gpushare_client_gpu_seconds_total", &trainer),
            1.5
        );
        assert_eq!(
            value(&scrape, "gpushare_client_memory_bytes", &trainer),
            3_145_728.0
        );
        assert_eq!(
            value(&scrape, "gpushare_client_memory_quota_bytes", &trainer),
            1_073_741_824.0
        );
        assert_eq!(
            value(&scrape, "gpushare_client_kernels_total", &trainer),
            600.0
        );
        assert_eq!(
            value(&scrape, "gpushare_client_commands_total", &trainer),
            1_000.0
        );
        assert_eq!(
            value(&scrape, "gpushare_client_errors_total", &trainer),
            3.0
        );
        for (direction, bytes) in [("htod", 4_096.0), ("dtoh", 2_048.0), ("dtod", 1_024.0)] {
            let mut labels = trainer.to_vec();
            labels.push(("direction", direction));
            assert_eq!(
                value(&scrape, "gpushare_client_copied_bytes_total", &labels),
                bytes
            );
        }
        let notebook = [("client", "9"), ("class", "best-effort"), ("gpu", "1")];
        assert_eq!(
            value(&scrape, "gpushare_client_memory_bytes", &notebook),
            3_145_728.0
        );
        assert!(
            !text.contains("gpushare_client_memory_quota_bytes{client=\"9\""),
            "no quota series for an unlimited client"
        );
        assert_eq!(value(&scrape, "gpushare_clients", &[]), 2.0);
        assert_eq!(value(&scrape, "gpushare_uptime_seconds", &[]), 65.5);
        assert_eq!(
            value(&scrape, "gpushare_memory_used_bytes", &[]),
            6_291_456.0
        );
        assert_eq!(
            value(
                &scrape,
                "gpushare_device_memory_total_bytes",
                &[("gpu", "1")]
            ),
            17_179_869_184.0
        );
        assert_eq!(
            value(
                &scrape,
                "gpushare_device_memory_used_bytes",
                &[("gpu", "1")]
            ),
            3_145_728.0
        );
        assert_eq!(
            value(
                &scrape,
                "gpushare_build_info",
                &[("version", "0.1.0"), ("backend", "sim"), ("protocol", "1")]
            ),
            1.0
        );
        // Types as declared, and every family has its HELP.
        let kind = |name: &str| {
            scrape
                .samples
                .iter()
                .find(|s| s.metric == name)
                .map(|s| std::mem::discriminant(&s.value))
        };
        let counter = std::mem::discriminant(&prometheus_parse::Value::Counter(0.0));
        let gauge = std::mem::discriminant(&prometheus_parse::Value::Gauge(0.0));
        for s in &scrape.samples {
            assert!(
                scrape.docs.contains_key(&s.metric),
                "{} has no HELP",
                s.metric
            );
            let expected = if s.metric.ends_with("_total") {
                counter
            } else {
                gauge
            };
            assert_eq!(kind(&s.metric), Some(expected), "{}", s.metric);
        }
        // One TYPE line per family: all of a family's samples follow it.
        let types: Vec<&str> = text.lines().filter(|l| l.starts_with("# TYPE")).collect();
        let unique: HashSet<&&str> = types.iter().collect();
        assert_eq!(types.len(), unique.len());
    }

    #[test]
    fn label_values_and_help_are_escaped() {
        let mut r = report();
        r.clients[0].name = "say \"hi\"\\now\nnext".into();
        let text = render(&r);
        assert!(
            text.contains(r#"name="say \"hi\"\\now\nnext""#),
            "escaped label in:\n{text}"
        );
        assert_eq!(text.lines().filter(|l| l.contains("say")).count(), 14);
        assert_eq!(escape("a\\b\nc\"d", false), "a\\\\b\\nc\"d");
        assert_eq!(number(f64::NAN), "NaN");
        assert_eq!(number(f64::INFINITY), "+Inf");
        assert_eq!(number(f64::NEG_INFINITY), "-Inf");
        assert_eq!(number(3.0), "3");
        assert_eq!(number(0.25), "0.25");
        parse(&text);
    }

    #[test]
    fn telemetry_adds_process_series_and_kinds() {
        let r = report();
        let telemetry = TelemetryStatus {
            enabled: true,
            reason: None,
            dev_prefix: "/dev/nvidia".into(),
            uprobes: true,
        };
        let process = |pid: i32, comm: &str| ProcessActivity {
            pid,
            comm: comm.into(),
            uid: 0,
            first_seen_ns: 1,
            last_seen_ns: 2,
            ioctls: vec![IoctlStats {
                cmd: 0x2a,
                name: "RM_CONTROL".into(),
                count: 40,
                errors: 1,
                total_ns: 2_000_000,
                arg_bytes: 64,
            }],
            launches: 12,
            allocs: 3,
            frees: 2,
            ctx_creates: 1,
            gpu_fds: 4,
            kind: gpushare_protocol::stats::ProcessKind::Observed,
            client_id: None,
        };
        let processes = [process(100, "trainer"), process(300, "python3")];
        let text = render_with_telemetry(&r, Some(&telemetry), &processes);
        let scrape = parse(&text);
        assert_eq!(
            value(
                &scrape,
                "gpushare_client_kernels_total",
                &[("client", "7"), ("kind", "both")]
            ),
            600.0
        );
        assert_eq!(value(&scrape, "gpushare_telemetry_enabled", &[]), 1.0);
        let py = [
            ("pid", "300"),
            ("comm", "python3"),
            ("kind", "observed"),
            ("uid", "0"),
        ];
        let mut rm = py.to_vec();
        rm.push(("ioctl", "RM_CONTROL"));
        assert_eq!(value(&scrape, "gpushare_process_ioctls_total", &rm), 40.0);
        assert_eq!(
            value(&scrape, "gpushare_process_ioctl_errors_total", &rm),
            1.0
        );
        assert_eq!(
            value(&scrape, "gpushare_process_ioctl_seconds_total", &rm),
            0.002
        );
        assert_eq!(value(&scrape, "gpushare_process_launches_total", &py), 12.0);
        assert_eq!(value(&scrape, "gpushare_process_gpu_fds", &py), 4.0);
        assert_eq!(
            value(
                &scrape,
                "gpushare_process_ioctls_total",
                &[("pid", "100"), ("kind", "both")]
            ),
            40.0
        );
    }

    /// One request on a fresh connection; the whole response as text.
    async fn get(addr: SocketAddr, request: &[u8]) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
        s.write_all(request).await.expect("write");
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
        String::from_utf8_lossy(&out).into_owned()
    }

    #[tokio::test]
    async fn serves_metrics_over_http_and_survives_garbage() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve_on(listener, || render(&report()), async {
            let _ = stopped.await;
        }));

        let ok = get(
            addr,
            b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .await;
        let (head, body) = ok.split_once("\r\n\r\n").expect("head and body");
        assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
        assert!(
            head.to_ascii_lowercase()
                .contains("content-type: text/plain; version=0.0.4; charset=utf-8"),
            "{head}"
        );
        assert_eq!(value(&parse(body), "gpushare_clients", &[]), 2.0);

        // Two requests on one keep-alive connection.
        let two = b"GET /metrics?x=1 HTTP/1.1\r\nHost: x\r\n\r\nGET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
        assert_eq!(get(addr, two).await.matches("HTTP/1.1 200 OK").count(), 2);

        assert!(
            get(
                addr,
                b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            )
            .await
            .starts_with("HTTP/1.1 404")
        );
        let post = get(
            addr,
            b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert!(post.starts_with("HTTP/1.1 405"), "{post}");
        let head = get(
            addr,
            b"HEAD /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert!(
            head.starts_with("HTTP/1.1 200") && !head.contains("# HELP"),
            "{head}"
        );

        // Garbage, binary, and a head larger than the limit: an error or a close, never a crash.
        let garbage = get(addr, b"\x00\xff\r\n\r\nnot http at all\r\n\r\n").await;
        assert!(
            garbage.is_empty() || garbage.starts_with("HTTP/1.1 400"),
            "{garbage}"
        );
        let mut huge = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: ".to_vec();
        huge.extend(std::iter::repeat_n(b'a', 64 * 1024));
        huge.extend_from_slice(b"\r\n\r\n");
        let big = get(addr, &huge).await;
        assert!(
            big.is_empty() || big.starts_with("HTTP/1.1 431"),
            "{}",
            &big[..big.len().min(200)]
        );
        // A client that connects and says nothing does not block others.
        let _silent = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let again = get(addr, b"GET /metrics HTTP/1.0\r\n\r\n").await;
        assert!(
            again.starts_with("HTTP/1.0 200") || again.starts_with("HTTP/1.1 200"),
            "{again}"
        );

        let _ = stop.send(());
        let done = tokio::time::timeout(Duration::from_secs(5), server).await;
        assert!(
            matches!(done, Ok(Ok(Ok(())))),
            "server stops on shutdown: {done:?}"
        );
    }
}

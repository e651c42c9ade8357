//! `gpushared --metrics-listen`: a real scrape of the live endpoint, and the Grafana dashboard
//! (`packaging/grafana/gpushare.json`) against it: every series and label it queries must be
//! in a scrape of a sim broker with clients of each kind.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use gpushare_protocol::control::Role;
use gpushare_tests::raw::RawClient;
use gpushare_tests::{Broker, BrokerOptions, binary, wait_until};

fn scrape(addr: &str, request: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).expect("connect to metrics endpoint");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    s.write_all(request.as_bytes()).expect("send");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

/// Where the broker serves its metrics, from its log (said just after it takes clients, so
/// it may come a moment after the socket answers).
fn metrics_address(broker: &Broker) -> String {
    broker.wait_for_log(
        "metrics endpoint listening",
        std::time::Duration::from_secs(10),
    );
    let line = broker
        .log_text()
        .lines()
        .find(|l| l.contains("metrics endpoint listening"))
        .map(str::to_string);
    line.as_deref()
        .and_then(|l| l.split("http://").nth(1))
        .and_then(|rest| rest.split('/').next())
        .expect("the broker logs where metrics are served")
        .to_string()
}

#[test]
fn the_metrics_endpoint_serves_live_client_figures() {
    let broker = Broker::start_with(BrokerOptions {
        extra_args: vec!["--metrics-listen".into(), "127.0.0.1:0".into()],
        ..Default::default()
    });
    let addr = metrics_address(&broker);
    let client = broker.client_named("scraped");
    let buf = client.alloc::<f32>(1024).expect("alloc");
    client
        .launch(
            &client.default_stream(),
            gpushare::Kernel::FillF32 {
                dst: buf.ptr(),
                n: 1024,
                value: 1.0,
            },
        )
        .expect("fill");
    client.synchronize().expect("sync");

    let response = scrape(
        &addr,
        "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(response.contains("text/plain; version=0.0.4"), "{response}");
    assert!(response.contains("gpushare_clients 1"), "{response}");
    let memory = response
        .lines()
        .find(|l| l.starts_with("gpushare_client_memory_bytes{") && l.contains("name=\"scraped\""))
        .expect("a memory sample for the client");
    assert!(memory.ends_with(" 4096"), "{memory}");
    let kernels = response
        .lines()
        .find(|l| l.starts_with("gpushare_client_kernels_total{") && l.contains("name=\"scraped\""))
        .expect("a kernel counter for the client");
    assert!(kernels.ends_with(" 1"), "{kernels}");
    let missing = scrape(
        &addr,
        "GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert!(missing.starts_with("HTTP/1.1 404"), "{missing}");
}

/// Labels Prometheus adds to every series it scrapes: no exporter serves them.
const TARGET_LABELS: [&str; 2] = ["instance", "job"];

/// Each series of a scrape with the label names it carries.
fn series(scrape: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in scrape.lines().filter(|l| l.starts_with("gpushare_")) {
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        let labels = out.entry(line[..name_end].to_string()).or_default();
        if let Some(body) = line[name_end..]
            .strip_prefix('{')
            .and_then(|rest| rest.split_once('}'))
            .map(|(body, _)| body)
        {
            // Label values here hold no `,` or `=`: split on the `="` that starts each value.
            for pair in body.split("\",") {
                if let Some((key, _)) = pair.split_once("=\"") {
                    labels.insert(key.to_string());
                }
            }
        }
    }
    out
}

/// The `gpushare_…` series a PromQL expression reads.
fn metrics_in(expr: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = expr;
    while let Some(at) = rest.find("gpushare_") {
        let name: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        rest = &rest[at + name.len()..];
        out.insert(name);
    }
    out
}

/// The label names a PromQL expression matches on (`{user=~"$user"}`), groups by
/// (`by (client, name)`) or lists (`label_values(…, user)`).
fn labels_in(expr: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let name = |s: &str| s.trim().to_string();
    let mut rest = expr;
    while let Some(open) = rest.find('{') {
        let Some(close) = rest[open..].find('}') else {
            break;
        };
        for matcher in rest[open + 1..open + close].split(',') {
            if let Some(at) = matcher.find(['=', '!']) {
                out.insert(name(&matcher[..at]));
            }
        }
        rest = &rest[open + close..];
    }
    for clause in expr.split("by (").skip(1) {
        if let Some((list, _)) = clause.split_once(')') {
            out.extend(list.split(',').map(name));
        }
    }
    if let Some(args) = expr.strip_prefix("label_values(")
        && let Some((_, label)) = args.trim_end_matches(')').rsplit_once(',')
    {
        out.insert(name(label));
    }
    out.retain(|l| !l.is_empty());
    out
}

/// Every PromQL expression of the dashboard: its panels' queries and its variables'.
fn dashboard_queries() -> Vec<String> {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/grafana/gpushare.json");
    let text = std::fs::read_to_string(&path).expect("read the dashboard");
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let mut queries = Vec::new();
    fn walk(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(map) => {
                for (key, value) in map {
                    match (key.as_str(), value) {
                        ("expr", serde_json::Value::String(q)) => out.push(q.clone()),
                        ("query", serde_json::Value::String(q)) if q.contains("gpushare_") => {
                            out.push(q.clone())
                        }
                        _ => walk(value, out),
                    }
                }
            }
            serde_json::Value::Array(items) => items.iter().for_each(|i| walk(i, out)),
            _ => {}
        }
    }
    walk(&dashboard, &mut queries);
    queries
}

/// A process that keeps an NVIDIA-like device file (a stand-in under a private prefix) open
/// and has made ioctls on it, so that eBPF telemetry reports it as outside load.
struct OutsideProcess(std::process::Child);

impl OutsideProcess {
    fn start(device: &str) -> OutsideProcess {
        let mut child = Command::new(binary("gpushare-ioctl-child"))
            .args([format!("open={device}"), "ioctl=7".into(), "wait".into()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn gpushare-ioctl-child");
        let mut line = String::new();
        if let Some(out) = child.stdout.as_mut() {
            BufReader::new(out).read_line(&mut line).expect("read");
        }
        assert_eq!(line.trim(), "ready", "the ioctl child stopped early");
        OutsideProcess(child)
    }
}

impl Drop for OutsideProcess {
    fn drop(&mut self) {
        drop(self.0.stdin.take());
        let _ = self.0.wait();
    }
}

#[test]
fn every_series_the_dashboard_queries_is_in_a_live_scrape() {
    let queries = dashboard_queries();
    assert!(queries.len() >= 10, "few queries found: {queries:?}");
    // eBPF telemetry needs root; elsewhere the outside-load series cannot appear.
    let root = nix::unistd::geteuid().is_root();
    let standin = tempfile::tempdir().expect("temp dir");
    let prefix = standin.path().join("nvidia").to_string_lossy().into_owned();
    let mut extra_args = vec!["--metrics-listen".into(), "127.0.0.1:0".into()];
    if root {
        extra_args.extend([
            "--telemetry-dev-prefix".into(),
            prefix.clone(),
            "--no-uprobes".into(),
        ]);
    }
    let broker = Broker::start_with(BrokerOptions {
        policy: Some(
            "[defaults]\nmemory_quota = \"1 GiB\"\ngpu_memory_quota = \"512 MiB\"\n".into(),
        ),
        extra_args,
        ..Default::default()
    });
    let addr = metrics_address(&broker);

    // A library client at work (latency figures cover the last 100 ms: it must keep
    // sending), a governed one (throttled time), and a process outside the broker.
    let stop = Arc::new(AtomicBool::new(false));
    let worker = {
        let client = broker.client_named("dashboard");
        let stop = stop.clone();
        std::thread::spawn(move || {
            let buf = client.alloc::<f32>(4096).expect("alloc");
            let stream = client.default_stream();
            while !stop.load(Ordering::Relaxed) {
                stream
                    .launch(gpushare::Kernel::FillF32 {
                        dst: buf.ptr(),
                        n: 4096,
                        value: 1.0,
                    })
                    .expect("fill");
                stream.synchronize().expect("sync");
            }
        })
    };
    let _governed = RawClient::connect_as(&broker.socket, Role::Governed);
    let _outside = root.then(|| OutsideProcess::start(&format!("{prefix}-standin0")));

    let needs_ebpf = |metric: &str| metric.starts_with("gpushare_process_");
    let telemetry_on = |scrape: &str| scrape.contains("gpushare_telemetry_enabled 1");
    let mut last = String::new();
    let mut missing = Vec::new();
    let complete = wait_until(Duration::from_secs(20), || {
        last = scrape(
            &addr,
            "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        );
        let have = series(&last);
        missing.clear();
        for query in &queries {
            for metric in metrics_in(query) {
                if needs_ebpf(&metric) && !telemetry_on(&last) {
                    continue;
                }
                let Some(labels) = have.get(&metric) else {
                    missing.push(format!("{metric} (in {query})"));
                    continue;
                };
                for label in labels_in(query) {
                    if !labels.contains(&label) && !TARGET_LABELS.contains(&label.as_str()) {
                        missing.push(format!("label {label} of {metric} (in {query})"));
                    }
                }
            }
        }
        missing.is_empty()
    });
    stop.store(true, Ordering::Relaxed);
    worker.join().expect("worker");
    assert!(
        complete,
        "the dashboard queries what no scrape has:\n{}\n\nlast scrape:\n{last}",
        missing.join("\n")
    );
    if !telemetry_on(&last) {
        let _ = std::io::stderr().write_all(
            b"SKIPPED metrics: eBPF telemetry is off here, so the dashboard's gpushare_process_* series were not checked\n",
        );
    }
}

#[test]
fn the_dashboard_query_parser_finds_series_and_labels() {
    let q = r#"sum by (client, name) (rate(gpushare_client_gpu_seconds_total{instance=~"$instance", user=~"$user"}[$__rate_interval])) / gpushare_client_memory_quota_bytes{kind!="x"}"#;
    assert_eq!(
        metrics_in(q).into_iter().collect::<Vec<_>>(),
        [
            "gpushare_client_gpu_seconds_total",
            "gpushare_client_memory_quota_bytes"
        ]
    );
    assert_eq!(
        labels_in(q).into_iter().collect::<Vec<_>>(),
        ["client", "instance", "kind", "name", "user"]
    );
    assert_eq!(
        labels_in("label_values(gpushare_build_info, instance)")
            .into_iter()
            .collect::<Vec<_>>(),
        ["instance"]
    );
    let s =
        series("gpushare_clients 1\ngpushare_client_weight{client=\"1\",user=\"a\"} 1\n# HELP x\n");
    assert_eq!(s["gpushare_clients"].len(), 0);
    assert_eq!(
        s["gpushare_client_weight"].iter().collect::<Vec<_>>(),
        ["client", "user"]
    );
}

//! `gpushared --metrics-listen`: a real scrape of the live endpoint.

use std::io::{Read, Write};
use std::time::Duration;

use gpushare_tests::{Broker, BrokerOptions};

fn scrape(addr: &str, request: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).expect("connect to metrics endpoint");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    s.write_all(request.as_bytes()).expect("send");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

#[test]
fn the_metrics_endpoint_serves_live_client_figures() {
    let broker = Broker::start_with(BrokerOptions {
        extra_args: vec!["--metrics-listen".into(), "127.0.0.1:0".into()],
        ..Default::default()
    });
    let line = broker
        .log_text()
        .lines()
        .find(|l| l.contains("metrics endpoint listening"))
        .map(str::to_string);
    let addr = line
        .as_deref()
        .and_then(|l| l.split("http://").nth(1))
        .and_then(|rest| rest.split('/').next())
        .expect("the broker logs where metrics are served")
        .to_string();
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

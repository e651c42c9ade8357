//! Many client processes at once, each checking its own results.

use std::process::Stdio;
use std::time::{Duration, Instant};

use gpushare_tests::{Broker, wait_until};

#[test]
fn eight_concurrent_clients_get_correct_vector_adds_and_gemms() {
    let broker = Broker::start();
    let started = Instant::now();
    let children: Vec<_> = (0..8)
        .map(|i| {
            let workload = ["vecadd", "gemm", "mixed"][i % 3];
            broker
                .command("gpushare-demo")
                .args(["--name", &format!("client-{i}"), "--workload", workload])
                .args(["--iterations", "12", "--size", "4096", "--json"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn demo client")
        })
        .collect();
    // While they run, the broker sees several of them at once.
    let mut max_seen = 0;
    wait_until(Duration::from_secs(30), || {
        max_seen = max_seen.max(broker.status().clients.len());
        max_seen >= 4
    });
    let mut total_checked = 0;
    for (i, child) in children.into_iter().enumerate() {
        let out = child.wait_with_output().expect("wait");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "client {i} failed: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let summary: serde_json::Value = serde_json::from_str(stdout.trim()).expect("json summary");
        assert_eq!(summary["mismatches"], 0, "client {i}: {summary}");
        total_checked +=
            summary["vecadds"].as_u64().unwrap_or(0) + summary["gemms"].as_u64().unwrap_or(0);
    }
    assert_eq!(
        total_checked,
        8 * 12,
        "every iteration of every client was verified"
    );
    assert!(
        max_seen >= 4,
        "clients overlapped in time (saw at most {max_seen} at once)"
    );
    // Everything was released.
    assert!(wait_until(Duration::from_secs(5), || broker
        .status()
        .clients
        .is_empty()));
    eprintln!("8 clients finished in {:.1?}", started.elapsed());
}

#[test]
fn threads_of_one_client_share_its_session_safely() {
    let broker = Broker::start();
    let client = broker.client();
    std::thread::scope(|s| {
        for t in 0..4u32 {
            let client = client.clone();
            s.spawn(move || {
                let stream = client.create_stream().expect("stream");
                for it in 0..20u32 {
                    let n = 1000 + (t * 10 + it) as usize;
                    let buf = client.alloc::<f32>(n).expect("alloc");
                    let value = (t * 100 + it) as f32;
                    stream
                        .launch(gpushare::Kernel::FillF32 {
                            dst: buf.ptr(),
                            n: n as u64,
                            value,
                        })
                        .expect("fill");
                    stream.synchronize().expect("sync");
                    assert!(
                        buf.to_vec().expect("read").iter().all(|&v| v == value),
                        "thread {t} iteration {it}"
                    );
                }
            });
        }
    });
    client.synchronize().expect("sync");
}

//! GPU-only tests: they start `gpushared --backend cuda` and are skipped, with a printed
//! note, where no GPU is usable (set GPUSHARE_REQUIRE_GPU=1 to make that a failure).
//! The rest of the integration suite also runs on a GPU with GPUSHARE_TEST_BACKEND=cuda.

use std::process::Stdio;

use gpushare::{ErrorCode, Kernel, ModuleFormat};
use gpushare_tests::{SCALE_ADD_PTX, gpu_broker, pattern};

#[test]
fn ptx_module_runs_with_packed_parameters() {
    let Some(broker) = gpu_broker() else { return };
    let client = broker.client();
    assert_eq!(client.session().backend, "cuda");
    let module = client
        .load_module(ModuleFormat::Ptx, SCALE_ADD_PTX.as_bytes())
        .expect("load PTX");
    let f = module.function("scale_add").expect("function");
    let n = 100_003usize;
    let (hx, hy) = (pattern(n, 11), pattern(n, 12));
    let x = client.alloc::<f32>(n).expect("alloc");
    let y = client.alloc::<f32>(n).expect("alloc");
    x.copy_from_host(&hx).expect("up");
    y.copy_from_host(&hy).expect("up");
    let a = 1.75f32;
    let mut params = Vec::new();
    params.extend_from_slice(&y.ptr().to_le_bytes());
    params.extend_from_slice(&x.ptr().to_le_bytes());
    params.extend_from_slice(&a.to_le_bytes());
    params.extend_from_slice(&(n as u32).to_le_bytes());
    let stream = client.create_stream().expect("stream");
    let blocks = (n as u32).div_ceil(256);
    client
        .launch_function(&stream, &f, [blocks, 1, 1], [256, 1, 1], 0, &params)
        .expect("launch");
    stream.synchronize().expect("sync");
    let got = y.to_vec().expect("down");
    for i in 0..n {
        assert_eq!(got[i], a.mul_add(hx[i], hy[i]), "element {i}");
    }
    // Typed errors for a missing function and a broken image (with the JIT's own words).
    let err = module.function("no_such_kernel").expect_err("missing");
    assert_eq!(err.code(), Some(ErrorCode::InvalidArgument), "{err}");
    let err = client
        .load_module(
            ModuleFormat::Ptx,
            b".version 8.0\n.target sm_90\nthis is not ptx\n",
        )
        .err()
        .expect("bad PTX");
    assert_eq!(err.code(), Some(ErrorCode::InvalidArgument), "{err}");
    assert!(err.to_string().contains("cannot load module"), "{err}");
}

#[test]
fn concurrent_clients_on_the_gpu_get_correct_results() {
    let Some(broker) = gpu_broker() else { return };
    let children: Vec<_> = (0..6)
        .map(|i| {
            broker
                .command("gpushare-demo")
                .args([
                    "--name",
                    &format!("gpu-{i}"),
                    "--workload",
                    ["vecadd", "gemm", "mixed"][i % 3],
                ])
                .args(["--iterations", "30", "--size", "262144", "--json"])
                .stdout(Stdio::piped())
                .spawn()
                .expect("spawn")
        })
        .collect();
    for (i, child) in children.into_iter().enumerate() {
        let out = child.wait_with_output().expect("wait");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "client {i}: {stdout}");
        let summary: serde_json::Value = serde_json::from_str(stdout.trim()).expect("json");
        assert_eq!(summary["mismatches"], 0, "{summary}");
        assert_eq!(summary["backend"], "cuda");
    }
}

#[test]
fn gpu_time_is_measured_with_cuda_events() {
    let Some(broker) = gpu_broker() else { return };
    let client = broker.client_named("timed");
    let stream = client.create_stream().expect("stream");
    let (start, end) = (
        client.create_event().expect("event"),
        client.create_event().expect("event"),
    );
    start.record(&stream).expect("record");
    stream
        .launch(Kernel::Spin {
            micros: 3_000,
            blocks: 4,
        })
        .expect("spin");
    end.record(&stream).expect("record");
    stream.synchronize().expect("sync");
    let elapsed = end.elapsed_since(&start).expect("elapsed");
    assert!(
        elapsed.as_micros() >= 2_900 && elapsed.as_micros() < 4_000,
        "event elapsed {elapsed:?}"
    );
    // Accounting is charged by the client's data thread just after it completes commands.
    let gpu_time = || {
        broker
            .status()
            .clients
            .iter()
            .find(|c| c.name == "timed")
            .map_or(0, |c| c.gpu_time_ns)
    };
    gpushare_tests::wait_until(std::time::Duration::from_secs(2), || {
        gpu_time() >= 2_900_000
    });
    let status = broker.status();
    let ns = gpu_time();
    assert!(
        (2_900_000..4_500_000).contains(&ns),
        "GPU time from events: {ns} ns"
    );
    assert_eq!(
        status.device.sm_count, 132,
        "an H100 has 132 SMs: {:?}",
        status.device
    );
}

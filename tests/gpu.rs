//! GPU-only tests: they start `gpushared --backend cuda` and are skipped, with a printed
//! note, where no GPU is usable (set GPUSHARE_REQUIRE_GPU=1 to make that a failure).
//! The rest of the integration suite also runs on a GPU with GPUSHARE_TEST_BACKEND=cuda.

use std::process::Stdio;

use std::time::Duration;

use gpushare::{ErrorCode, Kernel, ModuleFormat, PriorityClass};
use gpushare_tests::{
    BrokerOptions, SCALE_ADD_PTX, WORKER_MAPPINGS_BELOW, gpu_broker, gpu_broker_with, host_gemm,
    mappings, pattern,
};

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
    assert_eq!(err.code(), Some(ErrorCode::NotFound), "{err}");
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
    let gpu_time = || broker.client_status("timed").map_or(0, |c| c.gpu_time_ns);
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

/// A program that thinks while its kernel runs, then queues another behind it: its data
/// thread closed the first span of device time while the kernel still ran. The second kernel
/// and its span come after the first: 2 × 30 ms are charged, not the 10 ms of thinking too, and
/// where a span's start is stamped beside the stream (`span_clock.rs`), not the overlap twice
/// (80 ms).
#[test]
fn device_time_of_work_queued_behind_running_work_is_counted_once() {
    let Some(broker) = gpu_broker() else { return };
    let client = broker.client_named("behind");
    let stream = client.create_stream().expect("stream");
    let spin = Kernel::Spin {
        micros: 30_000,
        blocks: 4,
    };
    stream.launch(spin).expect("first");
    // Longer than any spin of a normal client's data thread (--spin-max-us), shorter than
    // the kernel.
    std::thread::sleep(Duration::from_millis(10));
    stream.launch(spin).expect("second");
    stream.synchronize().expect("sync");
    let gpu_time = || broker.client_status("behind").map_or(0, |c| c.gpu_time_ns);
    gpushare_tests::wait_until(Duration::from_secs(2), || gpu_time() >= 59_000_000);
    let ns = gpu_time();
    assert!(
        (59_000_000..70_000_000).contains(&ns),
        "GPU time of two 30 ms kernels, one queued behind the other: {ns} ns"
    );
}

/// `[priority] lower_sm_share`: beside a high-priority client, a best-effort client's kernels
/// run on a green context of a quarter of the SMs, in order with what it queued before on the
/// whole GPU, and give the same results (cuBLAS GEMM and built-in kernels); once the high
/// client leaves they go back to the whole GPU, again in order.
#[test]
fn best_effort_work_on_an_sm_partition_stays_correct_and_in_order() {
    let Some(broker) = gpu_broker_with(BrokerOptions {
        policy: Some(
            "scheduler = \"priority\"\n[priority]\nlower_sm_share = 0.25\n\
             [defaults]\nclass = \"high\"\n"
                .into(),
        ),
        ..Default::default()
    }) else {
        return;
    };
    let be = gpushare::Client::connect_with(gpushare::ConnectOptions {
        class: Some(PriorityClass::BestEffort),
        ..broker.options("be")
    })
    .expect("connect best-effort");
    let (m, n, k) = (256usize, 192, 320);
    let (ha, hb) = (pattern(m * k, 21), pattern(k * n, 22));
    let a = be.alloc::<f32>(m * k).expect("alloc");
    let b = be.alloc::<f32>(k * n).expect("alloc");
    let c = be.alloc::<f32>(m * n).expect("alloc");
    a.copy_from_host(&ha).expect("up");
    b.copy_from_host(&hb).expect("up");
    let stream = be.create_stream().expect("stream");
    // C = A·B + beta·C.
    let gemm = |beta: f32| Kernel::GemmF32 {
        a: a.ptr(),
        b: b.ptr(),
        c: c.ptr(),
        m: m as u32,
        n: n as u32,
        k: k as u32,
        alpha: 1.0,
        beta,
    };
    // A long kernel, then C = value: whatever runs next must wait for both.
    let slow_fill = |value: f32| {
        stream
            .launch(Kernel::Spin {
                micros: 300_000,
                blocks: 1,
            })
            .expect("spin");
        stream
            .launch(Kernel::FillF32 {
                dst: c.ptr(),
                n: (m * n) as u64,
                value,
            })
            .expect("fill");
    };
    let ab = host_gemm(&ha, &hb, m, n, k);
    let check = |what: &str, plus: f32| {
        let got = c.to_vec().expect("down");
        for (i, (g, w)) in got.iter().zip(&ab).enumerate() {
            let w = w + plus;
            assert!(
                (g - w).abs() <= 1e-3 * w.abs().max(1.0),
                "{what}: C[{i}] = {g}, want {w}"
            );
        }
    };
    // Alone: the whole GPU (the stream's cuBLAS handle is made there).
    stream.launch(gemm(0.0)).expect("gemm");
    stream.synchronize().expect("sync");
    check("alone", 0.0);

    // Queued on the whole GPU, then a high client comes: the GEMM goes to the partition and
    // must still see C = 7.
    slow_fill(7.0);
    let high = broker.client_named("high");
    assert_eq!(high.session().class, PriorityClass::High);
    stream.launch(gemm(1.0)).expect("gemm on the partition");
    stream.synchronize().expect("sync");
    check("on a partition after work on the whole GPU", 7.0);
    assert!(
        broker.wait_for_log("SM partition made", Duration::from_secs(5)),
        "no green context was made: {}",
        broker.log_text()
    );

    // Queued on the partition, then the high client leaves: back on the whole GPU, in order.
    slow_fill(3.0);
    drop(high);
    assert!(gpushare_tests::wait_until(Duration::from_secs(5), || {
        broker.status().clients.len() == 1
    }));
    stream
        .launch(gemm(1.0))
        .expect("gemm back on the whole GPU");
    stream.synchronize().expect("sync");
    check("on the whole GPU after work on the partition", 3.0);
}

/// gpushared holding the context itself (`--in-process-device`) starts one helper that keeps
/// the CUDA driver initialised (so a restart after a fault is quicker), and the helper goes
/// when gpushared does.
#[test]
fn the_cuda_driver_holder_lives_exactly_as_long_as_gpushared() {
    let Some(mut broker) = gpu_broker_with(BrokerOptions {
        extra_args: vec!["--in-process-device".into()],
        ..Default::default()
    }) else {
        return;
    };
    let mut holders = Vec::new();
    assert!(
        gpushare_tests::wait_until(Duration::from_secs(5), || {
            holders = broker.cuda_holders();
            holders.len() == 1
        }),
        "one holder: {holders:?}"
    );
    assert!(broker.terminate(Duration::from_secs(10)).is_some());
    let holder = holders[0];
    assert!(
        gpushare_tests::wait_until(Duration::from_secs(5), || {
            !std::path::Path::new(&format!("/proc/{holder}")).exists()
                || std::fs::read_to_string(format!("/proc/{holder}/stat")).is_ok_and(|s| {
                    s.rsplit_once(')')
                        .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
                })
        }),
        "the holder {holder} outlived gpushared"
    );
}

/// Within one GPU context a client's module kernel can read memory another client allocated
/// (the broker cannot check the raw pointers a kernel follows: the README says so). Trust
/// domains are the fix: a client of another domain runs in another context, so the same read
/// faults, only its own session ends, and the owner's data stays its own.
#[test]
fn a_kernel_of_one_trust_domain_cannot_read_another_domains_memory() {
    let test = "a_kernel_of_one_trust_domain_cannot_read_another_domains_memory";
    let Some((a, b)) = gpushare_tests::other_users(test) else {
        return;
    };
    let policy = format!("[[users]]\nuid = {}\ntrust_domain = \"lab\"\n", b.uid);
    let Some(broker) = gpu_broker_with(BrokerOptions {
        policy: Some(policy),
        ..Default::default()
    }) else {
        return;
    };
    let owner = broker.client_named("owner");
    // The secret sits past the start of a large allocation, where nothing of the reader's
    // own is likely to be mapped in another context.
    let n = 16 << 20;
    let secret = owner.alloc::<f32>(n).expect("alloc");
    secret.copy_from_host(&vec![3.0; n]).expect("upload");
    let at = secret.ptr() + (n as u64 - 1024) * 4;
    let expected = 3.0 * 1024.0;

    // Same domain (user a, like root, in the default one): the read succeeds.
    let mut same = gpushare_tests::faults::Scripted::start_as(&broker, &a);
    assert!(same.run("connect").starts_with("connected"));
    let said = same.run(&format!("read-at {at:#x} 1024"));
    assert_eq!(said, format!("read {expected}"), "within one context");

    // Another domain (user b, in `lab`): the same read faults in lab's own context.
    let mut other = gpushare_tests::faults::Scripted::start_as(&broker, &b);
    assert!(other.run("connect").starts_with("connected"));
    let said = other.run(&format!("read-at {at:#x} 1024"));
    assert!(
        said.starts_with("error") && !said.contains(&expected.to_string()),
        "across domains: {said}"
    );
    let fatal = other.run("wait-fatal");
    assert!(fatal.contains("faulted the GPU"), "{fatal}");
    // The owner's domain was not touched: its data and its session are as they were.
    assert_eq!(secret.to_vec().expect("intact")[n - 1], 3.0);
    assert!(
        owner.take_device_reset().is_none(),
        "the default domain was not reset"
    );
    assert_eq!(same.run("fill"), "ok");
}

/// Device addresses come from the device worker's address space, which maps bottom-up (see
/// tests/worker_layout.rs): they must lie below where programs map their libraries and
/// mmaps, so that a consolidated program finds each one free in its own address space.
#[test]
fn device_addresses_lie_below_where_programs_map() {
    let Some(broker) = gpu_broker() else { return };
    let client = broker.client();
    let buffers: Vec<_> = [20usize << 20, 2 << 20, 256 << 20, 20 << 20]
        .into_iter()
        .map(|bytes| client.alloc::<u8>(bytes).expect("alloc"))
        .collect();
    let ours = mappings(std::process::id() as i32);
    for b in &buffers {
        let (lo, hi) = (b.ptr(), b.ptr() + b.byte_len());
        assert!(
            hi <= WORKER_MAPPINGS_BELOW,
            "device buffer at {lo:#x}..{hi:#x} is where programs map their own memory"
        );
        let clash = ours.iter().find(|(s, e, _)| *s < hi && lo < *e);
        assert!(clash.is_none(), "{lo:#x}..{hi:#x} meets {clash:#x?}");
    }
}

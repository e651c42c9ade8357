//! One client against a real broker: every command works and gives correct results.

use std::time::Duration;

use gpushare::{ErrorCode, Kernel, ModuleFormat};
use gpushare_tests::{Broker, pattern};

#[test]
fn vector_kernels_copies_and_events_give_correct_results() {
    let broker = Broker::start();
    let client = broker.client();
    let n = 10_000;
    let stream = client.create_stream().expect("stream");
    let a = client.alloc::<f32>(n).expect("alloc a");
    let b = client.alloc::<f32>(n).expect("alloc b");
    let c = client.alloc::<f32>(n).expect("alloc c");
    let (ha, hb) = (pattern(n, 1), pattern(n, 2));
    a.copy_from_host(&ha).expect("upload a");
    b.copy_from_host(&hb).expect("upload b");

    let start = client.create_event().expect("event");
    let end = client.create_event().expect("event");
    start.record(&stream).expect("record");
    stream
        .launch(Kernel::VecAddF32 {
            a: a.ptr(),
            b: b.ptr(),
            c: c.ptr(),
            n: n as u64,
        })
        .expect("launch");
    stream
        .launch(Kernel::AxpyF32 {
            x: a.ptr(),
            y: c.ptr(),
            n: n as u64,
            alpha: 2.0,
        })
        .expect("launch");
    end.record(&stream).expect("record");
    stream.synchronize().expect("sync");
    assert!(end.query().expect("query"));
    let elapsed = end.elapsed_since(&start).expect("elapsed");
    assert!(elapsed > Duration::ZERO, "modelled time advances");

    let got = c.to_vec().expect("download");
    for i in 0..n {
        assert_eq!(got[i], ha[i] + hb[i] + 2.0 * ha[i], "element {i}");
    }

    let sum = client.alloc::<f32>(1).expect("alloc");
    stream
        .launch(Kernel::ReduceSumF32 {
            x: a.ptr(),
            out: sum.ptr(),
            n: n as u64,
        })
        .expect("reduce");
    stream
        .launch(Kernel::FillF32 {
            dst: b.ptr(),
            n: 10,
            value: 7.5,
        })
        .expect("fill");
    b.memset(&stream, 0).expect("memset");
    stream
        .launch(Kernel::FillF32 {
            dst: b.ptr(),
            n: 10,
            value: 7.5,
        })
        .expect("fill");
    c.copy_from_device(&stream, &a).expect("d2d");
    stream.synchronize().expect("sync");
    let expected: f64 = ha.iter().map(|&v| v as f64).sum();
    let got_sum = sum.to_vec().expect("download")[0] as f64;
    assert!(
        (got_sum - expected).abs() / expected < 1e-5,
        "{got_sum} vs {expected}"
    );
    let bv = b.to_vec().expect("download");
    assert!(bv[..10].iter().all(|&v| v == 7.5) && bv[10..].iter().all(|&v| v == 0.0));
    assert_eq!(c.to_vec().expect("download"), ha);
}

#[test]
fn gemm_matches_a_host_reference() {
    let broker = Broker::start();
    let client = broker.client();
    let (m, n, k) = (33, 17, 65);
    let ha = pattern(m * k, 3);
    let hb = pattern(k * n, 4);
    let hc = pattern(m * n, 5);
    let a = client.alloc::<f32>(m * k).expect("alloc");
    let b = client.alloc::<f32>(k * n).expect("alloc");
    let c = client.alloc::<f32>(m * n).expect("alloc");
    a.copy_from_host(&ha).expect("up");
    b.copy_from_host(&hb).expect("up");
    c.copy_from_host(&hc).expect("up");
    let stream = client.default_stream();
    stream
        .launch(Kernel::GemmF32 {
            a: a.ptr(),
            b: b.ptr(),
            c: c.ptr(),
            m: m as u32,
            n: n as u32,
            k: k as u32,
            alpha: 1.5,
            beta: -0.5,
        })
        .expect("gemm");
    let got = c.to_vec().expect("down");
    for i in 0..m {
        for j in 0..n {
            let dot: f64 = (0..k)
                .map(|p| ha[i * k + p] as f64 * hb[p * n + j] as f64)
                .sum();
            let want = 1.5 * dot - 0.5 * hc[i * n + j] as f64;
            let g = got[i * n + j] as f64;
            assert!(
                (g - want).abs() <= 1e-3 * want.abs().max(1.0),
                "C[{i},{j}] = {g}, want {want}"
            );
        }
    }
}

#[test]
fn large_copies_round_trip_through_a_small_arena() {
    let broker = Broker::start();
    let opts = gpushare::ConnectOptions {
        arena_size: 64 * 1024,
        ..broker.options("small-arena")
    };
    let client = gpushare::Client::connect_with(opts).expect("connect");
    let data: Vec<u8> = (0..1_000_003u32)
        .map(|i| (i.wrapping_mul(31) >> 3) as u8)
        .collect();
    let buf = client.alloc::<u8>(data.len()).expect("alloc");
    buf.copy_from_host(&data).expect("upload in many chunks");
    assert_eq!(buf.to_vec().expect("download in many chunks"), data);
}

#[test]
fn errors_are_typed_and_leave_the_session_usable() {
    let broker = Broker::start();
    let client = broker.client();
    let buf = client.alloc::<f32>(16).expect("alloc");
    // A pointer range past the end of the allocation.
    let stream = client.default_stream();
    stream
        .launch(Kernel::FillF32 {
            dst: buf.ptr(),
            n: 17,
            value: 1.0,
        })
        .expect("submitted");
    let err = stream.synchronize().expect_err("reported at sync");
    assert_eq!(err.code(), Some(ErrorCode::InvalidPointer), "{err}");
    // Unknown handles.
    let err = client
        .submit_wait(gpushare::Command::StreamSync { stream: 999 })
        .expect_err("bad stream");
    assert_eq!(err.code(), Some(ErrorCode::InvalidHandle));
    let err = client.free_raw(0x1234).expect_err("bad free");
    assert_eq!(err.code(), Some(ErrorCode::InvalidPointer));
    let err = client.alloc_raw(0).expect_err("zero alloc");
    assert_eq!(err.code(), Some(ErrorCode::InvalidArgument));
    if client.session().backend == "sim" {
        // The sim refuses modules with a typed NotSupported.
        let err = client
            .load_module(ModuleFormat::Ptx, b".version 8.0\n.target sm_90\n")
            .err()
            .expect("refused");
        assert_eq!(err.code(), Some(ErrorCode::NotSupported), "{err}");
        assert!(err.to_string().contains("sim"), "{err}");
    }
    // Still fine afterwards.
    stream
        .launch(Kernel::FillF32 {
            dst: buf.ptr(),
            n: 16,
            value: 1.0,
        })
        .expect("launch");
    assert_eq!(buf.to_vec().expect("down"), vec![1.0; 16]);
    client.nop().expect("nop");
}

#[test]
fn status_reports_each_clients_usage() {
    let broker = Broker::start();
    let client = broker.client_named("accounted");
    let stream = client.create_stream().expect("stream");
    let buf = client.alloc::<f32>(1 << 16).expect("alloc");
    buf.copy_from_host(&vec![1.0; 1 << 16]).expect("up");
    stream
        .launch(Kernel::Spin {
            micros: 1_000,
            blocks: 8,
        })
        .expect("spin");
    stream
        .launch(Kernel::FillF32 {
            dst: buf.ptr(),
            n: 1 << 16,
            value: 2.0,
        })
        .expect("fill");
    stream.synchronize().expect("sync");
    let _ = buf.to_vec().expect("down");
    // Device time is charged by the client's data thread once it has read the measurement.
    let charged = || {
        let s = broker.status();
        s.clients
            .iter()
            .find(|c| c.name == "accounted")
            .map_or(0, |c| c.gpu_time_ns)
    };
    gpushare_tests::wait_until(std::time::Duration::from_secs(2), || charged() >= 1_000_000);
    let status = broker.status();
    assert_eq!(status.backend, gpushare_tests::test_backend());
    assert_eq!(
        status.device.sm_count, 132,
        "the sim models an H100, which has 132 SMs"
    );
    let me = status
        .clients
        .iter()
        .find(|c| c.name == "accounted")
        .expect("listed");
    assert_eq!(me.memory_used, 4 << 16);
    assert_eq!(me.kernels, 2);
    assert_eq!(me.bytes_htod, 4 << 16);
    assert_eq!(me.bytes_dtoh, 4 << 16);
    assert_eq!(me.streams, 2, "default stream + one");
    assert!(
        me.gpu_time_ns >= 1_000_000,
        "the 1 ms spin is charged: {}",
        me.gpu_time_ns
    );
    // The sim's modelled time is exact. On a GPU, event timing measures elapsed device time,
    // which includes slices given to other processes' contexts (parallel tests run their own
    // brokers), so only a loose bound holds there.
    let bound = if status.backend == "sim" {
        2_000_000
    } else {
        50_000_000
    };
    assert!(
        me.gpu_time_ns < bound,
        "and not much more: {}",
        me.gpu_time_ns
    );
    assert_eq!(me.errors, 0);
    assert_eq!(me.pid, std::process::id() as i32);
}

#[test]
fn host_buffers_copy_without_staging_and_are_recycled() {
    let broker = Broker::start();
    let opts = gpushare::ConnectOptions {
        host_buffers: 3 << 20,
        ..broker.options("host-buffers")
    };
    let client = gpushare::Client::connect_with(opts).expect("connect");
    let stream = client.create_stream().expect("stream");
    let dev = client.alloc::<u8>(1 << 20).expect("alloc");
    let mut up = client.host_buffer(1 << 20).expect("host buffer");
    for (i, b) in up.as_mut_slice().iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    let down = client.host_buffer(1 << 20).expect("second host buffer");
    client
        .copy_host_buffer_to_device(&stream, &up, dev.ptr())
        .expect("h2d");
    client
        .copy_device_to_host_buffer(&stream, dev.ptr(), &down)
        .expect("d2h");
    stream.synchronize().expect("sync");
    assert_eq!(down.as_slice(), up.as_slice());
    assert!(client.host_buffer(2 << 20).is_err(), "only 1 MiB left");
    drop(up);
    drop(down);
    let whole = client
        .host_buffer(3 << 20)
        .expect("freed space is merged back");
    assert_eq!(whole.len(), 3 << 20);
    // Staged copies still work beside host buffers.
    dev.copy_from_host(&vec![7u8; 1 << 20]).expect("staged");
    assert!(dev.to_vec().expect("down").iter().all(|&b| b == 7));
}

/// bfloat16 bits of `x` (round to nearest even), as the tests feed the bf16 GEMM.
fn bf16(x: f32) -> u16 {
    let bits = x.to_bits();
    ((bits + 0x7fff + ((bits >> 16) & 1)) >> 16) as u16
}

#[test]
fn bf16_gemm_matches_a_host_reference() {
    let broker = Broker::start();
    let client = broker.client();
    let (m, n, k) = (48, 40, 96);
    let ha: Vec<u16> = pattern(m * k, 21).iter().map(|&v| bf16(v - 5.0)).collect();
    let hb: Vec<u16> = pattern(k * n, 22).iter().map(|&v| bf16(v / 10.0)).collect();
    let a = client.alloc::<u16>(m * k).expect("alloc");
    let b = client.alloc::<u16>(k * n).expect("alloc");
    let c = client.alloc::<f32>(m * n).expect("alloc");
    a.copy_from_host(&ha).expect("up");
    b.copy_from_host(&hb).expect("up");
    let stream = client.default_stream();
    let gemm = Kernel::GemmBf16 {
        a: a.ptr(),
        b: b.ptr(),
        c: c.ptr(),
        m: m as u32,
        n: n as u32,
        k: k as u32,
        alpha: 1.0,
        beta: 0.0,
    };
    stream.launch(gemm).expect("launch");
    let got = c.to_vec().expect("down");
    let widen = |h: u16| f32::from_bits((h as u32) << 16) as f64;
    for i in 0..m {
        for j in 0..n {
            let want: f64 = (0..k)
                .map(|p| widen(ha[i * k + p]) * widen(hb[p * n + j]))
                .sum();
            let g = got[i * n + j] as f64;
            assert!(
                (g - want).abs() <= 1e-3 * want.abs().max(1.0),
                "C[{i},{j}] = {g}, want {want}"
            );
        }
    }
    // A bf16 operand range is sized in 2-byte elements: one element too many is refused.
    let too_big = Kernel::GemmBf16 {
        a: a.ptr(),
        b: b.ptr(),
        c: c.ptr(),
        m: m as u32 + 1,
        n: n as u32,
        k: k as u32,
        alpha: 1.0,
        beta: 0.0,
    };
    stream.launch(too_big).expect("submitted");
    assert_eq!(
        stream.synchronize().expect_err("out of bounds").code(),
        Some(ErrorCode::InvalidPointer)
    );
}

#[test]
fn status_reports_command_latency_percentiles() {
    let broker = Broker::start();
    let client = broker.client_named("timed-commands");
    let stream = client.default_stream();
    // Spins of 200 µs: synchronizations then take at least that long.
    for _ in 0..20 {
        stream
            .launch(Kernel::Spin {
                micros: 200,
                blocks: 1,
            })
            .expect("spin");
        client.nop().expect("nop");
    }
    // The broker publishes percentiles at most every 100 ms, at the end of a batch: a nop
    // each time round makes a batch end.
    let ok = gpushare_tests::wait_until(std::time::Duration::from_secs(10), || {
        client.nop().expect("nop");
        let s = broker.status();
        s.clients.iter().any(|c| {
            c.name == "timed-commands" && c.latency_p50_ns.is_some() && c.latency_p99_ns.is_some()
        })
    });
    assert!(
        ok,
        "no latency percentiles in {:?}",
        broker.status().clients
    );
    let c = broker.client_status("timed-commands").expect("listed");
    let (p50, p99) = (c.latency_p50_ns.unwrap_or(0), c.latency_p99_ns.unwrap_or(0));
    assert!(p50 > 0 && p99 >= p50, "p50 {p50} ns, p99 {p99} ns");
    // The depth is a gauge: the data thread counts the last nop as waiting until just after
    // it has answered it, so a look right after the answer may still see it.
    let quiet = gpushare_tests::wait_until(std::time::Duration::from_secs(10), || {
        broker
            .client_status("timed-commands")
            .is_some_and(|c| c.queue_depth == 0)
    });
    assert!(
        quiet,
        "nothing waits once the client is quiet: {:?}",
        broker.client_status("timed-commands")
    );
}

#[test]
fn a_clients_spin_follows_how_close_together_its_requests_come() {
    // A ceiling far above the gaps a loaded machine makes of 1 ms sleeps.
    let broker = Broker::start_with(gpushare_tests::BrokerOptions {
        extra_args: vec!["--spin-max-us".into(), "50000".into()],
        ..Default::default()
    });
    let idle = broker.client_named("idle-spin");
    idle.nop().expect("nop");
    let busy = broker.client_named("close-spin");
    // Requests a millisecond or so apart: each finds the 50-µs base spin over.
    let grown = gpushare_tests::wait_until(Duration::from_secs(30), || {
        busy.nop().expect("nop");
        std::thread::sleep(Duration::from_millis(1));
        broker
            .client_status("close-spin")
            .is_some_and(|c| c.spin_ns > 50_000)
    });
    let spin = |name| broker.client_status(name).map(|c| c.spin_ns);
    assert!(grown, "the spin stayed at {:?} ns", spin("close-spin"));
    assert!(
        spin("close-spin").is_some_and(|ns| ns <= 50_000_000),
        "past the ceiling: {:?} ns",
        spin("close-spin")
    );
    assert_eq!(
        spin("idle-spin"),
        Some(50_000),
        "an idle client keeps the base"
    );
}

/// A sim module whose one function occupies the device for its `u64` parameter's µs.
const SIM_MODULE: &[u8] = b"gpushare-sim-module 1\nkernel spin\n\0";

#[test]
fn module_launches_with_parameters_go_without_waiting_and_leave_host_buffers_alone() {
    if gpushare_tests::test_backend() != "sim" {
        return; // the sim module is the sim's own (tests/gpu.rs launches PTX)
    }
    let broker = Broker::start();
    // 32 KiB of staging before 64 KiB of host buffers: the launches below go round the
    // staging area many times.
    let opts = gpushare::ConnectOptions {
        arena_size: 96 << 10,
        host_buffers: 64 << 10,
        ..broker.options("params")
    };
    let client = gpushare::Client::connect_with(opts).expect("connect");
    let mut host = client.host_buffer(64 << 10).expect("host buffer");
    for (i, b) in host.as_mut_slice().iter_mut().enumerate() {
        *b = (i % 253) as u8;
    }
    let stream = client.create_stream().expect("stream");
    let module = client
        .load_module(ModuleFormat::Ptx, SIM_MODULE)
        .expect("sim module");
    let spin = module.function("spin").expect("function");
    // One parameter word, padded to a KiB.
    let mut params = vec![0u8; 1024];
    params[..8].copy_from_slice(&1u64.to_le_bytes());
    for _ in 0..500 {
        client
            .launch_function(&stream, &spin, [1, 1, 1], [1, 1, 1], 0, &params)
            .expect("launch");
    }
    stream.synchronize().expect("every launch ran");
    assert_eq!(client.completions_received(), client.commands_submitted());

    // A launch the broker refuses (the function takes 8 bytes) returns at once; its error
    // comes with the next synchronization, once.
    client
        .launch_function(&stream, &spin, [1, 1, 1], [1, 1, 1], 0, &[0u8; 4])
        .expect("posted without waiting");
    let err = stream.synchronize().expect_err("reported at sync");
    assert_eq!(err.code(), Some(ErrorCode::InvalidArgument), "{err}");
    stream.synchronize().expect("reported once");

    // Staged copies share the staging area with launches, and host buffers stay as written.
    let data: Vec<u8> = (0..300_007u32).map(|i| (i * 7 % 251) as u8).collect();
    let dev = client.alloc::<u8>(data.len()).expect("alloc");
    client
        .launch_function(&stream, &spin, [1, 1, 1], [1, 1, 1], 0, &params)
        .expect("launch");
    dev.copy_from_host(&data).expect("upload");
    assert_eq!(dev.to_vec().expect("download"), data);
    assert!(
        host.as_slice()
            .iter()
            .enumerate()
            .all(|(i, &b)| b == (i % 253) as u8),
        "host buffers are not staging"
    );
}

#[test]
fn launches_and_staged_copies_from_two_threads_share_a_small_staging_area() {
    if gpushare_tests::test_backend() != "sim" {
        return;
    }
    let broker = Broker::start();
    let opts = gpushare::ConnectOptions {
        arena_size: 32 << 10,
        ..broker.options("two-threads")
    };
    let client = gpushare::Client::connect_with(opts).expect("connect");
    let module = client
        .load_module(ModuleFormat::Ptx, SIM_MODULE)
        .expect("sim module");
    let spin = module.function("spin").expect("function");
    let data: Vec<u8> = (0..200_003u32).map(|i| (i * 13 % 249) as u8).collect();
    let dev = client.alloc::<u8>(data.len()).expect("alloc");
    std::thread::scope(|s| {
        s.spawn(|| {
            let stream = client.create_stream().expect("stream");
            let mut params = vec![0u8; 3000];
            params[..8].copy_from_slice(&0u64.to_le_bytes());
            for _ in 0..2000 {
                client
                    .launch_function(&stream, &spin, [1, 1, 1], [1, 1, 1], 0, &params)
                    .expect("launch");
            }
            stream.synchronize().expect("launches ran");
        });
        for _ in 0..20 {
            dev.copy_from_host(&data).expect("upload");
            assert_eq!(dev.to_vec().expect("download"), data);
        }
    });
}

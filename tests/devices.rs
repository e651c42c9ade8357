//! A broker serving several devices: clients pick one or get the least loaded, and a fault
//! on one device costs nothing on the others.

use gpushare::{ConnectOptions, Kernel};
use gpushare_tests::faults::{fill_after_reset, verified_fill};
use gpushare_tests::{Broker, BrokerOptions, wait_until};

fn two_gpu_broker() -> Broker {
    Broker::start_with(BrokerOptions {
        backend: Some("sim".into()),
        extra_args: vec!["--sim-gpus".into(), "2".into()],
        ..Default::default()
    })
}

/// A client of `broker` on GPU `gpu`, named after it.
fn client_on(broker: &Broker, gpu: u32) -> gpushare::Client {
    gpushare::Client::connect_with(ConnectOptions {
        gpu: Some(gpu),
        ..broker.options(&format!("on-{gpu}"))
    })
    .expect("connect")
}

#[test]
fn clients_choose_a_device_or_get_the_least_loaded() {
    let broker = two_gpu_broker();
    let status = broker.status();
    assert_eq!(
        status.devices.iter().map(|d| d.index).collect::<Vec<_>>(),
        [0, 1]
    );

    let on_one = gpushare::Client::connect_with(ConnectOptions {
        gpu: Some(1),
        ..broker.options("pinned-to-1")
    })
    .expect("connect to GPU 1");
    assert_eq!(on_one.session().device.index, 1);
    let held = on_one.alloc::<f32>(1 << 18).expect("alloc on GPU 1");
    on_one
        .launch(
            &on_one.default_stream(),
            Kernel::FillF32 {
                dst: held.ptr(),
                n: 1 << 18,
                value: 4.0,
            },
        )
        .expect("fill");
    assert!(held.to_vec().expect("read").iter().all(|&v| v == 4.0));

    // GPU 1 holds 1 MiB, GPU 0 nothing: a client without a preference lands on GPU 0.
    let chosen = broker.client_named("anywhere");
    assert_eq!(chosen.session().device.index, 0);
    let status = broker.status();
    let gpu_of = |name: &str| {
        status
            .clients
            .iter()
            .find(|c| c.name == name)
            .map(|c| c.gpu)
    };
    assert_eq!(gpu_of("pinned-to-1"), Some(1));
    assert_eq!(gpu_of("anywhere"), Some(0));
}

#[test]
fn asking_for_a_device_that_does_not_exist_is_refused_clearly() {
    let broker = two_gpu_broker();
    let err = gpushare::Client::connect_with(ConnectOptions {
        gpu: Some(7),
        ..broker.options("lost")
    })
    .err()
    .expect("refused");
    let msg = err.to_string();
    assert!(
        msg.contains("GPU 7 does not exist") && msg.contains("0..=1"),
        "{msg}"
    );
}

#[test]
fn a_fault_on_one_gpu_leaves_the_other_gpus_alone() {
    let broker = Broker::start_with(BrokerOptions {
        backend: Some("sim".into()),
        extra_args: vec![
            "--sim-gpus".into(),
            "2".into(),
            "--allow-fault-injection".into(),
        ],
        ..Default::default()
    });
    broker.dump_log_if_stuck(std::time::Duration::from_secs(60));
    let on = |gpu: u32, name: &str| {
        gpushare::Client::connect_with(ConnectOptions {
            gpu: Some(gpu),
            ..broker.options(name)
        })
        .expect("connect")
    };
    // GPU 0 holds data; GPU 1 has a bystander and the culprit.
    let far = on(0, "far");
    let held = far.alloc::<f32>(1024).expect("alloc on GPU 0");
    held.copy_from_host(&[2.5; 1024]).expect("upload");
    let near = on(1, "near");
    verified_fill(&near, 1.0).expect("GPU 1 works");
    let culprit = on(1, "culprit");
    let mut before = Vec::new();
    assert!(
        wait_until(std::time::Duration::from_secs(10), || {
            before = broker.worker_pids();
            before.len() == 4
        }),
        "a worker and a spare for each GPU: {before:?}"
    );

    culprit
        .default_stream()
        .launch(Kernel::Fault { hang: false })
        .expect("fault accepted");
    assert!(culprit.synchronize().is_err(), "the culprit sees its fault");
    assert!(broker.wait_for_log(
        "a new device worker took over",
        std::time::Duration::from_secs(10)
    ));
    // GPU 1's bystander loses its device state and goes on; GPU 0 notices nothing.
    fill_after_reset(&near, 3.0).expect("GPU 1 serves its bystander again");
    assert_eq!(held.to_vec().expect("GPU 0's buffer"), vec![2.5; 1024]);
    assert!(far.take_device_reset().is_none(), "GPU 0 was not reset");
    verified_fill(&far, 4.0).expect("GPU 0 works");
    let after = broker.worker_pids();
    let kept = before.iter().filter(|p| after.contains(p)).count();
    assert_eq!(
        kept, 3,
        "only the faulted GPU's worker was replaced (its spare took over): {before:?} -> {after:?}"
    );
    let gpu_of = |name: &str| broker.client_status(name).map(|c| c.gpu);
    assert_eq!((gpu_of("far"), gpu_of("near")), (Some(0), Some(1)));
    assert!(
        wait_until(std::time::Duration::from_secs(10), || gpu_of("culprit")
            .is_none()),
        "the culprit was evicted"
    );
}

/// The policy's `gpu_memory_quota` bounds what a user holds on any one GPU, beside the
/// `memory_quota` over all of them; status shows both.
#[test]
fn a_users_memory_stays_within_the_quota_on_each_gpu_and_in_total() {
    const MIB: u64 = 1 << 20;
    let uid = nix::unistd::getuid().as_raw();
    let broker = Broker::start_with(BrokerOptions {
        backend: Some("sim".into()),
        extra_args: vec!["--sim-gpus".into(), "2".into()],
        policy: Some(format!(
            "[[users]]\nuid = {uid}\nmemory_quota = \"96 MiB\"\ngpu_memory_quota = \"64 MiB\"\n"
        )),
        ..Default::default()
    });
    let (zero, one) = (client_on(&broker, 0), client_on(&broker, 1));
    let a = zero
        .alloc_raw(64 * MIB)
        .expect("64 MiB on GPU 0: its quota");
    let err = zero.alloc_raw(MIB).expect_err("past GPU 0's quota");
    assert_eq!(err.code(), Some(gpushare::ErrorCode::OutOfQuota), "{err}");
    let _b = one.alloc_raw(32 * MIB).expect("GPU 1 has its own 64 MiB");
    let err = one.alloc_raw(MIB).expect_err("past the 96 MiB over both");
    assert_eq!(err.code(), Some(gpushare::ErrorCode::OutOfQuota), "{err}");

    let status = broker.status();
    let me = status
        .users
        .iter()
        .find(|u| u.uid == uid)
        .expect("my account");
    assert_eq!(me.memory_used, 96 * MIB);
    assert_eq!(me.gpu_memory_quota, Some(64 * MIB));
    let held: Vec<(u32, u64)> = me
        .gpu_memory
        .iter()
        .map(|g| (g.gpu, g.memory_used))
        .collect();
    assert_eq!(held, [(0, 64 * MIB), (1, 32 * MIB)]);
    // Freed on GPU 0, the room is there again.
    zero.free_raw(a).expect("free");
    let _c = zero.alloc_raw(MIB).expect("room on GPU 0 and in total");
}

/// Each GPU's memory lies at device addresses of its own, as under CUDA's unified addressing:
/// a program using two GPUs, or memory another GPU shared, must never find one address on
/// both (workers started alike would reserve the same range).
#[test]
fn each_gpu_s_memory_lies_at_device_addresses_of_its_own() {
    let broker = two_gpu_broker();
    let (zero, one) = (client_on(&broker, 0), client_on(&broker, 1));
    let a = zero.alloc::<f32>(1 << 18).expect("alloc on GPU 0");
    let b = one.alloc::<f32>(1 << 18).expect("alloc on GPU 1");
    let bytes = (1u64 << 18) * 4;
    let (a0, b0) = (a.ptr(), b.ptr());
    assert!(
        a0 + bytes <= b0 || b0 + bytes <= a0,
        "GPU 0's memory at {a0:#x} and GPU 1's at {b0:#x} overlap"
    );
    assert!(
        !broker.log_contains("at the same device addresses"),
        "{}",
        broker.log_text()
    );
}

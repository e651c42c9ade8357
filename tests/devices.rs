//! A broker serving several devices: clients pick one or get the least loaded.

use gpushare::{ConnectOptions, Kernel};
use gpushare_tests::{Broker, BrokerOptions};

fn two_gpu_broker() -> Broker {
    Broker::start_with(BrokerOptions {
        backend: Some("sim".into()),
        extra_args: vec!["--sim-gpus".into(), "2".into()],
        ..Default::default()
    })
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

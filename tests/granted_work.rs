//! What gpushared learns of a client's granted kernels (sim device; on a GPU too with
//! GPUSHARE_TEST_BACKEND=cuda): a kernel that finished stops holding the other clients back
//! even while its client keeps gpushared busy with other work and never waits for it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use gpushare::Kernel;
use gpushare_tests::{Broker, BrokerOptions};

/// Under FAIR one kernel at a time (`quantum_us = 0`) nobody else's kernel is granted until
/// the one in flight is seen finished. A client launches a kernel and then only queues small
/// memsets on another stream, as fast as its ring takes them, never waiting for the kernel
/// and never pausing: the other client's kernel must still run once that kernel has finished.
#[test]
fn a_finished_kernel_holds_nobody_while_its_client_keeps_busy_elsewhere() {
    let broker = Broker::start_with(BrokerOptions {
        policy: Some("scheduler = \"fair\"\n[fair]\nquantum_us = 0\n".into()),
        extra_args: vec!["--sim-realtime".into()],
        ..Default::default()
    });
    let chatty = broker.client_named("chatty");
    let other = broker.client_named("other");
    let stop = Arc::new(AtomicBool::new(false));
    let busy = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let elsewhere = chatty.create_stream().expect("stream");
            let buffer = chatty.alloc::<u8>(256).expect("alloc");
            let kernel = Kernel::Spin {
                micros: 1000,
                blocks: 1,
            };
            // A first kernel waited for (a session times its first), then the one that stays.
            let stream = chatty.default_stream();
            stream.launch(kernel).expect("launch");
            stream.synchronize().expect("sync");
            stream.launch(kernel).expect("launch");
            let mut sent = 0u64;
            while !stop.load(Ordering::Relaxed) {
                buffer.memset(&elsewhere, 0).expect("memset");
                sent += 1;
            }
            elsewhere.synchronize().expect("sync");
            drop(buffer);
            (chatty, sent)
        })
    };
    let kernels = |name: &str| broker.client_status(name).map_or(0, |c| c.kernels);
    assert!(
        gpushare_tests::wait_until(Duration::from_secs(10), || kernels("chatty") == 2),
        "chatty's kernel was not launched"
    );
    let done = Arc::new(AtomicBool::new(false));
    let waiter = {
        let done = done.clone();
        std::thread::spawn(move || {
            let stream = other.default_stream();
            let kernel = Kernel::Spin {
                micros: 1000,
                blocks: 1,
            };
            stream.launch(kernel).expect("launch");
            stream.synchronize().expect("sync");
            done.store(true, Ordering::Relaxed);
            other
        })
    };
    let ran = gpushare_tests::wait_until(Duration::from_secs(10), || done.load(Ordering::Relaxed));
    stop.store(true, Ordering::Relaxed);
    let (_chatty, sent) = busy.join().expect("chatty's thread");
    waiter.join().expect("the other client's thread");
    assert!(
        ran,
        "the other client's kernel waited 10 s behind chatty's finished one while chatty sent \
         {sent} memsets on another stream"
    );
    println!("the other client's kernel ran while chatty sent {sent} memsets");
}

//! Threads sharing one client with `rebuild` on, when another client faults the GPU. In
//! place, the client's state is kept: a thread that had work on the GPU hears it was lost,
//! once, and nothing else changes. Across a restart of gpushared (its device in its own
//! process), each thread that meets the reset hears it once, promptly, and one rebuild serves
//! them all.

use std::time::{Duration, Instant};

use gpushare::{DeviceBuffer, Error, Kernel, Stream};
use gpushare_tests::Broker;
use gpushare_tests::faults::{Scripted, broker, rebuilding_client, restart_broker};

/// Several threads share one rebuilding client, each working on its own stream, when another
/// client faults the GPU: a call that meets the reset fails with `Rebuilt` (never the raw
/// reset error), promptly, whichever thread did the rebuild; then every stream works.
#[test]
fn every_thread_of_a_client_that_meets_a_reset_in_place_loses_at_most_its_work_in_flight() {
    let broker = broker(&[]);
    let client = rebuilding_client(&broker, "threads");
    const THREADS: usize = 4;
    let work: Vec<(Stream, DeviceBuffer<f32>)> = (0..THREADS)
        .map(|_| {
            let buf = client.alloc::<f32>(1024).expect("alloc");
            buf.copy_from_host(&[2.0; 1024]).expect("upload");
            (client.create_stream().expect("stream"), buf)
        })
        .collect();
    let mut culprit = Scripted::start(&broker);
    assert!(culprit.run("connect").starts_with("connected"));
    let stop = std::sync::atomic::AtomicBool::new(false);
    let errors: Vec<Error> = std::thread::scope(|s| {
        let threads: Vec<_> = work
            .iter()
            .map(|(stream, buf)| {
                let stop = &stop;
                s.spawn(move || {
                    let mut errors = Vec::new();
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let r = stream
                            .launch(Kernel::FillF32 {
                                dst: buf.ptr(),
                                n: 1024,
                                value: 3.0,
                            })
                            .and_then(|()| stream.synchronize());
                        if let Err(e) = r {
                            errors.push(e);
                        }
                    }
                    errors
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(20));
        let said = culprit.run("illegal");
        if said.starts_with("error") {
            std::thread::sleep(Duration::from_millis(800));
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let errors = threads
            .into_iter()
            .flat_map(|t| t.join().expect("thread"))
            .collect();
        assert!(said.starts_with("error"), "the fault shows: {said}");
        errors
    });
    for e in &errors {
        assert_eq!(
            e.code(),
            Some(gpushare::ErrorCode::WorkLost),
            "a call that met the fault: {e:?}"
        );
        assert!(!e.is_fatal(), "{e}");
    }
    assert!(
        errors.len() <= THREADS,
        "at most one failed call per thread: {errors:?}"
    );
    assert_eq!(
        client.rebuilds(),
        0,
        "nothing to rebuild: the state was kept"
    );
    for (stream, buf) in &work {
        stream
            .launch(Kernel::FillF32 {
                dst: buf.ptr(),
                n: 1024,
                value: 4.0,
            })
            .expect("launch");
        stream.synchronize().expect("the stream works on");
        assert!(buf.to_vec().expect("read").iter().all(|&v| v == 4.0));
    }
}

#[test]
fn work_lost_in_a_reset_in_place_is_reported_to_the_thread_that_waits_for_it() {
    let broker = broker(&[]);
    let client = rebuilding_client(&broker, "two-threads");
    let stream = client.create_stream().expect("stream");
    let out = client.alloc::<f32>(1024).expect("alloc");
    out.copy_from_host(&[1.0; 1024]).expect("upload");
    for on in [&stream, &client.default_stream()] {
        on.launch(Kernel::FillF32 {
            dst: out.ptr(),
            n: 1024,
            value: 3.0,
        })
        .expect("launch");
    }
    let holder = broker.device_holder();
    let mut culprit = Scripted::start(&broker);
    assert!(culprit.run("connect").starts_with("connected"));
    assert!(culprit.run("illegal").starts_with("error"));
    assert!(gpushare_tests::wait_until(Duration::from_secs(30), || {
        broker.device_holder() != holder && broker.log_contains("device context recreated")
    }));
    // Another thread of the client sees nothing of it; the one that waits for the fills does.
    let other = std::thread::scope(|s| s.spawn(|| client.nop()).join().expect("thread"));
    other.expect("nothing to say to a call that waits for nothing");
    let e = stream
        .synchronize()
        .expect_err("the fill the fault stopped");
    assert_eq!(e.code(), Some(gpushare::ErrorCode::WorkLost), "{e}");
    stream.synchronize().expect("said once");
    // Said once for the program, as CUDA says an asynchronous error once for a context: the
    // default stream's lost fill is not said again. Whatever ran of the fills is in the
    // memory, which is intact.
    let v = out.to_vec().expect("read");
    assert!(v.iter().all(|&x| x == 1.0 || x == 3.0), "{v:?}");
    assert_eq!(client.rebuilds(), 0);
}

#[test]
fn every_thread_of_a_rebuilding_client_that_meets_a_restart_gets_rebuilt() {
    let broker = restart_broker();
    threads_of_a_rebuilding_client_meet_a_fault(&broker, Duration::from_secs(10));
    assert!(broker.log_contains("restarting gpushared"));
}

fn threads_of_a_rebuilding_client_meet_a_fault(broker: &Broker, within: Duration) {
    let client = rebuilding_client(broker, "threads");
    const THREADS: usize = 4;
    let work: Vec<(Stream, DeviceBuffer<f32>)> = (0..THREADS)
        .map(|_| {
            let buf = client.alloc::<f32>(1024).expect("alloc");
            buf.copy_from_host(&[2.0; 1024]).expect("upload");
            (client.create_stream().expect("stream"), buf)
        })
        .collect();
    let mut culprit = Scripted::start(broker);
    assert!(culprit.run("connect").starts_with("connected"));
    let stop = std::sync::atomic::AtomicBool::new(false);
    let errors: Vec<(Error, Duration)> = std::thread::scope(|s| {
        let threads: Vec<_> = work
            .iter()
            .map(|(stream, buf)| {
                let stop = &stop;
                s.spawn(move || {
                    let mut errors = Vec::new();
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let started = Instant::now();
                        let r = stream
                            .launch(Kernel::FillF32 {
                                dst: buf.ptr(),
                                n: 1024,
                                value: 3.0,
                            })
                            .and_then(|()| stream.synchronize());
                        if let Err(e) = r {
                            errors.push((e, started.elapsed()));
                        }
                    }
                    errors
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(20));
        let said = culprit.run("illegal");
        if said.starts_with("error") {
            std::thread::sleep(Duration::from_millis(300) + within / 4);
        }
        // Stopped before any assertion: a panic here would wait for them forever.
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let errors = threads
            .into_iter()
            .flat_map(|t| t.join().expect("thread"))
            .collect();
        assert!(said.starts_with("error"), "the fault shows: {said}");
        errors
    });
    for (e, took) in &errors {
        assert!(
            matches!(e, Error::Rebuilt(_)),
            "a call that met the reset: {e:?} after {took:?}"
        );
        assert!(*took < within, "answered after {took:?}");
    }
    assert!(
        (1..=THREADS).contains(&errors.len()),
        "at most one failed call per thread: {errors:?}"
    );
    assert_eq!(client.rebuilds(), 1, "one rebuild for all of them");
    for (stream, buf) in &work {
        stream
            .launch(Kernel::FillF32 {
                dst: buf.ptr(),
                n: 1024,
                value: 4.0,
            })
            .expect("launch");
        stream.synchronize().expect("the stream works again");
        assert!(buf.to_vec().expect("read").iter().all(|&v| v == 4.0));
    }
}

//! Threads sharing one client with `rebuild` on, when another client faults the GPU: each
//! thread that meets the reset hears it once, promptly, one rebuild serves them all, and work
//! submitted before another thread's rebuild is never read as done.

use std::time::{Duration, Instant};

use gpushare::{DeviceBuffer, Error, Kernel, Stream};
use gpushare_tests::Broker;
use gpushare_tests::faults::{Scripted, broker, rebuilding_client, restart_broker};

/// Several threads share one rebuilding client, each working on its own stream, when another
/// client faults the GPU: a call that meets the reset fails with `Rebuilt` (never the raw
/// reset error), promptly, whichever thread did the rebuild; then every stream works.
#[test]
fn every_thread_of_a_rebuilding_client_that_meets_a_reset_gets_rebuilt_promptly() {
    threads_of_a_rebuilding_client_meet_a_fault(&broker(&[]), Duration::from_secs(2));
}

/// With rebuild on, work one thread submitted before a reset, which another thread's call
/// then rebuilt after, never reads as done: that thread's first wait (here a read of the
/// buffer the lost kernel was to fill) fails with `Rebuilt`, once, instead of returning the
/// buffer's restored, stale bytes.
#[test]
fn work_lost_before_another_threads_rebuild_is_reported_to_the_thread_that_waits_for_it() {
    let broker = broker(&[]);
    let client = rebuilding_client(&broker, "two-threads");
    let stream = client.create_stream().expect("stream");
    let out = client.alloc::<f32>(1024).expect("alloc");
    out.copy_from_host(&[1.0; 1024]).expect("upload");
    let (submitted, wait_submitted) = std::sync::mpsc::channel();
    let (rebuilt, wait_rebuilt) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|s| {
        let (stream, out, client) = (&stream, &out, &client);
        let worker = s.spawn(move || {
            for on in [stream, &client.default_stream()] {
                on.launch(Kernel::FillF32 {
                    dst: out.ptr(),
                    n: 1024,
                    value: 3.0,
                })
                .expect("launch");
            }
            let _ = submitted.send(());
            // Another thread meets the fault and rebuilds meanwhile.
            let _ = wait_rebuilt.recv();
            let first = out.to_vec();
            let then = out.to_vec();
            let stream_after = stream.synchronize();
            (first, then, stream_after)
        });
        wait_submitted.recv().expect("the worker submitted");
        let mut culprit = Scripted::start(&broker);
        assert!(culprit.run("connect").starts_with("connected"));
        let said = culprit.run("illegal");
        // This thread's next calls meet the reset (or the restart) and rebuild.
        let deadline = Instant::now() + Duration::from_secs(30);
        let met = loop {
            match client.nop() {
                Err(e) => break e,
                Ok(()) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(2));
                }
                Ok(()) => break Error::Protocol("no reset met in 30 s".into()),
            }
        };
        let _ = rebuilt.send(());
        let (first, then, stream_after) = worker.join().expect("worker");
        assert!(said.starts_with("error"), "the fault shows: {said}");
        assert!(matches!(met, Error::Rebuilt(_)), "{met:?}");
        assert_eq!(client.rebuilds(), 1);
        let e = first
            .map(|v| v.len())
            .expect_err("the fill the reset took is not read as done");
        assert!(matches!(e, Error::Rebuilt(_)), "{e:?}");
        // Told once: from now on it reads what the rebuild restored (the last upload).
        assert_eq!(then.expect("read after the report"), vec![1.0; 1024]);
        stream_after.expect("the worker was told already");
    });
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

//! The sim device's own tests: modelled time, memory, modules.

use super::*;

#[test]
fn modelled_time_is_deterministic_and_serial() {
    let dev = SimDevice::new(SimOptions::default());
    let mut s1 = dev.create_stream(PriorityClass::Normal).expect("stream");
    let mut s2 = dev.create_stream(PriorityClass::Normal).expect("stream");
    let mut e0 = dev.create_event().expect("event");
    let mut e1 = dev.create_event().expect("event");
    dev.record_event(&mut e0, &mut s1).expect("record");
    dev.launch(
        &mut s1,
        &Kernel::Spin {
            micros: 100,
            blocks: 1,
        },
    )
    .expect("spin");
    dev.launch(
        &mut s2,
        &Kernel::Spin {
            micros: 50,
            blocks: 1,
        },
    )
    .expect("spin");
    dev.launch(
        &mut s1,
        &Kernel::Spin {
            micros: 10,
            blocks: 1,
        },
    )
    .expect("spin");
    dev.record_event(&mut e1, &mut s1).expect("record");
    // s1's second spin waits for s2's, which waited for s1's first.
    assert_eq!(dev.elapsed_ns(&e0, &e1), Ok(160_000));
    assert_eq!(dev.take_busy_ns(&mut s1), 110_000);
    assert_eq!(dev.take_busy_ns(&mut s2), 50_000);
    assert_eq!(dev.take_busy_ns(&mut s1), 0, "taken once");
}

#[test]
fn real_modules_are_refused_and_sim_modules_run_for_their_time() {
    let dev = SimDevice::new(SimOptions::default());
    let err = dev
        .load_module(ModuleFormat::Ptx, b".version 8.0")
        .expect_err("refused");
    assert_eq!(err.code(), gpushare_protocol::ErrorCode::NotSupported);
    let module = dev
        .load_module(ModuleFormat::Ptx, b"gpushare-sim-module 1\nkernel spin\n\0")
        .expect("a sim module loads");
    let spin = dev.get_function(&module, "spin").expect("spin");
    let mut s = dev.create_stream(PriorityClass::Normal).expect("stream");
    let launch = ModuleLaunch {
        function: 1,
        grid: [1, 1, 1],
        block: [32, 1, 1],
        shared_mem_bytes: 0,
        params_offset: 0,
        params_len: 8,
    };
    dev.launch_module(
        &mut s,
        &spin,
        &launch,
        &LaunchAttributes::default(),
        &250u64.to_le_bytes(),
    )
    .expect("launch");
    assert_eq!(dev.take_busy_ns(&mut s), 250_000, "250 µs of modelled time");
    assert_eq!(
        dev.function_shape(&spin).expect("shape").params,
        vec![(0, 8)]
    );
    // As CUDA answers them: more shared memory than a block may have, a missing name.
    let greedy = ModuleLaunch {
        shared_mem_bytes: SimFunction::MAX_DYNAMIC_SHARED + 1,
        ..launch
    };
    let err = dev
        .launch_module(
            &mut s,
            &spin,
            &greedy,
            &LaunchAttributes::default(),
            &[0; 8],
        )
        .expect_err("refused");
    assert_eq!(err.code(), gpushare_protocol::ErrorCode::InvalidArgument);
    let err = dev
        .get_function(&module, "nope")
        .expect_err("no such function");
    assert_eq!(err.code(), gpushare_protocol::ErrorCode::NotFound);
}

/// A done-mark in realtime mode appears when the work before it ends on the wall clock, not
/// when it is accepted (a fault's progress marks still are written at once).
#[test]
fn a_done_mark_appears_when_the_work_before_it_ends() {
    let dev = SimDevice::new(SimOptions {
        realtime: true,
        ..SimOptions::default()
    });
    let memfd = crate::shm::sealed_memfd("marks-test", 4096).expect("memfd");
    let page = crate::shm::HostRegion::map(&memfd, 4096, 0).expect("mapped");
    let word = |slot: u64| {
        let mut b = [0u8; 4];
        page.slice(slot * 4, 4).expect("slot").read_into(&mut b);
        u32::from_le_bytes(b)
    };
    let mut s = dev.create_stream(PriorityClass::Normal).expect("stream");
    dev.launch(
        &mut s,
        &Kernel::Spin {
            micros: 50_000,
            blocks: 1,
        },
    )
    .expect("spin");
    let accepted = Instant::now();
    dev.write_done_mark(&mut s, page.whole(), 1, 7)
        .expect("done mark");
    let deadline = accepted + Duration::from_secs(10);
    while word(1) != 7 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(word(1), 7, "the done mark came");
    assert!(
        accepted.elapsed() >= Duration::from_millis(45),
        "not before its work ended: {:?}",
        accepted.elapsed()
    );
}

/// In real time, as on a GPU, a stream's device time is known once its work has ended.
#[test]
fn device_time_is_known_once_the_work_has_ended() {
    let dev = SimDevice::new(SimOptions {
        realtime: true,
        ..SimOptions::default()
    });
    let mut s = dev.create_stream(PriorityClass::Normal).expect("stream");
    let spin = Kernel::Spin {
        micros: 30_000,
        blocks: 1,
    };
    dev.launch(&mut s, &spin).expect("spin");
    assert_eq!(dev.take_busy_ns(&mut s), 0, "still running");
    assert!(dev.measuring(&s), "a measurement is pending");
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut got = 0;
    while got == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
        got = dev.take_busy_ns(&mut s);
    }
    assert_eq!(got, 30_000_000);
    assert!(!dev.measuring(&s));
}

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

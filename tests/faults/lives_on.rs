//! What a client made lives on across another client's fault: its modules, its CUDA graphs
//! and memory its program mapped itself.

use std::time::Duration;

use gpushare_tests::faults::{Scripted, broker};
use gpushare_tests::test_backend;

use super::wait_for_takeover;

/// A client's modules and functions live on across a fault without being loaded again at
/// takeover: the spare made them as they were made (and, with `--spare-maps-at-takeover`,
/// the new worker makes them at takeover). The sim's own module format stands in for a GPU
/// image (tests/gpu.rs runs PTX).
#[test]
fn a_clients_modules_live_on_across_a_fault() {
    if test_backend() != "sim" {
        return;
    }
    const SIM_MODULE: &[u8] = b"gpushare-sim-module 1\nkernel spin\n\0";
    for args in [&[][..], &["--spare-maps-at-takeover"][..]] {
        let broker = broker(args);
        let victim = broker.client_named("victim");
        let stream = victim.create_stream().expect("stream");
        let module = victim
            .load_module(gpushare::ModuleFormat::Ptx, SIM_MODULE)
            .expect("sim module");
        let spin = module.function("spin").expect("function");
        let run = || {
            victim
                .launch_function(&stream, &spin, [1, 1, 1], [1, 1, 1], 0, &5u64.to_le_bytes())
                .and_then(|()| stream.synchronize())
        };
        run().expect("the module runs");
        assert!(gpushare_tests::wait_until(Duration::from_secs(30), || {
            broker.log_text().contains("spare device worker ready")
        }));
        let holder = broker.device_holder();
        let mut culprit = Scripted::start(&broker);
        assert!(culprit.run("connect").starts_with("connected"));
        assert!(culprit.run("illegal").starts_with("error"));
        wait_for_takeover(&broker, holder);
        run().expect("the same function runs in the new worker");
        assert!(
            victim.take_device_reset().is_none(),
            "{args:?}: nothing lost"
        );
        let log = broker.log_text();
        assert!(!log.contains("cannot make"), "{args:?}:\n{log}");
        let ahead = format!("modules_made_ahead={}", args.is_empty());
        assert!(log.contains(&ahead), "{args:?}: {ahead}\n{log}");
    }
}

/// A CUDA graph a consolidated program instantiated before another process's fault runs
/// after it (the worker that took over made it again from the nodes gpushared kept), with the
/// same results, and takes new parameters there.
#[test]
fn a_program_s_cuda_graphs_live_on_across_a_fault() {
    if test_backend() != "sim" {
        return; // the stand-in program loads the sim's own module (tests/gpu.rs runs PTX)
    }
    use gpushare_tests::cuda_program::CudaProgram;
    let dir = tempfile::tempdir().expect("temp dir");
    let program = CudaProgram::build(dir.path(), false);
    holding_across_a_fault(&program, &[], &["graph-hold"], "graph holding");
}

/// Runs the stand-in `program` in a holding mode (`args`) under a broker started with
/// `broker_args`: once it says it holds its state, another process faults the GPU, the
/// worker that takes over is waited for, and the program, told to go on, must pass
/// `section`.
fn holding_across_a_fault(
    program: &gpushare_tests::cuda_program::CudaProgram,
    broker_args: &[&str],
    args: &[&str],
    section: &str,
) {
    use gpushare_tests::cuda_program::{Running, assert_passed};
    let broker = broker(broker_args);
    assert!(gpushare_tests::wait_until(Duration::from_secs(30), || {
        broker.log_text().contains("spare device worker ready")
    }));
    let mut cmd = program.command(&broker.socket, args);
    cmd.stdin(std::process::Stdio::piped());
    let mut holder_program = Running::spawn(cmd);
    holder_program.wait_for_line("holding", Duration::from_secs(60));
    let holder = broker.device_holder();
    let mut culprit = Scripted::start(&broker);
    assert!(culprit.run("connect").starts_with("connected"));
    assert!(culprit.run("illegal").starts_with("error"));
    wait_for_takeover(&broker, holder);
    holder_program.send_line("go");
    let out = holder_program.finish(Duration::from_secs(60));
    assert_passed(
        &out,
        &["loading", "init", section, "finish"],
        &broker.log_text(),
    );
}

/// Memory of the virtual memory API (`cuMemCreate` … `cuMemMap`) lives on across a fault
/// like any other: a consolidated program holding some mapped and some only by its handle
/// reads it all back intact after another process's fault replaced the device worker, with
/// the memory mapped into the spare ahead of the fault, or at takeover.
#[test]
fn memory_a_program_mapped_itself_lives_on_across_a_fault() {
    use gpushare_tests::cuda_program::CudaProgram;
    let dir = tempfile::tempdir().expect("temp dir");
    let program = CudaProgram::build(dir.path(), false);
    for args in [&[][..], &["--spare-maps-at-takeover"][..]] {
        holding_across_a_fault(&program, args, &["vmm-hold", "41"], "vmm holding");
    }
}

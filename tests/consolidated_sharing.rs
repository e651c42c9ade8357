//! Consolidated programs sharing device memory with each other:
//! - the virtual memory API: memory one process made and exported
//!   (`cuMemExportToShareableHandle`) is taken by another of the same user through the
//!   descriptor (`cuMemImportFromShareableHandle`), both see each other's writes, also from
//!   another GPU (what NCCL's transport between a job's processes does); another user's
//!   process is refused unless the policy lets users share memory;
//! - CUDA IPC (`cuIpcGetMemHandle`, `cuIpcGetEventHandle` and their `Open`s, what
//!   `torch.multiprocessing` uses): a process of the same user opens another's allocation and
//!   event, waits on the event and sees the memory; another user's is refused;
//! - memory a process freed while its own queued work still wrote it goes to no other process
//!   of the user's before that work has ended (CUDA's free waits for it).
//!
//! (One program's own use of the virtual memory API: `consolidated.rs`, section "virtual
//! memory"; across a fault: `faults.rs`.) Needs `cc` and the workspace built; the other-user
//! cases need root (`daemon`).

use std::time::Duration;

use gpushare_tests::cuda_program::{CudaProgram, assert_passed, run};
use gpushare_tests::{Broker, BrokerOptions, other_users};

const RUN_TIMEOUT: Duration = Duration::from_secs(120);

#[test]
fn a_process_of_the_same_user_takes_exported_memory_and_sees_what_the_other_wrote() {
    let broker = Broker::start();
    let dir = tempfile::tempdir().expect("temp dir");
    let program = CudaProgram::build(dir.path(), false);
    let out = run(
        program.command(&broker.socket, &["vmm-export", "7", "-1", "ok"]),
        RUN_TIMEOUT,
    );
    assert_passed(
        &out,
        &["loading", "init", "vmm export", "vmm import", "finish"],
        &broker.log_text(),
    );
}

#[test]
fn a_process_on_another_gpu_takes_exported_memory_and_both_see_each_others_writes() {
    let broker = Broker::start_with(BrokerOptions {
        extra_args: vec!["--sim-gpus".into(), "2".into()],
        ..Default::default()
    });
    let dir = tempfile::tempdir().expect("temp dir");
    let program = CudaProgram::build(dir.path(), false);
    let mut cmd = program.command(&broker.socket, &["vmm-export", "11", "-1", "ok"]);
    cmd.env("GPUSHARE_GPU", "0")
        .env("STANDIN_IMPORTER_GPU", "1");
    let out = run(cmd, RUN_TIMEOUT);
    assert_passed(
        &out,
        &["loading", "init", "vmm export", "vmm import", "finish"],
        &broker.log_text(),
    );
    // The sim numbers its GPUs' PCI buses from 1.
    assert!(
        out.stdout.contains("vmm export on bus 1") && out.stdout.contains("vmm import on bus 2"),
        "the exporter on GPU 0 and the importer on GPU 1:\n{}",
        out.stdout
    );
}

#[test]
fn another_users_process_is_refused_the_memory_unless_the_policy_lets_users_share() {
    let test = "another_users_process_is_refused_the_memory_unless_the_policy_lets_users_share";
    let Some((other, _)) = other_users(test) else {
        return;
    };
    let uid = other.uid.to_string();
    for (policy, expect) in [
        (None, "refused"),
        (Some("share_memory_between_users = true\n"), "ok"),
    ] {
        let broker = Broker::start_with(BrokerOptions {
            policy: policy.map(str::to_string),
            ..Default::default()
        });
        let program = CudaProgram::build_for_other_users(&broker);
        let mut cmd = program.command(&broker.socket, &["vmm-export", "9", &uid, expect]);
        cmd.current_dir("/");
        let out = run(cmd, RUN_TIMEOUT);
        assert_passed(
            &out,
            &["loading", "init", "vmm export", "vmm import", "finish"],
            &broker.log_text(),
        );
    }
}

#[test]
fn a_process_of_the_same_user_opens_anothers_allocation_and_event_through_cuda_ipc() {
    let broker = Broker::start();
    let dir = tempfile::tempdir().expect("temp dir");
    let program = CudaProgram::build(dir.path(), false);
    let out = run(
        program.command(&broker.socket, &["ipc-export", "5", "-1", "ok"]),
        RUN_TIMEOUT,
    );
    assert_passed(
        &out,
        &["loading", "init", "ipc export", "ipc import", "finish"],
        &broker.log_text(),
    );
}

#[test]
fn another_users_process_is_refused_what_one_shared_through_cuda_ipc() {
    let test = "another_users_process_is_refused_what_one_shared_through_cuda_ipc";
    let Some((other, _)) = other_users(test) else {
        return;
    };
    let broker = Broker::start();
    let program = CudaProgram::build_for_other_users(&broker);
    let uid = other.uid.to_string();
    let mut cmd = program.command(&broker.socket, &["ipc-export", "6", &uid, "refused"]);
    cmd.current_dir("/");
    let out = run(cmd, RUN_TIMEOUT);
    assert_passed(
        &out,
        &["loading", "init", "ipc export", "ipc import", "finish"],
        &broker.log_text(),
    );
}

#[test]
fn memory_freed_under_queued_work_reaches_no_other_process_before_that_work_ends() {
    let broker = Broker::start();
    let dir = tempfile::tempdir().expect("temp dir");
    let program = CudaProgram::build(dir.path(), false);
    let out = run(program.command(&broker.socket, &["free-busy"]), RUN_TIMEOUT);
    assert_passed(
        &out,
        &["loading", "init", "free busy", "reuse check", "finish"],
        &broker.log_text(),
    );
}

/// Peer access asked of gpushared (`EnablePeerAccess`, what `cuCtxEnablePeerAccess` sends in
/// a process working on two GPUs) is granted between two GPUs that reach each other, and
/// refused with a sentence for the session's own GPU and a GPU gpushared does not have. (The
/// stand-in program's use of it: `consolidated.rs`; that the memory is then
/// reached: `broker/src/device/mirrors.rs`'s tests, and on GPUs `docs/benchmarks.md`.)
#[test]
fn peer_access_is_granted_between_two_gpus_and_refused_otherwise() {
    use gpushare::ErrorCode;
    use gpushare_protocol::control::{BrokerMessage, ClientMessage, Role};
    use gpushare_tests::raw::RawClient;
    let broker = Broker::start_with(BrokerOptions {
        extra_args: vec!["--sim-gpus".into(), "2".into()],
        ..Default::default()
    });
    let ask = |raw: &RawClient, gpu: u32| match raw
        .request(&ClientMessage::EnablePeerAccess { request: 1, gpu }, &[])
    {
        Some(BrokerMessage::PeerAccessEnabled { result, .. }) => result,
        Some(BrokerMessage::RequestFailed { error, .. }) => Err(error),
        other => panic!("EnablePeerAccess({gpu}) answered {other:?}"),
    };
    let raw = RawClient::connect_as(&broker.socket, Role::Consolidated);
    let answers = [ask(&raw, 0), ask(&raw, 1)];
    let own = answers.iter().filter(|a| a.is_err()).count();
    assert_eq!(own, 1, "one GPU is the session's own: {answers:?}");
    for refused in answers.iter().filter_map(|a| a.as_ref().err()) {
        assert_eq!(refused.code, ErrorCode::InvalidArgument, "{refused:?}");
        assert!(
            refused.message.contains("this session's own"),
            "{refused:?}"
        );
    }
    let none = ask(&raw, 7).expect_err("no GPU 7");
    assert_eq!(none.code, ErrorCode::InvalidArgument, "{none:?}");
    assert!(raw.status_ok(), "the session goes on");
}

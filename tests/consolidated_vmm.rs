//! The virtual memory API between consolidated programs: memory one process made and
//! exported (`cuMemExportToShareableHandle`) is taken by another of the same user through
//! the descriptor (`cuMemImportFromShareableHandle`), both see each other's writes; another
//! user's process is refused unless the policy lets users share memory. (One program's own use
//! of the API: `consolidated.rs`, section "virtual memory"; across a fault: `faults.rs`.)
//!
//! Needs `cc` and the workspace built; the other-user cases need root (`daemon`).

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

//! Admins change and evict live clients; nobody else may. Needs root (the admin, and to run
//! a process as `nobody`): says SKIPPED otherwise, and fails instead in CI (`CI` or
//! `GPUSHARE_REQUIRE_ROOT` set).

use std::process::Command;
use std::time::Duration;

use gpushare::{ErrorCode, PriorityClass};
use gpushare_tests::{Broker, BrokerOptions, binary, wait_until};

fn admin_broker() -> Broker {
    Broker::start_with(BrokerOptions {
        policy: Some("admin_group = \"gpushare-admins\"\n".into()),
        ..Default::default()
    })
}

#[test]
fn root_changes_a_live_clients_grant_and_evicts_it_with_a_reason() {
    if !gpushare_tests::root_or_skip(
        "root_changes_a_live_clients_grant_and_evicts_it_with_a_reason",
    ) {
        return;
    }
    let broker = admin_broker();
    let client = broker.client_named("victim");
    let id = client.session().client_id;
    let mut admin = gpushare::Monitor::connect(&broker.socket).expect("monitor");

    admin
        .admin_set(
            id,
            Some(PriorityClass::BestEffort),
            Some(7),
            Some(Some(1 << 20)),
        )
        .expect("set");
    let me = broker
        .status()
        .clients
        .into_iter()
        .find(|c| c.client_id == id)
        .expect("listed");
    assert_eq!(
        (me.class, me.weight, me.memory_quota),
        (PriorityClass::BestEffort, 7, Some(1 << 20))
    );
    // The new quota is enforced at once.
    let err = client.alloc_raw(2 << 20).expect_err("past the new quota");
    assert_eq!(err.code(), Some(ErrorCode::OutOfQuota));
    admin
        .admin_set(id, None, None, Some(None))
        .expect("remove the quota");
    client
        .free_raw(client.alloc_raw(2 << 20).expect("unlimited again"))
        .expect("free");

    let err = admin
        .admin_set(999, None, Some(2), None)
        .expect_err("no such client");
    assert_eq!(err.code(), Some(ErrorCode::InvalidHandle));

    admin.admin_evict(id, "maintenance window").expect("evict");
    assert!(wait_until(Duration::from_secs(5), || broker
        .status()
        .clients
        .is_empty()));
    let err = client.nop().expect_err("evicted");
    assert!(
        err.is_fatal() && err.to_string().contains("maintenance window"),
        "{err}"
    );
}

#[test]
fn an_unprivileged_user_may_neither_change_nor_evict() {
    if !gpushare_tests::root_or_skip("an_unprivileged_user_may_neither_change_nor_evict") {
        return;
    }
    let broker = admin_broker();
    let client = broker.client_named("protected");
    let id = client.session().client_id.to_string();
    for action in [
        vec!["admin-evict", id.as_str()],
        vec!["admin-quota", id.as_str(), "1"],
    ] {
        let out = Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(binary("gpushare-testclient"))
            .args(&action)
            .env("GPUSHARE_SOCKET", &broker.socket)
            .output()
            .expect("run as nobody");
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            said.contains("only root or members of the admin group `gpushare-admins`"),
            "{action:?} as nobody: {said}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    client.nop().expect("untouched");
    assert_eq!(broker.status().clients[0].memory_quota, None);
}

//! Tests of a connection's control loop, with a sim broker and real socket pairs.

use std::io::Write;
use std::os::fd::AsFd;

use gpushare_protocol::control::{LostState, Role, ShutdownKind};
use tokio::sync::watch;

use super::*;
use crate::server::testing::{
    closed, hear, hello, identity, pair, register, say, sim_broker, within,
};

/// Runs a monitor's control loop (as `who`) while a client says what `talk` says, then
/// leaves; returns how the loop ended.
async fn monitor_loop(
    broker: &Broker,
    who: &Identity,
    talk: impl AsyncFnOnce(&UnixSeqpacket),
) -> Option<SessionEnd> {
    let (server, client) = pair();
    let (_stop_tx, mut stop) = watch::channel(None::<Stop>);
    let client_side = async move {
        talk(&client).await;
        drop(client);
    };
    let (end, ()) = tokio::join!(
        within(broker.control_loop(&server, None, None, who, &mut stop, None)),
        client_side
    );
    end
}

fn failed(request: u64, code: ErrorCode, message: &str) -> BrokerMessage {
    BrokerMessage::RequestFailed {
        request,
        error: WireError::new(code, message),
    }
}

#[tokio::test]
async fn a_monitor_gets_status_but_no_modules() {
    let broker = sim_broker(1);
    let end = monitor_loop(&broker, &identity(1000, &[]), async |client| {
        say(client, &ClientMessage::Status { request: 3 }).await;
        match hear(client).await {
            BrokerMessage::Status { request, report } => {
                assert_eq!(request, 3);
                assert_eq!(report.backend, "sim");
            }
            other => panic!("expected a status report, got {other:?}"),
        }
        let denied = "monitor connections cannot load modules";
        let asks = [
            ClientMessage::LoadModule {
                request: 4,
                format: ModuleFormat::Ptx,
                image_len: 1,
            },
            ClientMessage::GetFunction {
                request: 5,
                module: 1,
                name: "f".into(),
            },
            ClientMessage::UnloadModule {
                request: 6,
                module: 1,
            },
        ];
        for (ask, request) in asks.iter().zip(4..) {
            say(client, ask).await;
            assert_eq!(
                hear(client).await,
                failed(request, ErrorCode::PermissionDenied, denied)
            );
        }
        say(client, &ClientMessage::Goodbye).await;
    })
    .await;
    assert!(
        end.is_none(),
        "a goodbye ends the loop with nothing to report"
    );
}

#[tokio::test]
async fn a_bad_request_fails_alone_and_the_connection_goes_on() {
    let broker = sim_broker(1);
    monitor_loop(&broker, &identity(1000, &[]), async |client| {
        client.send(&[0xff; 8]).await.expect("send");
        match hear(client).await {
            BrokerMessage::RequestFailed { request: 0, error } => {
                assert_eq!(error.code, ErrorCode::ProtocolViolation)
            }
            other => panic!("expected RequestFailed, got {other:?}"),
        }
        say(client, &ClientMessage::Hello(hello(Role::Monitor))).await;
        assert_eq!(
            hear(client).await,
            failed(0, ErrorCode::ProtocolViolation, "already said hello")
        );
        say(client, &ClientMessage::Status { request: 9 }).await;
        assert!(matches!(
            hear(client).await,
            BrokerMessage::Status { request: 9, .. }
        ));
    })
    .await;
}

#[tokio::test]
async fn the_peer_leaving_ends_the_loop() {
    let broker = sim_broker(1);
    let end = monitor_loop(&broker, &identity(1000, &[]), async |client| {
        client
            .shutdown(std::net::Shutdown::Write)
            .expect("shutdown");
    })
    .await;
    assert!(end.is_none());
}

#[tokio::test]
async fn a_stopping_broker_tells_the_client_why() {
    let broker = sim_broker(1);
    let (server, client) = pair();
    let (stop_tx, mut stop) = watch::channel(None::<Stop>);
    let who = identity(1000, &[]);
    let talk = async {
        stop_tx
            .send(Some(Stop::restarting("GPU 0 is stuck")))
            .expect("the loop listens");
        hear(&client).await
    };
    let (end, told) = tokio::join!(
        within(broker.control_loop(&server, None, None, &who, &mut stop, None)),
        talk
    );
    assert!(end.is_none());
    assert_eq!(
        told,
        BrokerMessage::ShuttingDown {
            kind: ShutdownKind::Restarting,
            reason: "GPU 0 is stuck".into()
        }
    );
}

#[tokio::test]
async fn the_data_thread_ending_is_told_and_handed_back() {
    let broker = sim_broker(1);
    let who = identity(1000, &[]);
    for (end, told) in [
        (
            SessionEnd::ProtocolViolation("bad ring index".into()),
            Some("protocol violation: bad ring index"),
        ),
        (SessionEnd::Evicted("by admin".into()), Some("by admin")),
        (SessionEnd::Stopped, None),
    ] {
        let (server, client) = pair();
        let (_stop_tx, mut stop) = watch::channel(None::<Stop>);
        let (ended_tx, mut ended) = oneshot::channel();
        let expected = format!("{end:?}");
        ended_tx.send(end).expect("receiver alive");
        let got =
            within(broker.control_loop(&server, None, None, &who, &mut stop, Some(&mut ended)))
                .await;
        assert_eq!(format!("{got:?}"), format!("Some({expected})"));
        drop(server);
        match told {
            Some(reason) => assert_eq!(
                hear(&client).await,
                BrokerMessage::Evicted {
                    reason: reason.into()
                }
            ),
            None => assert!(closed(&client).await),
        }
    }
}

#[tokio::test]
async fn a_notice_from_the_data_thread_is_forwarded() {
    let broker = sim_broker(1);
    let info = register(&broker, 100, 0, false);
    let (server, client) = pair();
    let (_stop_tx, mut stop) = watch::channel(None::<Stop>);
    let who = identity(1000, &[]);
    let notice = BrokerMessage::DeviceReset {
        gpu: 0,
        reason: "another client faulted".into(),
        lost: LostState::default(),
    };
    let talk = async {
        info.post_notice(notice.clone());
        let heard = hear(&client).await;
        say(&client, &ClientMessage::Goodbye).await;
        heard
    };
    let (end, heard) = tokio::join!(
        within(broker.control_loop(&server, None, Some(&info), &who, &mut stop, None)),
        talk
    );
    assert!(end.is_none());
    assert_eq!(heard, notice);
}

#[tokio::test]
async fn admin_requests_are_answered_with_their_request_id() {
    let broker = sim_broker(1);
    let target = register(&broker, 100, 0, false);
    monitor_loop(&broker, &identity(0, &[]), async |client| {
        let set = ClientMessage::AdminSet {
            request: 2,
            client: 999,
            class: None,
            weight: Some(2),
            memory_quota: None,
        };
        say(client, &set).await;
        assert_eq!(
            hear(client).await,
            BrokerMessage::AdminDone {
                request: 2,
                result: Err(WireError::new(
                    ErrorCode::InvalidHandle,
                    "no client 999 is connected"
                ))
            }
        );
        let evict = ClientMessage::AdminEvict {
            request: 3,
            client: target.id,
            reason: "make room".into(),
        };
        say(client, &evict).await;
        assert_eq!(
            hear(client).await,
            BrokerMessage::AdminDone {
                request: 3,
                result: Ok(())
            }
        );
    })
    .await;
    assert_eq!(target.eviction().as_deref(), Some("make room"));
}

#[tokio::test]
async fn a_module_image_is_checked_before_the_device_sees_it() {
    let broker = sim_broker(1);
    let device = broker.gpus[0].device().clone();
    let modules = Arc::default();
    let accounts: Arc<crate::accounts::Accounts> = Arc::default();
    let seat = accounts.seat_for_tests(1000, "alice");
    let holder = Holder {
        accounts,
        account: seat.account().clone(),
    };
    let load = |len, fds| {
        Broker::load_module(
            (&modules, &device),
            &broker.images,
            &holder,
            ModuleFormat::Ptx,
            len,
            fds,
        )
    };
    let image = |bytes: &[u8]| {
        let mut f = tempfile::tempfile().expect("temp file");
        f.write_all(bytes).expect("write");
        vec![f.as_fd().try_clone_to_owned().expect("dup")]
    };
    let code = |r: Result<u64, WireError>| r.expect_err("refused").code;

    assert_eq!(code(load(4, Vec::new()).await), ErrorCode::InvalidArgument);
    assert_eq!(
        code(load(MAX_MODULE_IMAGE + 1, image(b"tiny")).await),
        ErrorCode::InvalidArgument
    );
    let short = load(10, image(b"abc")).await.expect_err("short file");
    assert_eq!(
        short,
        WireError::new(
            ErrorCode::InvalidArgument,
            "module image file has 3 bytes, not the 10 announced"
        )
    );
    // A whole image reaches the device, which on sim refuses modules.
    assert_eq!(code(load(4, image(b"ptx!")).await), ErrorCode::NotSupported);
}

#[tokio::test]
async fn unknown_modules_are_invalid_handles() {
    let broker = sim_broker(1);
    let device = broker.gpus[0].device().clone();
    let modules: Arc<Mutex<ModuleTable>> = Arc::default();
    let got = Broker::get_function(&modules, &device, 7, "f".into()).await;
    assert_eq!(
        got,
        Err(WireError::new(ErrorCode::InvalidHandle, "no module 7"))
    );

    let (server, client) = pair();
    let (_stop_tx, mut stop) = watch::channel(None::<Stop>);
    let who = identity(1000, &[]);
    let talk = async {
        say(
            &client,
            &ClientMessage::UnloadModule {
                request: 8,
                module: 7,
            },
        )
        .await;
        let heard = hear(&client).await;
        say(&client, &ClientMessage::Goodbye).await;
        heard
    };
    let (_, heard) = tokio::join!(
        within(broker.control_loop(
            &server,
            Some((&modules, &device)),
            None,
            &who,
            &mut stop,
            None
        )),
        talk
    );
    assert_eq!(
        heard,
        BrokerMessage::ModuleUnloaded {
            request: 8,
            result: Err(WireError::new(ErrorCode::InvalidHandle, "no module 7"))
        }
    );
}

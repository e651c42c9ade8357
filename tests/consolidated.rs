//! Consolidated clients: an unmodified CUDA program's work in gpushared's context.

use gpushare_protocol::Command;
use gpushare_protocol::control::Role;
use gpushare_tests::raw::RawClient;
use gpushare_tests::{Broker, BrokerOptions};

/// The legacy order as gpushared keeps it, spoken raw: event records are operations on their
/// stream like any other. Times are the sim device's modelled ones, exact.
#[test]
fn event_records_keep_cuda_legacy_stream_order() {
    let broker = Broker::start_with(BrokerOptions {
        backend: Some("sim".into()),
        ..Default::default()
    });
    let raw = RawClient::connect_as(&broker.socket, Role::Consolidated);
    let ok = |cmd: Command| {
        let c = raw.submit_one(cmd).expect("a completion");
        assert_eq!(c.status, 0, "{cmd:?}");
        c.result
    };
    let len = 32 << 20;
    let dst = ok(Command::Alloc { bytes: len });
    let (blocking, non_blocking, other_blocking) = (1, 2, 3);
    for (stream, flags) in [(blocking, 0), (non_blocking, 1), (other_blocking, 0)] {
        ok(Command::StreamCreateAs {
            stream,
            flags,
            priority: 0,
        });
    }
    for event in [1, 2, 3] {
        ok(Command::EventCreateAs { event, flags: 0 });
    }
    // How far a memset on `work` moves events recorded on `watch` before and after it.
    let moved = |watch, work, between: &dyn Fn()| {
        ok(Command::EventRecord {
            stream: watch,
            event: 1,
        });
        ok(Command::Memset {
            stream: work,
            dst,
            value: 1,
            len,
        });
        between();
        ok(Command::EventRecord {
            stream: watch,
            event: 2,
        });
        ok(Command::EventElapsed { start: 1, end: 2 })
    };
    let nothing = || {};
    assert!(
        moved(0, blocking, &nothing) > 0,
        "stream 0 after a blocking stream"
    );
    assert_eq!(
        moved(0, non_blocking, &nothing),
        0,
        "not after a non-blocking one"
    );
    assert!(
        moved(blocking, 0, &nothing) > 0,
        "a blocking stream after stream 0"
    );
    assert_eq!(
        moved(non_blocking, 0, &nothing),
        0,
        "a non-blocking one is not"
    );
    // Through stream 0: a record there orders it after the blocking stream's work, and the
    // other blocking stream after that record.
    let record_on_0 = || {
        ok(Command::EventRecord {
            stream: 0,
            event: 3,
        });
    };
    assert!(
        moved(other_blocking, blocking, &record_on_0) > 0,
        "one blocking stream after another's work, through a record on stream 0"
    );
}

//! The priority policy's gate in the real broker: best-effort work granted before a
//! high-priority request waits on the device until the request's kernels are done.

use gpushare::{Client, ConnectOptions, Kernel};
use gpushare_protocol::PriorityClass;

use super::broker_with;

/// What the best-effort client has queued when the request comes: a 300 ms kernel running and
/// one more behind it. On the sim device work runs in the order the device takes it, so
/// without the gate the second kernel, taken at once, runs before the request's kernel.
/// `settled`: the request comes only once the device worker has taken both (without the gate
/// it takes them at once; with it the second waits at the gate, so the test cannot wait for
/// that and pauses instead).
fn queued_then_request(policy: &str, settled: bool) -> bool {
    let broker = broker_with(policy);
    let be = Client::connect_with(ConnectOptions {
        class: Some(PriorityClass::BestEffort),
        ..broker.options("be")
    })
    .expect("connect best-effort");
    let high = broker.client_named("high");
    assert_eq!(high.session().class, PriorityClass::High);
    let stream = be.create_stream().expect("stream");
    let long = Kernel::Spin {
        micros: 300_000,
        blocks: 1,
    };
    let be_done = be.create_event().expect("event");
    stream.launch(long).expect("first");
    stream.launch(long).expect("second");
    be_done.record(&stream).expect("record");
    // Both granted (two may be in flight beside a high-priority client) before the request:
    // the data thread answers this after the commands before it, without the device.
    be.end_iteration().expect("a command after the launches");
    if settled {
        // The worker answers the session's calls in order: this one after both launches.
        // (Without it the request could reach the device first, 3 runs in 25 on a 2-core VM.)
        be.create_event()
            .expect("a call the worker answers after the launches");
    } else {
        // With the gate the worker cannot answer such a call before 300 ms (the second
        // kernel waits at the gate), so give it the time it takes to send them instead: a
        // gate that did not hold would have let the second kernel onto the device by now.
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let request = high.default_stream();
    request
        .launch(Kernel::Spin {
            micros: 1_000,
            blocks: 1,
        })
        .expect("request");
    request.synchronize().expect("request done");
    let be_finished_first = be_done.query().expect("query");
    be_done.synchronize().expect("best-effort work finishes");
    be_finished_first
}

#[test]
fn best_effort_work_queued_before_a_high_priority_request_waits_for_it() {
    let policy = "scheduler = \"priority\"\n[defaults]\nclass = \"high\"\n";
    // Up to three tries: on the 2-core VM, in about one run of fifteen (before the gate's
    // keeper changed too), the request reached the sim device only after the second kernel
    // had passed the gate at 300 ms: its launch, or the end of iteration before it, held
    // that long (not traced yet). A gate that did not hold loses every try: the second
    // kernel is on the device before the request.
    let held = (0..3).any(|_| !queued_then_request(policy, false));
    assert!(
        held,
        "the best-effort kernel queued before the request ran before it, three times"
    );
    // Without the gate it does on the sim device (what the test tells apart there). A GPU
    // runs the request's one-block kernel beside the running one, and its stream priority
    // puts it ahead of the queued one, gate or not: there the test checks that gated work
    // runs and finishes.
    if gpushare_tests::test_backend() == "sim" {
        assert!(queued_then_request(
            &format!("{policy}[priority]\ngate = false\n"),
            true
        ));
    }
}

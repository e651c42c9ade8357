//! Governed programs under the scheduler: held while high-priority work is in flight, and
//! paced by TGS rate control.

use super::*;

/// A governed training loop (`governed_app loop MS THREADS mixed BLOCKS`) as a best-effort
/// client, with `meanwhile` run while it runs: its launch count, and its row in status before
/// it exits (after its last synchronization reported every launch).
fn best_effort_loop(
    broker: &Broker,
    ms: u32,
    threads: u32,
    blocks: u64,
    meanwhile: impl FnOnce(),
) -> (u64, gpushare::ClientStats) {
    let mut child = governed_app(
        &broker.socket,
        &["--class", "best-effort", "--name", "trainer"],
        &[
            "loop",
            &ms.to_string(),
            &threads.to_string(),
            "mixed",
            &blocks.to_string(),
        ],
    )
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .spawn()
    .expect("start the program");
    meanwhile();
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let line = lines.next().and_then(Result::ok).unwrap_or_default();
    let launched: u64 = line
        .strip_prefix("launched ")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("the program printed `{line}`"));
    let mut row = None;
    assert!(
        wait_until(Duration::from_secs(5), || {
            row = broker
                .status()
                .clients
                .into_iter()
                .find(|c| c.name == "trainer" && c.kernels == launched);
            row.is_some()
        }),
        "status never showed the program's {launched} launches: {:?}",
        broker.status().clients
    );
    drop(child.stdin.take());
    let status = child.wait().expect("wait");
    assert!(status.success(), "{status}");
    (launched, row.expect("row"))
}

/// A brokered client of `class` with `work` of 20 ms spin kernels queued at once (its ring
/// holds them all): busy from the moment this returns for about that long. Returns what waits
/// for the work to be done.
///
/// Long kernels keep the scheduler's view true: on the sim device a kernel runs while it is
/// launched, so between two of them the dispatcher sees nothing in flight for a moment, and a
/// waiting best-effort request may pass then (as it may on a GPU in a real gap).
fn spin_for(broker: &Broker, class: gpushare::PriorityClass, work: Duration) -> impl FnOnce() {
    const KERNEL: Duration = Duration::from_millis(20);
    let client = gpushare::Client::connect_with(gpushare::ConnectOptions {
        class: Some(class),
        ..broker.options("spinner")
    })
    .expect("connect the spinner");
    let kernels = work.as_millis().div_ceil(KERNEL.as_millis());
    let stream = client.default_stream();
    for _ in 0..kernels {
        stream
            .launch(gpushare::Kernel::Spin {
                micros: KERNEL.as_micros() as u64,
                blocks: 1,
            })
            .expect("launch");
    }
    // Under way once the first kernel has run (the broker counts a kernel when its launch
    // returns, on the sim when it is done).
    assert!(
        wait_until(Duration::from_secs(5), || broker
            .status()
            .clients
            .iter()
            .any(|c| c.name == "spinner" && c.kernels >= 1)),
        "the spinner's work did not start"
    );
    move || {
        stream.synchronize().expect("the spinner's work");
        drop(stream);
        drop(client);
    }
}

fn sim_realtime_broker(policy: &str) -> Broker {
    let broker = Broker::start_with(BrokerOptions {
        policy: Some(policy.into()),
        // Kernels take their modelled time on the wall clock, so the spinner is busy while its
        // queued kernels last.
        extra_args: vec!["--sim-realtime".into()],
        backend: Some("sim".into()),
        ..Default::default()
    });
    broker.dump_log_if_stuck(Duration::from_secs(60));
    broker
}

#[test]
fn a_best_effort_governed_program_is_held_while_high_priority_work_is_in_flight() {
    let broker = sim_realtime_broker("scheduler = \"priority\"\n[defaults]\nclass = \"high\"\n");
    // The high-priority client connected but idle: the program's launches are scheduled
    // (two clients), and nothing holds them.
    // A client alone on its GPU is not scheduled at all: this one, connected throughout,
    // makes sure every launch of the others is.
    let _idle = broker.client_named("idle");
    let (free, free_row) = best_effort_loop(&broker, 400, 2, 4, || {});
    // The high-priority client busy for 1.5 s from before the program starts (the program's
    // loop takes 0.4 s): the program's launches wait for gaps in its work, and the waits show
    // as throttled time.
    let (held, held_row) = best_effort_loop(
        &broker,
        400,
        2,
        4,
        spin_for(
            &broker,
            gpushare::PriorityClass::High,
            Duration::from_secs(1),
        ),
    );
    println!(
        "best-effort governed loop: {free} launches beside an idle high-priority client (throttled {} ns), {held} beside a busy one (throttled {} ns)",
        free_row.throttled_ns, held_row.throttled_ns
    );
    assert!(held_row.governed && held_row.class == gpushare::PriorityClass::BestEffort);
    // The program is held except in the gaps of the high-priority work (more of them when
    // the machine's CPUs are busy and the spinner's thread waits for one): its launches fall
    // and its waits grow, by a wide margin on a quiet machine, and always some.
    assert!(
        held_row.throttled_ns > 0 && held_row.throttled_ns > free_row.throttled_ns,
        "throttled {} ns beside busy high-priority work, {} ns beside idle",
        held_row.throttled_ns,
        free_row.throttled_ns
    );
    assert!(held < free, "{held} launches while held, {free} while free");
}

#[test]
fn tgs_rate_control_paces_a_best_effort_governed_program_beside_a_high_priority_one() {
    // PACK runs every client's work at once and never holds one class for another: what
    // changes between the two runs is only the other client's class, and with it the TGS rate
    // limit on best-effort thread blocks (binding while a high-priority client has work in
    // flight). Each launch is a huge grid, far past the limiter's bucket.
    let broker = sim_realtime_broker("scheduler = \"pack\"\n[defaults]\nclass = \"high\"\n");
    let blocks = 1u64 << 28;
    // A client alone on its GPU is not scheduled at all: this one, connected throughout,
    // makes sure every launch of the others is.
    let _idle = gpushare::Client::connect_with(gpushare::ConnectOptions {
        class: Some(gpushare::PriorityClass::Normal),
        ..broker.options("idle")
    })
    .expect("connect");
    let run = |class| {
        best_effort_loop(
            &broker,
            400,
            1,
            blocks,
            spin_for(&broker, class, Duration::from_millis(1500)),
        )
    };
    let (beside_normal, normal_row) = run(gpushare::PriorityClass::Normal);
    let (beside_high, high_row) = run(gpushare::PriorityClass::High);
    println!(
        "best-effort governed loop of {blocks}-block launches: {beside_normal} launches beside a busy normal client (throttled {} ns), {beside_high} beside a busy high one (throttled {} ns)",
        normal_row.throttled_ns, high_row.throttled_ns
    );
    // As in the priority test, only gaps in the high-priority work let it through.
    assert!(
        high_row.throttled_ns > 0 && high_row.throttled_ns > normal_row.throttled_ns,
        "throttled {} ns beside high, {} ns beside normal",
        high_row.throttled_ns,
        normal_row.throttled_ns
    );
    assert!(
        beside_high < beside_normal,
        "{beside_high} launches rate-limited, {beside_normal} not"
    );
}

//! The GPU scheduler as sessions meet it.

use super::*;
use gpushare_protocol::Kernel;

fn dispatch(sm_partitions: bool, share: Option<f64>) -> GpuScheduler {
    priority_pair(
        PriorityConfig {
            lower_sm_share: share,
            ..PriorityConfig::default()
        },
        sm_partitions,
    )
}

/// Under priority with `priority`, a high-priority client (1) and a best-effort one (2).
fn priority_pair(priority: PriorityConfig, sm_partitions: bool) -> GpuScheduler {
    let d = GpuScheduler::new(
        PolicyKind::Priority,
        Tunables {
            priority,
            ..Tunables::default()
        },
        DeviceShape {
            sms: 132,
            sm_partitions,
        },
    );
    d.add_client(1, PriorityClass::High, 1, 1, false, "default");
    d.add_client(2, PriorityClass::BestEffort, 1, 2, false, "default");
    d
}

#[test]
fn high_priority_kernels_skip_the_scheduler_only_while_a_partition_holds_the_rest() {
    let d = dispatch(true, Some(0.25));
    assert!(!d.schedules(PriorityClass::High));
    assert!(d.schedules(PriorityClass::BestEffort));
    // No partition asked for, or none the device can make: high is scheduled.
    assert!(dispatch(true, None).schedules(PriorityClass::High));
    assert!(dispatch(false, Some(0.25)).schedules(PriorityClass::High));
    // A governed program is in its own context, which no partition holds.
    d.add_client(3, PriorityClass::BestEffort, 1, 3, true, "default");
    assert!(d.schedules(PriorityClass::High));
    d.remove_client(3);
    assert!(!d.schedules(PriorityClass::High));
    // Switching the policy live follows.
    d.set_policy(PolicyKind::Priority, Tunables::default());
    assert!(d.schedules(PriorityClass::High));
    d.set_policy(PolicyKind::Fair, Tunables::default());
    assert!(d.schedules(PriorityClass::High));
}

/// FAIR side by side with a 5 ms quantum and a 10 ms free lead, two clients.
fn free_scheduler() -> GpuScheduler {
    let d = GpuScheduler::new(
        PolicyKind::Fair,
        Tunables {
            fair: crate::sched::FairConfig {
                side_by_side: true,
                quantum_ns: 5_000_000,
                free_lead_ns: 10_000_000,
                ..crate::sched::FairConfig::default()
            },
            ..Tunables::default()
        },
        DeviceShape {
            sms: 132,
            sm_partitions: false,
        },
    );
    d.add_client(1, PriorityClass::Normal, 1, 1, false, "default");
    d.add_client(2, PriorityClass::Normal, 1, 2, false, "default");
    d
}

#[test]
fn fair_running_free_leaves_launches_ungated_until_a_lead_grows() {
    let d = free_scheduler();
    assert!(
        d.schedules(PriorityClass::Normal),
        "gated until device time says"
    );
    // Level device time: free once the policy has held nobody for a while (50 ms).
    let level_until_free = || {
        let give_up = Instant::now() + Duration::from_secs(5);
        while d.schedules(PriorityClass::Normal) {
            assert!(Instant::now() < give_up, "never free");
            d.device_time(1, 100_000);
            d.device_time(2, 100_000);
            std::thread::yield_now();
        }
    };
    level_until_free();
    d.device_time(1, 30_000_000);
    assert!(d.schedules(PriorityClass::Normal), "a 30 ms lead: gated");
    d.device_time(2, 30_000_000);
    level_until_free();
    // A policy switched live starts gated.
    d.set_policy(PolicyKind::Fair, Tunables::default());
    assert!(d.schedules(PriorityClass::Normal));
}

#[test]
fn clients_share_a_context_tag_exactly_when_they_share_a_gpu_context() {
    let d = dispatch(false, None);
    d.add_client(3, PriorityClass::BestEffort, 1, 3, false, "lab");
    d.add_client(4, PriorityClass::BestEffort, 1, 4, false, "lab");
    d.add_client(5, PriorityClass::BestEffort, 1, 5, false, "other");
    d.add_client(6, PriorityClass::BestEffort, 1, 6, true, "default");
    d.add_client(7, PriorityClass::BestEffort, 1, 7, true, "default");
    let context = |id| d.lock().dispatcher.spec(id).map(|s| s.context);
    assert_eq!(context(1), Some(0));
    assert_eq!(context(1), context(2));
    assert_eq!(context(3), context(4));
    let distinct: std::collections::HashSet<_> = [1, 3, 5, 6, 7].into_iter().map(context).collect();
    assert_eq!(distinct.len(), 5, "{distinct:?}");
    // A deadline re-registers the client; it stays in its context.
    d.set_deadline((3, PriorityClass::BestEffort, 1), None, None)
        .expect("client is registered");
    assert_eq!(context(3), context(4));
}

/// A session's stamps of its work on the device, as the guardian reads them.
struct Stamps(crate::gpu::health::FaultWatch, u64);

impl Member for Stamps {
    fn id(&self) -> u64 {
        self.1
    }
    fn pid(&self) -> i32 {
        0
    }
    fn uid(&self) -> u32 {
        0
    }
    fn watch(&self) -> &crate::gpu::health::FaultWatch {
        &self.0
    }
    fn wake(&self) {}
}

/// Running free, a client whose work waits on the device behind others' is charged nothing;
/// its session's stamps still count it, so its lag gates the launches.
#[test]
fn running_free_a_client_with_work_waiting_on_the_device_gates_the_launches() {
    let d = free_scheduler();
    let waiting = Arc::new(Stamps(Default::default(), 2));
    d.watch(2, waiting.clone());
    let until = |gated: bool, why: &str| {
        let give_up = Instant::now() + Duration::from_secs(5);
        while d.schedules(PriorityClass::Normal) != gated {
            assert!(Instant::now() < give_up, "{why}");
            d.device_time(1, 100_000);
            std::thread::yield_now();
        }
    };
    // Client 2 has had no work yet: client 1 alone is charged, and runs free.
    until(false, "never free");
    waiting.0.busy_since.store(1, Ordering::Release);
    until(true, "client 2's work waits, yet launches stay free");
}

/// `status`'s account of running free: none where the policy cannot, then whether launches
/// skip the scheduler now and for how long in all, kept across a switch of policy.
#[test]
fn the_time_spent_running_free_is_counted_across_a_policy_switch() {
    assert_eq!(dispatch(false, None).free_running(), None, "priority");
    let d = free_scheduler();
    assert_eq!(d.free_running(), Some((false, 0)));
    let give_up = Instant::now() + Duration::from_secs(5);
    while d
        .free_running()
        .is_none_or(|(now, total)| !now || total == 0)
    {
        assert!(Instant::now() < give_up, "never free");
        d.device_time(1, 100_000);
        d.device_time(2, 100_000);
        std::thread::yield_now();
    }
    d.set_policy(PolicyKind::Fifo, Tunables::default());
    let Some((false, total)) = d.free_running() else {
        panic!("after the switch: {:?}", d.free_running());
    };
    assert!(total > 0);
    assert_eq!(d.free_running(), Some((false, total)), "no longer growing");
}

/// A gate that only remembers what it was told.
#[derive(Default)]
struct Switch(AtomicBool);

impl GateSwitch for Switch {
    fn set_closed(&self, closed: bool) {
        self.0.store(closed, Ordering::Release);
    }

    fn word(&self) -> crate::device::GateWord {
        gate_word(7)
    }
}

fn gate_word(region: u64) -> crate::device::GateWord {
    crate::device::GateWord {
        page: crate::shm::Span {
            region,
            offset: 0,
            len: 4096,
        },
        slot: 0,
    }
}

fn spin_kernel() -> Kernel {
    Kernel::Spin {
        micros: 100,
        blocks: 1,
    }
}

/// A kernel of `id` granted at once (the test's clients are never held).
fn granted(d: &GpuScheduler, id: ClientId) -> Turn {
    d.acquire(
        id,
        |p| p.builtin_profile(&spin_kernel()),
        &[],
        |_| {},
        || false,
    )
    .expect("granted")
}

/// Under priority, lower kernels granted beside a high-priority client wait at the gate, and
/// the gate is closed exactly while high-priority kernels are in flight.
#[test]
fn the_priority_gate_is_closed_while_high_priority_kernels_are_in_flight() {
    let d = dispatch(false, None);
    let switch = Arc::new(Switch::default());
    switch.0.store(true, Ordering::Release);
    d.set_gate(switch.clone());
    assert!(!switch.0.load(Ordering::Acquire), "a new gate is opened");
    let lower = granted(&d, 2);
    assert!(lower.gated, "a lower kernel beside a high-priority client");
    // Only at this gate: another trust domain's page has a gate nothing closes.
    assert!(d.steers(&gate_word(7)));
    assert!(!d.steers(&gate_word(8)));
    assert_eq!(d.gate_closed(), Some(false));
    let high = granted(&d, 1);
    assert!(!high.gated, "high-priority work never waits at the gate");
    assert!(switch.0.load(Ordering::Acquire), "closed for the request");
    d.complete(1, &[(high.request, None)]);
    assert!(!switch.0.load(Ordering::Acquire), "opened once it is done");
    d.complete(2, &[(lower.request, None)]);
    // Alone, the lower client is not gated.
    d.remove_client(1);
    assert!(!granted(&d, 2).gated);
}

/// A high-priority client that never pauses does not keep the gate closed for longer than
/// `MAX_CLOSED_NS`; it closes again for its next request.
#[test]
fn the_priority_gate_opens_for_a_high_priority_client_that_never_pauses() {
    let d = dispatch(false, None);
    let switch = Arc::new(Switch::default());
    d.set_gate(switch.clone());
    let first = granted(&d, 1);
    assert!(switch.0.load(Ordering::Acquire));
    let give_up = Instant::now() + Duration::from_secs(5);
    while switch.0.load(Ordering::Acquire) {
        assert!(Instant::now() < give_up, "never opened");
        // Nothing finished: the scheduler only looks again.
        d.complete(1, &[]);
        std::thread::yield_now();
    }
    // More of it, still in flight: still open.
    let second = granted(&d, 1);
    assert!(!switch.0.load(Ordering::Acquire));
    d.complete(1, &[(first.request, None), (second.request, None)]);
    granted(&d, 1);
    assert!(
        switch.0.load(Ordering::Acquire),
        "closed for the next request"
    );
}

/// Other policies, and priority with `gate = false`, never close it.
#[test]
fn the_priority_gate_stays_open_unless_the_policy_gates() {
    let d = priority_pair(
        PriorityConfig {
            gate_lower: false,
            ..PriorityConfig::default()
        },
        false,
    );
    let switch = Arc::new(Switch::default());
    d.set_gate(switch.clone());
    assert!(!granted(&d, 2).gated);
    granted(&d, 1);
    assert!(!switch.0.load(Ordering::Acquire));
    d.set_policy(PolicyKind::Fair, Tunables::default());
    assert_eq!(d.gate_closed(), Some(false));
}

/// A priority pair whose gate has its keeper running.
fn kept_gate() -> (Arc<GpuScheduler>, Arc<Switch>) {
    let d = Arc::new(dispatch(false, None));
    let switch = Arc::new(Switch::default());
    d.set_gate(switch.clone());
    d.keep_gate();
    (d, switch)
}

/// Waits (5 s at most) until the gate, closed now, is opened with no other call.
fn opened_by_the_keeper(d: &GpuScheduler, switch: &Switch) {
    assert!(switch.0.load(Ordering::Acquire), "closed to begin with");
    let give_up = Instant::now() + Duration::from_secs(5);
    while switch.0.load(Ordering::Acquire) {
        assert!(Instant::now() < give_up, "never opened");
        std::thread::yield_now();
    }
    assert_eq!(d.gate_closed(), Some(false));
}

/// With its keeper running, the gate opens after `MAX_CLOSED_NS` though nothing else happens:
/// what would make the scheduler look again (the request finishing) may itself be held on
/// the device (run G4 in docs/benchmarks.md).
#[test]
fn the_priority_gate_s_keeper_opens_it_by_the_clock() {
    let (d, switch) = kept_gate();
    granted(&d, 1);
    opened_by_the_keeper(&d, &switch);
}

/// A closing that comes while the keeper is awake (it watches by itself for a while after a
/// closing, and is then not woken) is opened by the bound all the same.
#[test]
fn the_priority_gate_s_keeper_opens_a_closing_it_was_not_woken_for() {
    let (d, switch) = kept_gate();
    let first = granted(&d, 1);
    assert!(switch.0.load(Ordering::Acquire));
    d.complete(1, &[(first.request, None)]);
    assert!(!switch.0.load(Ordering::Acquire), "opened once it is done");
    // The keeper looked at the first closing's bound, found the gate open, and watches.
    let give_up = Instant::now() + Duration::from_secs(5);
    while !d.gate_keeper_watching() {
        assert!(Instant::now() < give_up, "the keeper never watched");
        std::thread::yield_now();
    }
    // Closed again: the keeper is not woken for it.
    granted(&d, 1);
    opened_by_the_keeper(&d, &switch);
}

//! What the dispatcher charges a client for its kernels.

use super::*;

/// What a client is charged: a kernel that had the GPU to itself its measured time, one that
/// shared it (another client's work in flight when it was granted, or granted while it ran)
/// its estimate, since its measured span includes the other's work.
#[test]
fn a_kernel_is_charged_its_measured_time_only_when_it_ran_alone() {
    let n = PriorityClass::Normal;
    let mut d = dispatcher(
        PolicyKind::Fifo,
        SchedConfig::default(),
        &[spec(1, n), spec(2, n)],
    );
    let charged = |d: &Dispatcher, id| d.stats(id).map(|s| s.gpu_ns);
    // Alone: its measured 50 µs.
    let a = d.submit(1, k(10), 0).expect("registered");
    assert_eq!(d.poll(0).len(), 1);
    d.complete(1, a, Some(50 * US), 1).expect("in flight");
    assert_eq!(charged(&d, 1), Some(50 * US));
    // Client 2's kernel granted while client 1's ran: both shared the GPU, both charged 10 µs.
    let a = d.submit(1, k(10), 2).expect("registered");
    assert_eq!(d.poll(2).len(), 1);
    let b = d.submit(2, k(10), 3).expect("registered");
    assert_eq!(d.poll(3).len(), 1);
    d.complete(1, a, Some(70 * US), 4).expect("in flight");
    d.complete(2, b, Some(70 * US), 5).expect("in flight");
    assert_eq!(charged(&d, 1), Some(60 * US));
    assert_eq!(charged(&d, 2), Some(10 * US));
    // Client 1's own kernels back to back, nobody else's since: measured again, whatever
    // client 2 did before they were granted.
    let a1 = d.submit(1, k(10), 6).expect("registered");
    let a2 = d.submit(1, k(10), 6).expect("registered");
    assert_eq!(d.poll(6).len(), 2);
    d.complete(1, a1, Some(20 * US), 7).expect("in flight");
    d.complete(1, a2, Some(30 * US), 8).expect("in flight");
    assert_eq!(charged(&d, 1), Some(110 * US));
}

/// A timed kernel whose time comes after it was reported finished: charged its estimate
/// meanwhile, and its profile learns the time when it comes, as at completion; a time for
/// another client's request, or for a client gone, teaches nothing.
#[test]
fn a_time_that_comes_later_teaches_the_profile_as_one_at_completion() {
    let n = PriorityClass::Normal;
    let mut d = dispatcher(
        PolicyKind::Fifo,
        SchedConfig::default(),
        &[spec(1, n), spec(2, n)],
    );
    let learned = |d: &Dispatcher| d.profiles().get(k(10).key).map(|p| p.est_ns);
    let a = d.submit(1, k(10), 0).expect("registered");
    assert_eq!(d.poll(0).len(), 1);
    d.complete_timed_later(1, a, 1).expect("in flight");
    assert_eq!(d.stats(1).map(|s| s.gpu_ns), Some(10 * US), "its estimate");
    assert_eq!(d.inflight_of(1), 0, "finished");
    assert_eq!(learned(&d), None, "nothing measured yet");
    assert!(d.timed(2, a, 40 * US, 2).is_err(), "not client 2's");
    d.timed(1, a, 40 * US, 2).expect("awaited");
    assert_eq!(learned(&d), Some(40 * US));
    assert!(d.timed(1, a, 40 * US, 3).is_err(), "taught once");
    let b = d.submit(1, k(10), 4).expect("registered");
    assert_eq!(d.poll(4).len(), 1);
    d.complete_timed_later(1, b, 5).expect("in flight");
    d.remove_client(1).expect("registered");
    assert!(d.timed(1, b, 90 * US, 6).is_err(), "its client is gone");
    assert_eq!(learned(&d), Some(40 * US));
}

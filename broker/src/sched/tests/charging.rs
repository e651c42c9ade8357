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

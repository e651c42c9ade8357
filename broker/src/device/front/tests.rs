//! The front against a sim device in real time, where (as on a GPU) device time is learnt
//! only once the work has ended, by whichever call on the stream comes next.

use std::time::{Duration, Instant};

use gpushare_protocol::{Kernel, PriorityClass};

use crate::device::sim::{SimDevice, SimOptions};
use crate::device::{Call, Device, DeviceResult, Stream};

fn realtime() -> Device {
    let sim = SimDevice::new(SimOptions {
        realtime: true,
        ..SimOptions::default()
    });
    Device::local(sim, None).expect("a sim device")
}

/// Queues `kernel` on `s`, on the whole device.
fn launch(d: &Device, s: &mut Stream, kernel: Kernel) -> DeviceResult<()> {
    d.queue(
        s,
        |stream| Call::Launch {
            stream,
            kernel,
            start: None,
            place: Default::default(),
        },
        &[],
    )
}

/// Device time that a question about the stream learns (is it busy, is it done) is charged
/// at the next account, not lost: FAIR's shares and `status` rest on it.
#[test]
fn device_time_learnt_by_a_question_about_the_stream_is_still_charged() {
    let d = realtime();
    for ask in ["busy", "done"] {
        let mut s = d.create_stream(PriorityClass::Normal).expect("stream");
        let kernel = Kernel::Spin {
            micros: 20_000,
            blocks: 1,
        };
        launch(&d, &mut s, kernel).expect("launch");
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut running = true;
        while running && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
            running = match ask {
                "busy" => d.stream_busy(&mut s),
                _ => !d.stream_done(&s).expect("stream done"),
            };
        }
        assert!(!running, "the kernel ended");
        let _ = d.stream_busy(&mut s);
        assert_eq!(d.take_busy_ns(&mut s), 20_000_000, "asked whether {ask}");
        d.destroy_stream(s);
    }
}

/// A stream seen finished is not asked again until work is queued on it (a framework keeps
/// dozens of streams, and each question is a round trip to the device), but work queued
/// after that makes it busy again.
#[test]
fn a_stream_seen_finished_is_busy_again_once_work_is_queued() {
    let d = realtime();
    let mut s = d.create_stream(PriorityClass::Normal).expect("stream");
    assert!(!d.stream_busy(&mut s), "a new stream has nothing to do");
    let spin = |s: &mut Stream, micros| {
        launch(&d, s, Kernel::Spin { micros, blocks: 1 }).expect("launch");
    };
    spin(&mut s, 1_000);
    let deadline = Instant::now() + Duration::from_secs(10);
    while d.stream_busy(&mut s) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(!d.stream_busy(&mut s), "the first kernel ended");
    spin(&mut s, 200_000);
    assert!(
        d.stream_busy(&mut s),
        "a kernel queued after is seen running"
    );
    d.sync_stream(&mut s).expect("sync");
    assert!(!d.stream_busy(&mut s), "synchronized, nothing is left");
    assert!(!d.stream_busy(&mut s), "and it stays so");
    d.destroy_stream(s);
}

/// A synchronization writes the stream's closing value itself, once it has seen the work
/// finish: until then the slot says the work started (a fault meanwhile reports it lost, never
/// finished), and a second synchronization with nothing queued between closes with the same
/// value.
#[test]
fn the_wait_that_sees_a_stream_s_work_finish_marks_it_finished() {
    let d = realtime();
    let mut s = d.create_stream(PriorityClass::Normal).expect("stream");
    launch(
        &d,
        &mut s,
        Kernel::Spin {
            micros: 100_000,
            blocks: 1,
        },
    )
    .expect("launch");
    let progress = d.progress.as_ref().expect("a progress page");
    let slot = s.slot.expect("a progress slot");
    let opening = s
        .episode
        .as_ref()
        .and_then(|e| e.mark())
        .expect("an opening value");
    let close = d.close(&mut s).expect("a closing value");
    assert_ne!(close.value, opening);
    assert_eq!(d.close(&mut s), Some(close), "nothing queued since");
    assert!(
        progress.reached(slot, opening),
        "the stream got to the work"
    );
    std::thread::sleep(Duration::from_millis(20));
    assert!(
        progress.reached(slot, opening),
        "running, not marked finished"
    );
    d.sync_stream(&mut s).expect("sync");
    assert!(
        progress.reached(slot, close.value),
        "marked finished by the synchronization"
    );
    d.destroy_stream(s);
}

/// The opening value is written once the device has taken a stream's first call: work queued
/// after the fault was seen, which the device refuses, is found never started, while work
/// queued before it was seen counts as started.
#[test]
fn work_the_device_refused_is_found_never_started() {
    use crate::device::progress::Fate;
    let d = realtime();
    let mut culprit = d.create_stream(PriorityClass::Normal).expect("stream");
    let mut before = d.create_stream(PriorityClass::Normal).expect("stream");
    let mut after = d.create_stream(PriorityClass::Normal).expect("stream");
    let fill = Kernel::Spin {
        micros: 10,
        blocks: 1,
    };
    launch(&d, &mut culprit, Kernel::Fault { hang: false }).expect("taken: it faults later");
    launch(&d, &mut before, fill).expect("taken before anyone saw the fault");
    assert!(d.sync_stream(&mut culprit).is_err(), "the fault is seen");
    let _ = launch(&d, &mut after, fill);
    assert!(matches!(d.fate(&mut before), Fate::Lost(_)));
    // (In process a refused call fails at once, to its caller, and is not kept; through a
    // worker the refusal comes later, and the kept calls are queued again.)
    assert!(
        matches!(d.fate(&mut after), Fate::NotStarted(_)),
        "refused work counted as started"
    );
}

/// A synchronization writes the value it is told to (a client's sync word) once it has seen
/// the work finish, but not when it is to report a failure of work queued before it: the word
/// never says a synchronization succeeded that the client is told failed.
#[test]
fn the_sync_word_is_written_only_for_a_synchronization_that_succeeds() {
    let d = realtime();
    let mut s = d.create_stream(PriorityClass::Normal).expect("stream");
    let progress = d.progress.as_ref().expect("a progress page");
    // A slot of the progress page that no stream has stands in for the client's word.
    let slot = progress.take_slot().expect("a free slot");
    let told = |value| {
        Some(crate::device::ProgressValue {
            page: progress.span(),
            slot,
            value,
        })
    };
    let spin = |s: &mut Stream| {
        launch(
            &d,
            s,
            Kernel::Spin {
                micros: 2_000,
                blocks: 1,
            },
        )
        .expect("launch");
    };
    spin(&mut s);
    d.sync_stream_telling(&mut s, told(77)).expect("sync");
    assert!(progress.reached(slot, 77), "told of a sync that succeeded");
    spin(&mut s);
    // It fails on the device: reported when queued (an in-process device runs it at once)
    // or by the sync, which then says nothing to the word.
    let queued = d.queue(
        &mut s,
        |stream| Call::Memset {
            stream,
            dst: 0xdead_0000,
            value: 0,
            elem_bytes: 1,
            count: 16,
        },
        &[],
    );
    let synced = d.sync_stream_telling(&mut s, told(88));
    assert!(
        queued.is_err() || synced.is_err(),
        "the failure is reported"
    );
    assert!(progress.reached(slot, 77), "not told after a failure");
    spin(&mut s);
    d.sync_stream_telling(&mut s, told(99))
        .expect("the failure was told once");
    assert!(progress.reached(slot, 99));
    d.destroy_stream(s);
}

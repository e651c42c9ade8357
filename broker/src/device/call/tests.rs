use super::*;
use gpushare_protocol::control::{decode, encode};

#[test]
fn every_device_error_survives_the_trip() {
    let errors = [
        DeviceError::OutOfMemory,
        DeviceError::NotSupported {
            backend: "sim".into(),
            what: "modules".into(),
        },
        DeviceError::InvalidArgument("x".into()),
        DeviceError::NotReady,
        DeviceError::Failed("f".into()),
        DeviceError::Fault("illegal address".into()),
        DeviceError::Cancelled,
        DeviceError::AddressUnavailable("0x1000".into()),
    ];
    for e in errors {
        let answer = Answer::failed(e.clone());
        let back: Answer = decode(&encode(&answer).expect("encodes")).expect("decodes");
        assert_eq!(back.reply.ok(), Err(e));
    }
}

#[test]
fn the_time_from_an_event_to_itself_is_zero() {
    use crate::device::sim::{SimDevice, SimOptions};
    let exec = Executor::new(SimDevice::new(SimOptions::default()));
    let run = |call| exec.run(call, &[]).reply;
    let class = PriorityClass::Normal;
    assert!(run(Call::CreateStream { id: 1, class }).ok().is_ok());
    let kind = EventKind::Timing;
    assert!(run(Call::CreateEvent { id: 2, kind }).ok().is_ok());
    let record = Call::RecordEvent {
        event: 2,
        stream: 1,
        start: false,
    };
    assert!(run(record).ok().is_ok());
    // `cuEventElapsedTime(e, e)`: this once locked the event twice and never answered.
    assert_eq!(run(Call::ElapsedNs { start: 2, end: 2 }).value(), Ok(0));
}

#[test]
fn a_reply_of_the_wrong_kind_is_an_error_not_a_value() {
    assert_eq!(Reply::Value(7).value(), Ok(7));
    assert!(Reply::Done.value().is_err());
    assert_eq!(
        Reply::Failed(DeviceError::NotReady).done(),
        Err(DeviceError::NotReady)
    );
}

#[test]
fn only_launches_take_a_start_marker() {
    let mut launch = Call::Launch {
        stream: 1,
        kernel: Kernel::FillF32 {
            dst: 0,
            n: 1,
            value: 0.0,
        },
        start: None,
        place: Default::default(),
    };
    *launch.start_marker().expect("a launch") = Some(4);
    assert!(matches!(launch, Call::Launch { start: Some(4), .. }));
    let mut sync = Call::SyncStream {
        stream: 1,
        close: None,
        told: None,
    };
    assert!(sync.start_marker().is_none());
}

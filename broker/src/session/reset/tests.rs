//! Tests of what a session lost in device resets, and of recognising commands that name it.

use gpushare_protocol::Kernel;
use gpushare_protocol::command::ModuleLaunch;

use super::*;

/// What a reset took: a buffer [0x1000, 0x1100), stream 3 (with work never synchronized),
/// event 4 and function 5.
fn lost() -> Lost {
    let mut l = Lost::default();
    l.buffers.insert(0x1000, 0x100);
    l.streams.insert(3);
    l.unsynced.insert(3);
    l.events.insert(4);
    l.functions.insert(5);
    l
}

fn launch_module(function: u64) -> Command {
    Command::LaunchModule {
        stream: 0,
        launch: ModuleLaunch {
            function,
            grid: [1; 3],
            block: [1; 3],
            shared_mem_bytes: 0,
            params_offset: 0,
            params_len: 0,
        },
    }
}

#[test]
fn a_lost_buffer_holds_its_bytes_only() {
    let l = lost();
    assert!(l.has_ptr(0x1000));
    assert!(l.has_ptr(0x10ff));
    assert!(!l.has_ptr(0x1100), "one past the end");
    assert!(!l.has_ptr(0x0fff));
    assert!(!Lost::default().has_ptr(0x1000));
}

#[test]
fn a_lost_buffer_at_the_top_of_memory_does_not_wrap() {
    let mut l = Lost::default();
    l.buffers.insert(u64::MAX - 0x10, 0x100);
    assert!(l.has_ptr(u64::MAX - 0x10));
    assert!(l.has_ptr(u64::MAX - 1));
    assert!(!l.has_ptr(0));
}

#[test]
fn commands_naming_lost_memory_are_recognised() {
    let l = lost();
    let copy = |src, dst| Command::CopyDtoD {
        stream: 0,
        src,
        dst,
        len: 4,
    };
    assert!(l.named_by(&copy(0x1010, 0x9000)), "by the source");
    assert!(l.named_by(&copy(0x9000, 0x1010)), "by the destination");
    assert!(!l.named_by(&copy(0x9000, 0x9100)));
    assert!(l.named_by(&Command::Free { ptr: 0x1000 }));
    let fill = |dst| Command::Launch {
        stream: 0,
        kernel: Kernel::FillF32 {
            dst,
            n: 4,
            value: 1.0,
        },
    };
    assert!(l.named_by(&fill(0x1080)), "by a kernel's operand");
    assert!(!l.named_by(&fill(0x2000)));
}

#[test]
fn commands_naming_lost_handles_are_recognised() {
    let l = lost();
    let on_lost_stream = Command::Memset {
        stream: 3,
        dst: 0x9000,
        value: 0,
        len: 4,
    };
    assert!(l.named_by(&on_lost_stream));
    assert!(l.named_by(&Command::StreamSync { stream: 3 }));
    assert!(!l.named_by(&Command::StreamSync { stream: 2 }));
    assert!(l.named_by(&Command::EventSync { event: 4 }));
    assert!(l.named_by(&Command::EventElapsed { start: 1, end: 4 }));
    assert!(!l.named_by(&Command::EventElapsed { start: 1, end: 2 }));
    assert!(l.named_by(&launch_module(5)));
    assert!(!l.named_by(&launch_module(6)));
    assert!(!l.named_by(&Command::Nop));
    assert!(!l.named_by(&Command::ClientSync));
}

#[test]
fn releasing_a_lost_handle_forgets_it() {
    let mut l = lost();
    let free = Command::Free { ptr: 0x1000 };
    assert!(l.release(&free));
    assert!(
        !l.named_by(&free),
        "a second free is an ordinary bad pointer"
    );

    let destroy = Command::StreamDestroy { stream: 3 };
    assert!(l.release(&destroy));
    assert!(!l.named_by(&destroy));
    assert!(
        !l.take_unsynced(3),
        "a destroyed stream's lost work is not reported"
    );

    let destroy = Command::EventDestroy { event: 4 };
    assert!(l.release(&destroy));
    assert!(!l.named_by(&destroy));
}

#[test]
fn only_releases_release() {
    let mut l = lost();
    assert!(!l.release(&Command::StreamSync { stream: 3 }));
    assert!(!l.release(&launch_module(5)));
    assert!(l.named_by(&Command::StreamSync { stream: 3 }));
    assert!(l.named_by(&launch_module(5)));
}

#[test]
fn lost_work_is_reported_once() {
    let mut l = lost();
    assert!(!l.take_unsynced(2));
    assert!(l.take_unsynced(3));
    assert!(!l.take_unsynced(3));

    let mut l = lost();
    l.unsynced.insert(0);
    assert!(l.take_any_unsynced());
    assert!(!l.take_any_unsynced());
    assert!(!l.take_unsynced(0));
}

#[test]
fn placing_memory_again_forgets_the_lost_buffers_it_overlaps() {
    let mut l = lost();
    l.buffers.insert(0x2000, 0x100);
    l.buffers.insert(0x3000, 0x100);
    // Overlaps the first by its last byte, the second wholly; touches the third.
    l.forget_buffers_in(0x10ff, 0x3000);
    assert!(!l.has_ptr(0x1000));
    assert!(!l.has_ptr(0x2000));
    assert!(l.has_ptr(0x3000));
}

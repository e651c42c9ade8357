//! Host functions in stream order without blocking the caller (`cuLaunchHostFunc`,
//! `cuStreamAddCallback`), as CUDA runs them. Each stream that gets one has a slot of two
//! words in a page of page-locked host memory shared with gpushared, and a thread here. The
//! stream is sent a host point (`StreamHostPoint`): it writes the point's number into the
//! slot's first word when its earlier work is done, then waits until the second word reaches
//! that number. The stream's thread waits for the first word, calls the function, and writes
//! the second, so the stream's later work runs after it; the program's thread goes on at once.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use gpushare_protocol::Command;

use crate::driver::{self, Driver};
use crate::status::Cu;

/// Slots in the page: two words each.
const SLOTS: usize = 4096 / 8;

/// A function to call once the stream gets to its point.
pub type Call = Box<dyn FnOnce() + Send>;

struct Task {
    call: Call,
    value: u32,
}

/// A stream's slot, its thread's queue, and its last point's number.
struct Lane {
    slot: usize,
    tasks: mpsc::Sender<Task>,
    last: u32,
}

#[derive(Default)]
pub struct HostPoints {
    /// The page: where the program reaches it, and where the device does.
    page: OnceLock<Option<(usize, u64)>>,
    lanes: Mutex<HashMap<u32, Lane>>,
}

impl Driver {
    /// Queues `call` on `stream` to run after its earlier work and before its later work;
    /// gives it back when that cannot be done here (no page, no slot left), for the caller
    /// to run the blocking way.
    pub fn host_point(&self, stream: u32, call: Call) -> Cu<Result<(), Call>> {
        let Some((host, device)) = *self
            .host_points
            .page
            .get_or_init(|| self.shared_page().ok())
        else {
            return Ok(Err(call));
        };
        let mut lanes = self
            .host_points
            .lanes
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if !lanes.contains_key(&stream) {
            if lanes.len() >= SLOTS {
                return Ok(Err(call));
            }
            let slot = lanes.len();
            let (tasks, queue) = mpsc::channel();
            let words = host + slot * 8;
            let spawned = std::thread::Builder::new()
                .name("gpushare-host-fn".into())
                .spawn(move || serve(words, queue));
            if spawned.is_err() {
                return Ok(Err(call));
            }
            lanes.insert(
                stream,
                Lane {
                    slot,
                    tasks,
                    last: 0,
                },
            );
        }
        let Some(lane) = lanes.get_mut(&stream) else {
            return Ok(Err(call));
        };
        let Some(value) = lane.last.checked_add(1) else {
            return Ok(Err(call));
        };
        let done = device + (lane.slot * 8) as u64;
        self.transport.post(Command::StreamHostPoint {
            stream,
            done,
            go: done + 4,
            value,
        })?;
        lane.last = value;
        // The thread lives as long as the process (its queue is never closed).
        let _ = lane.tasks.send(Task { call, value });
        Ok(Ok(()))
    }
}

/// A stream's thread: for each point in turn, waits until the stream got there, calls the
/// function, and lets the stream go on.
fn serve(words: usize, queue: mpsc::Receiver<Task>) {
    // SAFETY: two words of the shared page, which lives as long as the process; the device
    // writes the first, this thread the second.
    let (reached, go) = unsafe {
        (
            &*(words as *const AtomicU32),
            &*((words + 4) as *const AtomicU32),
        )
    };
    while let Ok(task) = queue.recv() {
        let started = Instant::now();
        let mut gone = false;
        while reached.load(Ordering::Acquire) < task.value {
            let waited = started.elapsed();
            if waited < Duration::from_micros(50) {
                std::hint::spin_loop();
            } else if waited < Duration::from_millis(2) {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
                // A session that ended never gets there.
                if driver::get().map_or(true, |d| d.transport.session.is_dead()) {
                    gone = true;
                    break;
                }
            }
        }
        if gone {
            return;
        }
        (task.call)();
        go.store(task.value, Ordering::Release);
    }
}

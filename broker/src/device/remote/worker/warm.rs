//! Warming a worker up, and keeping its address space's history the same in every worker.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};

use crate::device::{Backend, Call, DeviceResult};

/// Runs a little of everything a client's first requests need (a stream, memory, a built-in
/// kernel, cuBLAS), so that a spare taking over after a fault answers its first clients as
/// fast as a worker that has served for a while. It gives everything back, leaving no
/// memory held (rebuilding clients want their old addresses free).
pub(super) fn warm_up<B: Backend>(device: &B) {
    let started = std::time::Instant::now();
    let warmed = (|| -> DeviceResult<()> {
        let mut stream = device.create_stream(gpushare_protocol::PriorityClass::Normal)?;
        let ran = device.alloc(1 << 20).and_then(|buf| {
            let ran = (|| {
                device.launch(
                    &mut stream,
                    &gpushare_protocol::Kernel::FillF32 {
                        dst: buf,
                        n: 1 << 16,
                        value: 0.0,
                    },
                )?;
                // Zeros in bf16 too; the product lands in the buffer's second half.
                device.launch(
                    &mut stream,
                    &gpushare_protocol::Kernel::GemmBf16 {
                        a: buf,
                        b: buf,
                        c: buf + (512 << 10),
                        m: 64,
                        n: 64,
                        k: 64,
                        alpha: 1.0,
                        beta: 0.0,
                    },
                )?;
                device.sync_stream(&mut stream)
            })();
            let _ = device.free(buf);
            ran
        });
        device.destroy_stream(stream);
        ran
    })();
    match warmed {
        Ok(()) => tracing::debug!(took = ?started.elapsed(), "device warmed up"),
        Err(e) => {
            tracing::debug!(error = %e, took = ?started.elapsed(), "device warm-up cut short")
        }
    }
}

/// Whether the warm-up is over. Until it is, calls that place code and data in the context
/// (modules, functions) wait: the warm-up maps cuBLAS and loads kernels, and where the driver
/// puts a module's globals depends on everything mapped before. A spare that loaded a
/// client's modules while it warmed up placed them elsewhere than the serving worker, which
/// had warmed up before any client came (on the H200 cuBLAS's `deviceConstants` moved by
/// 0x32000000, and every PyTorch program lost its state at a fault).
#[derive(Default)]
pub(super) struct Warmed {
    /// Read without the lock (every launch asks); set under it, so a waiter cannot miss it.
    done: AtomicBool,
    lock: Mutex<()>,
    over: Condvar,
}

impl Warmed {
    pub(super) fn set(&self) {
        let _held = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        self.done.store(true, Ordering::Release);
        self.over.notify_all();
    }

    pub(super) fn wait(&self) {
        if self.done.load(Ordering::Acquire) {
            return;
        }
        let held = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        drop(
            self.over
                .wait_while(held, |_| !self.done.load(Ordering::Acquire))
                .unwrap_or_else(|p| p.into_inner()),
        );
    }
}

/// Whether a call waits for the warm-up: one that places code or data in the context
/// (above), and work that begins a measured span on a stream: during the warm-up's loading a
/// first launch stalls in the driver after its span's start event, and the stall was charged
/// to the client as device time (on an H200, 85 ms for a 3 ms kernel: docs/benchmarks.md,
/// run B4).
pub(super) fn waits_for_warm_up(call: &Call) -> bool {
    matches!(
        call,
        Call::LoadModule { .. }
            | Call::GetFunction { .. }
            | Call::ModuleGlobal { .. }
            | Call::Opening { .. }
            | Call::Launch { .. }
            | Call::LaunchModule { .. }
            | Call::LaunchGraph { .. }
            | Call::CopyHtoD { .. }
            | Call::CopyDtoH { .. }
            | Call::CopyDtoD { .. }
            | Call::Memset { .. }
    )
}

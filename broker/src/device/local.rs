//! [`Local`]: a device whose context lives in gpushared's own process
//! (`--in-process-device`): the link runs each call on its executor at once, on the calling
//! thread. The same executor serves a device worker; only the carrying differs.

use std::os::fd::BorrowedFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use gpushare_protocol::control::DeviceInfo;

use super::backend::Backend;
use super::call::{Answer, Call, Handle};
use super::executor::Executor;
use super::front::Device;
use super::link::{Ledger, Link};
use super::{DeviceError, DeviceResult};

/// A backend in this process.
pub struct Local<B: Backend> {
    executor: Executor<B>,
    ledger: Ledger,
    generation: AtomicU64,
}

impl<B: Backend> Local<B> {
    pub fn new(backend: B) -> Local<B> {
        Local {
            executor: Executor::new(backend),
            ledger: Ledger::default(),
            generation: AtomicU64::new(0),
        }
    }

    pub fn backend(&self) -> &B {
        self.executor.backend()
    }
}

impl Device {
    /// A device served by `backend` in this process.
    pub fn local<B: Backend>(backend: B) -> Device {
        Device::new(Arc::new(Local::new(backend)))
    }
}

impl<B: Backend> Link for Local<B> {
    fn backend(&self) -> &'static str {
        self.executor.backend().backend()
    }

    fn info(&self) -> &DeviceInfo {
        self.executor.backend().info()
    }

    fn sm_partitions(&self) -> bool {
        self.executor.backend().sm_partitions()
    }

    fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    fn call(
        &self,
        call: Call,
        payload: &[u8],
        _deadline: Option<Duration>,
    ) -> DeviceResult<Answer> {
        Ok(self.executor.run(call, payload))
    }

    fn post(&self, stream: Option<Handle>, call: Call, payload: &[u8]) -> DeviceResult<()> {
        let mut answer = self.executor.run(call, payload);
        // Run already: a failure is known now, and said now.
        if let super::call::Reply::Failed(e) = answer.reply {
            answer.reply = super::call::Reply::Done;
            self.ledger.note(self.generation(), stream, answer);
            return Err(e);
        }
        self.ledger.note(self.generation(), stream, answer);
        Ok(())
    }

    fn share_memory(&self, region: u64, fd: BorrowedFd<'_>, len: u64, at: u64) -> DeviceResult<()> {
        let fd = fd.try_clone_to_owned().map_err(|e| {
            DeviceError::Failed(format!("cannot share client memory with the device: {e}"))
        })?;
        self.executor.share_region(region, &fd, len, at)
    }

    fn unshare_memory(&self, region: u64) {
        self.executor.unshare_region(region);
    }

    fn interrupt(&self) {
        self.executor.backend().interrupt();
    }

    fn fault(&self) -> Option<String> {
        self.executor.backend().fault()
    }

    fn reset(&self) -> DeviceResult<()> {
        self.executor.backend().reset()?;
        // Whatever was made before belongs to the context that went.
        self.executor.forget_handles();
        self.generation.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    fn resets_in_place(&self) -> bool {
        self.executor.backend().resets_in_place()
    }

    fn reset_deadline(&self) -> Duration {
        self.executor.backend().reset_deadline()
    }
}

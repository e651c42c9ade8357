//! What a launch reads of the kernel profiles while it holds the scheduler.

use gpushare_protocol::Kernel;

use crate::sched::{ClientId, Dispatcher, KernelKey, KernelProfile};

/// The kernel profiles, read while a launch holds the scheduler.
pub struct Profiles<'a>(pub(super) &'a mut Dispatcher);

impl Profiles<'_> {
    /// The profile of a built-in kernel (a neutral prior until measured).
    pub fn builtin_profile(&mut self, kernel: &Kernel) -> KernelProfile {
        self.0.profiles_mut().builtin(kernel)
    }

    /// The profile of a module function launched with `blocks` blocks (learned, or a
    /// default guess until it has run).
    pub fn module_profile(&self, client: ClientId, function: u64, blocks: u32) -> KernelProfile {
        let key = KernelKey::client_function(client, function, blocks);
        self.0.profiles().profile(key)
    }
}

//! Modules a client loads, the functions it looks up in them, and their launches; with rebuild
//! on, each is recorded so that it can be made again after a reset.

use gpushare_protocol::StreamId;
use gpushare_protocol::control::ModuleFormat;

use super::{Client, lock};
use crate::{Error, Result};

impl Client {
    /// Loads a PTX, cubin or fatbin module (devices that support modules only; the sim device
    /// answers `NotSupported`).
    pub fn load_module(&self, format: ModuleFormat, image: &[u8]) -> Result<crate::Module> {
        let id = self.load_module_raw(format, image)?;
        Ok(crate::Module::from_raw(self.clone(), id))
    }

    /// Loads a module and returns its raw id, which nothing unloads automatically: the caller
    /// unloads it (the C ABI's `gpushare_module_unload`) or the broker does when the session
    /// ends. Prefer [`Client::load_module`] in Rust.
    pub fn load_module_raw(&self, format: ModuleFormat, image: &[u8]) -> Result<u64> {
        self.run(|c| {
            let broker = c.load_module(format, image)?;
            Ok(match &self.inner.registry {
                Some(r) => lock(r).add_module(broker, format, image),
                None => broker,
            })
        })
    }

    pub(crate) fn get_function(&self, module: u64, name: &str) -> Result<u64> {
        self.run(|c| match &self.inner.registry {
            Some(r) => {
                let broker_module = lock(r).module(module);
                let broker = c.get_function(broker_module, name)?;
                Ok(lock(r).add_function(broker, module, name))
            }
            None => c.get_function(module, name),
        })
    }

    /// Unloads a module. With rebuild on it is forgotten at once and never the call that
    /// meets a reset (a module a restart took is gone already).
    pub(crate) fn unload_module(&self, module: u64) -> Result<()> {
        let Some(registry) = &self.inner.registry else {
            return self.conn().unload_module(module);
        };
        let broker = {
            let mut reg = lock(registry);
            let broker = reg.module(module);
            reg.remove_module(module);
            broker
        };
        let conn = self.conn();
        if conn.restarted().is_some() {
            return Ok(());
        }
        match conn.unload_module(broker) {
            Err(Error::BrokerRestarting(_)) => Ok(()),
            other => other,
        }
    }

    /// Launches a module function with packed parameters on `stream`, without waiting (the
    /// parameters are copied into the arena first): an error the launch meets comes with the
    /// next synchronization, as for every launch.
    pub fn launch_function(
        &self,
        stream: &crate::Stream,
        function: &crate::Function,
        grid: [u32; 3],
        block: [u32; 3],
        shared_mem_bytes: u32,
        params: &[u8],
    ) -> Result<()> {
        self.launch_function_raw(
            stream.id(),
            function.id(),
            grid,
            block,
            shared_mem_bytes,
            params,
        )
    }

    /// Launches a module function by its raw ids (what the C ABI holds) with packed
    /// parameters on `stream`. Prefer [`Client::launch_function`] in Rust.
    pub fn launch_function_raw(
        &self,
        stream: StreamId,
        function: u64,
        grid: [u32; 3],
        block: [u32; 3],
        shared_mem_bytes: u32,
        params: &[u8],
    ) -> Result<()> {
        self.run(|c| match &self.inner.registry {
            Some(r) => {
                let mut reg = lock(r);
                // Work not waited for, like any asynchronous command (`user_command`).
                reg.submitted_async_on(stream);
                let (stream, function) = (reg.stream(stream), reg.function(function));
                // Submitted with the record held, as in `user_command`.
                c.launch_function(stream, function, (grid, block, shared_mem_bytes), params)
            }
            None => c.launch_function(stream, function, (grid, block, shared_mem_bytes), params),
        })
    }
}

//! Kernel launches: a built-in kernel, or a module function with its parameters copied out of
//! the arena; each waits for the scheduler's turn when the policy gates it, and is timed for
//! the scheduler when granted (`turns`).

use std::sync::atomic::Ordering;

use gpushare_protocol::command::{LAUNCH_ATTRIBUTES_BYTES, LaunchAttributes, ModuleLaunch};
use gpushare_protocol::{ErrorCode, Kernel, StreamId};
use zerocopy::FromBytes;

use super::SessionState;
use crate::device::{Call, Device, DeviceResult, Function, Place, Stream};
use crate::gpu::scheduler::Profiles;
use crate::sched::profile::KernelProfile;

impl SessionState {
    /// Launches a built-in kernel.
    pub(super) fn launch(
        &mut self,
        stream: StreamId,
        kernel: Kernel,
    ) -> Result<(u64, u64), ErrorCode> {
        for operand in kernel.operands()? {
            if operand.bytes > 0 {
                self.check_device(operand.ptr, operand.bytes)?;
            }
        }
        if !self.streams.contains_key(&stream) {
            return Err(ErrorCode::InvalidHandle);
        }
        self.queue_granted(
            stream,
            1,
            |d| d.builtin_profile(&kernel),
            |d, s, place| {
                let launch = |stream| Call::Launch {
                    stream,
                    kernel,
                    start: None,
                    place,
                };
                d.queue(s, launch, &[])
            },
        )
    }

    /// Launches a module function; `with_attributes`: the parameter block starts with the
    /// launch's [`LaunchAttributes`] (`LaunchEx`).
    pub(super) fn launch_module(
        &mut self,
        stream: StreamId,
        launch: ModuleLaunch,
        with_attributes: bool,
    ) -> Result<(u64, u64), ErrorCode> {
        let function = self
            .modules
            .lock()
            .map_err(|_| ErrorCode::Internal)?
            .function(launch.function)
            .ok_or(ErrorCode::InvalidHandle)?;
        // Copy the parameters out of shared memory so the client cannot change them
        // mid-launch; into a buffer kept across launches, so a launch allocates nothing.
        let params_slice = self
            .region
            .arena_slice(launch.params_offset, launch.params_len as u64)
            .ok_or(ErrorCode::ArenaOutOfBounds)?;
        let mut block = std::mem::take(&mut self.launch_params);
        block.resize(params_slice.len(), 0);
        params_slice.read_into(&mut block);
        let r = self.launch_block(stream, &launch, with_attributes, &function, &block);
        self.launch_params = block;
        r
    }

    /// Launches with the parameter block copied out of the arena.
    fn launch_block(
        &mut self,
        stream: StreamId,
        launch: &ModuleLaunch,
        with_attributes: bool,
        function: &Function,
        block: &[u8],
    ) -> Result<(u64, u64), ErrorCode> {
        let (attributes, params) = if with_attributes {
            let (header, params) = block
                .split_at_checked(LAUNCH_ATTRIBUTES_BYTES as usize)
                .ok_or(ErrorCode::InvalidArgument)?;
            let attributes = LaunchAttributes::read_from_bytes(header)
                .map_err(|_| ErrorCode::InvalidArgument)?;
            (attributes, params)
        } else {
            (LaunchAttributes::default(), block)
        };
        if !self.streams.contains_key(&stream) {
            return Err(ErrorCode::InvalidHandle);
        }
        let blocks = launch.grid.iter().fold(1u32, |a, &g| a.saturating_mul(g));
        let id = self.info.id;
        self.queue_granted(
            stream,
            1,
            |d| d.module_profile(id, launch.function, blocks),
            |d, s, place| {
                let function = d.id(function)?;
                let launch = |stream| Call::LaunchModule {
                    stream,
                    function,
                    launch: *launch,
                    attributes,
                    start: None,
                    place,
                };
                d.queue(s, launch, params)
            },
        )
    }

    /// Queues a kernel or graph (`queue` queues it where it is told: the SM partition, the
    /// priority gate) on `stream` as one unit the scheduler grants: its turn (profiled by
    /// `profile`), where the turn places it, and the start and end events that time it;
    /// `kernels` is what it adds to the client's count.
    pub(super) fn queue_granted(
        &mut self,
        stream: StreamId,
        kernels: u64,
        profile: impl FnOnce(&mut Profiles<'_>) -> KernelProfile,
        queue: impl FnOnce(&Device, &mut Stream, Place) -> DeviceResult<()>,
    ) -> Result<(u64, u64), ErrorCode> {
        let turn = self.acquire(profile);
        if let Some(held) = turn.map(|t| t.held_ns).filter(|&ns| ns > 0) {
            self.info
                .counters
                .throttled_ns
                .fetch_add(held, Ordering::Relaxed);
        }
        let place = Place {
            sms: turn.and_then(|t| t.sm_limit),
            gate: turn
                .filter(|t| t.gated)
                .and_then(|_| self.device.gate_word())
                .filter(|w| self.dispatch.steers(w)),
        };
        let start = turn.and_then(|t| self.start_granted(stream, t.time_every));
        let r = self.on_stream(stream, |d, s| queue(d, s, place));
        if let Some(turn) = turn {
            self.track_granted(stream, turn.request, start, r.is_ok());
        }
        let r = r?;
        self.info
            .counters
            .kernels
            .fetch_add(kernels, Ordering::Relaxed);
        Ok(r)
    }
}

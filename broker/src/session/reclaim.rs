//! The end of a session: everything the client held is released at once, whatever ended it.

use std::sync::atomic::Ordering;

use super::SessionState;
use crate::device::Call;

impl SessionState {
    /// Releases everything the client held: waits for its streams, then frees.
    pub(super) fn reclaim(&mut self) {
        // A charge of the user's refused meanwhile waits for this memory.
        let _leaving = self.info.account().leaving();
        let streams = self.streams.len();
        let allocations = self.allocations.len();
        let bytes = self.allocations.total_bytes();
        // A stream waiting for the client to run a host function would wait forever now.
        self.info.release_host_points();
        for slot in self.streams.values_mut() {
            let _ = self.device.sync_stream(&mut slot.stream);
        }
        if self.health.epoch() != self.epoch {
            // A reset came meanwhile: everything is already gone (and its addresses may be
            // someone else's now), so forget rather than free.
            self.park_if_resetting();
            self.forget_dead_context();
            self.allocations.clear();
            self.forget_vmm();
            if let Ok(mut m) = self.modules.lock() {
                m.clear();
            }
        }
        self.account(true);
        self.forget_legacy();
        for (_, slot) in self.streams.drain() {
            self.device.destroy_stream(slot.stream);
        }
        self.events.clear();
        self.event_marks.clear();
        if let Ok(mut m) = self.modules.lock() {
            m.clear();
        }
        for (ptr, _) in self.allocations.take() {
            if let Err(e) = self.device.free(ptr) {
                tracing::warn!(ptr = format_args!("{ptr:#x}"), error = %e, "could not free allocation of departed client");
            }
        }
        self.forget_ipc();
        let peers = std::mem::take(&mut *self.info.peers.lock().unwrap_or_else(|p| p.into_inner()));
        for other in peers {
            other.stop_mirroring(&self.device, self.info.id);
        }
        self.release_vmm();
        self.release_hosts(true);
        let span = self.region.arena().span();
        let _ = self.device.call(Call::UnregisterArena { span }, &[]);
        self.device.unshare_memory(self.region.id());
        self.info.set_memory_used(0);
        self.info.counters.streams.store(0, Ordering::Relaxed);
        tracing::info!(
            streams,
            allocations,
            bytes,
            "released everything the client held"
        );
    }

    /// Gives back the host memory the client shared: unregistered from the device when its
    /// context still lives (`live`), no longer shared with it, and unpinned in the account.
    pub(super) fn release_hosts(&mut self, live: bool) {
        let hosts = self
            .info
            .hosts
            .lock()
            .map(|mut h| h.take_all())
            .unwrap_or_default();
        for shared in hosts {
            if live {
                let span = shared.region.whole().span();
                let _ = self.device.call(Call::UnregisterHost { span }, &[]);
            }
            self.device.unshare_memory(shared.region.id());
            self.info.account().unpin(shared.region.len() as u64);
        }
    }
}

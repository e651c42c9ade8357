//! Peer access for one process on two GPUs: a device's chunks of clients' memory mapped into
//! another device's contexts at their own addresses, as CUDA's peer access lets a kernel reach
//! another GPU's memory. [`Mirrors`] is the side whose memory it is: the links it maps into,
//! told of each chunk made or let go ([`Link::mirror_into`]); the other side keeps what it
//! maps ([`Link::map_peer_chunk`]), for a context that takes over.

use std::collections::{BTreeMap, HashSet};
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex, Weak};

use super::DeviceResult;
use super::link::{Link, Space};

/// Other devices' memory mapped into a device's contexts: their ranges reserved there, and
/// each chunk's size and descriptor by address (kept for a context that takes over).
#[derive(Default)]
pub struct PeerMemory {
    pub spaces: Vec<Space>,
    pub chunks: BTreeMap<u64, (u64, OwnedFd)>,
}

impl PeerMemory {
    /// The chunks (address, size) mapped from `space`.
    pub fn inside(&self, space: Space) -> Vec<(u64, u64)> {
        let end = space.base.saturating_add(space.size);
        self.chunks
            .range(space.base..end)
            .map(|(&at, (size, _))| (at, *size))
            .collect()
    }
}

/// The links of other devices that map this device's chunks, each with the sessions that asked
/// for it (it ends with the last of them).
#[derive(Default)]
pub struct Mirrors(Mutex<Vec<Mirror>>);

struct Mirror {
    peer: Weak<dyn Link>,
    holders: HashSet<u64>,
}

impl Mirrors {
    fn live(&self) -> Vec<Arc<dyn Link>> {
        let mut list = self.0.lock().unwrap_or_else(|e| e.into_inner());
        list.retain(|m| m.peer.strong_count() > 0);
        list.iter().filter_map(|m| m.peer.upgrade()).collect()
    }

    /// A chunk was made or mapped at `at`: every mirroring device maps it too (one that cannot
    /// is said, and its peer access does not reach that chunk).
    pub fn made(&self, at: u64, size: u64, fd: BorrowedFd<'_>) {
        for peer in self.live() {
            if let Err(e) = peer.map_peer_chunk(at, size, fd) {
                tracing::warn!(at, size, error = %e, "another GPU cannot map this one's new memory: its peer access does not reach it");
            }
        }
    }

    /// The chunk at `at` is being let go: every mirroring device lets go of it first.
    pub fn released(&self, at: u64, size: u64) {
        for peer in self.live() {
            peer.release_peer_chunk(at, size);
        }
    }

    /// Adds `peer` for `holder` (a session): the first time, reserves `space` there and maps
    /// `chunks` (at, size, descriptor) into it. The caller holds its chunks' lock, so that
    /// none is made or let go meanwhile.
    pub fn add<'a>(
        &self,
        peer: Weak<dyn Link>,
        holder: u64,
        space: Space,
        chunks: impl Iterator<Item = (u64, u64, BorrowedFd<'a>)>,
    ) -> DeviceResult<()> {
        let mut list = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = list.iter_mut().find(|m| m.peer.ptr_eq(&peer)) {
            m.holders.insert(holder);
            return Ok(());
        }
        let target = peer
            .upgrade()
            .ok_or_else(|| super::DeviceError::Failed("the other GPU's context is gone".into()))?;
        target.reserve_peer(space)?;
        let mapped = chunks
            .into_iter()
            .try_for_each(|(at, size, fd)| target.map_peer_chunk(at, size, fd));
        if let Err(e) = mapped {
            target.forget_peer(space);
            return Err(e);
        }
        list.push(Mirror {
            peer,
            holders: HashSet::from([holder]),
        });
        Ok(())
    }

    /// `holder` no longer needs `peer` to map this device's memory; with the last holder gone
    /// the peer lets go of all of it (in `space`). The caller holds its chunks' lock.
    pub fn drop_holder(&self, peer: &Weak<dyn Link>, holder: u64, space: Space) {
        let mut list = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let Some(i) = list.iter().position(|m| m.peer.ptr_eq(peer)) else {
            return;
        };
        list[i].holders.remove(&holder);
        if list[i].holders.is_empty() {
            let gone = list.swap_remove(i);
            if let Some(target) = gone.peer.upgrade() {
                target.forget_peer(space);
                tracing::info!(
                    base = format_args!("{:#x}", space.base),
                    "peer access ended: no session asks for this GPU's memory on the other any more"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use gpushare_protocol::PriorityClass;

    use crate::device::pool::tests::{device as sim, used};
    use crate::device::{Call, Device};

    /// Sets `len` bytes at `dst` to `value` with work on `d`.
    fn memset(d: &Device, dst: u64, value: u32, len: u64) -> crate::device::DeviceResult<()> {
        let mut s = d.create_stream(PriorityClass::Normal)?;
        let queued = d.queue(
            &mut s,
            |stream| Call::Memset {
                stream,
                dst,
                value,
                elem_bytes: 1,
                count: len,
            },
            &[],
        );
        let synced = queued.and_then(|_| d.sync_stream(&mut s));
        d.destroy_stream(s);
        synced
    }

    /// `len` bytes at `src` of `d`, read through a host region.
    fn read(d: &Device, src: u64, len: u64) -> Vec<u8> {
        let memfd = crate::shm::sealed_memfd("mirror-test", 4096).expect("memfd");
        let page = crate::shm::HostRegion::map(&memfd, 4096, 0).expect("mapped");
        d.share_memory(page.id(), memfd.as_fd(), 4096, 0, 0)
            .expect("shared");
        let mut s = d.create_stream(PriorityClass::Normal).expect("stream");
        let dst = page.slice(0, len).expect("inside").span();
        d.queue(
            &mut s,
            |stream| Call::CopyDtoH {
                stream,
                src,
                dst,
                staged: true,
                close: None,
            },
            &[],
        )
        .expect("copy");
        d.sync_stream(&mut s).expect("sync");
        d.destroy_stream(s);
        let mut out = vec![0u8; len as usize];
        page.slice(0, len).expect("inside").read_into(&mut out);
        d.unshare_memory(page.id());
        out
    }

    /// Memory of one device, mirrored into another, is reached there at its own addresses
    /// (work on the other device writes it), memory made afterwards too; it is not counted
    /// as the other device's; let go on its device, the other device no longer reaches it.
    #[test]
    fn a_device_mirrored_into_another_is_reached_there_until_its_memory_goes() {
        let (a, b) = (sim(), sim());
        let before = a.alloc(4 << 20, 1).expect("memory on a");
        let b_used = used(&b);
        a.mirror_into(&b, 1).expect("mirrored");
        a.mirror_into(&b, 1).expect("twice is once");
        a.mirror_into(&b, 2).expect("a second session asks too");
        let after = a.alloc(4 << 20, 1).expect("more memory on a");
        assert_eq!(used(&b), b_used, "a's memory is not b's");
        for (ptr, value) in [(before, 0x5a), (after, 0xa5)] {
            memset(&b, ptr + 4096, value, 64).expect("b writes a's memory");
            assert_eq!(read(&a, ptr + 4096, 64), vec![value as u8; 64]);
        }
        // Freed, its chunk is kept a while for a's next allocation of its size
        // (`pool::IDLE_FOR`), then let go at a's next allocation.
        a.free(after).expect("free");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let mut gone = false;
        while !gone && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(50));
            a.free(a.alloc(512, 1).expect("a little")).expect("free");
            gone = memset(&b, after, 1, 64).is_err();
        }
        assert!(gone, "let go on a, gone from b");
        memset(&b, before, 3, 64).expect("the rest still reached");
        // Ended by the last session that asked for it.
        a.stop_mirroring(&b, 1);
        memset(&b, before, 4, 64).expect("session 2 still holds it");
        a.stop_mirroring(&b, 2);
        assert!(
            memset(&b, before, 5, 64).is_err(),
            "no session holds it: gone from b"
        );
        assert_eq!(used(&b), b_used);
        a.mirror_into(&b, 3).expect("asked again");
        memset(&b, before, 6, 64).expect("reached again");
    }
}

//! Page-locked host memory a consolidated client shares (`ShareHostMemory`): mapped and
//! registered by the control task, copied to and from by the data thread.

use std::collections::HashMap;
use std::sync::Arc;

use gpushare_protocol::ErrorCode;

use crate::shm::HostRegion;

/// Most host regions one client may share at once.
pub const MAX_HOST_REGIONS: usize = 4096;
/// Most host bytes one client may share at once (page-locked memory is taken from every
/// other process on the machine).
pub const MAX_HOST_BYTES: u64 = 64 << 30;

/// One shared region and where device code reaches it.
pub struct Shared {
    pub region: Arc<HostRegion>,
    pub device_ptr: u64,
}

#[derive(Default)]
pub struct HostRegions {
    by_id: HashMap<u32, Shared>,
    next: u32,
    bytes: u64,
}

impl HostRegions {
    /// Whether `len` more bytes would stay within the limits.
    pub fn room_for(&self, len: u64) -> Result<(), ErrorCode> {
        if self.by_id.len() >= MAX_HOST_REGIONS || self.bytes.saturating_add(len) > MAX_HOST_BYTES {
            return Err(ErrorCode::TooManyHandles);
        }
        Ok(())
    }

    /// Adds a registered region; returns its id.
    pub fn insert(&mut self, region: Arc<HostRegion>, device_ptr: u64) -> Result<u32, ErrorCode> {
        self.room_for(region.len() as u64)?;
        self.next = self.next.checked_add(1).ok_or(ErrorCode::TooManyHandles)?;
        self.bytes += region.len() as u64;
        self.by_id.insert(self.next, Shared { region, device_ptr });
        Ok(self.next)
    }

    /// Whether `[ptr, ptr + len)` lies in one region as device code reaches it (a memset of
    /// page-locked host memory runs on the device).
    pub fn holds_device_range(&self, ptr: u64, len: u64) -> bool {
        let Some(end) = ptr.checked_add(len) else {
            return false;
        };
        self.by_id
            .values()
            .any(|s| ptr >= s.device_ptr && end <= s.device_ptr + s.region.len() as u64)
    }

    /// Writes `value` at device address `ptr` of a region, from here (the device sees it as it
    /// sees the client's writes); whether a region holds those 4 bytes.
    pub fn write_u32(&self, ptr: u64, value: u32) -> bool {
        let Some(s) = self.by_id.values().find(|s| {
            ptr >= s.device_ptr && ptr.saturating_add(4) <= s.device_ptr + s.region.len() as u64
        }) else {
            return false;
        };
        match s.region.whole().part(ptr - s.device_ptr, 4) {
            Some(word) => {
                word.write_from(&value.to_le_bytes());
                true
            }
            None => false,
        }
    }

    pub fn get(&self, id: u32) -> Option<Arc<HostRegion>> {
        self.by_id.get(&id).map(|s| s.region.clone())
    }

    pub fn remove(&mut self, id: u32) -> Option<Shared> {
        let s = self.by_id.remove(&id)?;
        self.bytes -= s.region.len() as u64;
        Some(s)
    }

    /// Every region, for releasing them when the session ends.
    /// Every region as device calls name it, and where device code reaches it.
    pub fn spans(&self) -> Vec<(crate::shm::Span, u64)> {
        self.by_id
            .values()
            .map(|s| (s.region.whole().span(), s.device_ptr))
            .collect()
    }

    pub fn take_all(&mut self) -> Vec<Shared> {
        self.bytes = 0;
        self.by_id.drain().map(|(_, s)| s).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn region(pages: u64) -> Arc<HostRegion> {
        use nix::fcntl::{FcntlArg, SealFlag, fcntl};
        use nix::sys::memfd::{MFdFlags, memfd_create};
        let fd = memfd_create("test", MFdFlags::MFD_ALLOW_SEALING).expect("memfd");
        nix::unistd::ftruncate(&fd, (pages * 4096) as i64).expect("size");
        fcntl(fd.as_fd(), FcntlArg::F_ADD_SEALS(SealFlag::F_SEAL_SHRINK)).expect("seal");
        Arc::new(HostRegion::map(&fd, pages * 4096, 0).expect("map"))
    }

    #[test]
    fn regions_are_found_by_id_until_removed() {
        let mut h = HostRegions::default();
        let a = h.insert(region(1), 0x1000).expect("room");
        let b = h.insert(region(2), 0x9000).expect("room");
        assert_ne!(a, b);
        assert_eq!(h.get(b).map(|r| r.len()), Some(8192));
        assert!(h.remove(a).is_some());
        assert!(h.get(a).is_none());
        assert!(h.remove(a).is_none());
        assert_eq!(h.take_all().len(), 1);
        assert!(h.get(b).is_none());
    }

    #[test]
    fn a_slice_outside_the_region_is_refused() {
        let r = region(1);
        assert!(r.slice(0, 4096).is_some());
        assert!(r.slice(4095, 1).is_some());
        assert!(r.slice(4095, 2).is_none());
        assert!(r.slice(u64::MAX, 2).is_none());
    }

    #[test]
    fn unsealed_or_short_memory_is_refused() {
        use nix::sys::memfd::{MFdFlags, memfd_create};
        let fd = memfd_create("test", MFdFlags::MFD_ALLOW_SEALING).expect("memfd");
        nix::unistd::ftruncate(&fd, 4096).expect("size");
        assert!(HostRegion::map(&fd, 4096, 0).is_err(), "not sealed");
        nix::fcntl::fcntl(
            fd.as_fd(),
            nix::fcntl::FcntlArg::F_ADD_SEALS(nix::fcntl::SealFlag::F_SEAL_SHRINK),
        )
        .expect("seal");
        assert!(
            HostRegion::map(&fd, 8192, 0).is_err(),
            "shorter than announced"
        );
        assert!(HostRegion::map(&fd, 100, 0).is_err(), "not whole pages");
        assert!(HostRegion::map(&fd, 4096, 0).is_ok());
    }
}

//! The program's page-locked host memory (`cuMemHostAlloc`, `cuMemHostRegister`) on every
//! device it works on: each device's session shares it (a region of its own in each), so that
//! copies to and from it are DMA on any device, and a device whose session opens later gets
//! it then. The files are kept for that.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

use super::HostRegion;
use super::host::HostFile;
use crate::driver::Driver;
use crate::log::say_once;
use crate::status::Cu;

struct Pinned {
    file: HostFile,
    flags: u32,
}

impl Pinned {
    /// Shares the region mapped at `addr` with `d`'s session; where that fails, copies between
    /// it and that device are staged (said once).
    fn share_with(&self, d: &Driver, addr: usize) {
        if d.share_region(&self.file, addr, self.flags).is_err() {
            say_once(
                "page-locked memory could not be shared with another device's session: copies between it and that device are staged",
            );
        }
    }
}

/// Every region of the program's, by address.
static PINNED: Mutex<BTreeMap<usize, Pinned>> = Mutex::new(BTreeMap::new());

fn pinned() -> MutexGuard<'static, BTreeMap<usize, Pinned>> {
    PINNED.lock().unwrap_or_else(|p| p.into_inner())
}

impl Driver {
    /// Page-locked memory of the program's (see `share_host`), shared with every device's
    /// session the process has; its address.
    pub(crate) fn pin(&self, len: usize, existing: Option<usize>, flags: u32) -> Cu<usize> {
        let mut all = pinned();
        let (addr, file) = self.share_host(len, existing, flags)?;
        let pinned = Pinned { file, flags };
        for other in crate::route::opened_except(self) {
            pinned.share_with(other, addr);
        }
        all.insert(addr, pinned);
        Ok(addr)
    }

    /// Takes the region at `addr` back from every device's session; the region as this
    /// device's session had it.
    pub(super) fn unpin(&self, addr: usize) -> Cu<HostRegion> {
        let mut all = pinned();
        let region = self.unshare_host(addr)?;
        for other in crate::route::opened_except(self) {
            if other.memory.host_region_at(addr).is_some() {
                let _ = other.unshare_host(addr);
            }
        }
        all.remove(&addr);
        Ok(region)
    }
}

/// Shares every region of the program's with a device's session just opened, then `publish`es
/// it (under the lock `pin` takes, so that no region made meanwhile is missed).
pub(crate) fn adopt(d: &Driver, publish: impl FnOnce()) {
    let all = pinned();
    for (&addr, p) in all.iter() {
        p.share_with(d, addr);
    }
    publish();
}

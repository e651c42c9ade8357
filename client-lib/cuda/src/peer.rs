//! Peer access. Every context of this driver is on its one device, and a device is no peer of
//! itself (`cuDeviceCanAccessPeer` says 0), so enabling access to another context fails as a
//! driver fails it between devices that cannot reach each other.

use std::ffi::c_uint;

use crate::context::{Contexts, current};
use crate::driver;
use crate::status::{Cu, entry};
use crate::types::{CUcontext, CUresult, result};

/// What `cuCtxEnablePeerAccess(peer, flags)` gives with `current` current.
fn enable(contexts: &Contexts, current: CUcontext, peer: CUcontext, flags: c_uint) -> Cu<()> {
    if flags != 0 {
        return Err(result::INVALID_VALUE);
    }
    if current.is_null() || peer == current {
        return Err(result::INVALID_CONTEXT);
    }
    contexts.get(current)?;
    contexts.get(peer)?;
    crate::entry::say_refused("cuCtxEnablePeerAccess", result::PEER_ACCESS_UNSUPPORTED);
    Err(result::PEER_ACCESS_UNSUPPORTED)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxEnablePeerAccess(peer: CUcontext, flags: c_uint) -> CUresult {
    entry("cuCtxEnablePeerAccess", || {
        enable(&driver::get()?.contexts, current(), peer, flags)
    })
}

/// Access that was never enabled cannot be disabled.
#[unsafe(no_mangle)]
pub extern "C" fn cuCtxDisablePeerAccess(peer: CUcontext) -> CUresult {
    entry("cuCtxDisablePeerAccess", || {
        driver::get()?.contexts.get(peer)?;
        Err(result::PEER_ACCESS_NOT_ENABLED)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn another_context_is_no_peer_and_misuse_gets_its_own_error() {
        let contexts = Contexts::new();
        let primary = contexts.primary();
        let other = contexts.create(0);
        let enable = |cur, peer, flags| enable(&contexts, cur, peer, flags).err();
        assert_eq!(
            enable(primary, other, 0),
            Some(result::PEER_ACCESS_UNSUPPORTED)
        );
        assert_eq!(
            enable(other, primary, 0),
            Some(result::PEER_ACCESS_UNSUPPORTED)
        );
        assert_eq!(
            enable(primary, primary, 0),
            Some(result::INVALID_CONTEXT),
            "itself"
        );
        assert_eq!(
            enable(std::ptr::null_mut(), other, 0),
            Some(result::INVALID_CONTEXT),
            "no current context"
        );
        let stale = std::ptr::without_provenance_mut(0x1000);
        assert_eq!(enable(primary, stale, 0), Some(result::INVALID_CONTEXT));
        assert_eq!(
            enable(primary, other, 1),
            Some(result::INVALID_VALUE),
            "flags"
        );
    }
}

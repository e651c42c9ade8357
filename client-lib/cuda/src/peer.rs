//! Peer access. In a job of one process per GPU (`gpushare run --gpus N`, a local rank set),
//! access to another GPU's primary context is enabled where gpushared's GPUs reach each other
//! (what lets a process map another rank's memory); a process working on several GPUs itself
//! is told the GPUs have none (`Gpus::peer_access` says why). Between contexts of one device,
//! or GPUs without access, enabling fails as a driver fails it between devices that cannot.

use std::ffi::c_uint;

use crate::context::{Contexts, current};
use crate::driver;
use crate::status::{Cu, entry};
use crate::types::{CUcontext, CUdevice, CUresult, result};

/// What `cuCtxEnablePeerAccess(peer, flags)` gives with `current` current, where `reaches`
/// says whether one device reaches another's memory.
fn enable(
    contexts: &Contexts,
    reaches: impl Fn(CUdevice, CUdevice) -> bool,
    current: CUcontext,
    peer: CUcontext,
    flags: c_uint,
) -> Cu<()> {
    if flags != 0 {
        return Err(result::INVALID_VALUE);
    }
    if current.is_null() || peer == current {
        return Err(result::INVALID_CONTEXT);
    }
    let from = contexts.get(current)?.device;
    let to = contexts.get(peer)?.device;
    if !reaches(from, to) {
        return Err(result::PEER_ACCESS_UNSUPPORTED);
    }
    if !contexts.peer_enabled(current, to, true) {
        return Err(result::PEER_ACCESS_ALREADY_ENABLED);
    }
    Ok(())
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxEnablePeerAccess(peer: CUcontext, flags: c_uint) -> CUresult {
    entry("cuCtxEnablePeerAccess", || {
        let d = driver::get()?;
        let reaches = |a, b| d.gpus.peer_access(a, b);
        let outcome = enable(d.contexts, reaches, current(), peer, flags);
        let reached = d
            .contexts
            .get(peer)
            .is_ok_and(|to| d.gpus.reaches(d.device, to.device));
        if outcome == Err(result::PEER_ACCESS_UNSUPPORTED) && !reached {
            crate::entry::say_refused("cuCtxEnablePeerAccess", result::PEER_ACCESS_UNSUPPORTED);
        } else if outcome == Err(result::PEER_ACCESS_UNSUPPORTED) {
            crate::log::say_once(
                "cuCtxEnablePeerAccess: a process that works on several GPUs itself gets no peer access through gpushare (copies between the GPUs work; kernels reading another GPU's memory and jax.pmap do not; NCCL within one process, as torch.nn.DataParallel, works with NCCL_P2P_DISABLE=1); a job of one process per GPU (torchrun, `gpushare run --gpus N`) gets it",
            );
        }
        outcome
    })
}

/// Access that was never enabled cannot be disabled.
#[unsafe(no_mangle)]
pub extern "C" fn cuCtxDisablePeerAccess(peer: CUcontext) -> CUresult {
    entry("cuCtxDisablePeerAccess", || {
        let contexts = &driver::get()?.contexts;
        let to = contexts.get(peer)?.device;
        if current().is_null() || !contexts.peer_enabled(current(), to, false) {
            return Err(result::PEER_ACCESS_NOT_ENABLED);
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn another_context_is_no_peer_and_misuse_gets_its_own_error() {
        let contexts = Contexts::new();
        let primary = contexts.primary();
        let other = contexts.create(0, 0);
        let enable = |cur, peer, flags| enable(&contexts, |a, b| a != b, cur, peer, flags).err();
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

    #[test]
    fn another_gpus_primary_context_is_a_peer_where_the_gpus_reach_each_other() {
        let contexts = Contexts::for_devices(2, 0);
        let own = contexts.primary();
        let other = contexts.primary_of(1).expect("device 1").handle();
        let reach = |a: CUdevice, b: CUdevice| a != b;
        assert_eq!(enable(&contexts, reach, own, other, 0), Ok(()));
        assert_eq!(
            enable(&contexts, reach, own, other, 0),
            Err(result::PEER_ACCESS_ALREADY_ENABLED)
        );
        assert!(contexts.peer_enabled(own, 1, false), "disabled once");
        assert!(!contexts.peer_enabled(own, 1, false), "not twice");
        assert_eq!(
            enable(&contexts, |_, _| false, own, other, 0),
            Err(result::PEER_ACCESS_UNSUPPORTED),
            "GPUs that do not reach each other"
        );
    }
}

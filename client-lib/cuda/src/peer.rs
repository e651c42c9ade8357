//! Peer access, where gpushared's GPUs reach each other. In a job of one process per GPU
//! (`gpushare run --gpus N`, a local rank set) enabling it is this process's own affair: a
//! rank maps another rank's memory through the virtual memory API, which gpushared serves
//! across GPUs. A process that works on several GPUs itself asks gpushared to map the other
//! GPU's memory into this GPU's context at its own addresses (`EnablePeerAccess`), so that its
//! kernels here reach it. Between contexts of one device, or GPUs without access, enabling
//! fails as a driver fails it between devices that cannot.

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
        let reaches = |a, b| d.gpus.reaches(a, b);
        let ctx = current();
        let outcome = enable(d.contexts, reaches, ctx, peer, flags);
        if outcome == Err(result::PEER_ACCESS_UNSUPPORTED) {
            crate::entry::say_refused("cuCtxEnablePeerAccess", result::PEER_ACCESS_UNSUPPORTED);
        }
        outcome?;
        if d.gpus.rank {
            return Ok(());
        }
        let from = d.contexts.get(ctx)?.device;
        let to = d.contexts.get(peer)?.device;
        let mapped = map_peer(from, to);
        if mapped.is_err() {
            d.contexts.peer_enabled(ctx, to, false);
        }
        mapped
    })
}

/// Asks gpushared to map device `to`'s memory into device `from`'s context (both sessions
/// open, `to`'s first if it is not).
fn map_peer(from: CUdevice, to: CUdevice) -> Cu<()> {
    use gpushare_protocol::control::{BrokerMessage, ClientMessage};
    let here = crate::route::on_device(from)?;
    let there = crate::route::on_device(to)?;
    let gpu = there.device_info().index;
    let reply = here
        .transport
        .session
        .request(
            |request| ClientMessage::EnablePeerAccess { request, gpu },
            &[],
        )
        .map_err(|e| crate::status::from_error(&e))?;
    match reply {
        BrokerMessage::PeerAccessEnabled { result: Ok(()), .. } => Ok(()),
        BrokerMessage::PeerAccessEnabled { result: Err(w), .. } => {
            crate::log::say_once(&format!(
                "cuCtxEnablePeerAccess: gpushared cannot map device {to}'s memory into device {from}'s context: {}",
                w.message
            ));
            Err(result::PEER_ACCESS_UNSUPPORTED)
        }
        _ => Err(result::UNKNOWN),
    }
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

//! Copies and memsets that touch another device's memory than their stream's. Each device a
//! process works on has a session of its own (`crate::route`), and gpushared orders work
//! within a session only, so such a copy is done at once, in the calling thread: after the
//! stream's earlier work, and before the call returns (as CUDA's synchronous copies; an
//! asynchronous one only waits longer than it would have to).
//!
//! Between two devices the bytes go through a buffer in two halves, one device filling a half
//! while the other empties the other: where the destination's GPU reaches the source's, a
//! window of the source device's memory that the destination's session maps too (the virtual
//! memory API's export and import, as NCCL's transport between two processes uses it), so that
//! both copies are the GPUs' own and the second crosses the link between them; else page-locked
//! host memory that both sessions share.

use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::driver::Driver;
use crate::log::say_once;
use crate::memory::vmm::{AllocationProp, Location};
use crate::route::other_owner;
use crate::status::Cu;
use crate::types::CUdevice;

/// A piece of a copy between two devices through a window of device memory: half the window.
/// Each piece costs two waits (on the H200 pair, 16 MiB pieces moved 212-238 GB/s, 0.57-0.66
/// of a direct copy's over NVLink: docs/benchmarks.md).
const WINDOW_PIECE: usize = 64 << 20;
/// A piece of a copy between two devices through host memory: half the host buffer.
const PIECE: usize = 16 << 20;

/// The host buffer of copies between devices (page-locked, `2 * PIECE`), made at the first
/// that needs it; one copy at a time uses it.
static BOUNCE: Mutex<Option<usize>> = Mutex::new(None);

/// A window of one device's memory that another device maps too: where each sees it.
#[derive(Debug, Clone, Copy)]
struct Window {
    source: u64,
    destination: u64,
}

/// Each (source, destination) pair's window, made at its first copy (`None`: it could not be,
/// and copies between the two go through host memory). One copy at a time uses a window.
static WINDOWS: Mutex<BTreeMap<Pair, Option<Window>>> = Mutex::new(BTreeMap::new());

/// A source device and a destination device.
type Pair = (CUdevice, CUdevice);

impl Driver {
    /// Does a copy on `stream` (this device's) whose `dst` or `src` is another device's
    /// memory, and says whether there was one; `false` leaves the copy to the caller.
    /// `devices_only`: both addresses must be device memory (a device-to-device copy).
    ///
    /// # Safety
    /// Each address is device memory, or (unless `devices_only`) host memory valid for `len`
    /// bytes.
    pub(crate) unsafe fn copy_across(
        &self,
        dst: u64,
        src: u64,
        len: usize,
        stream: u32,
        devices_only: bool,
    ) -> Cu<bool> {
        let (to, from) = (other_owner(self, dst), other_owner(self, src));
        if to.is_none() && from.is_none() {
            return Ok(false);
        }
        self.refuse_in_capture(stream)?;
        let to = to.unwrap_or(self);
        let from = from.unwrap_or(self);
        let dst_on_device = to.memory.device_range(dst, 0).is_some();
        let src_on_device = from.memory.device_range(src, 0).is_some();
        if devices_only && !(dst_on_device && src_on_device) {
            return Err(crate::types::result::INVALID_VALUE);
        }
        // Between two devices, the side on this device (the stream's) works on the stream
        // itself, in order with its earlier work; every other step waits for the stream first.
        let on_stream = |d: &Driver| (d.device == self.device).then_some(stream);
        match (dst_on_device, src_on_device) {
            (true, true) if to.device != from.device => {
                let (fill, drain) = (on_stream(from), on_stream(to));
                if fill.is_none() && drain.is_none() {
                    self.sync_stream(stream)?;
                }
                between(
                    Side(from, fill.unwrap_or(0)),
                    Side(to, drain.unwrap_or(0)),
                    dst,
                    src,
                    len,
                )?;
            }
            (true, true) => {
                self.sync_stream(stream)?;
                to.copy_dtod(dst, src, len, 0)?;
                to.sync_stream(0)?;
            }
            // SAFETY: host memory of `len` bytes, by the caller's contract.
            (true, false) => unsafe {
                self.sync_stream(stream)?;
                to.copy_htod(dst, src as *const u8, len, 0, true)?
            },
            // SAFETY: as above.
            (false, true) => unsafe {
                self.sync_stream(stream)?;
                from.copy_dtoh(dst as *mut u8, src, len, 0, true)?
            },
            // Another device's memory is on one side, so not reached.
            (false, false) => return Err(crate::types::result::INVALID_VALUE),
        }
        Ok(true)
    }

    /// Does a memset on `stream` (this device's) of another device's memory, and says whether
    /// it was one.
    pub(crate) fn memset_across(
        &self,
        dst: u64,
        value: u32,
        elem_bytes: u8,
        count: usize,
        stream: u32,
    ) -> Cu<bool> {
        let Some(owner) = other_owner(self, dst) else {
            return Ok(false);
        };
        self.refuse_in_capture(stream)?;
        self.sync_stream(stream)?;
        owner.memset(dst, value, elem_bytes, count, 0)?;
        owner.sync_stream(0)?;
        Ok(true)
    }

    /// A copy across devices waits, so it cannot be captured: the capture is invalidated, as
    /// by any wait.
    fn refuse_in_capture(&self, stream: u32) -> Cu<()> {
        if crate::graph::capturing(self, stream) {
            crate::entry::say_unsupported(
                "a copy or memset of another device's memory captured in a CUDA graph",
            );
        }
        crate::graph::refuse_while_capturing(self, stream)
    }
}

/// One device of a copy between two, and the stream of its own its part runs on.
#[derive(Clone, Copy)]
struct Side<'a>(&'a Driver, u32);

/// Copies `len` bytes of `from`'s device memory at `src` to `to`'s at `dst`, through a window
/// where there is one, else through host memory.
fn between(from: Side, to: Side, dst: u64, src: u64, len: usize) -> Cu<()> {
    let (Side(from, fill_on), Side(to, drain_on)) = (from, to);
    let mut windows = WINDOWS.lock().unwrap_or_else(|p| p.into_inner());
    let known = windows.get(&(from.device, to.device)).copied();
    let window = match known {
        Some(w) => w,
        None => {
            let w = open_window(from, to);
            if w.is_none() {
                say_once(
                    "copies between two devices go through host memory: no memory of one could be mapped by the other",
                );
            }
            windows.insert((from.device, to.device), w);
            w
        }
    };
    match window {
        Some(w) => in_halves(
            len,
            WINDOW_PIECE,
            |half, at, n| {
                from.copy_dtod(w.source + half, src + at, n, fill_on)?;
                from.sync_stream(fill_on)
            },
            |half, at, n| to.copy_dtod(dst + at, w.destination + half, n, drain_on),
            || to.sync_stream(drain_on),
        ),
        None => {
            drop(windows);
            through_host(Side(from, fill_on), Side(to, drain_on), dst, src, len)
        }
    }
}

/// Makes a window of `2 * WINDOW_PIECE` bytes of `from`'s memory that `to` maps too; `None` where the
/// GPUs do not reach each other or a step fails (said once).
fn open_window(from: &Driver, to: &Driver) -> Option<Window> {
    if !from.gpus.reaches(to.device, from.device) {
        return None;
    }
    let prop = AllocationProp {
        location: Location {
            id: from.device,
            ..AllocationProp::shareable_on_device().location
        },
        ..AllocationProp::shareable_on_device()
    };
    let granule = from.vmm_granularity(&prop).ok()?;
    let size = ((2 * WINDOW_PIECE) as u64).next_multiple_of(granule);
    let made = (|| -> Cu<Window> {
        let handle = from.vmm_create(size, &prop)?;
        let source = from.vmm_reserve(size, granule, 0)?;
        from.vmm_map(source, size, 0, handle)?;
        let fd = from.vmm_export(handle)?;
        // SAFETY: the descriptor `vmm_export` just opened for this process, used once here.
        let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        let theirs = to.vmm_import(std::os::fd::AsRawFd::as_raw_fd(&fd))?;
        let destination = to.vmm_reserve(size, granule, 0)?;
        to.vmm_map(destination, size, 0, theirs)?;
        Ok(Window {
            source,
            destination,
        })
    })();
    made.inspect_err(|code| {
        crate::log::say(&format!(
            "a window of device {}'s memory for device {} could not be made (CUDA error {code})",
            from.device, to.device
        ))
    })
    .ok()
}

/// Copies through the page-locked host buffer, piece `i + 1` into one half while piece `i`
/// leaves the other.
fn through_host(from: Side, to: Side, dst: u64, src: u64, len: usize) -> Cu<()> {
    let (Side(from, fill_on), Side(to, drain_on)) = (from, to);
    let mut bounce = BOUNCE.lock().unwrap_or_else(|p| p.into_inner());
    let base = match *bounce {
        Some(at) => at,
        None => *bounce.insert(from.pin(2 * PIECE, None, 0)?),
    };
    in_halves(
        len,
        PIECE,
        |half, at, n| {
            // SAFETY: each half is `PIECE` bytes of the bounce buffer, which lives for the
            // process; `n <= PIECE`.
            unsafe {
                from.copy_dtoh(
                    (base + half as usize) as *mut u8,
                    src + at,
                    n,
                    fill_on,
                    false,
                )?
            };
            from.sync_stream(fill_on)
        },
        // SAFETY: as above; the half holds the piece (`fill` waited for it).
        |half, at, n| unsafe {
            to.copy_htod(
                dst + at,
                (base + half as usize) as *const u8,
                n,
                drain_on,
                false,
            )
        },
        || to.sync_stream(drain_on),
    )
}

/// `len` bytes in pieces of `piece` through a buffer of two halves: `fill(half, at, n)` puts bytes
/// `at..at + n` into the half at offset `half` and waits for them; `drain(half, at, n)` sends
/// them on without waiting, and `settle` waits for every drain. A half is filled again only
/// once its last drain is done.
fn in_halves(
    len: usize,
    piece: usize,
    mut fill: impl FnMut(u64, u64, usize) -> Cu<()>,
    mut drain: impl FnMut(u64, u64, usize) -> Cu<()>,
    mut settle: impl FnMut() -> Cu<()>,
) -> Cu<()> {
    let half = |i: usize| ((i % 2) * piece) as u64;
    let nth = |i: usize| ((i * piece) as u64, piece.min(len - i * piece));
    let pieces = len.div_ceil(piece);
    let (at, n) = nth(0);
    fill(half(0), at, n)?;
    for i in 0..pieces {
        let (at, n) = nth(i);
        drain(half(i), at, n)?;
        if i + 1 < pieces {
            let (next, n) = nth(i + 1);
            // The other half's last drain (piece `i - 1`) was settled below.
            fill(half(i + 1), next, n)?;
        }
        settle()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `in_halves` asked, in order.
    #[derive(Debug, PartialEq)]
    enum Step {
        Fill(u64, u64, usize),
        Drain(u64, u64, usize),
        Settle,
    }

    fn steps(len: usize, piece: usize) -> Vec<Step> {
        let log = std::cell::RefCell::new(Vec::new());
        in_halves(
            len,
            piece,
            |h, at, n| {
                log.borrow_mut().push(Step::Fill(h, at, n));
                Ok(())
            },
            |h, at, n| {
                log.borrow_mut().push(Step::Drain(h, at, n));
                Ok(())
            },
            || {
                log.borrow_mut().push(Step::Settle);
                Ok(())
            },
        )
        .expect("no step fails");
        log.into_inner()
    }

    #[test]
    fn pieces_alternate_halves_and_a_half_is_filled_again_only_after_its_drain_settled() {
        use Step::*;
        assert_eq!(
            steps(25, 10),
            [
                Fill(0, 0, 10),
                Drain(0, 0, 10),
                Fill(10, 10, 10),
                Settle,
                Drain(10, 10, 10),
                Fill(0, 20, 5),
                Settle,
                Drain(0, 20, 5),
                Settle,
            ]
        );
        assert_eq!(steps(7, 10), [Fill(0, 0, 7), Drain(0, 0, 7), Settle]);
    }

    #[test]
    fn a_failed_step_ends_the_copy() {
        let mut drains = 0;
        let failed = in_halves(
            40,
            10,
            |_, _, _| Ok(()),
            |_, at, _| {
                drains += 1;
                if at == 10 {
                    Err(crate::types::result::LAUNCH_FAILED)
                } else {
                    Ok(())
                }
            },
            || Ok(()),
        );
        assert_eq!(failed, Err(crate::types::result::LAUNCH_FAILED));
        assert_eq!(drains, 2, "nothing after the failed piece");
    }
}

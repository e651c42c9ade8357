//! Stream capture: which streams capture into which graph, what they record, and the streams
//! that join a capture by waiting on an event recorded in it.

use std::cell::Cell;
use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use super::{Capture, Graphs, Node, Op, Recording, lock};
use crate::driver::Driver;
use crate::status::Cu;
use crate::types::{CUgraph, capture, result};

thread_local! {
    /// The thread's capture mode (`cuThreadExchangeStreamCaptureMode`).
    pub(super) static MODE: Cell<i32> = const { Cell::new(capture::MODE_GLOBAL) };
}

impl Graphs {
    pub(super) fn capture_of(&self, stream: u32) -> Option<Arc<Capture>> {
        if self.capturing.load(Ordering::Acquire) == 0 {
            return None;
        }
        lock(&self.captures).get(&stream).cloned()
    }

    /// Starts a capture on `stream`, into a new graph.
    pub(super) fn begin(&self, stream: u32, mode: c_int) -> Cu<()> {
        self.begin_into(stream, mode, None, Vec::new())
    }

    /// Starts a capture on `stream`: into `into` (its nodes so far kept, the first recorded
    /// node depending on `deps`, indices of its), or into a new graph.
    pub(super) fn begin_into(
        &self,
        stream: u32,
        mode: c_int,
        into: Option<CUgraph>,
        deps: Vec<u32>,
    ) -> Cu<()> {
        if !(capture::MODE_GLOBAL..=capture::MODE_RELAXED).contains(&mode) {
            return Err(result::INVALID_VALUE);
        }
        let base = match into {
            Some(g) => {
                u32::try_from(lock(&self.graph(g)?.nodes).len()).map_err(|_| result::UNKNOWN)?
            }
            None => 0,
        };
        let mut captures = lock(&self.captures);
        if captures.contains_key(&stream) {
            return Err(result::ILLEGAL_STATE);
        }
        let mut recording = Recording {
            base,
            ..Recording::default()
        };
        recording.tails.insert(stream, deps);
        let c = Arc::new(Capture {
            id: self.next_id.fetch_add(1, Ordering::Relaxed) + 1,
            state: Mutex::new(recording),
            invalidated: AtomicBool::new(false),
            graph: into.unwrap_or_else(|| self.new_graph()) as usize,
        });
        captures.insert(stream, c);
        self.capturing.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    /// Ends the capture `stream` began, and every stream's that joined it: the graph, holding
    /// what they recorded.
    pub(super) fn end(&self, stream: u32) -> Cu<CUgraph> {
        let c = {
            let mut captures = lock(&self.captures);
            let c = captures.remove(&stream).ok_or(result::ILLEGAL_STATE)?;
            // Every stream that joined this capture leaves it with its origin.
            let joined: Vec<u32> = captures
                .iter()
                .filter(|(_, other)| Arc::ptr_eq(other, &c))
                .map(|(&s, _)| s)
                .collect();
            for s in &joined {
                captures.remove(s);
            }
            self.capturing.fetch_sub(1 + joined.len(), Ordering::AcqRel);
            c
        };
        lock(&self.events).retain(|_, other| !Arc::ptr_eq(other, &c));
        if c.invalidated.load(Ordering::Acquire) {
            return Err(result::STREAM_CAPTURE_INVALIDATED);
        }
        let nodes = std::mem::take(&mut lock(&c.state).nodes);
        self.append(c.graph as CUgraph, nodes)?;
        Ok(c.graph as CUgraph)
    }

    #[inline]
    fn record(&self, stream: u32, make: impl FnOnce() -> Op) -> Cu<bool> {
        let Some(c) = self.capture_of(stream) else {
            return Ok(false);
        };
        if c.invalidated.load(Ordering::Acquire) {
            return Err(result::STREAM_CAPTURE_INVALIDATED);
        }
        let handle = self.node_handle();
        let mut r = lock(&c.state);
        let index = r.base + u32::try_from(r.nodes.len()).map_err(|_| result::OUT_OF_MEMORY)?;
        let deps = r.tails.insert(stream, vec![index]).unwrap_or_default();
        r.nodes.push(Node {
            op: make(),
            deps,
            handle,
        });
        Ok(true)
    }

    fn invalidate(&self, stream: u32) -> Cu<()> {
        if let Some(c) = self.capture_of(stream) {
            c.invalidated.store(true, Ordering::Release);
            return Err(result::STREAM_CAPTURE_UNSUPPORTED);
        }
        Ok(())
    }

    fn record_event(&self, stream: u32, event: u32) -> Cu<bool> {
        let Some(c) = self.capture_of(stream) else {
            return Ok(false);
        };
        {
            let mut r = lock(&c.state);
            let at = r.tails.get(&stream).cloned().unwrap_or_default();
            r.marks.insert(event, at);
        }
        lock(&self.events).insert(event, c);
        Ok(true)
    }

    fn join(&self, stream: u32, event: u32) -> Cu<bool> {
        if self.capturing.load(Ordering::Acquire) == 0 {
            return Ok(false);
        }
        let joined = lock(&self.events).get(&event).cloned();
        if let Some(c) = joined {
            if let std::collections::hash_map::Entry::Vacant(slot) =
                lock(&self.captures).entry(stream)
            {
                slot.insert(c.clone());
                self.capturing.fetch_add(1, Ordering::AcqRel);
            }
            // The stream's next node waits for what the event marks, too.
            let mut r = lock(&c.state);
            let marked = r.marks.get(&event).cloned().unwrap_or_default();
            let tail = r.tails.entry(stream).or_default();
            for m in marked {
                if !tail.contains(&m) {
                    tail.push(m);
                }
            }
            return Ok(true);
        }
        Ok(self.capture_of(stream).is_some())
    }

    /// The nodes the capture on `stream` would make its next node depend on, as handles.
    pub(super) fn capture_tail(&self, c: &Capture, stream: u32) -> Vec<usize> {
        let r = lock(&c.state);
        let tail = r.tails.get(&stream).cloned().unwrap_or_default();
        tail.iter()
            .filter_map(|&i| i.checked_sub(r.base))
            .filter_map(|i| r.nodes.get(i as usize).map(|n| n.handle))
            .collect()
    }
}

/// Whether `stream` is capturing.
#[inline]
pub fn capturing(d: &Driver, stream: u32) -> bool {
    d.graphs.capturing.load(Ordering::Acquire) != 0 && d.graphs.capture_of(stream).is_some()
}

/// Records the op `make` builds when `stream` is capturing (`Ok(true)`); `Ok(false)` when
/// it is not and the caller sends it.
#[inline]
pub fn capture(d: &Driver, stream: u32, make: impl FnOnce() -> Op) -> Cu<bool> {
    d.graphs.record(stream, make)
}

/// Waiting for a capturing stream is not allowed (it invalidates the capture).
pub fn refuse_while_capturing(d: &Driver, stream: u32) -> Cu<()> {
    d.graphs.invalidate(stream)
}

/// Copies with pageable host memory cannot be captured (CUDA refuses them too).
pub fn refuse_pageable_in_capture(d: &Driver, stream: u32) -> Cu<()> {
    d.graphs.invalidate(stream)
}

/// An event recorded on a capturing stream marks a point of the capture (`Ok(true)`).
pub fn record_in_capture(d: &Driver, stream: u32, event: u32) -> Cu<bool> {
    d.graphs.record_event(stream, event)
}

/// A stream waiting on an event of a capture joins the capture (`Ok(true)`). A capturing
/// stream's wait on an event outside its capture is an external dependency, which replay
/// orders by sending everything on one stream.
pub fn wait_in_capture(d: &Driver, stream: u32, event: u32) -> Cu<bool> {
    d.graphs.join(stream, event)
}

pub(super) fn status_of(c: Option<&Arc<Capture>>) -> i32 {
    match c {
        None => capture::STATUS_NONE,
        Some(c) if c.invalidated.load(Ordering::Acquire) => capture::STATUS_INVALIDATED,
        Some(_) => capture::STATUS_ACTIVE,
    }
}

#[cfg(test)]
mod tests {
    use gpushare_protocol::Command;

    use super::*;

    fn memset(stream: u32, value: u8) -> Op {
        Op::Command(Command::Memset {
            stream,
            dst: 0x1000,
            value,
            len: 16,
        })
    }

    fn recorded(g: &Graphs, graph: CUgraph) -> Vec<(u8, Vec<u32>)> {
        let nodes = lock(&g.graph(graph).expect("graph").nodes).clone();
        nodes
            .iter()
            .map(|n| match &n.op {
                Op::Command(Command::Memset { value, .. }) => (*value, n.deps.clone()),
                other => panic!("not recorded here: {other:?}"),
            })
            .collect()
    }

    #[test]
    fn a_capturing_stream_records_in_order_and_others_send() {
        let g = Graphs::default();
        assert_eq!(g.record(7, || memset(7, 1)), Ok(false), "not capturing");
        g.begin(7, capture::MODE_GLOBAL).expect("begin");
        assert_eq!(g.record(7, || memset(7, 1)), Ok(true));
        assert_eq!(g.record(8, || memset(8, 9)), Ok(false), "another stream");
        assert_eq!(g.record(7, || memset(7, 2)), Ok(true));
        let graph = g.end(7).expect("end");
        assert_eq!(recorded(&g, graph), [(1, vec![]), (2, vec![0])]);
        assert_eq!(g.capturing.load(Ordering::Acquire), 0);
        assert_eq!(g.record(7, || memset(7, 3)), Ok(false), "capture over");
    }

    #[test]
    fn a_stream_joins_a_capture_through_its_event_and_leaves_with_it() {
        let g = Graphs::default();
        g.begin(1, capture::MODE_GLOBAL).expect("begin");
        assert_eq!(g.record_event(1, 40), Ok(true));
        assert_eq!(
            g.record_event(2, 41),
            Ok(false),
            "stream 2 is not capturing"
        );
        assert_eq!(g.join(3, 41), Ok(false), "an event outside any capture");
        assert_eq!(g.join(2, 40), Ok(true));
        assert_eq!(g.record(2, || memset(2, 5)), Ok(true));
        assert_eq!(g.record(1, || memset(1, 6)), Ok(true));
        let graph = g.end(1).expect("end");
        // Stream 2's node waits for what the event marked (nothing yet); stream 1's for its
        // own start.
        assert_eq!(recorded(&g, graph), [(5, vec![]), (6, vec![])], "one graph");
        assert!(g.capture_of(2).is_none(), "the joined stream left");
        assert_eq!(g.capturing.load(Ordering::Acquire), 0);
        assert_eq!(g.end(2), Err(result::ILLEGAL_STATE));
        assert_eq!(g.join(2, 40), Ok(false), "the capture's events are gone");
    }

    #[test]
    fn a_forked_stream_depends_on_the_fork_and_the_join_waits_for_both_branches() {
        let g = Graphs::default();
        g.begin(1, capture::MODE_GLOBAL).expect("begin");
        assert_eq!(g.record(1, || memset(1, 1)), Ok(true));
        assert_eq!(g.record_event(1, 40), Ok(true), "the fork");
        assert_eq!(g.join(2, 40), Ok(true));
        assert_eq!(g.record(2, || memset(2, 2)), Ok(true));
        assert_eq!(g.record(1, || memset(1, 3)), Ok(true));
        assert_eq!(g.record_event(2, 41), Ok(true), "the join");
        assert_eq!(g.join(1, 41), Ok(true));
        assert_eq!(g.record(1, || memset(1, 4)), Ok(true));
        let graph = g.end(1).expect("end");
        assert_eq!(
            recorded(&g, graph),
            [(1, vec![]), (2, vec![0]), (3, vec![0]), (4, vec![2, 1])],
            "the two branches run side by side, the last node after both"
        );
    }

    #[test]
    fn what_cannot_be_captured_invalidates_the_capture() {
        let g = Graphs::default();
        assert_eq!(g.invalidate(4), Ok(()), "nothing to invalidate");
        g.begin(4, capture::MODE_RELAXED).expect("begin");
        assert_eq!(g.invalidate(4), Err(result::STREAM_CAPTURE_UNSUPPORTED));
        let c = g.capture_of(4);
        assert_eq!(status_of(c.as_ref()), capture::STATUS_INVALIDATED);
        assert_eq!(
            g.record(4, || memset(4, 1)),
            Err(result::STREAM_CAPTURE_INVALIDATED)
        );
        assert_eq!(g.end(4), Err(result::STREAM_CAPTURE_INVALIDATED));
        assert_eq!(status_of(g.capture_of(4).as_ref()), capture::STATUS_NONE);
        g.begin(4, capture::MODE_GLOBAL)
            .expect("a new capture may begin");
        assert_eq!(status_of(g.capture_of(4).as_ref()), capture::STATUS_ACTIVE);
    }

    #[test]
    fn a_capture_begins_once_per_stream_in_a_known_mode() {
        let g = Graphs::default();
        assert_eq!(g.begin(1, 3), Err(result::INVALID_VALUE));
        assert_eq!(g.begin(1, -1), Err(result::INVALID_VALUE));
        g.begin(1, capture::MODE_THREAD_LOCAL).expect("begin");
        assert_eq!(g.begin(1, capture::MODE_GLOBAL), Err(result::ILLEGAL_STATE));
        let id = |s| g.capture_of(s).map(|c| c.id);
        g.begin(2, capture::MODE_GLOBAL).expect("begin");
        assert_ne!(id(1), id(2), "each capture has its own id");
    }
}

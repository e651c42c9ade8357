//! The bookkeeping of a stream's device time: spans of continuous work, each bracketed by a
//! start and an end event, harvested once the end has passed.
//!
//! Generic over the event handle, with the driver calls passed in, so the rules — one open
//! span at a time, events reused, a failed measurement never holding up later ones — are
//! tested without a GPU.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::device::DeviceResult;

/// What became of a closed span when asked.
pub(super) enum Measured {
    /// Its end event has not passed yet.
    Pending,
    /// It took this many nanoseconds of device time.
    Took(u64),
    /// It cannot be measured (the events failed); drop it.
    Lost,
}

pub(super) struct Spans<E> {
    /// Start event of the span in progress, and when it opened (wall clock).
    open: Option<(E, Instant)>,
    /// Closed spans not yet measured, oldest first: (start, end).
    closed: VecDeque<(E, E)>,
    /// The end of the span measured last, kept (not reused) until the next one is measured: a
    /// span's start may come before it, and the overlap is not counted twice.
    last_end: Option<E>,
    /// Events free for reuse.
    spare: Vec<E>,
    /// Device time of the spans measured since it was last taken.
    busy_ns: u64,
}

impl<E: Copy> Spans<E> {
    pub(super) fn new() -> Spans<E> {
        Spans {
            open: None,
            closed: VecDeque::new(),
            last_end: None,
            spare: Vec::new(),
            busy_ns: 0,
        }
    }

    /// A spare event, else a new one from `create`.
    fn take_event(&mut self, create: impl FnOnce() -> DeviceResult<E>) -> DeviceResult<E> {
        match self.spare.pop() {
            Some(e) => Ok(e),
            None => create(),
        }
    }

    /// Opens a span unless one is open; `record` puts its start event on the stream.
    #[inline]
    pub(super) fn begin(
        &mut self,
        create: impl FnOnce() -> DeviceResult<E>,
        record: impl FnOnce(E) -> DeviceResult<()>,
    ) -> DeviceResult<()> {
        if self.open.is_none() {
            let e = self.take_event(create)?;
            record(e)?;
            self.open = Some((e, Instant::now()));
        }
        Ok(())
    }

    /// Whether the open span should close now: the client went `idle` (its idle time is never
    /// charged), or the span has been open for `longest`.
    pub(super) fn due(&self, idle: bool, longest: Duration) -> bool {
        self.open
            .is_some_and(|(_, at)| idle || at.elapsed() >= longest)
    }

    /// Closes the open span; `record` puts its end event on the stream after the work queued
    /// so far, and says whether it did. A span that cannot be closed is dropped.
    pub(super) fn close(
        &mut self,
        create: impl FnOnce() -> DeviceResult<E>,
        record: impl FnOnce(E) -> bool,
    ) {
        let Some((start, _)) = self.open.take() else {
            return;
        };
        let end = match self.take_event(create) {
            Ok(e) => e,
            Err(_) => {
                self.spare.push(start);
                return;
            }
        };
        if record(end) {
            self.closed.push_back((start, end));
        } else {
            self.spare.extend([start, end]);
        }
    }

    /// Adds the time of every closed span that has finished, oldest first, and stops at the
    /// first that has not. `measure` gets the end of the span measured before (if it was
    /// measured), then the span's start and end.
    pub(super) fn harvest(&mut self, mut measure: impl FnMut(Option<E>, E, E) -> Measured) {
        while let Some(&(start, end)) = self.closed.front() {
            let kept = match measure(self.last_end, start, end) {
                Measured::Pending => break,
                Measured::Took(ns) => {
                    self.busy_ns += ns;
                    Some(end)
                }
                Measured::Lost => {
                    self.spare.push(end);
                    None
                }
            };
            self.closed.pop_front();
            self.spare.push(start);
            if let Some(e) = std::mem::replace(&mut self.last_end, kept) {
                self.spare.push(e);
            }
        }
    }

    /// Whether closed spans wait to be measured.
    pub(super) fn measuring(&self) -> bool {
        !self.closed.is_empty()
    }

    /// Device time measured since the last call.
    pub(super) fn take_busy_ns(&mut self) -> u64 {
        std::mem::take(&mut self.busy_ns)
    }

    /// Every event held, each once, for destroying.
    pub(super) fn drain(&mut self) -> impl Iterator<Item = E> + '_ {
        self.open
            .take()
            .map(|(e, _)| e)
            .into_iter()
            .chain(self.closed.drain(..).flat_map(|(a, b)| [a, b]))
            .chain(self.last_end.take())
            .chain(self.spare.drain(..))
    }
}

/// The driver's elapsed milliseconds as nanoseconds; a negative or NaN reading counts as 0.
pub(super) fn ms_to_ns(ms: f32) -> u64 {
    (ms.max(0.0) as f64 * 1e6) as u64
}

#[cfg(test)]
mod tests {
    use std::cell::{Cell, RefCell};

    use super::*;
    use crate::device::DeviceError;

    /// Fake events: numbers handed out in order, with a log of what was recorded.
    struct Driver {
        next: Cell<u32>,
        recorded: RefCell<Vec<u32>>,
    }

    impl Driver {
        fn new() -> Driver {
            Driver {
                next: Cell::new(1),
                recorded: RefCell::new(Vec::new()),
            }
        }

        fn create(&self) -> DeviceResult<u32> {
            let e = self.next.get();
            self.next.set(e + 1);
            Ok(e)
        }

        fn record(&self, e: u32) -> DeviceResult<()> {
            self.recorded.borrow_mut().push(e);
            Ok(())
        }

        fn begin(&self, spans: &mut Spans<u32>) {
            spans
                .begin(|| self.create(), |e| self.record(e))
                .expect("fake driver never fails");
        }

        fn close(&self, spans: &mut Spans<u32>) {
            spans.close(|| self.create(), |e| self.record(e).is_ok());
        }
    }

    fn failed() -> DeviceResult<u32> {
        Err(DeviceError::Failed("no event".into()))
    }

    #[test]
    fn a_span_opens_once_however_much_work_is_queued() {
        let driver = Driver::new();
        let mut spans = Spans::new();
        for _ in 0..3 {
            driver.begin(&mut spans);
        }
        assert_eq!(*driver.recorded.borrow(), [1]);
        driver.close(&mut spans);
        assert_eq!(*driver.recorded.borrow(), [1, 2]);
        assert!(spans.measuring());
    }

    #[test]
    fn closing_without_an_open_span_does_nothing() {
        let driver = Driver::new();
        let mut spans: Spans<u32> = Spans::new();
        driver.close(&mut spans);
        assert!(driver.recorded.borrow().is_empty());
        assert!(!spans.measuring());
    }

    #[test]
    fn harvest_adds_finished_spans_in_order_and_stops_at_a_pending_one() {
        let driver = Driver::new();
        let mut spans = Spans::new();
        for _ in 0..3 {
            driver.begin(&mut spans);
            driver.close(&mut spans);
        }
        // Spans (1,2), (3,4), (5,6): the second has not finished.
        let mut asked = Vec::new();
        spans.harvest(|_, start, end| {
            asked.push((start, end));
            match start {
                1 => Measured::Took(1_000),
                _ => Measured::Pending,
            }
        });
        assert_eq!(asked, [(1, 2), (3, 4)]);
        assert_eq!(spans.take_busy_ns(), 1_000);
        assert_eq!(spans.take_busy_ns(), 0, "taking the time resets it");
        assert!(spans.measuring());

        spans.harvest(|_, start, _| Measured::Took(u64::from(start)));
        assert_eq!(spans.take_busy_ns(), 3 + 5);
        assert!(!spans.measuring());
    }

    #[test]
    fn a_lost_measurement_does_not_hold_up_later_ones() {
        let driver = Driver::new();
        let mut spans = Spans::new();
        for _ in 0..2 {
            driver.begin(&mut spans);
            driver.close(&mut spans);
        }
        spans.harvest(|_, start, _| match start {
            1 => Measured::Lost,
            _ => Measured::Took(7),
        });
        assert_eq!(spans.take_busy_ns(), 7);
        assert!(!spans.measuring());
    }

    #[test]
    fn measured_events_are_reused_and_the_last_end_is_kept_until_the_next_span_is_measured() {
        let driver = Driver::new();
        let mut spans = Spans::new();
        for _ in 0..2 {
            driver.begin(&mut spans);
            driver.close(&mut spans);
            spans.harvest(|_, _, _| Measured::Took(1));
        }
        driver.begin(&mut spans);
        driver.close(&mut spans);
        assert_eq!(
            driver.next.get(),
            4,
            "only events 1, 2 and 3 were ever made"
        );
        // Start 1 is reused at once; end 2 only once the span after it was measured.
        assert_eq!(*driver.recorded.borrow(), [1, 2, 1, 3, 2, 1]);
    }

    #[test]
    fn each_span_is_measured_with_the_end_of_the_one_measured_before() {
        let driver = Driver::new();
        let mut spans = Spans::new();
        for _ in 0..4 {
            driver.begin(&mut spans);
            driver.close(&mut spans);
        }
        // Spans (1,2), (3,4), (5,6), (7,8); the third is lost.
        let mut asked = Vec::new();
        spans.harvest(|before, start, end| {
            asked.push((before, start, end));
            match start {
                5 => Measured::Lost,
                _ => Measured::Took(1),
            }
        });
        assert_eq!(
            asked,
            [(None, 1, 2), (Some(2), 3, 4), (Some(4), 5, 6), (None, 7, 8)],
            "a lost span's end is not trusted"
        );
    }

    #[test]
    fn a_span_whose_end_cannot_be_made_or_recorded_is_dropped_and_its_events_kept() {
        let driver = Driver::new();
        let mut spans = Spans::new();
        driver.begin(&mut spans);
        spans.close(failed, |_| panic!("nothing to record"));
        assert!(!spans.measuring());
        assert!(
            !spans.due(true, Duration::ZERO),
            "the span is no longer open"
        );

        driver.begin(&mut spans); // reuses event 1
        spans.close(|| driver.create(), |_| false);
        assert!(!spans.measuring());
        let mut held: Vec<u32> = spans.drain().collect();
        held.sort();
        assert_eq!(held, [1, 2]);
    }

    #[test]
    fn a_start_that_cannot_be_made_opens_no_span() {
        let mut spans: Spans<u32> = Spans::new();
        assert!(spans.begin(failed, |_| Ok(())).is_err());
        assert!(!spans.due(true, Duration::ZERO));
    }

    #[test]
    fn an_open_span_is_due_when_the_client_idles_or_it_is_old_enough() {
        let driver = Driver::new();
        let mut spans = Spans::new();
        let hour = Duration::from_secs(3600);
        assert!(!spans.due(true, Duration::ZERO), "nothing open");
        driver.begin(&mut spans);
        assert!(!spans.due(false, hour));
        assert!(spans.due(true, hour));
        assert!(spans.due(false, Duration::ZERO));
    }

    #[test]
    fn drain_hands_back_every_event_once() {
        let driver = Driver::new();
        let mut spans = Spans::new();
        for _ in 0..2 {
            driver.begin(&mut spans);
            driver.close(&mut spans);
        }
        spans.harvest(|_, start, _| match start {
            1 => Measured::Took(1),
            _ => Measured::Pending,
        });
        driver.begin(&mut spans);
        // Now 2 is open, (3, 4) closed and 1 spare.
        let mut held: Vec<u32> = spans.drain().collect();
        held.sort();
        assert_eq!(held, [1, 2, 3, 4]);
        assert_eq!(spans.drain().count(), 0);
    }

    #[test]
    fn milliseconds_become_nanoseconds_and_bad_readings_zero() {
        assert_eq!(ms_to_ns(1.5), 1_500_000);
        assert_eq!(ms_to_ns(0.0), 0);
        assert_eq!(ms_to_ns(-0.25), 0);
        assert_eq!(ms_to_ns(f32::NAN), 0);
    }
}

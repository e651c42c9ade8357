//! What the screen shows and how the user arranged it: the last frame, the connection, the
//! sort order, the filter, the selection, the help popup and each row's share history.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use super::collect::{Frame, Row, RowKey};

/// Samples of GPU share kept per row (the sparkline is as wide as the screen allows).
pub const HISTORY: usize = 240;

/// Refresh intervals that `+`/`-` step through.
pub const INTERVALS: [Duration; 9] = [
    Duration::from_millis(100),
    Duration::from_millis(200),
    Duration::from_millis(500),
    Duration::from_secs(1),
    Duration::from_secs(2),
    Duration::from_secs(3),
    Duration::from_secs(5),
    Duration::from_secs(10),
    Duration::from_secs(30),
];

/// What rows are ordered by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SortKey {
    GpuShare,
    Memory,
    Kernels,
    Copies,
    Ioctls,
    Pid,
    User,
    Name,
}

impl SortKey {
    pub const ALL: [SortKey; 8] = [
        SortKey::GpuShare,
        SortKey::Memory,
        SortKey::Kernels,
        SortKey::Copies,
        SortKey::Ioctls,
        SortKey::Pid,
        SortKey::User,
        SortKey::Name,
    ];

    pub fn label(self) -> &'static str {
        match self {
            SortKey::GpuShare => "GPU%",
            SortKey::Memory => "MEMORY",
            SortKey::Kernels => "KERN/s",
            SortKey::Copies => "COPY MB/s",
            SortKey::Ioctls => "IOCTL/s",
            SortKey::Pid => "PID",
            SortKey::User => "USER",
            SortKey::Name => "COMMAND",
        }
    }

    pub fn next(self) -> SortKey {
        let i = SortKey::ALL.iter().position(|&k| k == self).unwrap_or(0);
        SortKey::ALL[(i + 1) % SortKey::ALL.len()]
    }

    /// Numbers read best largest first, names alphabetically.
    fn descending_by_default(self) -> bool {
        !matches!(self, SortKey::Pid | SortKey::User | SortKey::Name)
    }

    fn compare(self, a: &Row, b: &Row) -> std::cmp::Ordering {
        let num = |f: fn(&Row) -> Option<f64>| {
            // "-" (unknown) sorts below every number.
            let (x, y) = (
                f(a).unwrap_or(f64::NEG_INFINITY),
                f(b).unwrap_or(f64::NEG_INFINITY),
            );
            x.total_cmp(&y)
        };
        match self {
            SortKey::GpuShare => num(|r| r.gpu_share),
            SortKey::Memory => num(|r| r.memory_used.map(|m| m as f64)),
            SortKey::Kernels => num(|r| r.kernels_per_s),
            SortKey::Copies => num(|r| r.copy_bytes_per_s),
            SortKey::Ioctls => num(|r| r.ioctls_per_s),
            SortKey::Pid => a.pid.cmp(&b.pid),
            SortKey::User => a.user.cmp(&b.user),
            SortKey::Name => a.name.to_lowercase().cmp(&b.name.to_lowercase()),
        }
    }
}

/// Whether the broker answers.
#[derive(Debug, Clone, PartialEq)]
pub enum Connection {
    /// No answer yet.
    Connecting,
    Up,
    /// The last poll failed; the collector keeps trying.
    Down {
        error: String,
        since: Instant,
    },
}

pub struct State {
    pub socket: String,
    /// The last frame the broker gave (kept, dimmed, while disconnected).
    pub frame: Option<Frame>,
    pub connection: Connection,
    pub sort: SortKey,
    /// Flips the sort key's natural direction.
    pub reversed: bool,
    pub filter: String,
    /// Keys go to the filter line, not to the commands.
    pub editing_filter: bool,
    /// Follows the row, not the line, across refreshes and re-sorts.
    pub selected: Option<RowKey>,
    pub show_help: bool,
    pub interval: Duration,
    /// GPU share history per row, in tenths of a percent, oldest first.
    pub history: HashMap<RowKey, VecDeque<u64>>,
}

impl State {
    pub fn new(socket: String, interval: Duration) -> State {
        State {
            socket,
            frame: None,
            connection: Connection::Connecting,
            sort: SortKey::GpuShare,
            reversed: false,
            filter: String::new(),
            editing_filter: false,
            selected: None,
            show_help: false,
            interval,
            history: HashMap::new(),
        }
    }

    /// Takes one poll's outcome.
    pub fn apply(&mut self, sample: Result<Frame, String>, now: Instant) {
        match sample {
            Ok(frame) => {
                self.connection = Connection::Up;
                for row in &frame.rows {
                    let h = self.history.entry(row.key).or_default();
                    let permille = row
                        .gpu_share
                        .map_or(0, |s| (s * 1000.0).round().max(0.0) as u64);
                    h.push_back(permille);
                    if h.len() > HISTORY {
                        h.pop_front();
                    }
                }
                self.history
                    .retain(|k, _| frame.rows.iter().any(|r| r.key == *k));
                self.frame = Some(frame);
                self.keep_selection_visible();
            }
            Err(error) => {
                let since = match &self.connection {
                    Connection::Down { since, .. } => *since,
                    _ => now,
                };
                self.connection = Connection::Down { error, since };
            }
        }
    }

    /// The rows that pass the filter, in display order.
    pub fn visible_rows(&self) -> Vec<&Row> {
        let Some(frame) = &self.frame else {
            return Vec::new();
        };
        let needle = self.filter.to_lowercase();
        let mut rows: Vec<&Row> = frame
            .rows
            .iter()
            .filter(|r| needle.is_empty() || matches_filter(r, &needle))
            .collect();
        let descending = self.sort.descending_by_default() != self.reversed;
        rows.sort_by(|a, b| {
            let o = self.sort.compare(a, b).then_with(|| a.pid.cmp(&b.pid));
            if descending { o.reverse() } else { o }
        });
        rows
    }

    pub fn selected_index(&self) -> Option<usize> {
        let key = self.selected?;
        self.visible_rows().iter().position(|r| r.key == key)
    }

    /// The selected row, if the filter shows it.
    pub fn selected_row(&self) -> Option<&Row> {
        let key = self.selected?;
        self.visible_rows().into_iter().find(|r| r.key == key)
    }

    /// Moves the selection by `delta` lines, clamped to the visible rows.
    pub fn move_selection(&mut self, delta: isize) {
        let keys: Vec<RowKey> = self.visible_rows().iter().map(|r| r.key).collect();
        if keys.is_empty() {
            self.selected = None;
            return;
        }
        let next = match self.selected_index() {
            Some(i) => i.saturating_add_signed(delta).min(keys.len() - 1),
            None => 0,
        };
        self.selected = Some(keys[next]);
    }

    pub fn cycle_sort(&mut self) {
        self.sort = self.sort.next();
        self.reversed = false;
    }

    pub fn reverse_sort(&mut self) {
        self.reversed = !self.reversed;
    }

    /// One step slower (`slower`) or faster through [`INTERVALS`].
    pub fn step_interval(&mut self, slower: bool) {
        let Some(i) = INTERVALS.iter().position(|&d| d >= self.interval) else {
            // Slower than the list: `-` comes back to it, `+` leaves it be.
            if !slower {
                self.interval = INTERVALS[INTERVALS.len() - 1];
            }
            return;
        };
        let j = if slower {
            // From an off-list value, the next list value up is already one step slower.
            if INTERVALS[i] > self.interval {
                i
            } else {
                (i + 1).min(INTERVALS.len() - 1)
            }
        } else {
            i.saturating_sub(1)
        };
        self.interval = INTERVALS[j];
    }

    /// Keeps a selection on a row that is still shown; selects the top row if there is none.
    pub fn keep_selection_visible(&mut self) {
        if self.selected_index().is_none() {
            self.selected = self.visible_rows().first().map(|r| r.key);
        }
    }
}

fn matches_filter(r: &Row, needle: &str) -> bool {
    r.name.to_lowercase().contains(needle)
        || r.user.to_lowercase().contains(needle)
        || r.pid.to_string().contains(needle)
        || r.kind.as_str().contains(needle)
        || r.class.as_deref().is_some_and(|c| c.contains(needle))
        || r.gpu
            .is_some_and(|g| needle.replace(' ', "") == format!("gpu{g}"))
}

#[cfg(test)]
mod tests {
    use super::super::collect::tests::{client, report};
    use super::super::collect::{Deriver, Extras};
    use super::*;

    fn state_with(names: &[(&str, u64)]) -> State {
        let mut d = Deriver::default();
        let clients = names
            .iter()
            .enumerate()
            .map(|(i, (name, gpu_ms))| {
                let mut c = client(i as u64 + 1, 100 + i as i32, name);
                c.gpu_time_ns = gpu_ms * 1_000_000;
                c
            })
            .collect();
        let mut s = State::new("/tmp/sock".into(), Duration::from_secs(1));
        s.apply(
            Ok(d.derive(&report(10_000, clients), &Extras::default())),
            Instant::now(),
        );
        s
    }

    fn names(s: &State) -> Vec<String> {
        s.visible_rows().iter().map(|r| r.name.clone()).collect()
    }

    #[test]
    fn sorts_by_share_then_other_keys_and_reverses() {
        let mut s = state_with(&[("a", 100), ("b", 900), ("c", 500)]);
        assert_eq!(names(&s), ["b", "c", "a"]);
        s.reverse_sort();
        assert_eq!(names(&s), ["a", "c", "b"]);
        while s.sort != SortKey::Name {
            s.cycle_sort();
        }
        assert!(!s.reversed, "a new key starts in its natural direction");
        assert_eq!(names(&s), ["a", "b", "c"]);
    }

    #[test]
    fn filter_and_selection_follow_the_row() {
        let mut s = state_with(&[("train", 100), ("infer", 900), ("trace", 500)]);
        assert_eq!(s.selected_row().map(|r| r.name.as_str()), Some("infer"));
        s.move_selection(1);
        assert_eq!(s.selected_row().map(|r| r.name.as_str()), Some("trace"));
        s.move_selection(10);
        assert_eq!(s.selected_row().map(|r| r.name.as_str()), Some("train"));
        s.move_selection(-10);
        assert_eq!(s.selected_row().map(|r| r.name.as_str()), Some("infer"));
        s.filter = "TR".into();
        s.keep_selection_visible();
        assert_eq!(names(&s), ["trace", "train"]);
        assert_eq!(s.selected_row().map(|r| r.name.as_str()), Some("trace"));
    }

    #[test]
    fn the_filter_gpu_n_keeps_the_programs_on_that_gpu() {
        let mut s = state_with(&[("train", 100), ("infer", 900), ("trace", 500)]);
        if let Some(f) = s.frame.as_mut() {
            for r in &mut f.rows {
                r.gpu = Some(u32::from(r.name != "train"));
            }
        }
        s.filter = "GPU 1".into();
        assert_eq!(names(&s), ["infer", "trace"]);
        s.filter = "gpu0".into();
        assert_eq!(names(&s), ["train"]);
    }

    #[test]
    fn history_and_connection_survive_a_failed_poll() {
        let mut s = state_with(&[("a", 250)]);
        let key = s.frame.as_ref().map(|f| f.rows[0].key);
        let start = Instant::now();
        s.apply(Err("broker gone".into()), start);
        s.apply(Err("still gone".into()), start + Duration::from_secs(3));
        match &s.connection {
            Connection::Down { error, since } => {
                assert_eq!(error, "still gone");
                assert_eq!(*since, start);
            }
            other => panic!("expected Down, got {other:?}"),
        }
        assert!(s.frame.is_some(), "the last frame stays on screen");
        let h = key
            .and_then(|k| s.history.get(&k))
            .cloned()
            .unwrap_or_default();
        assert_eq!(h, [250]);
    }

    #[test]
    fn interval_steps_through_the_list() {
        let mut s = State::new(String::new(), Duration::from_secs(1));
        s.step_interval(true);
        assert_eq!(s.interval, Duration::from_secs(2));
        s.step_interval(false);
        s.step_interval(false);
        assert_eq!(s.interval, Duration::from_millis(500));
        s.interval = Duration::from_millis(700);
        s.step_interval(true);
        assert_eq!(s.interval, Duration::from_secs(1));
        s.interval = Duration::from_millis(700);
        s.step_interval(false);
        assert_eq!(s.interval, Duration::from_millis(500));
        s.interval = Duration::from_secs(30);
        s.step_interval(true);
        assert_eq!(s.interval, Duration::from_secs(30));
        s.interval = Duration::from_secs(60);
        s.step_interval(true);
        assert_eq!(s.interval, Duration::from_secs(60));
        s.step_interval(false);
        assert_eq!(s.interval, Duration::from_secs(30));
    }
}

//! Lines of timings kept in memory and written to stderr in blocks (and when asked), so that
//! writing them hardly moves the times they show: the client driver's
//! `GPUSHARE_CUDA_TRACE=3` and gpushared's `GPUSHARE_TIMELINE=1`.

use std::sync::Mutex;

const BLOCK: usize = 64 * 1024;

pub struct TimedLines(Mutex<String>);

impl TimedLines {
    pub const fn new() -> TimedLines {
        TimedLines(Mutex::new(String::new()))
    }

    /// Adds one line (`write` writes it, without its newline).
    pub fn line(&self, write: impl FnOnce(&mut String)) {
        let mut lines = self.0.lock().unwrap_or_else(|p| p.into_inner());
        write(&mut lines);
        lines.push('\n');
        if lines.len() >= BLOCK {
            write_out(&mut lines);
        }
    }

    /// Writes what is kept.
    pub fn flush(&self) {
        write_out(&mut self.0.lock().unwrap_or_else(|p| p.into_inner()));
    }

    /// What is kept, taken (for tests).
    pub fn take(&self) -> String {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

impl Default for TimedLines {
    fn default() -> Self {
        TimedLines::new()
    }
}

fn write_out(lines: &mut String) {
    let _ = std::io::Write::write_all(&mut std::io::stderr(), lines.as_bytes());
    lines.clear();
}

//! `gpushare top -b`: frames as plain text or as one JSON object per line, for scripts.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use gpushare_tools::output::{self, Printed};
use gpushare_tools::socket::BrokerSocket;
use serde::Serialize;

use super::collect::{Collector, Frame};
use super::state::State;
use crate::format;

#[derive(Serialize)]
struct JsonFrame<'a> {
    frame: u64,
    unix_ms: u64,
    connected: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
    #[serde(flatten)]
    data: Option<&'a Frame>,
}

/// Prints `iterations` frames (forever when `None`) `interval` apart. Fails only when no frame
/// could be taken at all, so a script learns that the broker was never there.
pub fn run(
    socket: BrokerSocket,
    interval: Duration,
    iterations: Option<u64>,
    json: bool,
) -> anyhow::Result<()> {
    let mut collector = Collector::new(socket.clone());
    let mut state = State::new(socket.path.display().to_string(), interval);
    let mut last_error = None;
    let mut connected_once = false;
    let mut n = 0u64;
    while iterations.is_none_or(|max| n < max) {
        if n > 0 {
            std::thread::sleep(interval);
        }
        n += 1;
        let sample = collector.poll();
        let text = match &sample {
            Ok(frame) => {
                connected_once = true;
                state.apply(Ok(frame.clone()), Instant::now());
                if json {
                    json_line(n, None, Some(frame))?
                } else {
                    format!("{}\n", format::top_frame(frame, &state.visible_rows()))
                }
            }
            Err(e) => {
                last_error = Some(e.clone());
                let more = iterations.is_none_or(|max| n < max);
                match (json, more) {
                    (true, _) => json_line(n, Some(e), None)?,
                    (false, true) => format!("disconnected — retrying: {e}\n\n"),
                    (false, false) => format!("disconnected: {e}\n\n"),
                }
            }
        };
        // A reader that went away (`| head`) ends the run quietly, as it does for `top -b`.
        if output::print(&text)? == Printed::ReaderGone {
            return Ok(());
        }
    }
    match (connected_once, last_error) {
        (false, Some(e)) => anyhow::bail!("{e}"),
        _ => Ok(()),
    }
}

fn json_line(n: u64, error: Option<&str>, frame: Option<&Frame>) -> anyhow::Result<String> {
    let unix_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let mut line = serde_json::to_string(&JsonFrame {
        frame: n,
        unix_ms,
        connected: frame.is_some(),
        error,
        data: frame,
    })?;
    line.push('\n');
    Ok(line)
}

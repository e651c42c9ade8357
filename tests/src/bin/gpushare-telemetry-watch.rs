//! Runs a command under eBPF telemetry and prints what the kernel saw of every process that
//! used the GPU meanwhile: decoded NVIDIA ioctls and libcuda calls. For trying telemetry on a
//! real GPU machine without the broker, and for `docs/telemetry.md`.
//!
//! `gpushare-telemetry-watch [--prefix P] [--no-uprobes] [--libcuda PATH] [--detached]
//! [--json FILE] -- CMD...`
//! - `--prefix`: device-path prefix (default `/dev/nvidia`).
//! - `--no-uprobes`: no uprobes on libcuda.
//! - `--libcuda PATH`: the library to probe (default: found like the broker finds it).
//! - `--detached`: run CMD without telemetry (a baseline for overhead measurements).
//! - `--json FILE`: also write the last snapshot of each process as JSON.
//!
//! Snapshots are taken every 100 ms while CMD runs; a process that exited is reported with its
//! final figures. Needs root.

use std::collections::BTreeMap;
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use gpushare_broker::telemetry::{ProcessActivity, Telemetry, TelemetryOptions};

const INTERVAL: Duration = Duration::from_millis(100);

fn main() -> ExitCode {
    let mut opts = TelemetryOptions::default();
    let mut detached = false;
    let mut json: Option<String> = None;
    let mut args = std::env::args().skip(1);
    let mut command: Vec<String> = Vec::new();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--prefix" => opts.dev_prefix = args.next().unwrap_or_default(),
            "--no-uprobes" => opts.uprobes = false,
            "--libcuda" => opts.libcuda = args.next().map(Into::into),
            "--detached" => detached = true,
            "--json" => json = args.next(),
            "--" => {
                command = args.by_ref().collect();
            }
            _ => {
                eprintln!("gpushare-telemetry-watch: unknown argument `{arg}`");
                return ExitCode::from(2);
            }
        }
    }
    let Some((program, program_args)) = command.split_first() else {
        eprintln!(
            "usage: gpushare-telemetry-watch [--prefix P] [--no-uprobes] [--detached] [--json FILE] -- CMD..."
        );
        return ExitCode::from(2);
    };

    let started = Instant::now();
    let telemetry = if detached {
        None
    } else {
        match Telemetry::start(&opts) {
            Ok(t) => Some(t),
            Err(reason) => {
                eprintln!("gpushare-telemetry-watch: telemetry off: {reason}");
                return ExitCode::from(2);
            }
        }
    };
    if let Some(t) = &telemetry {
        eprintln!(
            "[watch] telemetry on in {:.0} ms (prefix {}, uprobes {})",
            started.elapsed().as_secs_f64() * 1e3,
            t.status().dev_prefix,
            t.status().uprobes
        );
    }

    let mut child = match Command::new(program).args(program_args).spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("gpushare-telemetry-watch: cannot run {program}: {e}");
            return ExitCode::from(2);
        }
    };
    let me = std::process::id() as i32;
    let mut last: BTreeMap<i32, ProcessActivity> = BTreeMap::new();
    let run_start = Instant::now();
    let status = loop {
        if let Some(t) = &telemetry {
            let live = t.snapshot();
            for p in live.into_iter().chain(t.take_exited()) {
                if p.pid != me {
                    last.insert(p.pid, p);
                }
            }
        }
        match child.try_wait() {
            Ok(Some(status)) => {
                // The exit is in the maps now: one more reading collects the final figures.
                if let Some(t) = &telemetry {
                    let _ = t.snapshot();
                    for p in t.take_exited() {
                        last.insert(p.pid, p);
                    }
                }
                break status;
            }
            Ok(None) => std::thread::sleep(INTERVAL),
            Err(e) => {
                eprintln!("gpushare-telemetry-watch: waiting for {program}: {e}");
                return ExitCode::from(2);
            }
        }
    };
    eprintln!(
        "[watch] {program} exited ({status}) after {:.2} s",
        run_start.elapsed().as_secs_f64()
    );
    if telemetry.is_none() {
        return ExitCode::SUCCESS;
    }
    print!("{}", report(last.values()));
    if let Some(path) = json {
        let all: Vec<&ProcessActivity> = last.values().collect();
        match serde_json::to_string_pretty(&all) {
            Ok(text) => {
                if let Err(e) = std::fs::write(&path, text) {
                    eprintln!("gpushare-telemetry-watch: cannot write {path}: {e}");
                }
            }
            Err(e) => eprintln!("gpushare-telemetry-watch: {e}"),
        }
    }
    ExitCode::SUCCESS
}

/// A table per process: its ioctls by command, and its libcuda calls.
fn report<'a>(processes: impl Iterator<Item = &'a ProcessActivity>) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    for p in processes {
        let _ = writeln!(
            out,
            "pid {} ({}) uid {}: {} ioctls on {} GPU fds, active {:.3} s; libcuda: {} launches, {} allocs, {} frees, {} context creations",
            p.pid,
            p.comm,
            p.uid,
            p.total_ioctls(),
            p.gpu_fds,
            p.last_seen_ns.saturating_sub(p.first_seen_ns) as f64 / 1e9,
            p.launches,
            p.allocs,
            p.frees,
            p.ctx_creates
        );
        if !p.ioctls.is_empty() {
            let _ = writeln!(
                out,
                "  {:<34} {:>10} {:>8} {:>8} {:>10} {:>10}",
                "command", "cmd", "count", "errors", "avg µs", "arg bytes"
            );
        }
        for i in &p.ioctls {
            let _ = writeln!(
                out,
                "  {:<34} {:>#10x} {:>8} {:>8} {:>10.1} {:>10}",
                i.name,
                i.cmd,
                i.count,
                i.errors,
                i.total_ns as f64 / i.count.max(1) as f64 / 1e3,
                i.arg_bytes
            );
        }
    }
    out
}

//! `gpushare-demo tour`: what gpushare buys, measured live. A private broker (on the GPU when
//! there is one, else on the sim device in real time) serves an interactive client alone, then
//! beside a best-effort trainer under FIFO, then under the priority policy (switched with a
//! policy reload, as an administrator would; on a GPU that policy also runs the trainer on an SM
//! partition, [`policy`] says why); one table gives the interactive latency and the trainer's
//! throughput in each case. During the last case a client is refused past its memory
//! quota and `gpushare top -b` shows every client. Every result the clients compute is checked,
//! and the broker must stop cleanly.

use std::io::Write as _;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytesize::ByteSize;
use gpushare::{Client, ConnectOptions, DeviceBuffer, ErrorCode, PriorityClass, StatusReport};
use gpushare_protocol::stats::TelemetryStatus;

use super::private::{Broker, BrokerArgs, Worker, sibling};
use super::work::{Summary, ms};

mod policy;
use policy::{DEFAULT_LOWER_SM_SHARE, Priority, QUOTA, partition_note};

/// How long the tour waits for gpushared's telemetry to come on (or say why not).
const TELEMETRY_SETTLES: Duration = Duration::from_secs(10);

#[derive(Debug, clap::Args)]
pub struct TourArgs {
    #[command(flatten)]
    broker: BrokerArgs,
    /// Seconds each case runs (0.2 to 60).
    #[arg(long, default_value = "1.5", value_parser = parse_seconds)]
    seconds: Duration,
    /// On a GPU, the share of the SMs the trainer runs on under priority (`[priority]
    /// lower_sm_share`, a hardware partition; above 0, at most 1). The sim device has no
    /// partitions and leaves it out.
    #[arg(long, default_value_t = DEFAULT_LOWER_SM_SHARE, value_parser = parse_share)]
    lower_sm_share: f64,
}

fn parse_seconds(s: &str) -> Result<Duration, String> {
    crate::parse_span(s, "seconds", 1.0, 0.2, 60.0)
}

fn parse_share(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 1.0 => Ok(v),
        _ => Err(format!(
            "`{s}` is not a share of the SMs (above 0, at most 1)"
        )),
    }
}

/// The tour's policy file for this user.
fn policy(scheduler: &str, priority: Priority) -> String {
    policy::policy(scheduler, priority, nix::unistd::getuid().as_raw())
}

fn interactive(broker: &Broker) -> anyhow::Result<Worker> {
    Worker::start(
        broker,
        "interactive",
        &[
            "--class",
            "high",
            "--workload",
            "interactive",
            "--size",
            "16384",
        ],
    )
}

fn trainer(broker: &Broker) -> anyhow::Result<Worker> {
    Worker::start(
        broker,
        "trainer",
        &[
            "--class",
            "best-effort",
            "--workload",
            "trainer",
            "--size",
            "4096",
            // A training step queues many kernels before it waits, as PyTorch's does.
            "--kernels-per-step",
            "16",
            "--kernel-us",
            "1000",
        ],
    )
}

/// One row of the table.
struct Case {
    what: &'static str,
    interactive: Summary,
    trainer: Option<Summary>,
}

pub fn run(args: &TourArgs) -> anyhow::Result<()> {
    let dir = tempfile::tempdir().context("cannot make a temporary directory")?;
    let broker = Broker::start(&args.broker, dir.path(), &policy("fifo", Priority::PLAIN))?;
    let report = broker.status()?;
    say(&format!(
        "broker up: backend {}, device {}: {} SMs, {}; policy {}",
        report.backend,
        report.device.name,
        report.device.sm_count,
        ByteSize(report.device.total_memory),
        report.policy
    ));
    // `backend auto: no usable GPU (why); using the sim device`
    if let Some(why) = broker.log_text().lines().find_map(|l| {
        l.split_once("no usable GPU ")
            .map(|(_, why)| why.to_string())
    }) {
        let why = why.split("; using the sim device").next().unwrap_or(&why);
        say(&format!(
            "no usable GPU {why}: the sim device stands in, taking each command's modelled time on the wall clock"
        ));
    }
    let report = settled_telemetry(&broker, report)?;
    say(&telemetry_line(&report.telemetry));
    let phase = args.seconds;
    let mut cases = Vec::new();

    say("case 1: the interactive client alone");
    let alone = interactive(&broker)?;
    std::thread::sleep(phase);
    cases.push(Case {
        what: "alone",
        interactive: alone.finish()?,
        trainer: None,
    });

    say("case 2: beside a best-effort trainer, policy fifo");
    cases.push(beside_trainer(
        &broker,
        phase,
        "beside a trainer, fifo",
        |_| Ok(()),
    )?);

    let priority = Priority::for_backend(&report.backend, args.lower_sm_share);
    let partitions = if priority.lower_sm_share.is_some() {
        ""
    } else {
        "; no lower_sm_share, the sim device has no SM partitions"
    };
    say(&format!(
        "case 3: the same, after switching the policy to priority (edit + SIGHUP): {priority}{partitions}"
    ));
    broker.switch_to("priority", &policy("priority", priority))?;
    cases.push(beside_trainer(
        &broker,
        phase,
        "beside a trainer, priority",
        |broker| {
            let _notebook = quota_refusal(broker)?;
            top_frame(broker)
        },
    )?);

    print_table(&cases);
    if let Some(line) = priority_gain(&cases) {
        say(&line);
    }
    if priority.lower_sm_share.is_some() {
        say(&partition_note(&broker.log_text(), report.device.sm_count));
    }
    if report.backend == "sim" {
        say(
            "the sim device runs one kernel at a time: under priority the trainer's queued \
             kernels wait while the interactive client has work, but a kernel already running \
             is not stopped, and this host's CPU load moves the figures. docs/benchmarks.md \
             has the priority policy on an H100.",
        );
    }
    let requests: u64 = cases.iter().map(|c| c.interactive.requests).sum();
    let steps: u64 = cases
        .iter()
        .filter_map(|c| c.trainer.as_ref())
        .map(|t| t.steps)
        .sum();
    broker.stop()?;
    say(&format!(
        "all {requests} requests and {steps} training steps verified; broker stopped cleanly"
    ));
    Ok(())
}

/// A trainer, then the interactive client beside it, for `phase`; `during` runs while both do.
fn beside_trainer(
    broker: &Broker,
    phase: Duration,
    what: &'static str,
    during: impl FnOnce(&Broker) -> anyhow::Result<()>,
) -> anyhow::Result<Case> {
    let trainer = trainer(broker)?;
    let interactive = interactive(broker)?;
    let started = Instant::now();
    // Halfway, so that `top`'s rates cover a stretch of both at work.
    std::thread::sleep(phase / 2);
    during(broker)?;
    std::thread::sleep(phase.saturating_sub(started.elapsed()));
    let interactive = interactive.finish()?;
    let trainer = trainer.finish()?;
    Ok(Case {
        what,
        interactive,
        trainer: Some(trainer),
    })
}

/// A client that asks for more than its quota is refused and keeps what it holds; it stays
/// connected while the buffer returned lives, so that `top` shows it.
fn quota_refusal(broker: &Broker) -> anyhow::Result<DeviceBuffer<u8>> {
    let notebook = Client::connect_with(ConnectOptions {
        socket: broker.socket.clone(),
        name: "notebook".into(),
        class: Some(PriorityClass::Normal),
        ..Default::default()
    })?;
    let held = notebook.alloc::<u8>(64 << 20)?;
    let err = match notebook.alloc::<u8>(QUOTA as usize) {
        Ok(_) => bail!("an allocation past the memory quota was not refused"),
        Err(e) => e,
    };
    if err.code() != Some(ErrorCode::OutOfQuota) {
        bail!("an allocation past the quota failed, but not for the quota: {err}");
    }
    say(&format!(
        "quota: notebook holds {} of its {} quota and asks for {} more: refused ({err}); it keeps what it holds",
        ByteSize(64 << 20),
        ByteSize(QUOTA),
        ByteSize(QUOTA)
    ));
    Ok(held)
}

/// `gpushare top -b -n 1` while the clients run; every one of them must be in it.
fn top_frame(broker: &Broker) -> anyhow::Result<()> {
    let out = Command::new(sibling("gpushare")?)
        .arg("--socket")
        .arg(&broker.socket)
        .args(["top", "-b", "-n", "1"])
        .output()
        .context("cannot run gpushare top")?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "gpushare top -b failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    for name in ["interactive", "trainer", "notebook"] {
        if !text
            .lines()
            .any(|l| l.split_whitespace().nth(2) == Some(name))
        {
            bail!("the top frame has no row for {name}:\n{text}");
        }
    }
    say("gpushare top -b -n 1, while they run:");
    let mut frame = String::new();
    for line in text.trim_end().lines() {
        if !line.is_empty() {
            frame.push_str("    ");
            frame.push_str(line);
        }
        frame.push('\n');
    }
    print(&frame);
    Ok(())
}

/// The broker's status once its telemetry is on or off: loading the eBPF programs takes a
/// moment after the socket is up, and "off — starting" would mislead.
fn settled_telemetry(broker: &Broker, mut report: StatusReport) -> anyhow::Result<StatusReport> {
    let until = Instant::now() + TELEMETRY_SETTLES;
    while report.telemetry.starting() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
        report = broker.status()?;
    }
    Ok(report)
}

fn telemetry_line(t: &TelemetryStatus) -> String {
    match (t.enabled, &t.reason) {
        (true, _) if t.uprobes => {
            "telemetry: eBPF on (NVIDIA ioctls and libcuda calls of every process)".into()
        }
        (true, _) => "telemetry: eBPF on (NVIDIA ioctls of every process)".into(),
        (false, _) if t.starting() => format!(
            "telemetry: still starting after {} s",
            TELEMETRY_SETTLES.as_secs()
        ),
        (false, Some(why)) => format!("telemetry: off — {why}"),
        (false, None) => "telemetry: off".into(),
    }
}

fn print_table(cases: &[Case]) {
    let mut t = String::from("\n");
    t.push_str(&format!(
        "    {:<28} {:>16} {:>16} {:>16}\n",
        "interactive client", "latency p50", "latency p99", "trainer steps/s"
    ));
    for c in cases {
        let steps = c
            .trainer
            .as_ref()
            .and_then(|t| t.steps_per_s)
            .map_or_else(|| "-".into(), |s| format!("{s:.1}"));
        t.push_str(&format!(
            "    {:<28} {:>16} {:>16} {:>16}\n",
            c.what,
            ms(c.interactive.latency_p50_ms),
            ms(c.interactive.latency_p99_ms),
            steps
        ));
    }
    print(&format!("{t}\n"));
}

/// What priority bought the interactive client beside the trainer, against FIFO, at the
/// median (cases: alone, FIFO, priority).
fn priority_gain(cases: &[Case]) -> Option<String> {
    let p50 = |i: usize| cases.get(i).and_then(|c| c.interactive.latency_p50_ms);
    let (alone, fifo, priority) = (p50(0)?, p50(1)?, p50(2)?);
    if priority <= 0.0 || alone <= 0.0 {
        return None;
    }
    Some(format!(
        "beside the trainer, priority answered the interactive client {:.1}x sooner than fifo at the median ({priority:.2} against {fifo:.2} ms; {:.1}x its {alone:.2} ms alone)",
        fifo / priority,
        priority / alone
    ))
}

fn say(line: &str) {
    print(&format!("[tour] {line}\n"));
}

/// Output that ends quietly when the reader goes away.
fn print(text: &str) {
    let _ = gpushare_tools::output::print(text);
    let _ = std::io::stdout().flush();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tour_says_what_priority_bought_against_fifo() {
        let case = |what, p50| Case {
            what,
            interactive: Summary {
                latency_p50_ms: p50,
                ..Summary::default()
            },
            trainer: None,
        };
        let cases = [
            case("alone", Some(0.5)),
            case("fifo", Some(16.0)),
            case("priority", Some(2.0)),
        ];
        let line = priority_gain(&cases).expect("a line");
        assert!(line.contains("8.0x sooner"), "{line}");
        assert!(line.contains("4.0x its 0.50 ms alone"), "{line}");
        assert!(priority_gain(&cases[..2]).is_none(), "no priority case");
        let silent = [
            case("alone", Some(0.5)),
            case("fifo", None),
            case("priority", Some(2.0)),
        ];
        assert!(priority_gain(&silent).is_none(), "a case without a median");
    }

    #[test]
    fn telemetry_still_starting_is_not_called_off() {
        let status = |enabled, reason: Option<&str>| TelemetryStatus {
            enabled,
            reason: reason.map(str::to_string),
            dev_prefix: "/dev/nvidia".into(),
            uprobes: false,
        };
        let starting = status(false, Some(gpushare_protocol::stats::TELEMETRY_STARTING));
        assert!(starting.starting());
        let line = telemetry_line(&starting);
        assert!(!line.contains("off"), "{line}");
        assert!(line.contains("still starting"), "{line}");
        let off = status(false, Some("no BPF"));
        assert!(!off.starting());
        assert_eq!(telemetry_line(&off), "telemetry: off — no BPF");
        assert!(!status(true, None).starting());
    }

    #[test]
    fn a_case_lasts_a_sane_number_of_seconds() {
        assert_eq!(parse_seconds("1.5"), Ok(Duration::from_millis(1500)));
        for bad in ["NaN", "inf", "-1", "0", "61", "soon"] {
            assert!(parse_seconds(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_trainer_s_share_of_the_sms_is_a_fraction_of_them() {
        assert_eq!(parse_share("0.5"), Ok(0.5));
        assert_eq!(parse_share("1"), Ok(1.0));
        for bad in ["NaN", "inf", "-0.5", "0", "1.5", "half"] {
            assert!(parse_share(bad).is_err(), "{bad}");
        }
    }
}

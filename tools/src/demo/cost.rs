//! `gpushare-demo cost`: what gpushared costs the CPU, measured on a private broker. One
//! interactive client at a time makes the same requests in each class; the broker's CPU time
//! (its own and its device workers', from its status) over the client's whole session, per
//! thousand requests, beside the client's own. Then many idle clients: the broker's CPU while
//! none of them does anything (the goal is none).

use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;

use super::private::{Broker, BrokerArgs, Worker};
use super::work::ms;

#[derive(Debug, clap::Args)]
pub struct CostArgs {
    #[command(flatten)]
    broker: BrokerArgs,
    /// Requests the client of each class makes.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(1..))]
    requests: u64,
    /// Mean think time between two requests, ms (fractions allowed: 0.2 is 200 µs).
    #[arg(long, default_value = "2", value_parser = crate::parse_think_ms)]
    think_ms: Duration,
    /// Idle clients held open for the idle measurement (0 skips it).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(0..=1000))]
    idle_clients: u32,
    /// Seconds the idle measurement lasts.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=600))]
    idle_seconds: u64,
    /// Print the results as one JSON object.
    #[arg(long)]
    json: bool,
}

/// One class's client: its requests and what they cost.
#[derive(Debug, Serialize)]
struct ClassCost {
    class: &'static str,
    requests: u64,
    /// CPU ms per thousand requests: gpushared's threads, its device workers, the client.
    broker_ms_per_1000: f64,
    workers_ms_per_1000: f64,
    client_ms_per_1000: f64,
    latency_p50_ms: Option<f64>,
    latency_p99_ms: Option<f64>,
}

/// The broker's CPU with idle clients connected, in cores (1.0 = one core busy).
#[derive(Debug, Serialize)]
struct IdleCost {
    clients: u32,
    seconds: f64,
    broker_cores: f64,
    workers_cores: f64,
}

#[derive(Debug, Serialize)]
struct Results {
    backend: String,
    device: String,
    cores: usize,
    classes: Vec<ClassCost>,
    idle: Option<IdleCost>,
}

const CLASSES: [&str; 3] = ["high", "normal", "best-effort"];

pub fn run(args: &CostArgs) -> anyhow::Result<()> {
    let dir = tempfile::tempdir().context("cannot make a temporary directory")?;
    let broker = Broker::start(&args.broker, dir.path(), &policy(args.idle_clients))?;
    let report = broker.status()?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if !args.json {
        say(&format!(
            "broker up: backend {}, device {}, on {cores} CPU cores; telemetry {}",
            report.backend,
            report.device.name,
            if report.telemetry.enabled {
                "on"
            } else {
                "off"
            }
        ));
    }
    let mut classes = Vec::new();
    for class in CLASSES {
        if !args.json {
            say(&format!(
                "a {class} client makes {} requests, {} ms of think time apart on average",
                args.requests,
                args.think_ms.as_secs_f64() * 1e3
            ));
        }
        classes.push(class_cost(&broker, class, args)?);
    }
    let idle = match args.idle_clients {
        0 => None,
        n => {
            if !args.json {
                say(&format!(
                    "{n} idle clients connected, for {} s",
                    args.idle_seconds
                ));
            }
            Some(idle_cost(
                &broker,
                n,
                Duration::from_secs(args.idle_seconds),
            )?)
        }
    };
    broker.stop()?;
    let results = Results {
        backend: report.backend.clone(),
        device: report.device.name.clone(),
        cores,
        classes,
        idle,
    };
    if args.json {
        print(&format!("{}\n", serde_json::to_string(&results)?));
    } else {
        print(&table(&results));
    }
    Ok(())
}

/// The tour's user may ask for every class, and hold the idle clients' sessions.
fn policy(idle_clients: u32) -> String {
    format!(
        "# gpushare-demo cost: this user may use every class.\n\
         scheduler = \"priority\"\n\
         [[users]]\n\
         uid = {}\n\
         class = \"high\"\n\
         max_sessions = {}\n",
        nix::unistd::getuid().as_raw(),
        idle_clients + 8
    )
}

/// A client of `class` from its connection to its session's end, against the broker's CPU
/// over the same span.
fn class_cost(broker: &Broker, class: &'static str, args: &CostArgs) -> anyhow::Result<ClassCost> {
    let before = broker.status()?.usage;
    let requests = args.requests.to_string();
    let think = (args.think_ms.as_secs_f64() * 1e3).to_string();
    let client = Worker::spawn(
        broker,
        "cost-client",
        &[
            "--class",
            class,
            "--workload",
            "interactive",
            "--size",
            "16384",
            "--iterations",
            &requests,
            "--think-ms",
            &think,
        ],
    )?;
    let summary = client.finish()?;
    broker.wait_for("the client's session to end", |s| {
        s.clients.iter().all(|c| c.name != "cost-client")
    })?;
    let after = broker.status()?.usage;
    let per_1000 = |ns: f64| ns / 1e6 * 1000.0 / summary.requests.max(1) as f64;
    Ok(ClassCost {
        class,
        requests: summary.requests,
        broker_ms_per_1000: per_1000(after.cpu_ns.saturating_sub(before.cpu_ns) as f64),
        workers_ms_per_1000: per_1000(
            after.workers_cpu_ns.saturating_sub(before.workers_cpu_ns) as f64
        ),
        client_ms_per_1000: per_1000(summary.cpu_s * 1e9),
        latency_p50_ms: summary.latency_p50_ms,
        latency_p99_ms: summary.latency_p99_ms,
    })
}

/// `n` clients that hold a session and do nothing; the broker's CPU over `span` once all are
/// connected (and a second to settle).
fn idle_cost(broker: &Broker, n: u32, span: Duration) -> anyhow::Result<IdleCost> {
    let mut idle = Vec::with_capacity(n as usize);
    for _ in 0..n {
        idle.push(Worker::start(
            broker,
            "idle",
            &["--workload", "idle", "--arena-kib", "256"],
        )?);
    }
    broker.wait_for("every idle client to connect", |s| {
        s.clients.iter().filter(|c| c.name == "idle").count() == n as usize
    })?;
    std::thread::sleep(Duration::from_secs(1));
    let r0 = broker.status()?;
    let started = Instant::now();
    std::thread::sleep(span);
    let r1 = broker.status()?;
    let wall = started.elapsed();
    for client in idle {
        client.finish_idle()?;
    }
    // The broker's own clock, so a slow status round trip does not skew the share.
    let span_ns = r1.uptime_ms.saturating_sub(r0.uptime_ms).max(1) as f64 * 1e6;
    Ok(IdleCost {
        clients: n,
        seconds: wall.as_secs_f64(),
        broker_cores: r1.usage.cpu_ns.saturating_sub(r0.usage.cpu_ns) as f64 / span_ns,
        workers_cores: r1
            .usage
            .workers_cpu_ns
            .saturating_sub(r0.usage.workers_cpu_ns) as f64
            / span_ns,
    })
}

fn table(r: &Results) -> String {
    let mut t = format!(
        "\n    CPU per 1000 requests ({}, {} cores)\n    {:<14} {:>9} {:>12} {:>14} {:>12} {:>11} {:>11}\n",
        r.backend,
        r.cores,
        "client class",
        "requests",
        "gpushared",
        "device worker",
        "the client",
        "latency p50",
        "latency p99"
    );
    for c in &r.classes {
        t.push_str(&format!(
            "    {:<14} {:>9} {:>9.0} ms {:>11.0} ms {:>9.0} ms {:>11} {:>11}\n",
            c.class,
            c.requests,
            c.broker_ms_per_1000,
            c.workers_ms_per_1000,
            c.client_ms_per_1000,
            ms(c.latency_p50_ms),
            ms(c.latency_p99_ms)
        ));
    }
    if let Some(i) = &r.idle {
        t.push_str(&format!(
            "\n    {} idle clients for {:.0} s: gpushared used {:.2}% of a core, its device workers {:.2}%\n",
            i.clients,
            i.seconds,
            i.broker_cores * 100.0,
            i.workers_cores * 100.0
        ));
    }
    t.push('\n');
    t
}

fn say(line: &str) {
    print(&format!("[cost] {line}\n"));
}

fn print(text: &str) {
    let _ = gpushare_tools::output::print(text);
}

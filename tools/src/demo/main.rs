//! `gpushare-demo`: a client that runs verified work through the broker and prints a summary
//! ([`work`]); several in different classes make the multi-client tests. `gpushare-demo tour`
//! ([`tour`]) is the README's demo: what a high-priority client gets beside a trainer under
//! FIFO and under the priority policy, measured live on a private broker.

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use clap::{Parser, Subcommand};
use gpushare::{Client, ConnectOptions, PriorityClass};
use gpushare_tools::output::print;

mod cost;
mod private;
mod tour;
mod work;

use work::{Plan, Workload};

/// A gpushare demo client that checks its own results.
#[derive(Debug, Parser)]
#[command(
    name = "gpushare-demo",
    version,
    about,
    args_conflicts_with_subcommands = true
)]
struct Args {
    #[command(subcommand)]
    tour: Option<Tour>,
    /// Name shown in `gpushare status`.
    #[arg(long, default_value = "demo")]
    name: String,
    /// Ask for this class (a client can only lower the class its policy grants).
    #[arg(long, value_parser = parse_class)]
    class: Option<PriorityClass>,
    #[arg(long, value_enum, default_value_t = Workload::Mixed)]
    workload: Workload,
    /// Iterations: vector adds, GEMMs, interactive requests or trainer steps.
    #[arg(long, default_value_t = 50)]
    iterations: u64,
    /// Keep working until standard input closes instead of stopping after --iterations.
    #[arg(long)]
    until_eof: bool,
    /// Vector length; GEMMs are about sqrt(size) on a side.
    #[arg(long, default_value_t = 65536)]
    size: usize,
    /// Interactive: mean milliseconds of think time between requests (exponentially
    /// distributed, as requests to a server arrive; fractions allowed, 0 to 60,000).
    #[arg(long, default_value = "2", value_parser = parse_think_ms)]
    think_ms: Duration,
    /// Trainer: microseconds each of its kernels runs.
    #[arg(long, default_value_t = 2000)]
    kernel_us: u64,
    /// Trainer: kernels per step.
    #[arg(long, default_value_t = 4)]
    kernels_per_step: u32,
    /// Print the summary as JSON.
    #[arg(long)]
    json: bool,
    /// The session's shared host region (rings' data and staging), KiB; the broker's
    /// default otherwise.
    #[arg(long)]
    arena_kib: Option<u64>,
}

#[derive(Debug, Subcommand)]
enum Tour {
    /// Start a private broker and show what gpushare buys: an interactive client alone, then
    /// beside a best-effort trainer under FIFO, then under the priority policy; a quota
    /// refusal; a `gpushare top -b` frame. Every result is checked.
    Tour(tour::TourArgs),
    /// Start a private broker and measure what it costs the CPU: its CPU time per thousand
    /// requests of a high and of a best-effort client, and its CPU with many idle clients.
    Cost(cost::CostArgs),
}

fn parse_class(s: &str) -> Result<PriorityClass, String> {
    s.parse()
}

/// A mean think time in milliseconds, fractions allowed (`0.2` is 200 µs).
pub(crate) fn parse_think_ms(s: &str) -> Result<Duration, String> {
    parse_span(s, "milliseconds", 1e-3, 0.0, 60_000.0)
}

/// `s` as a number of `unit`s (each `unit_secs` seconds) from `low` to `high`, fractions
/// allowed.
pub(crate) fn parse_span(
    s: &str,
    unit: &str,
    unit_secs: f64,
    low: f64,
    high: f64,
) -> Result<Duration, String> {
    match s.parse::<f64>() {
        Ok(v) if (low..=high).contains(&v) => Ok(Duration::from_secs_f64(v * unit_secs)),
        _ => Err(format!(
            "`{s}` is not a number of {unit} from {low} to {high}"
        )),
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let ran = match &args.tour {
        Some(Tour::Tour(t)) => Some(("tour", tour::run(t))),
        Some(Tour::Cost(c)) => Some(("cost", cost::run(c))),
        None => None,
    };
    if let Some((what, result)) = ran {
        return match result {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("gpushare-demo {what}: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    if args.workload == Workload::Idle && !args.until_eof {
        eprintln!(
            "gpushare-demo {}: --workload idle holds its session until standard input closes: add --until-eof",
            args.name
        );
        return ExitCode::FAILURE;
    }
    match client(&args) {
        Ok(summary) => {
            let text = if args.json {
                serde_json::to_string(&summary).unwrap_or_default()
            } else {
                summary.line()
            };
            if let Err(e) = print(&format!("{text}\n")) {
                eprintln!("gpushare-demo {}: cannot print the summary: {e}", args.name);
                return ExitCode::FAILURE;
            }
            if summary.mismatches == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("gpushare-demo {}: {e:#}", args.name);
            ExitCode::FAILURE
        }
    }
}

fn client(args: &Args) -> anyhow::Result<work::Summary> {
    let client = Client::connect_with(ConnectOptions {
        name: args.name.clone(),
        class: args.class,
        arena_size: args.arena_kib.map_or(0, |k| k.saturating_mul(1024)),
        ..Default::default()
    })?;
    let granted = client.session().class;
    if let Some(asked) = args.class
        && asked != granted
    {
        // As `gpushare run` does: the client runs, in the class it was granted.
        eprintln!(
            "gpushare-demo {}: asked for class {asked}, but the broker's policy grants this user at most {granted}; it runs as {granted} (an administrator can raise the grant in the policy file)",
            args.name
        );
    }
    let stop = Arc::new(AtomicBool::new(false));
    if args.until_eof {
        let stop = stop.clone();
        std::thread::spawn(move || {
            // Anything read is ignored: the end of input is the signal.
            let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
            stop.store(true, Ordering::Relaxed);
        });
    }
    let plan = Plan {
        workload: args.workload,
        iterations: if args.until_eof {
            u64::MAX
        } else {
            args.iterations
        },
        size: args.size,
        think: args.think_ms,
        kernel: Duration::from_micros(args.kernel_us),
        kernels_per_step: args.kernels_per_step,
    };
    work::run(&client, &args.name, &plan, &stop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn think_times_take_fractions_of_a_millisecond_and_nothing_else() {
        assert_eq!(parse_think_ms("0.2"), Ok(Duration::from_micros(200)));
        assert_eq!(parse_think_ms("2"), Ok(Duration::from_millis(2)));
        assert_eq!(parse_think_ms("0"), Ok(Duration::ZERO));
        for bad in ["-1", "NaN", "inf", "60001", "2ms", ""] {
            assert!(parse_think_ms(bad).is_err(), "{bad}");
        }
    }
}

//! `gpushare`: see and manage the gpushare broker.

use std::path::Path;
use std::process::ExitCode;

use clap::{CommandFactory, Parser};
use gpushare::{Monitor, StatusReport};
use gpushare_tools::cli::{Cli, Commands, Quota};

mod format;
mod run;
mod top;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // The broker's refusals are sentences already; print them without the code prefix.
            match e.downcast_ref::<gpushare::Error>() {
                Some(gpushare::Error::Request(w)) => eprintln!("gpushare: {}", w.message),
                _ => eprintln!("gpushare: {e:#}"),
            }
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Commands::Status { json } => {
            let report = fetch_status(&cli.socket)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", format::status(&report));
            }
        }
        Commands::Clients { json } => {
            let report = fetch_status(&cli.socket)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report.clients)?);
            } else if report.clients.is_empty() {
                println!("no clients");
            } else {
                print!("{}", format::clients(&report.clients));
            }
        }
        Commands::Top(args) => {
            let batch = args.batch || args.json;
            if args.iterations.is_some() && !batch {
                anyhow::bail!("-n counts batch frames: add -b (or --json)");
            }
            if batch {
                top::batch::run(cli.socket, args.delay, args.iterations, args.json)?;
            } else {
                top::interactive(cli.socket, args.delay)?;
            }
        }
        Commands::Set {
            client,
            class,
            weight,
            memory_quota,
        } => {
            let mut monitor = Monitor::connect(&cli.socket)?;
            monitor.admin_set(client, class, weight, memory_quota.map(|q| q.0))?;
            let mut changed = Vec::new();
            if let Some(c) = class {
                changed.push(format!("class {c}"));
            }
            if let Some(w) = weight {
                changed.push(format!("weight {w}"));
            }
            if let Some(Quota(q)) = memory_quota {
                changed.push(match q {
                    Some(b) => format!("memory quota {}", bytesize::ByteSize(b)),
                    None => "memory quota unlimited".into(),
                });
            }
            println!("client {client}: {}", changed.join(", "));
        }
        Commands::Evict { client, reason } => {
            let reason = reason.unwrap_or_else(|| "evicted by an administrator".into());
            Monitor::connect(&cli.socket)?.admin_evict(client, &reason)?;
            println!("client {client} evicted");
        }
        Commands::Run(args) => return Err(run::exec(&cli.socket, args)),
        Commands::Completions { shell } => {
            clap_complete::generate(
                shell,
                &mut Cli::command(),
                "gpushare",
                &mut std::io::stdout(),
            );
        }
    }
    Ok(())
}

fn fetch_status(socket: &Path) -> anyhow::Result<StatusReport> {
    let mut monitor = Monitor::connect(socket)?;
    Ok(monitor.status()?)
}

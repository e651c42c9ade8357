//! `gpushare`: see and manage the gpushare broker.

use std::process::ExitCode;

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches};
use gpushare::{Monitor, StatusReport};
use gpushare_tools::cli::{Cli, Commands, Quota};
use gpushare_tools::output::print;
use gpushare_tools::socket::BrokerSocket;

mod format;
mod run;
mod slurm;
mod top;

fn main() -> ExitCode {
    let matches = Cli::command().get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    let socket = BrokerSocket {
        path: cli.socket.clone(),
        given: matches.value_source("socket") == Some(ValueSource::CommandLine),
    };
    match run(cli, &socket) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // The broker's refusals are sentences already; print them without the code prefix.
            match e.downcast_ref::<gpushare::Error>() {
                Some(gpushare::Error::Request(w)) => eprintln!("gpushare: {}", w.message),
                Some(other) => eprintln!("gpushare: {}", socket.describe(other)),
                None => eprintln!("gpushare: {e:#}"),
            }
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli, socket: &BrokerSocket) -> anyhow::Result<()> {
    match cli.command {
        Commands::Status { json } => {
            let report = fetch_status(socket)?;
            if json {
                print(&format!("{}\n", serde_json::to_string_pretty(&report)?))?;
            } else {
                print(&format::status(&report))?;
            }
        }
        Commands::Clients { json } => {
            let report = fetch_status(socket)?;
            if json {
                print(&format!(
                    "{}\n",
                    serde_json::to_string_pretty(&report.clients)?
                ))?;
            } else if report.clients.is_empty() {
                print("no clients\n")?;
            } else {
                print(&format::clients(&report.clients))?;
            }
        }
        Commands::Top(args) => {
            let batch = args.batch || args.json;
            if args.iterations.is_some() && !batch {
                anyhow::bail!("-n counts batch frames: add -b (or --json)");
            }
            if batch {
                top::batch::run(socket.clone(), args.delay, args.iterations, args.json)?;
            } else {
                top::interactive(socket.clone(), args.delay)?;
            }
        }
        Commands::Set {
            client,
            class,
            weight,
            memory_quota,
        } => {
            let mut monitor = connect(socket)?;
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
            print(&format!("client {client}: {}\n", changed.join(", ")))?;
        }
        Commands::Evict { client, reason } => {
            let reason = reason.unwrap_or_else(|| "evicted by an administrator".into());
            connect(socket)?.admin_evict(client, &reason)?;
            print(&format!("client {client} evicted\n"))?;
        }
        Commands::Run(args) => return Err(run::exec(&cli.socket, args)),
        Commands::Slurm { command } => slurm::run(command, socket)?,
        Commands::Completions { shell } => {
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "gpushare", &mut script);
            print(&String::from_utf8_lossy(&script))?;
        }
    }
    Ok(())
}

fn connect(socket: &BrokerSocket) -> anyhow::Result<Monitor> {
    socket.monitor().map_err(anyhow::Error::msg)
}

fn fetch_status(socket: &BrokerSocket) -> anyhow::Result<StatusReport> {
    Ok(connect(socket)?.status()?)
}

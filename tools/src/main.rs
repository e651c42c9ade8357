//! `gpushare`: see and manage the gpushare broker.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use gpushare::{Monitor, StatusReport};

mod format;

/// See and manage the gpushare GPU-sharing broker.
#[derive(Debug, Parser)]
#[command(name = "gpushare", version, about)]
struct Cli {
    /// Broker socket.
    #[arg(long, global = true, env = "GPUSHARE_SOCKET", default_value = gpushare_protocol::DEFAULT_SOCKET_PATH)]
    socket: PathBuf,
    #[command(subcommand)]
    command: Commands,
}

#[derive(Debug, Subcommand)]
enum Commands {
    /// Broker version, backend, device and the connected clients with their usage.
    Status {
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpushare: {e:#}");
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
    }
    Ok(())
}

fn fetch_status(socket: &std::path::Path) -> anyhow::Result<StatusReport> {
    let mut monitor = Monitor::connect(socket)?;
    Ok(monitor.status()?)
}

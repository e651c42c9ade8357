//! `gpushare-gen --out DIR`: the man pages and shell completions of `gpushared` and
//! `gpushare`, generated from the very clap definitions the binaries parse
//! (`gpushare_broker::cli::Args`, `gpushare_tools::cli::Cli`), so they never disagree with
//! `--help`. `scripts/package.sh` runs it and puts the results in the Debian package.
//!
//! Under DIR it writes:
//! - `man/man8/gpushared.8`, `man/man1/gpushare.1` and `man/man1/gpushare-COMMAND.1` for
//!   every (visible) subcommand: clap's NAME, SYNOPSIS, DESCRIPTION, OPTIONS and
//!   SUBCOMMANDS, plus the sections below (files, signals, environment, see also);
//! - `completions/bash/{gpushare,gpushared}`, `completions/zsh/_{gpushare,gpushared}` and
//!   `completions/fish/{gpushare,gpushared}.fish`, named as the shells look them up.
//!
//! The output depends only on the sources and `--date`, so packages build reproducibly.

use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use clap::{Command, CommandFactory as _, Parser};
use clap_complete::Shell;
use clap_mangen::Man;
use clap_mangen::roff::{Roff, bold, italic, roman};

/// Write gpushare's man pages and shell completions.
#[derive(Debug, Parser)]
#[command(name = "gpushare-gen", version, about)]
struct Args {
    /// Directory to write into (created if missing).
    #[arg(long)]
    out: PathBuf,
    /// The date printed in the pages' footer (YYYY-MM-DD); scripts/package.sh passes the
    /// last commit's date so that the package is reproducible.
    #[arg(long, default_value = "")]
    date: String,
}

const MANUAL: &str = "gpushare";
const POLICY_FILE: &str = "/etc/gpushare/gpushare.toml";
const SOCKET: &str = "/run/gpushare/gpushare.sock";

fn main() -> anyhow::Result<()> {
    let args = Args::parse();

    // The pages leave out the `help` subcommand (`--help` is listed; `gpushare help` needs no
    // page); the completions, like the binaries, keep it.
    let broker = gpushare_broker::cli::Args::command();
    let cli = gpushare_tools::cli::Cli::command();
    for (bin, mut cmd) in [("gpushared", broker.clone()), ("gpushare", cli.clone())] {
        write_completions(&args.out.join("completions"), bin, &mut cmd)?;
    }
    let broker = broker.disable_help_subcommand(true);
    let cli = cli.disable_help_subcommand(true);
    let cli_pages = subcommand_pages(&cli);

    // The footer names the package and its version on every page (subcommands have none).
    let source = format!("gpushare {}", cli.get_version().unwrap_or_default());
    let footer = Footer {
        source: &source,
        date: &args.date,
    };
    let man8 = args.out.join("man/man8");
    let man1 = args.out.join("man/man1");
    write_page(&man8, &broker, "8", &footer, &broker_sections())?;
    write_page(&man1, &cli, "1", &footer, &cli_sections(&cli_pages))?;
    for sub in &cli_pages {
        write_page(&man1, sub, "1", &footer, &[see_also(&["gpushare(1)"])])?;
    }
    Ok(())
}

/// Every visible subcommand of `cmd` (recursively), built so that each is named
/// `PARENT-SUB` (`gpushare-status`) as its page is.
fn subcommand_pages(cmd: &Command) -> Vec<Command> {
    let mut cmd = cmd.clone();
    cmd.build();
    let mut pages = Vec::new();
    collect(&cmd, &mut pages);
    pages
}

fn collect(cmd: &Command, into: &mut Vec<Command>) {
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        into.push(sub.clone());
        collect(sub, into);
    }
}

/// The name a page is filed and referred to under: `gpushare-status` for a subcommand.
fn page_name(cmd: &Command) -> String {
    cmd.get_display_name()
        .unwrap_or_else(|| cmd.get_name())
        .to_string()
}

/// What the bottom line of every page says.
struct Footer<'a> {
    source: &'a str,
    date: &'a str,
}

/// Renders clap's sections of `cmd`'s page with `extra` sections before VERSION, into
/// `dir/NAME.SECTION`.
fn write_page(
    dir: &Path,
    cmd: &Command,
    section: &str,
    footer: &Footer<'_>,
    extra: &[Roff],
) -> anyhow::Result<()> {
    fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let man = Man::new(cmd.clone())
        .section(section)
        .date(footer.date)
        .source(footer.source)
        .manual(MANUAL);
    let mut page = Vec::new();
    man.render_title(&mut page)?;
    man.render_name_section(&mut page)?;
    man.render_synopsis_section(&mut page)?;
    man.render_description_section(&mut page)?;
    if cmd.get_arguments().any(|a| !a.is_hide_set()) {
        man.render_options_section(&mut page)?;
    }
    if cmd.get_subcommands().any(|s| !s.is_hide_set()) {
        man.render_subcommands_section(&mut page)?;
    }
    if cmd.get_after_long_help().is_some() || cmd.get_after_help().is_some() {
        man.render_extra_section(&mut page)?;
    }
    for roff in extra {
        roff.to_writer(&mut page)?;
    }
    if cmd.get_version().is_some() {
        man.render_version_section(&mut page)?;
    }
    let path = dir.join(man.get_filename());
    fs::write(&path, page).with_context(|| format!("write {}", path.display()))?;
    Ok(())
}

fn write_completions(dir: &Path, bin: &str, cmd: &mut Command) -> anyhow::Result<()> {
    for (shell, file) in [
        (Shell::Bash, bin.to_string()),
        (Shell::Zsh, format!("_{bin}")),
        (Shell::Fish, format!("{bin}.fish")),
    ] {
        let shell_dir = dir.join(shell.to_string());
        fs::create_dir_all(&shell_dir)
            .with_context(|| format!("create {}", shell_dir.display()))?;
        let mut script = Vec::new();
        clap_complete::generate(shell, cmd, bin, &mut script);
        let path = shell_dir.join(file);
        fs::File::create(&path)
            .and_then(|mut f| f.write_all(&script))
            .with_context(|| format!("write {}", path.display()))?;
    }
    Ok(())
}

/// A section heading followed by one paragraph per entry; an entry is a tagged paragraph
/// (`.TP`) when it has a tag.
fn section(title: &str, entries: &[(Option<&str>, &str)]) -> Roff {
    let mut roff = Roff::new();
    roff.control("SH", [title]);
    for (tag, text) in entries {
        match tag {
            Some(tag) => {
                roff.control("TP", []);
                roff.text([bold(*tag)]);
            }
            None => {
                roff.control("PP", []);
            }
        }
        roff.text([roman(*text)]);
    }
    roff
}

fn see_also(pages: &[&str]) -> Roff {
    let mut roff = Roff::new();
    roff.control("SH", ["SEE ALSO"]);
    let mut inline = Vec::new();
    for (i, page) in pages.iter().enumerate() {
        if i > 0 {
            inline.push(roman(", "));
        }
        match page.split_once('(') {
            Some((name, rest)) => {
                inline.push(bold(name));
                inline.push(roman(format!("({rest}")));
            }
            None => inline.push(italic(*page)),
        }
    }
    roff.text(inline);
    roff
}

fn broker_sections() -> Vec<Roff> {
    vec![
        section(
            "SERVICE",
            &[
                (
                    None,
                    "Installed from the Debian package, gpushared runs as the systemd service \
                     gpushared.service: as root, with only the capabilities it uses, its \
                     socket owned by the gpushare group. Members of that group may use the GPU; \
                     add a user with \"adduser USER gpushare\" (effective at their next login). \
                     Start, stop and inspect it with systemctl(1) and journalctl(1); \
                     \"systemctl reload gpushared\" re-reads the policy file.",
                ),
                (
                    None,
                    "With --backend auto the broker serves the GPUs when the CUDA driver can \
                     open them and the sim device otherwise; \"gpushare status\" shows which.",
                ),
            ],
        ),
        section(
            "FILES",
            &[
                (
                    Some(POLICY_FILE),
                    "The policy file: priority class, fair-share weight and memory quota by \
                     user and group, and the admin group. The installed file explains its \
                     format in comments. Read at start (a mistake stops the broker with the \
                     file name and the offending value) and on SIGHUP.",
                ),
                (
                    Some(SOCKET),
                    "The control socket clients connect to (--socket). The service makes it \
                     root:gpushare, mode 0660, in a directory of the same group, mode 0750.",
                ),
            ],
        ),
        section(
            "SIGNALS",
            &[
                (
                    Some("SIGHUP"),
                    "Re-read the policy file (\"systemctl reload gpushared\"): it applies to \
                     clients that connect from then on; connected clients stay connected. A \
                     file with a mistake is reported and the policy in force is kept.",
                ),
                (
                    Some("SIGTERM, SIGINT"),
                    "Tell every client the broker is shutting down, release everything \
                     their sessions hold, remove the socket and exit with status 0.",
                ),
            ],
        ),
        section(
            "ENVIRONMENT",
            &[
                (
                    Some("GPUSHARE_SOCKET"),
                    "The control socket path when --socket is not given.",
                ),
                (
                    Some("RUST_LOG"),
                    "A log filter that overrides --log (tracing's env-filter syntax).",
                ),
            ],
        ),
        see_also(&["gpushare(1)", "systemctl(1)", "journalctl(1)"]),
    ]
}

fn cli_sections(subcommands: &[Command]) -> Vec<Roff> {
    let mut pages: Vec<String> = subcommands
        .iter()
        .map(|s| format!("{}(1)", page_name(s)))
        .collect();
    pages.push("gpushared(8)".into());
    let pages: Vec<&str> = pages.iter().map(String::as_str).collect();
    vec![
        section(
            "ENVIRONMENT",
            &[(
                Some("GPUSHARE_SOCKET"),
                "The broker's socket when --socket is not given.",
            )],
        ),
        section(
            "FILES",
            &[(
                Some(SOCKET),
                "The broker's socket. Connecting needs membership in its group (gpushare \
                 where the Debian package installed the broker).",
            )],
        ),
        see_also(&pages),
    ]
}

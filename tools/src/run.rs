//! `gpushare run`: starts a program with the libcuda interposer preloaded, so that it runs as
//! a governed client of the broker.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

use gpushare_conn::env;
use gpushare_tools::cli::RunArgs;

/// The interposer's file name.
pub const INTERPOSER: &str = "libgpushare_interpose.so";

/// Where the interposer is looked for when `--interposer` is not given: next to the
/// `gpushare` binary (a build or a bundle), then the install's library directories.
fn find_interposer() -> anyhow::Result<PathBuf> {
    let mut candidates = Vec::new();
    if let Ok(exe) = std::env::current_exe()
        && let Some(dir) = exe.parent()
    {
        candidates.push(dir.join(INTERPOSER));
        candidates.push(dir.join("../lib/gpushare").join(INTERPOSER));
    }
    candidates.push(Path::new("/usr/lib/gpushare").join(INTERPOSER));
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .ok_or_else(|| {
            anyhow::anyhow!(
                "cannot find {INTERPOSER} (looked in {}); pass --interposer PATH or set {}",
                candidates
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                env::INTERPOSER_ENV
            )
        })
}

/// Replaces this process with the governed program (so it exits with the program's status);
/// returns only when that cannot be done.
pub fn exec(socket: &Path, args: RunArgs) -> anyhow::Error {
    let interposer = match args.interposer.map_or_else(find_interposer, Ok) {
        Ok(p) => p,
        Err(e) => return e,
    };
    let interposer = std::fs::canonicalize(&interposer).unwrap_or(interposer);
    let Some((program, rest)) = args.command.split_first() else {
        return anyhow::anyhow!("no program to run");
    };
    let mut preload = interposer.into_os_string();
    if let Some(existing) = std::env::var_os("LD_PRELOAD").filter(|p| !p.is_empty()) {
        preload.push(":");
        preload.push(existing);
    }
    let mut cmd = std::process::Command::new(program);
    cmd.args(rest)
        .env("LD_PRELOAD", preload)
        .env(gpushare_protocol::SOCKET_ENV, socket);
    if let Some(class) = args.class {
        cmd.env(env::CLASS_ENV, class.as_str());
    }
    if let Some(weight) = args.weight {
        cmd.env(env::WEIGHT_ENV, weight.to_string());
    }
    if let Some(name) = args.name {
        cmd.env(env::NAME_ENV, name);
    }
    let err = cmd.exec();
    anyhow::anyhow!("cannot run {}: {err}", Path::new(program).display())
}

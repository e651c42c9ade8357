//! `gpushare run`: starts an unmodified CUDA program as a client of the broker.
//!
//! Consolidated (the default): gpushare's CUDA driver is the program's libcuda, found first
//! on `LD_LIBRARY_PATH` (searches by soname) and handed out by the audit library in
//! `LD_AUDIT` (links and `dlopen`s by a path to a real libcuda); every GPU call then runs in
//! gpushared's context. Governed: the libcuda interposer is preloaded, and the program keeps
//! its own CUDA context. Children inherit the environment, so each CUDA process the program
//! starts is a client of its own.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use gpushare_conn::env;
use gpushare_tools::cli::{Fallback, RunArgs, RunMode};

mod libs;
pub mod placement;
mod search;

use search::{COLON, COLON_OR_SPACE, named};

/// One change to a program's environment: `gpushare run` makes it on the program's command,
/// `gpushare slurm task-prolog` prints it for slurmstepd to make on the task's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvChange {
    Set(&'static str, OsString),
    Remove(&'static str),
}

impl EnvChange {
    pub fn name(&self) -> &'static str {
        match self {
            EnvChange::Set(name, _) | EnvChange::Remove(name) => name,
        }
    }

    fn set_or_remove(name: &'static str, value: Option<OsString>) -> EnvChange {
        match value {
            Some(v) => EnvChange::Set(name, v),
            None => EnvChange::Remove(name),
        }
    }
}

fn apply(cmd: &mut Command, changes: &[EnvChange]) {
    for change in changes {
        match change {
            EnvChange::Set(name, value) => cmd.env(name, value),
            EnvChange::Remove(name) => cmd.env_remove(name),
        };
    }
}

/// Replaces this process with the program (so it exits with the program's status); returns
/// only when that cannot be done.
pub fn exec(socket: &Path, args: RunArgs) -> anyhow::Error {
    let Some((program, rest)) = args.command.split_first() else {
        return anyhow::anyhow!("no program to run");
    };
    let mut cmd = Command::new(program);
    cmd.args(rest).env(gpushare_protocol::SOCKET_ENV, socket);
    if let Some(class) = args.class {
        cmd.env(env::CLASS_ENV, class.as_str());
    }
    if let Some(weight) = args.weight {
        cmd.env(env::WEIGHT_ENV, weight.to_string());
    }
    if let Some(gpu) = args.gpu {
        cmd.env(env::GPU_ENV, gpu.to_string());
    }
    if let Some(name) = &args.name {
        cmd.env(env::NAME_ENV, name);
    }
    let changes = match args.mode {
        RunMode::Governed if args.gpus.is_some() => {
            return anyhow::anyhow!(
                "--gpus places a consolidated job; a governed program uses the GPUs CUDA_VISIBLE_DEVICES gives it"
            );
        }
        RunMode::Governed => {
            // The interposer decides, as the program starts and whenever it loses the broker.
            match args.fallback {
                Some(Fallback::Direct) => cmd.env(env::FALLBACK_ENV, "direct"),
                Some(Fallback::Fail) => cmd.env(env::FALLBACK_ENV, "fail"),
                None => &mut cmd,
            };
            governed_env(args.interposer)
        }
        RunMode::Consolidated => {
            if args.fallback == Some(Fallback::Direct)
                && let Err(why) = unreachable(socket)
            {
                eprintln!(
                    "gpushare: gpushared is not reachable at {} ({why}): running {} directly on the GPU's own driver, outside gpushare (--fallback direct)",
                    socket.display(),
                    Path::new(program).display()
                );
                Ok(Inherited::read(None).changes())
            } else {
                match placed(socket, &args) {
                    Ok(placement) => consolidated_env(socket)
                        .map(|mut changes| {
                            changes.extend(placement);
                            changes
                        })
                        .map_err(|e| {
                            anyhow::anyhow!("{e:#} `--mode governed` runs the program without it")
                        }),
                    Err(e) => Err(e),
                }
            }
        }
    };
    match changes {
        Ok(changes) => apply(&mut cmd, &changes),
        Err(e) => return e,
    }
    let err = cmd.exec();
    anyhow::anyhow!("cannot run {}: {err}", Path::new(program).display())
}

/// The environment that puts a consolidated program on its GPU (`placement`); none where
/// gpushared cannot be asked.
fn placed(socket: &Path, args: &RunArgs) -> anyhow::Result<Vec<EnvChange>> {
    if let Some(n) = args.gpus.filter(|&n| n > 1) {
        return job(placement::place_several(socket, n as usize), args.verbose);
    }
    let ask = placement::Ask::read(args.gpu).map_err(anyhow::Error::msg)?;
    if let Some(listed) = placement::place_listed(socket, &ask) {
        return job(listed, args.verbose);
    }
    if ask.hides_every_gpu() && args.verbose {
        eprintln!(
            "gpushare: CUDA_VISIBLE_DEVICES={:?} hides every GPU: the program runs with none",
            ask.visible.as_deref().unwrap_or_default()
        );
    }
    match placement::place(socket, &ask) {
        None => Ok(Vec::new()),
        Some(Err(why)) => Err(anyhow::anyhow!("cannot place the program: {why}")),
        Some(Ok(p)) => {
            if args.verbose {
                eprintln!("gpushare: running on GPU {} ({}): {}", p.gpu, p.uuid, p.why);
            }
            Ok(p.changes())
        }
    }
}

/// The environment of a job of one process per GPU (`--gpus`, or `CUDA_VISIBLE_DEVICES`
/// naming several), said with `-v`.
fn job(
    several: Result<placement::Several, String>,
    verbose: bool,
) -> anyhow::Result<Vec<EnvChange>> {
    let several = several.map_err(|why| anyhow::anyhow!("cannot place the job: {why}"))?;
    if verbose {
        eprintln!("gpushare: running on GPUs {}", several.why);
    }
    Ok(several.changes())
}

/// The interposer preloaded.
fn governed_env(interposer: Option<PathBuf>) -> anyhow::Result<Vec<EnvChange>> {
    let interposer = match interposer {
        Some(p) => std::fs::canonicalize(&p).unwrap_or(p),
        None => libs::interposer()?,
    };
    let loader = Inherited::read(None);
    let preload = search::prepend(&interposer, loader.preload.clone());
    let mut changes = loader.changes();
    changes.retain(|c| c.name() != "LD_PRELOAD");
    changes.push(EnvChange::Set("LD_PRELOAD", preload));
    Ok(changes)
}

/// `Ok` when gpushared answers on `socket`; else why not.
fn unreachable(socket: &Path) -> Result<(), String> {
    match gpushare_conn::ControlSocket::connect(socket) {
        Ok(_) => Ok(()),
        Err(gpushare_conn::Error::Connect { cause, .. }) => Err(cause.to_string()),
        Err(other) => Err(other.to_string()),
    }
}

/// The environment of a consolidated program, with this process's environment as the one it
/// would inherit: gpushare's driver in place of libcuda, the broker at `socket`. The only
/// place that says it: `gpushare run` and Slurm's task prolog both take it from here.
pub fn consolidated_env(socket: &Path) -> anyhow::Result<Vec<EnvChange>> {
    let driver_dir = libs::driver_dir()?;
    let audit = libs::audit()?;
    let loader = Inherited::read(Some(&driver_dir));
    Ok(vec![
        EnvChange::Set(gpushare_protocol::SOCKET_ENV, socket.as_os_str().to_owned()),
        EnvChange::Set(
            "LD_LIBRARY_PATH",
            search::prepend(&driver_dir, loader.library_path),
        ),
        EnvChange::Set("LD_AUDIT", search::append(loader.audit, &audit)),
        EnvChange::set_or_remove("LD_PRELOAD", loader.preload),
        EnvChange::Set(
            env::CUDA_DRIVER_ENV,
            driver_dir.join(libs::DRIVER_SONAME).into_os_string(),
        ),
    ])
}

/// The loader's lists as this process got them, without gpushare's own entries: a program
/// started by a consolidated or governed program inherits those, and they would put the
/// wrong driver (or both) in front of it.
struct Inherited {
    library_path: Option<OsString>,
    audit: Option<OsString>,
    preload: Option<OsString>,
}

impl Inherited {
    /// `driver_dir`: the driver directory about to be used, dropped wherever it already is.
    fn read(driver_dir: Option<&Path>) -> Inherited {
        let inherited_dir = std::env::var_os(env::CUDA_DRIVER_ENV)
            .and_then(|d| Path::new(&d).parent().map(Path::to_path_buf));
        let ours = |p: &Path| Some(p) == driver_dir || Some(p) == inherited_dir.as_deref();
        Inherited {
            library_path: search::without(std::env::var_os("LD_LIBRARY_PATH"), COLON, ours),
            audit: search::without(std::env::var_os("LD_AUDIT"), COLON, |p| {
                named(p, libs::AUDIT)
            }),
            preload: search::without(std::env::var_os("LD_PRELOAD"), COLON_OR_SPACE, |p| {
                named(p, libs::INTERPOSER)
            }),
        }
    }

    /// Each list set (or cleared) as read, and no driver named; the caller adds its own after.
    fn changes(self) -> Vec<EnvChange> {
        vec![
            EnvChange::set_or_remove("LD_LIBRARY_PATH", self.library_path),
            EnvChange::set_or_remove("LD_AUDIT", self.audit),
            EnvChange::set_or_remove("LD_PRELOAD", self.preload),
            EnvChange::Remove(env::CUDA_DRIVER_ENV),
        ]
    }
}

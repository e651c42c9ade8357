//! `gpushare run`: starts an unmodified CUDA program as a client of the broker.
//!
//! Consolidated (the default): gpushare's CUDA driver is the program's libcuda, found first
//! on `LD_LIBRARY_PATH` (searches by soname) and handed out by the audit library in
//! `LD_AUDIT` (links and `dlopen`s by a path to a real libcuda); every GPU call then runs in
//! gpushared's context. Governed: the libcuda interposer is preloaded, and the program keeps
//! its own CUDA context. Children inherit the environment, so each CUDA process the program
//! starts is a client of its own.

use std::ffi::OsStr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use gpushare_conn::env;
use gpushare_tools::cli::{Fallback, RunArgs, RunMode};

mod libs;
mod search;

use search::{COLON, COLON_OR_SPACE, named};

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
    let prepared = match args.mode {
        RunMode::Governed => {
            // The interposer decides, as the program starts and whenever it loses the broker.
            match args.fallback {
                Some(Fallback::Direct) => cmd.env(env::FALLBACK_ENV, "direct"),
                Some(Fallback::Fail) => cmd.env(env::FALLBACK_ENV, "fail"),
                None => &mut cmd,
            };
            governed(&mut cmd, args.interposer)
        }
        RunMode::Consolidated => consolidated(
            &mut cmd,
            socket,
            args.fallback.unwrap_or(Fallback::Fail),
            program,
        ),
    };
    if let Err(e) = prepared {
        return e;
    }
    let err = cmd.exec();
    anyhow::anyhow!("cannot run {}: {err}", Path::new(program).display())
}

/// The interposer preloaded.
fn governed(cmd: &mut Command, interposer: Option<PathBuf>) -> anyhow::Result<()> {
    let interposer = match interposer {
        Some(p) => std::fs::canonicalize(&p).unwrap_or(p),
        None => libs::interposer()?,
    };
    let loader = Inherited::read(None);
    loader.apply(cmd);
    cmd.env("LD_PRELOAD", search::prepend(&interposer, loader.preload));
    Ok(())
}

/// gpushare's driver in place of libcuda; or, with `--fallback direct` and no broker, the
/// program as it is.
fn consolidated(
    cmd: &mut Command,
    socket: &Path,
    fallback: Fallback,
    program: &OsStr,
) -> anyhow::Result<()> {
    if fallback == Fallback::Direct
        && let Err(e) = gpushare_conn::ControlSocket::connect(socket)
    {
        let why = match &e {
            gpushare_conn::Error::Connect { cause, .. } => cause.to_string(),
            other => other.to_string(),
        };
        eprintln!(
            "gpushare: gpushared is not reachable at {} ({why}): running {} directly on the GPU's own driver, outside gpushare (--fallback direct)",
            socket.display(),
            Path::new(program).display()
        );
        Inherited::read(None).apply(cmd);
        return Ok(());
    }
    let driver_dir = libs::driver_dir()?;
    let audit = libs::audit()?;
    let loader = Inherited::read(Some(&driver_dir));
    loader.apply(cmd);
    cmd.env(
        "LD_LIBRARY_PATH",
        search::prepend(&driver_dir, loader.library_path),
    )
    .env("LD_AUDIT", search::append(loader.audit, &audit))
    .env(env::CUDA_DRIVER_ENV, driver_dir.join(libs::DRIVER_SONAME));
    Ok(())
}

/// The loader's lists as this process got them, without gpushare's own entries: a program
/// started by a consolidated or governed program inherits those, and they would put the
/// wrong driver (or both) in front of it.
struct Inherited {
    library_path: Option<std::ffi::OsString>,
    audit: Option<std::ffi::OsString>,
    preload: Option<std::ffi::OsString>,
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

    /// Sets (or clears) each list on `cmd` as read; the caller adds its own after.
    fn apply(&self, cmd: &mut Command) {
        for (name, value) in [
            ("LD_LIBRARY_PATH", &self.library_path),
            ("LD_AUDIT", &self.audit),
            ("LD_PRELOAD", &self.preload),
        ] {
            match value {
                Some(v) => cmd.env(name, v),
                None => cmd.env_remove(name),
            };
        }
        cmd.env_remove(env::CUDA_DRIVER_ENV);
    }
}

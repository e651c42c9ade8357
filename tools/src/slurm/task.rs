//! `gpushare slurm task-prolog`: Slurm's TaskProlog, run as the job's user before each task,
//! in the task's environment. What it prints, slurmstepd applies to the task's environment
//! (`export NAME=value`, `unset NAME`; `print TEXT` goes to the task's output): the
//! environment `gpushare run` gives a consolidated program, so that the task's CUDA programs
//! run on gpushare's driver within the job's grant.

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::run::placement::{Ask, place};
use crate::run::{EnvChange, consolidated_env};

/// `GPUSHARE_SLURM=off` in a job's environment: its tasks are left as they are.
pub const OPT_OUT_ENV: &str = "GPUSHARE_SLURM";

/// What the task prolog prints, as bytes (paths need not be UTF-8).
pub fn output(socket: &Path) -> Vec<u8> {
    let var = |name: &str| std::env::var_os(name);
    if opted_out(var) || !uses_gpu(var) {
        return Vec::new();
    }
    match consolidated_env(socket) {
        // An `unset` of what the task does not have would only add noise.
        Ok(changes) => lines(
            changes
                .into_iter()
                .filter(|c| matches!(c, EnvChange::Set(..)) || var(c.name()).is_some())
                .chain(placed(socket, var)),
        ),
        Err(e) => print_line(&format!(
            "gpushare: this task's CUDA programs run on the machine's driver, outside gpushare: {e:#}"
        )),
    }
}

/// Whether the job said `GPUSHARE_SLURM=off` (or `no`, `false`, `0`).
pub fn opted_out(var: impl Fn(&str) -> Option<OsString>) -> bool {
    var(OPT_OUT_ENV).is_some_and(|v| {
        let v = v.to_string_lossy().to_ascii_lowercase();
        matches!(v.trim(), "off" | "no" | "false" | "0")
    })
}

/// The task on its GPU, as `gpushare run` puts a program there (its NVML and
/// `CUDA_VISIBLE_DEVICES` naming that GPU too), where gpushared answers; else only the GPU.
fn placed(socket: &Path, var: impl Fn(&str) -> Option<OsString>) -> Vec<EnvChange> {
    let Some(gpu_only) = job_gpu(var) else {
        return Vec::new();
    };
    let ask = match &gpu_only {
        EnvChange::Set(_, gpu) => gpu.to_str().and_then(|g| g.parse().ok()),
        EnvChange::Remove(_) => None,
    }
    .map(|g| Ask {
        index: Some((g, format!("Slurm's GPU {g}"))),
        ..Ask::default()
    });
    match ask.and_then(|ask| place(socket, &ask)) {
        Some(Ok(p)) => p.changes(),
        _ => vec![gpu_only],
    }
}

/// The GPU the task's programs ask gpushared for: the first Slurm gave the step (or the job),
/// by its index in gres.conf, which is gpushared's (docs/slurm.md). `CUDA_VISIBLE_DEVICES`
/// cannot say it: under `ConstrainDevices` Slurm numbers a task's GPUs from 0.
pub fn job_gpu(var: impl Fn(&str) -> Option<OsString>) -> Option<EnvChange> {
    let first = |name| {
        let list = var(name)?;
        let first = list
            .to_str()?
            .split(',')
            .next()?
            .trim()
            .parse::<u32>()
            .ok()?;
        Some(first)
    };
    let gpu = first("SLURM_STEP_GPUS").or_else(|| first("SLURM_JOB_GPUS"))?;
    Some(EnvChange::Set(
        gpushare_conn::env::GPU_ENV,
        gpu.to_string().into(),
    ))
}

/// Whether Slurm gave the task a GPU or shards of one: what the GRES plugins put in its
/// environment.
pub fn uses_gpu(var: impl Fn(&str) -> Option<OsString>) -> bool {
    let counted = |name| var(name).is_some_and(|v| !v.is_empty() && v != "0");
    let listed = |name| var(name).is_some_and(|v| !v.is_empty());
    counted("SLURM_SHARDS_ON_NODE")
        || counted("SLURM_GPUS_ON_NODE")
        || listed("SLURM_JOB_GPUS")
        || listed("SLURM_STEP_GPUS")
}

/// The changes as TaskProlog lines. slurmstepd takes a value to the end of its line, as
/// is: a value with a newline cannot be said, and then nothing is (half of the environment
/// would put half of gpushare in front of the program).
pub fn lines(changes: impl IntoIterator<Item = EnvChange>) -> Vec<u8> {
    let mut out = Vec::new();
    for change in changes {
        match change {
            EnvChange::Set(name, value) => {
                if value.as_bytes().contains(&b'\n') {
                    return print_line(&format!(
                        "gpushare: this task's CUDA programs run on the machine's driver, outside gpushare: {name} holds a newline, which a TaskProlog cannot pass on"
                    ));
                }
                out.extend_from_slice(b"export ");
                out.extend_from_slice(name.as_bytes());
                out.push(b'=');
                out.extend_from_slice(value.as_bytes());
                out.push(b'\n');
            }
            EnvChange::Remove(name) => {
                out.extend_from_slice(format!("unset {name}\n").as_bytes());
            }
        }
    }
    out
}

/// A `print` line: slurmstepd writes its text to the task's standard output.
fn print_line(text: &str) -> Vec<u8> {
    format!("print {}\n", text.replace('\n', " ")).into_bytes()
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
        let map: HashMap<String, OsString> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        move |name| map.get(name).cloned()
    }

    #[test]
    fn a_task_uses_a_gpu_when_slurm_gave_it_one_or_shards() {
        assert!(uses_gpu(env(&[("SLURM_SHARDS_ON_NODE", "3")])));
        assert!(uses_gpu(env(&[("SLURM_GPUS_ON_NODE", "1")])));
        assert!(uses_gpu(env(&[("SLURM_JOB_GPUS", "0")])));
        assert!(uses_gpu(env(&[("SLURM_STEP_GPUS", "0,1")])));
        assert!(!uses_gpu(env(&[])));
        assert!(!uses_gpu(env(&[
            ("SLURM_SHARDS_ON_NODE", "0"),
            ("SLURM_GPUS_ON_NODE", ""),
            ("SLURM_JOB_GPUS", "")
        ])));
    }

    #[test]
    fn the_task_asks_for_the_gpu_slurm_gave_it_by_gres_conf_s_index() {
        let gpu = |pairs: &[(&str, &str)]| {
            job_gpu(env(pairs)).map(|c| match c {
                EnvChange::Set(name, value) => format!("{name}={}", value.to_string_lossy()),
                EnvChange::Remove(name) => format!("-{name}"),
            })
        };
        assert_eq!(
            gpu(&[("SLURM_STEP_GPUS", "2,3"), ("SLURM_JOB_GPUS", "1,2,3")]),
            Some("GPUSHARE_GPU=2".into())
        );
        assert_eq!(
            gpu(&[("SLURM_JOB_GPUS", "1")]),
            Some("GPUSHARE_GPU=1".into())
        );
        assert_eq!(gpu(&[("SLURM_SHARDS_ON_NODE", "2")]), None);
        assert_eq!(gpu(&[("SLURM_JOB_GPUS", "")]), None);
    }

    #[test]
    fn a_job_may_opt_out() {
        assert!(opted_out(env(&[("GPUSHARE_SLURM", "off")])));
        assert!(opted_out(env(&[("GPUSHARE_SLURM", "OFF")])));
        assert!(!opted_out(env(&[("GPUSHARE_SLURM", "on")])));
        assert!(!opted_out(env(&[])));
    }

    #[test]
    fn changes_print_as_slurmstepd_reads_them() {
        let printed = lines([
            EnvChange::Set("GPUSHARE_SOCKET", "/run/gpushare/gpushare.sock".into()),
            EnvChange::Set(
                "LD_LIBRARY_PATH",
                "/usr/lib/gpushare/cuda:/opt/my lib".into(),
            ),
            EnvChange::Remove("LD_PRELOAD"),
        ]);
        assert_eq!(
            String::from_utf8_lossy(&printed),
            "export GPUSHARE_SOCKET=/run/gpushare/gpushare.sock\n\
             export LD_LIBRARY_PATH=/usr/lib/gpushare/cuda:/opt/my lib\n\
             unset LD_PRELOAD\n"
        );
    }

    #[test]
    fn a_value_with_a_newline_prints_nothing_but_why() {
        let printed = lines([
            EnvChange::Set("GPUSHARE_SOCKET", "/run/gpushare/gpushare.sock".into()),
            EnvChange::Set("LD_LIBRARY_PATH", "/a\n/b".into()),
        ]);
        let text = String::from_utf8_lossy(&printed);
        assert!(text.starts_with("print gpushare: "), "{text}");
        assert!(text.contains("LD_LIBRARY_PATH holds a newline"), "{text}");
        assert_eq!(text.lines().count(), 1, "{text}");
    }
}

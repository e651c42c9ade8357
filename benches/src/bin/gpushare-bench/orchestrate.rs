//! The orchestrator: every scenario in every round, modes and setups taking turns within a
//! round, each step in its own worker process, and the medians over rounds.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::harness::{machine_description, run_for_json, with_broker, with_mps};
use crate::{
    Cli, Mode, Scenario, colocate, colocate_setup_label, mode_name, name, report, workload,
};

pub fn orchestrate(cli: &Cli) -> Result<()> {
    let me = std::env::current_exe().context("cannot find this executable")?;
    let broker_bin = cli
        .broker
        .clone()
        .unwrap_or_else(|| me.with_file_name("gpushared"));
    let machine = machine_description();
    eprintln!("gpushare-bench on {machine}");
    let mut results = serde_json::Map::new();
    for &scenario in &cli.scenarios {
        if scenario == Scenario::Trace {
            results.insert(name(scenario).into(), trace_rounds(cli, &me, &broker_bin)?);
            continue;
        }
        if scenario == Scenario::Colocate {
            results.insert(
                name(scenario).into(),
                colocate_rounds(cli, &me, &broker_bin)?,
            );
            continue;
        }
        let mut runs: Vec<(Mode, Vec<Value>)> =
            cli.modes.iter().map(|&m| (m, Vec::new())).collect();
        let mut errors = serde_json::Map::new();
        let modes = if scenario == Scenario::Probe {
            vec![Mode::Direct]
        } else {
            cli.modes.clone()
        };
        for round in 1..=cli.rounds.max(1) {
            for &mode in &modes {
                let step = format!("{} round {round}", name(scenario));
                let outcome = timed(&step, mode_name(mode), || match mode {
                    Mode::Direct => worker(&me, scenario, Mode::Direct, cli.quick, &[]),
                    Mode::Broker => with_broker(&broker_bin, &cli.broker_args, |socket| {
                        worker(
                            &me,
                            scenario,
                            Mode::Broker,
                            cli.quick,
                            &[("GPUSHARE_SOCKET", socket.as_os_str())],
                        )
                    }),
                    Mode::Mps => with_mps(|envs| worker(&me, scenario, Mode::Mps, cli.quick, envs)),
                });
                match outcome {
                    Ok(v) => {
                        if let Some((_, vs)) = runs.iter_mut().find(|(m, _)| *m == mode) {
                            vs.push(v);
                        }
                    }
                    Err(e) => {
                        errors.insert(mode_name(mode).into(), json!(format!("{e:#}")));
                    }
                }
            }
        }
        let mut by_mode = serde_json::Map::new();
        for (mode, values) in runs {
            if !values.is_empty() {
                by_mode.insert(mode_name(mode).into(), report::median_of(&values));
            } else if let Some(e) = errors.remove(mode_name(mode)) {
                by_mode.insert(mode_name(mode).into(), json!({"error": e}));
            }
        }
        results.insert(name(scenario).into(), Value::Object(by_mode));
    }
    let doc =
        json!({"machine": machine, "quick": cli.quick, "rounds": cli.rounds, "results": results});
    std::fs::write(&cli.json, serde_json::to_string_pretty(&doc)?)
        .with_context(|| format!("cannot write {}", cli.json.display()))?;
    println!("{}", report::markdown(&doc));
    eprintln!("JSON written to {}", cli.json.display());
    Ok(())
}

fn worker(
    me: &Path,
    scenario: Scenario,
    mode: Mode,
    quick: bool,
    envs: &[(&str, &std::ffi::OsStr)],
) -> Result<Value> {
    let mode_arg = match mode {
        Mode::Direct => "direct",
        Mode::Broker => "broker",
        Mode::Mps => "mps",
    };
    let mut cmd = Command::new(me);
    cmd.args(["worker", "--scenario", name(scenario), "--mode", mode_arg]);
    if quick {
        cmd.arg("--quick");
    }
    for (k, v) in envs {
        cmd.env(k, v);
    }
    run_for_json(&mut cmd, "worker")
}

/// Runs one step of a benchmark, saying on stderr when it starts and how it ended:
/// `[round] what …`.
fn timed(round: &str, what: &str, f: impl FnOnce() -> Result<Value>) -> Result<Value> {
    let started = Instant::now();
    eprintln!("[{round}] {what} …");
    let outcome = f();
    match &outcome {
        Ok(_) => eprintln!("[{round}] {what} done in {:.1?}", started.elapsed()),
        Err(e) => eprintln!("[{round}] {what} FAILED: {e:#}"),
    }
    outcome
}

/// Writes a policy file into `dir` and returns gpushared's arguments with it.
fn broker_args_with_policy(cli: &Cli, dir: &Path, name: &str, policy: &str) -> Result<Vec<String>> {
    let file = dir.join(format!("{name}.toml"));
    std::fs::write(&file, policy)?;
    let mut args = cli.broker_args.clone();
    args.push("--config".into());
    args.push(file.display().to_string());
    Ok(args)
}

/// A step's result, or its error as the JSON the report shows.
fn or_error(outcome: Result<Value>) -> Value {
    outcome.unwrap_or_else(|e| json!({"error": format!("{e:#}")}))
}

/// The colocate scenario, every setup in every round; setups take turns within a round and
/// the high-priority client sees the same arrivals in each setup of a round.
fn colocate_rounds(cli: &Cli, me: &Path, broker_bin: &Path) -> Result<Value> {
    use colocate::{Member, Role, Via, WorkerSpec};
    let seconds = if cli.quick { 3.0 } else { cli.colocate_seconds };
    if cli.be_workloads.is_empty() {
        bail!("--be-workloads names no workload");
    }
    let known: Vec<&str> = workload::iterations()
        .iter()
        .chain(&workload::probes())
        .map(|i| i.name)
        .collect();
    if let Some(bad) = std::iter::once(&cli.hp_workload)
        .chain(&cli.be_workloads)
        .find(|w| !known.contains(&w.as_str()))
    {
        bail!("unknown workload `{bad}` (known: {})", known.join(", "));
    }
    if let Some(bad) = cli.sm_shares.iter().find(|s| !(**s > 0.0 && **s <= 1.0)) {
        bail!("--sm-shares: {bad} is not a share of the SMs (above 0, at most 1)");
    }
    let policy_dir = tempfile::tempdir()?;
    // Every worker runs as this user: the policy grants it `high`, and the best-effort
    // workers ask for less. One policy per SM share.
    let broker_args = |share: f64| {
        let mut partition = String::new();
        if share < 1.0 {
            partition += &format!("lower_sm_share = {share}\n");
        }
        if let Some(depth) = cli.lower_depth {
            partition += &format!("lower_depth = {depth}\n");
        }
        if let Some(gate) = cli.gate {
            partition += &format!("gate = {gate}\n");
        }
        if !partition.is_empty() {
            partition.insert_str(0, "[priority]\n");
        }
        broker_args_with_policy(
            cli,
            policy_dir.path(),
            &format!("colocate-{}", (share * 1000.0).round() as u64),
            &format!(
                "scheduler = \"{}\"\n{partition}[defaults]\nclass = \"high\"\n",
                cli.colocate_scheduler
            ),
        )
    };
    let whole_gpu_args = broker_args(1.0)?;
    let mut rounds = Vec::new();
    for round in 1..=cli.rounds.max(1) {
        let seed = round as u64;
        let high = |via| Member {
            label: "high".into(),
            via,
            spec: WorkerSpec {
                role: Role::High,
                workload: cli.hp_workload.clone(),
                seconds,
                mean_gap_ms: cli.hp_gap_ms,
                seed,
                spin_us: cli.hp_spin_us,
                churn_every: 0,
                churn: cli.be_churn,
            },
        };
        let best_effort = |i: usize, via| Member {
            label: format!("be{i}"),
            via,
            spec: WorkerSpec {
                role: Role::BestEffort,
                workload: cli.be_workloads[i % cli.be_workloads.len()].clone(),
                seconds,
                mean_gap_ms: cli.hp_gap_ms,
                seed,
                spin_us: None,
                churn_every: cli.be_churn_every,
                churn: cli.be_churn,
            },
        };
        let mut r = serde_json::Map::new();
        let mut run = |key: String, f: &mut dyn FnMut() -> Result<Value>| {
            let v = or_error(timed(&format!("colocate round {round}"), &key, f));
            r.insert(key, v);
        };
        run("dedicated".into(), &mut || {
            colocate::run_group(me, &[high(Via::Direct)], &[])
        });
        let mut workloads = cli.be_workloads.clone();
        workloads.dedup();
        for (i, w) in workloads.iter().enumerate() {
            let idx = cli.be_workloads.iter().position(|x| x == w).unwrap_or(i);
            run(format!("standalone {w}"), &mut || {
                let alone = Member {
                    label: "be".into(),
                    ..best_effort(idx, Via::Direct)
                };
                colocate::run_group(me, &[alone], &[])
            });
        }
        if cli.modes.contains(&Mode::Broker) {
            run("gpushare alone".into(), &mut || {
                with_broker(broker_bin, &whole_gpu_args, |socket| {
                    let envs = [("GPUSHARE_SOCKET", socket.as_os_str())];
                    colocate::run_group(me, &[high(Via::Broker)], &envs)
                })
            });
        }
        for &n in &cli.be_counts {
            for &mode in &cli.modes {
                let via = if mode == Mode::Broker {
                    Via::Broker
                } else {
                    Via::Direct
                };
                let members: Vec<Member> = std::iter::once(high(via))
                    .chain((0..n).map(|i| best_effort(i, via)))
                    .collect();
                let shares: &[f64] = if mode == Mode::Broker {
                    &cli.sm_shares
                } else {
                    &[1.0]
                };
                for &share in shares {
                    let key = format!("{n} best-effort, {}", colocate_setup_label(mode, share));
                    run(key, &mut || match mode {
                        Mode::Direct => colocate::run_group(me, &members, &[]),
                        Mode::Mps => with_mps(|envs| colocate::run_group(me, &members, envs)),
                        Mode::Broker => with_broker(broker_bin, &broker_args(share)?, |socket| {
                            let envs = [("GPUSHARE_SOCKET", socket.as_os_str())];
                            colocate::run_group(me, &members, &envs)
                        }),
                    });
                }
            }
        }
        rounds.push(Value::Object(r));
    }
    Ok(json!({
        "seconds": seconds,
        "hp_gap_ms": cli.hp_gap_ms,
        "high_workload": cli.hp_workload,
        "be_workloads": cli.be_workloads,
        "be_counts": cli.be_counts,
        "scheduler": cli.colocate_scheduler,
        "sm_shares": cli.sm_shares,
        "median": report::median_of(&rounds),
        "rounds": rounds,
    }))
}

/// The trace scenario: the same jobs under each policy, the policies taking turns per round.
fn trace_rounds(cli: &Cli, me: &Path, broker_bin: &Path) -> Result<Value> {
    let policy_dir = tempfile::tempdir()?;
    let mut rounds = Vec::new();
    for round in 1..=cli.rounds.max(1) {
        let mut r = serde_json::Map::new();
        for policy in &cli.trace_policies {
            let args = broker_args_with_policy(
                cli,
                policy_dir.path(),
                policy,
                &format!("scheduler = \"{policy}\"\n"),
            )?;
            let outcome = timed(&format!("trace round {round}"), policy, || {
                with_broker(broker_bin, &args, |socket| {
                    let mut worker = Command::new(me);
                    worker
                        .args(["trace-worker", "--seed", "7", "--jobs"])
                        .arg(cli.trace_jobs.to_string());
                    if let Some(us) = cli.trace_spin_us {
                        worker.arg(format!("--spin-us={us}"));
                    }
                    run_for_json(worker.env("GPUSHARE_SOCKET", socket), "trace worker")
                })
            });
            r.insert(policy.clone(), or_error(outcome));
        }
        rounds.push(Value::Object(r));
    }
    Ok(json!({
        "jobs": cli.trace_jobs,
        "policies": cli.trace_policies,
        "median": report::median_of(&rounds),
        "rounds": rounds,
    }))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[test]
    fn a_failed_step_shows_in_the_report_as_its_error() {
        assert_eq!(or_error(Ok(json!({"x": 1}))), json!({"x": 1}));
        let failed = or_error(Err(anyhow::anyhow!("no GPU").context("worker")));
        assert_eq!(failed, json!({"error": "worker: no GPU"}));
    }

    #[test]
    fn a_policy_file_is_written_and_passed_after_the_users_broker_arguments() {
        let cli = Cli::parse_from(["gpushare-bench", "--broker-arg=--no-telemetry"]);
        let dir = tempfile::tempdir().expect("a temporary folder");
        let args = broker_args_with_policy(&cli, dir.path(), "srtf", "scheduler = \"srtf\"\n")
            .expect("the policy file is written");
        let file = dir.path().join("srtf.toml");
        assert_eq!(
            args,
            ["--no-telemetry", "--config", &file.display().to_string()]
        );
        let written = std::fs::read_to_string(&file).expect("the policy file exists");
        assert_eq!(written, "scheduler = \"srtf\"\n");
    }
}

//! Where `gpushare run` puts a consolidated program on a machine of two GPUs, and that CUDA
//! and NVML then agree on it: the program's device 0 (`cuDeviceGetUuid`) is the one GPU that
//! NVML (gpushare's `libnvidia-ml.so.1`, in front of a stand-in for the machine's NVML that
//! knows the sim GPUs) shows, at index 0, and `CUDA_VISIBLE_DEVICES` names it by UUID — for
//! `--gpu`, `CUDA_VISIBLE_DEVICES` by index or UUID, and the default placement.
//!
//! Needs `cc` and the workspace built (`gpushare`, `libcuda.so`, `libgpushare_nvml.so`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use gpushare_tests::{Broker, BrokerOptions, binary, cc, wait_until};

struct Programs {
    _dir: tempfile::TempDir,
    app: PathBuf,
    real_nvml: PathBuf,
}

fn programs() -> Programs {
    let dir = tempfile::tempdir().expect("temp dir");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("c");
    let app = dir.path().join("consolidated_app");
    cc::compile(&src.join("consolidated_app.c"), &["-ldl"], &app);
    std::fs::create_dir(dir.path().join("real")).expect("mkdir");
    let real_nvml = dir.path().join("real/libnvidia-ml.so.1");
    cc::nvml_standin(&real_nvml);
    Programs {
        _dir: dir,
        app,
        real_nvml,
    }
}

fn two_gpus() -> Broker {
    let broker = Broker::start_with(BrokerOptions {
        extra_args: vec!["--sim-gpus".into(), "2".into()],
        ..BrokerOptions::default()
    });
    broker.dump_log_if_stuck(Duration::from_secs(120));
    broker
}

/// The sim GPUs' UUIDs, by gpushared's index.
fn uuids(broker: &Broker) -> Vec<String> {
    broker
        .status()
        .devices
        .iter()
        .map(|d| d.uuid_text())
        .collect()
}

/// `gpushare run [run_args] -- consolidated_app MODE…`, NVML being the stand-in that knows
/// `machine_uuids`, with `env` added.
fn run(
    broker: &Broker,
    p: &Programs,
    run_args: &[&str],
    app_args: &[&str],
    env: &[(&str, &str)],
) -> Command {
    run_via(broker, p, run_args, &[], app_args, env)
}

/// As [`run`], the program started by `via` (`env NAME=VALUE`, say).
fn run_via(
    broker: &Broker,
    p: &Programs,
    run_args: &[&str],
    via: &[&str],
    app_args: &[&str],
    env: &[(&str, &str)],
) -> Command {
    let mut cmd = Command::new(binary("gpushare"));
    cmd.arg("--socket")
        .arg(&broker.socket)
        .arg("run")
        .args(run_args)
        .arg("--")
        .args(via)
        .arg(&p.app)
        .args(app_args)
        .env("GPUSHARE_TEST_NVML_UUIDS", uuids(broker).join(","))
        .env("GPUSHARE_REAL_NVML", &p.real_nvml);
    for var in [
        "LD_PRELOAD",
        "LD_AUDIT",
        "LD_LIBRARY_PATH",
        "GPUSHARE_CUDA_DRIVER",
        "GPUSHARE_GPU",
        "GPUSHARE_GPU_UUIDS",
        "CUDA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
    ] {
        cmd.env_remove(var);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

fn output(mut cmd: Command) -> (Output, String, String) {
    let out = cmd.output().expect("run gpushare");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out, stdout, stderr)
}

/// Runs the program in `where` mode and checks that CUDA, NVML and `CUDA_VISIBLE_DEVICES` all
/// name the one GPU of UUID `want`; returns what gpushare said on stderr.
fn runs_on(
    broker: &Broker,
    p: &Programs,
    run_args: &[&str],
    env: &[(&str, &str)],
    want: &str,
) -> String {
    let (out, stdout, stderr) = output(run(broker, p, run_args, &["where", "libcuda.so.1"], env));
    let what = format!("{run_args:?} {env:?}:\n{stdout}{stderr}");
    assert!(out.status.success(), "{what}");
    let lines: Vec<&str> = stdout.lines().collect();
    let cuda = format!("cuda {want}");
    let nvml0 = format!("nvml 0 {want}");
    let visible = format!("env CUDA_VISIBLE_DEVICES {want}");
    for line in [cuda.as_str(), "nvml 1", nvml0.as_str(), visible.as_str()] {
        assert!(lines.contains(&line), "no `{line}` in {what}");
    }
    stderr
}

#[test]
fn cuda_and_nvml_agree_on_the_gpu_asked_for_by_index_or_uuid() {
    let broker = two_gpus();
    let p = programs();
    let gpus = uuids(&broker);
    assert_eq!(gpus.len(), 2);
    assert_ne!(gpus[0], gpus[1]);
    runs_on(&broker, &p, &["--gpu", "1"], &[], &gpus[1]);
    runs_on(&broker, &p, &[], &[("CUDA_VISIBLE_DEVICES", "1")], &gpus[1]);
    runs_on(&broker, &p, &[], &[("GPUSHARE_GPU", "1")], &gpus[1]);
    runs_on(
        &broker,
        &p,
        &[],
        &[("CUDA_VISIBLE_DEVICES", &gpus[1])],
        &gpus[1],
    );
    // A unique start of a UUID, as CUDA takes it.
    let start = &gpus[0][..gpus[0].len() - 4];
    runs_on(
        &broker,
        &p,
        &[],
        &[("CUDA_VISIBLE_DEVICES", start)],
        &gpus[0],
    );
    // The sim's GPUs lie on the PCI bus in their order.
    runs_on(
        &broker,
        &p,
        &[],
        &[
            ("CUDA_VISIBLE_DEVICES", "1"),
            ("CUDA_DEVICE_ORDER", "PCI_BUS_ID"),
        ],
        &gpus[1],
    );
}

#[test]
fn a_name_that_fits_no_gpu_stops_gpushare_run_with_a_sentence() {
    let broker = two_gpus();
    let p = programs();
    for (env, said) in [
        (
            ("CUDA_VISIBLE_DEVICES", "5"),
            "gpushare: cannot place the program: CUDA_VISIBLE_DEVICES=5: no GPU 5 in CUDA's order (it serves GPUs 0..=1)",
        ),
        (
            ("CUDA_VISIBLE_DEVICES", "GPU-ffff"),
            "gpushare: cannot place the program: CUDA_VISIBLE_DEVICES=GPU-ffff: no GPU has the UUID GPU-ffff (it serves GPUs 0..=1)",
        ),
        (
            ("GPUSHARE_GPU", "2"),
            "gpushare: cannot place the program: GPUSHARE_GPU=2: gpushared has no such GPU (it serves GPUs 0..=1)",
        ),
    ] {
        let (out, stdout, stderr) =
            output(run(&broker, &p, &[], &["where", "libcuda.so.1"], &[env]));
        assert!(!out.status.success(), "{env:?}: {stdout}");
        assert!(stdout.is_empty(), "the program must not start: {stdout}");
        assert!(stderr.contains(said), "{env:?}: {stderr}");
    }
}

#[test]
fn unasked_a_program_goes_to_the_less_loaded_gpu() {
    let broker = two_gpus();
    let p = programs();
    let gpus = uuids(&broker);
    // A program holding 64 MiB on GPU 0: the next one that names no GPU goes to GPU 1.
    let mut holder = run(
        &broker,
        &p,
        &["--gpu", "0"],
        &["hold", "libcuda.so.1", "67108864"],
        &[],
    );
    let mut holder = holder
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the holder");
    let held = wait_until(Duration::from_secs(20), || {
        broker
            .status()
            .clients
            .iter()
            .any(|c| c.gpu == 0 && c.memory_used >= 64 << 20)
    });
    assert!(
        held,
        "the holder never held its memory: {:?}",
        broker.status().clients
    );
    let status = broker.status();
    assert_eq!(status.next_gpu, 1, "{:?}", status.gpu_loads);
    let said = runs_on(&broker, &p, &["--verbose"], &[], &gpus[1]);
    assert!(
        said.contains("the least loaded") && said.contains("GPU 1 chosen"),
        "{said}"
    );
    drop(holder.stdin.take());
    assert!(holder.wait().expect("wait").success());
}

/// A program that names its own GPU in `CUDA_VISIBLE_DEVICES` once started (as scripts that
/// pick their GPU do) runs there: gpushare's driver follows the entry, by index or UUID, and
/// NVML shows every GPU, as NVIDIA's does, for the program to map its entry through.
#[test]
fn a_program_that_names_its_own_gpu_runs_there_and_nvml_shows_every_gpu() {
    let broker = two_gpus();
    let p = programs();
    let gpus = uuids(&broker);
    for named in ["0", gpus[0].as_str()] {
        // gpushare run places it on GPU 1; the program then says GPU 0.
        let visible = format!("CUDA_VISIBLE_DEVICES={named}");
        let cmd = run_via(
            &broker,
            &p,
            &["--gpu", "1"],
            &["env", &visible],
            &["where", "libcuda.so.1"],
            &[],
        );
        let (out, stdout, stderr) = output(cmd);
        let what = format!("CUDA_VISIBLE_DEVICES={named}:\n{stdout}{stderr}");
        assert!(out.status.success(), "{what}");
        let lines: Vec<&str> = stdout.lines().collect();
        let want = [
            format!("cuda {}", gpus[0]),
            "nvml 2".to_string(),
            format!("nvml 0 {}", gpus[0]),
            format!("nvml 1 {}", gpus[1]),
        ];
        for line in &want {
            assert!(lines.contains(&line.as_str()), "no `{line}` in {what}");
        }
    }
}

/// A `CUDA_VISIBLE_DEVICES` that hides every GPU (empty, `-1`), as programs set to run on the
/// CPU, leaves the program no device, as CUDA does: no placement, and `cuInit` says
/// `CUDA_ERROR_NO_DEVICE` without a word.
#[test]
fn a_program_that_hides_every_gpu_gets_none() {
    let broker = two_gpus();
    let p = programs();
    for hidden in ["", "-1"] {
        let (out, stdout, stderr) = output(run(
            &broker,
            &p,
            &["-v"],
            &["init", "libcuda.so.1"],
            &[("CUDA_VISIBLE_DEVICES", hidden)],
        ));
        let what = format!("CUDA_VISIBLE_DEVICES={hidden:?}:\n{stdout}{stderr}");
        assert!(out.status.success(), "{what}");
        assert!(stdout.lines().any(|l| l == "cuInit 100 100"), "{what}");
        assert!(
            stderr.contains("hides every GPU") && !stderr.contains("running on GPU"),
            "{what}"
        );
    }
    assert!(broker.status().clients.is_empty());
}

/// Runs `cmd` (the program in `rank` mode) until it is ready, checks that gpushared serves it
/// on GPU `gpu`, lets it finish; its output, which must say every one of `lines`.
fn rank_on(broker: &Broker, mut cmd: Command, gpu: u32, lines: &[&str]) {
    use gpushare_tests::cuda_program::Running;
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut running = Running::spawn(cmd);
    let ready = running.wait_for_line("ready", Duration::from_secs(60));
    let pid: i32 = ready
        .trim_start_matches("ready ")
        .parse()
        .expect("ready PID");
    assert!(
        wait_until(Duration::from_secs(10), || broker
            .status()
            .clients
            .iter()
            .any(|c| c.pid == pid && c.gpu == gpu)),
        "served on GPU {gpu}: {:?}",
        broker.status().clients
    );
    running.send_line("done");
    let out = running.finish(Duration::from_secs(60));
    let what = format!("{}{}", out.stdout, out.stderr);
    assert!(out.status.success(), "{what}");
    for line in lines {
        assert!(
            out.stdout.lines().any(|l| l == *line),
            "no `{line}` in {what}"
        );
    }
}

#[test]
fn gpushare_run_gpus_gives_each_process_of_a_job_every_gpu_and_runs_it_on_its_local_ranks() {
    let broker = two_gpus();
    let p = programs();
    let gpus = uuids(&broker);
    let first = format!("cuda 0 {}", gpus[0]);
    let second = format!("cuda 1 {}", gpus[1]);
    for rank in [0u32, 1] {
        let cmd = run(
            &broker,
            &p,
            &["--gpus", "2"],
            &["rank", "libcuda.so.1"],
            &[("LOCAL_RANK", &rank.to_string())],
        );
        let current = format!("current {rank}");
        // The other GPU's primary context is handed out and answers for its device (CUDA's
        // runtime asks every device's at start); peer access to it is enabled; work with it
        // current runs there (a session of the process's own on that GPU, opened then).
        let other = format!("other device 0 {} peer 0 alloc 0 sync 0", 1 - rank);
        rank_on(
            &broker,
            cmd,
            rank,
            &[
                "cuda count 2",
                &first,
                &second,
                "peer 0 1 1",
                "p2p access 0 1 1",
                &current,
                &other,
                "nvml 2",
            ],
        );
    }

    // A process that names its own GPU in CUDA_VISIBLE_DEVICES before CUDA starts (as scripts
    // that pick their rank's GPU do) sees that one alone, and runs there.
    let cmd = run_via(
        &broker,
        &p,
        &["--gpus", "2"],
        &["env", &format!("CUDA_VISIBLE_DEVICES={}", gpus[1])],
        &["rank", "libcuda.so.1"],
        &[],
    );
    let own = format!("cuda 0 {}", gpus[1]);
    rank_on(&broker, cmd, 1, &["cuda count 1", &own, "current 0"]);

    // CUDA_VISIBLE_DEVICES naming several GPUs makes the same job of them, in the order named
    // (by index or by a unique start of a UUID): device 0 is the first named.
    let start = &gpus[0][..gpus[0].len() - 4];
    for (rank, runs_on) in [(0u32, 1u32), (1, 0)] {
        let visible = format!("1,{start}");
        let cmd = run(
            &broker,
            &p,
            &["-v"],
            &["rank", "libcuda.so.1"],
            &[
                ("CUDA_VISIBLE_DEVICES", &visible),
                ("LOCAL_RANK", &rank.to_string()),
            ],
        );
        let reversed_first = format!("cuda 0 {}", gpus[1]);
        let reversed_second = format!("cuda 1 {}", gpus[0]);
        let current = format!("current {rank}");
        rank_on(
            &broker,
            cmd,
            runs_on,
            &[
                "cuda count 2",
                &reversed_first,
                &reversed_second,
                &current,
                "nvml 2",
            ],
        );
    }
    let (out, _, stderr) = output(run(
        &broker,
        &p,
        &[],
        &["rank", "libcuda.so.1"],
        &[("CUDA_VISIBLE_DEVICES", "0,0")],
    ));
    assert!(
        !out.status.success() && stderr.contains("CUDA_VISIBLE_DEVICES=0,0 names GPU 0 twice"),
        "{stderr}"
    );

    // More GPUs than gpushared serves: a sentence, and the program never starts.
    let (out, stdout, stderr) = output(run(
        &broker,
        &p,
        &["--gpus", "3"],
        &["rank", "libcuda.so.1"],
        &[],
    ));
    assert!(!out.status.success() && stdout.is_empty(), "{stdout}");
    assert!(
        stderr.contains("cannot place the job: 3 GPUs asked for, gpushared serves 2"),
        "{stderr}"
    );
}

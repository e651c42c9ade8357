//! The consolidated driver's surface, fuzzed: a stand-in CUDA program (`c/driver_fuzz.c`)
//! calls gpushare's `libcuda.so.1` in the order, and with the arguments, an input's bytes
//! choose (hostile ones among them), against a real gpushared on the sim device, while
//! another user's program (the stand-in's `bystander` mode) works beside it and checks every
//! result. Every input of the checked-in corpus (`fuzz-corpus/driver/`) runs, then random
//! inputs for the rest of a bounded time. A run fails on a finding the fuzzer reports (a
//! `FAIL` line: a call that should have failed succeeded, data that came back wrong, a
//! result no CUresult, a panic in the driver), on a crash, or on a hang; gpushared must
//! stay up and serving, and reclaim everything the fuzzer's processes held.
//!
//! - `GPUSHARE_DRIVER_FUZZ_SECS`: time for the corpus and the random inputs together
//!   (default 30; the random inputs get what the corpus leaves, at least one).
//! - `GPUSHARE_DRIVER_FUZZ_SEED`: the random inputs' seed, printed by every run, to replay it.
//! - `GPUSHARE_DRIVER_FUZZ_INPUT`: run only this input file (a failed one is saved under
//!   `target/tmp/driver-fuzz/`) and print what the fuzzer said; `DRIVER_FUZZ_TRACE=1` makes
//!   it print each call.
//!
//! Needs `cc` and the workspace built (`cargo build --workspace`). As root, the bystander
//! runs as `daemon`; otherwise as the same user, in a process of its own.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use gpushare_tests::cuda_program::{CudaProgram, FUZZER_SOURCES, Finished, Running};
use gpushare_tests::{Broker, BrokerOptions, SystemUser, wait_until};

/// A fuzzer run past this has hung (the longest inputs take a few seconds).
const PER_INPUT_TIMEOUT: Duration = Duration::from_secs(20);
const DEFAULT_SECS: u64 = 30;

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz-corpus/driver")
}

fn env_u64(name: &str) -> Option<u64> {
    let text = std::env::var(name).ok()?;
    Some(
        text.parse()
            .unwrap_or_else(|e| panic!("{name}={text}: not a number ({e})")),
    )
}

/// SplitMix64: the random inputs' generator, the same on every machine and crate version,
/// so that a seed replays the same inputs for good.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// A random input: mostly a few hundred operations, sometimes thousands.
fn random_input(rng: &mut SplitMix) -> Vec<u8> {
    let len = match rng.next() % 8 {
        0 => 1 + rng.next() % 64,
        7 => 4096 + rng.next() % (12 << 10),
        _ => 64 + rng.next() % 4032,
    };
    rng.bytes(len as usize)
}

/// The fuzzer, built in a directory of its own (its working directory, where it writes a
/// module file), with gpushare's driver beside it.
struct Fuzzer {
    program: CudaProgram,
    dir: tempfile::TempDir,
}

impl Fuzzer {
    fn build() -> Fuzzer {
        let dir = tempfile::tempdir().expect("temp dir");
        let program = CudaProgram::build_from(dir.path(), "driver_fuzz", &FUZZER_SOURCES, false);
        Fuzzer { program, dir }
    }

    /// The names of the operations, in the order input bytes number them.
    fn ops(&self) -> Vec<String> {
        let out = std::process::Command::new(&self.program.exe)
            .arg("--ops")
            .output()
            .expect("run driver_fuzz --ops");
        assert!(out.status.success(), "driver_fuzz --ops: {}", out.status);
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// Runs one input to its end, or kills it at the timeout.
    fn run(&self, broker: &Broker, input: &[u8]) -> Outcome {
        let path = self.dir.path().join("input.bin");
        std::fs::write(&path, input).expect("write the input");
        let out_path = self.dir.path().join("output.txt");
        let err_path = self.dir.path().join("stderr.txt");
        let mut cmd = self
            .program
            .command(&broker.socket, &[path.to_str().expect("a UTF-8 temp path")]);
        cmd.current_dir(self.dir.path())
            .stdout(File::create(&out_path).expect("output file"))
            .stderr(File::create(&err_path).expect("stderr file"));
        let started = Instant::now();
        let mut child = cmd.spawn().expect("spawn driver_fuzz");
        let status = wait_or_kill(&mut child, PER_INPUT_TIMEOUT);
        Outcome {
            status,
            took: started.elapsed(),
            stdout: std::fs::read_to_string(&out_path).unwrap_or_default(),
            stderr: std::fs::read_to_string(&err_path).unwrap_or_default(),
        }
    }
}

/// The exit status, or `None` after killing a process that ran past `timeout`.
fn wait_or_kill(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait().expect("wait for driver_fuzz") {
            Some(status) => return Some(status),
            None if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(2)),
            None => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
}

struct Outcome {
    status: Option<ExitStatus>,
    took: Duration,
    stdout: String,
    stderr: String,
}

impl Outcome {
    /// Why this run is a failure, if it is one.
    fn problem(&self) -> Option<String> {
        use std::os::unix::process::ExitStatusExt;
        let Some(status) = self.status else {
            return Some(format!("hung: killed after {PER_INPUT_TIMEOUT:?}"));
        };
        if let Some(signal) = status.signal() {
            return Some(format!("killed by signal {signal}"));
        }
        if !status.success() {
            return Some(format!("findings ({status})"));
        }
        // The driver turns its own panics into CUDA_ERROR_UNKNOWN; the hook still says so.
        if self.stderr.contains("panicked") {
            return Some("the driver panicked".into());
        }
        if self.stderr.contains("internal error") {
            return Some("gpushared ended the session for an internal error".into());
        }
        None
    }
}

/// How many panics gpushared has logged.
fn panics(broker: &Broker) -> usize {
    broker.log_text().matches("panicked at").count()
}

/// The last `n` lines of `text`.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The fuzzer's `FAIL` lines, each with the op it came from (a long trace pushes them out of
/// its last lines).
fn findings(stdout: &str) -> String {
    let mut op = "";
    let mut found = Vec::new();
    for line in stdout.lines() {
        if line.starts_with("op ") {
            op = line;
        } else if line.contains("FAIL") {
            found.push(format!("{op}\n{line}"));
        }
    }
    if found.is_empty() {
        "(none)".into()
    } else {
        found.join("\n")
    }
}

/// Saves a failed input where it outlives the test, and fails the test with all there is to
/// know.
fn report(label: &str, input: &[u8], outcome: &Outcome, problem: &str, broker: &Broker) -> ! {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("driver-fuzz");
    std::fs::create_dir_all(&dir).expect("the failures' directory");
    let stem = label.trim_end_matches(".bin").replace([' ', '/'], "-");
    let saved = dir.join(format!("failed-{stem}.bin"));
    std::fs::write(&saved, input).expect("save the failed input");
    let said = dir.join(format!("failed-{stem}.out"));
    std::fs::write(&said, &outcome.stdout).expect("save what the fuzzer said");
    panic!(
        "driver fuzz: {label}: {problem}\n\
         the input is saved at {}: replay it with GPUSHARE_DRIVER_FUZZ_INPUT={} (and \
         DRIVER_FUZZ_TRACE=1 for every call); all the fuzzer printed is in {}\n\
         --- the fuzzer's findings\n{}\n\
         --- fuzzer stdout (last lines)\n{}\n--- fuzzer stderr (last lines)\n{}\n\
         --- broker log (last lines)\n{}",
        saved.display(),
        saved.display(),
        said.display(),
        findings(&outcome.stdout),
        tail(&outcome.stdout, 60),
        tail(&outcome.stderr, 20),
        tail(&broker.log_text(), 40),
    )
}

/// The inputs of the checked-in corpus, by name.
fn corpus() -> Vec<(String, Vec<u8>)> {
    let mut inputs: Vec<(String, Vec<u8>)> = std::fs::read_dir(corpus_dir())
        .expect("the corpus directory")
        .map(|e| {
            let path = e.expect("a corpus entry").path();
            let name = path
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into();
            (name, std::fs::read(&path).expect("read a corpus input"))
        })
        .collect();
    inputs.sort();
    inputs
}

/// Another user's program (`daemon` where this runs as root), working and checking each
/// result until told to stop.
fn start_bystander(broker: &Broker) -> Running {
    let user = nix::unistd::geteuid()
        .is_root()
        .then(|| SystemUser::lookup("daemon").expect("a `daemon` account"));
    broker.open_to_other_users();
    let dir = broker.dir.path().join("bystander");
    std::fs::create_dir(&dir).expect("the bystander's directory");
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let program = CudaProgram::build(&dir, true);
    let mut cmd = program.command(&broker.socket, &["bystander", "17"]);
    cmd.stdin(Stdio::piped()).current_dir("/");
    if let Some(user) = &user {
        user.apply(&mut cmd);
    }
    let mut running = Running::spawn(cmd);
    running.wait_for_line("ready", Duration::from_secs(60));
    running
}

/// Stops the bystander and checks that it saw every result right.
fn finish_bystander(mut bystander: Running, broker: &Broker) -> u64 {
    bystander.send_line("stop");
    let out: Finished = bystander.finish(Duration::from_secs(60));
    gpushare_tests::cuda_program::assert_passed(
        &out,
        &["loading", "init", "bystander", "finish"],
        &tail(&broker.log_text(), 40),
    );
    out.stdout
        .lines()
        .find_map(|l| l.strip_prefix("rounds "))
        .and_then(|n| n.parse().ok())
        .expect("a `rounds N` line")
}

/// gpushared is up, answers, and holds nothing for the fuzzer's processes any more: only the
/// bystander is a client, and its memory is all the memory held.
fn assert_reclaimed(broker: &mut Broker, bystander_pid: u32) {
    assert!(
        broker.child.try_wait().expect("poll gpushared").is_none(),
        "gpushared exited; log:\n{}",
        tail(&broker.log_text(), 60)
    );
    let reclaimed = || {
        let status = broker.status();
        status.clients.len() == 1
            && status.clients[0].pid as u32 == bystander_pid
            && status.memory_used == status.clients[0].memory_used
            && broker.mapped_client_regions() == 1
    };
    assert!(
        wait_until(Duration::from_secs(20), reclaimed),
        "gpushared still holds the fuzzer's sessions or memory: {:#?}\nregions mapped: {}",
        broker.status().clients,
        broker.mapped_client_regions()
    );
    let out = broker
        .command("gpushare")
        .arg("status")
        .output()
        .expect("run gpushare status");
    assert!(
        out.status.success(),
        "gpushare status after the fuzzing: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn hostile_programs_never_break_the_driver_gpushared_or_a_bystander() {
    let budget = Duration::from_secs(env_u64("GPUSHARE_DRIVER_FUZZ_SECS").unwrap_or(DEFAULT_SECS));
    let seed = env_u64("GPUSHARE_DRIVER_FUZZ_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
    });
    let only = std::env::var_os("GPUSHARE_DRIVER_FUZZ_INPUT").map(PathBuf::from);
    // Straight to stderr: the harness captures prints, and the seed must show in CI logs.
    let _ = std::io::Write::write_all(
        &mut std::io::stderr(),
        format!(
            "driver fuzz: seed {seed} (replay: GPUSHARE_DRIVER_FUZZ_SEED={seed}), {budget:?}\n"
        )
        .as_bytes(),
    );
    let mut broker = Broker::start_with(BrokerOptions {
        backend: Some("sim".into()),
        ..Default::default()
    });
    broker.dump_log_if_stuck(budget + Duration::from_secs(300));
    let fuzzer = Fuzzer::build();
    let bystander = start_bystander(&broker);
    let bystander_pid = broker
        .status()
        .clients
        .first()
        .map(|c| c.pid as u32)
        .expect("the bystander is a client");

    let started = Instant::now();
    let run = |label: &str, input: &[u8], broker: &mut Broker| {
        let panics_before = panics(broker);
        let outcome = fuzzer.run(broker, input);
        let problem = outcome.problem().or_else(|| {
            if let Some(s) = broker.child.try_wait().expect("poll gpushared") {
                return Some(format!("gpushared exited ({s})"));
            }
            // A panic serving the fuzzer costs it only its session, yet is a bug.
            (panics(broker) > panics_before).then(|| "gpushared panicked".to_string())
        });
        if let Some(problem) = problem {
            report(label, input, &outcome, &problem, broker);
        }
        outcome
    };
    let mut slowest = (Duration::ZERO, String::new());
    let mut count = 0;
    if let Some(path) = &only {
        let input = std::fs::read(path).expect("read GPUSHARE_DRIVER_FUZZ_INPUT");
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        let outcome = run(&format!("replay-{name}"), &input, &mut broker);
        let _ = std::io::Write::write_all(
            &mut std::io::stderr(),
            format!("{}{}", outcome.stdout, outcome.stderr).as_bytes(),
        );
        count += 1;
    } else {
        for (name, input) in corpus() {
            let took = run(&name, &input, &mut broker).took;
            slowest = slowest.max((took, name));
            count += 1;
        }
        let mut rng = SplitMix(seed);
        for i in 0.. {
            if i > 0 && started.elapsed() >= budget {
                break;
            }
            let input = random_input(&mut rng);
            let label = format!("seed {seed} input {i}");
            let took = run(&label, &input, &mut broker).took;
            slowest = slowest.max((took, label));
            count += 1;
        }
    }
    assert_reclaimed(&mut broker, bystander_pid);
    let rounds = finish_bystander(bystander, &broker);
    let _ = std::io::Write::write_all(
        &mut std::io::stderr(),
        format!(
            "driver fuzz: {count} inputs in {:.1?} (slowest {:.1?}: {}); the bystander checked {rounds} rounds\n",
            started.elapsed(),
            slowest.0,
            slowest.1
        )
        .as_bytes(),
    );
}

/// Every operation is the first of some corpus input, so the corpus reaches each of them
/// whatever the random inputs do; a new operation needs `write_the_seed_corpus` run again.
#[test]
fn the_corpus_starts_with_every_operation() {
    let ops = Fuzzer::build().ops();
    let firsts: Vec<&str> = corpus()
        .iter()
        .filter(|(_, input)| input.len() >= 2)
        .map(|(_, input)| ops[usize::from(input[1]) % ops.len()].as_str())
        .collect();
    let missing: Vec<&String> = ops
        .iter()
        .filter(|op| !firsts.contains(&op.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "no corpus input starts with {missing:?}: run `cargo test -p gpushare-tests --test driver_fuzz -- --ignored write_the_seed_corpus`"
    );
}

/// Writes the corpus's seed inputs (`seed-*.bin`): for each operation, cuInit, that
/// operation, then bytes from a fixed generator. Inputs that reproduced bugs (`bug-*.bin`)
/// are kept as they are.
#[test]
#[ignore = "writes the checked-in corpus"]
fn write_the_seed_corpus() {
    let ops = Fuzzer::build().ops();
    let dir = corpus_dir();
    std::fs::create_dir_all(&dir).expect("the corpus directory");
    for (name, _) in corpus().iter().filter(|(n, _)| n.starts_with("seed-")) {
        std::fs::remove_file(dir.join(name)).expect("remove an old seed input");
    }
    let mut written: Vec<&str> = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        if written.contains(&op.as_str()) {
            continue;
        }
        written.push(op);
        let mut input = vec![1, i as u8];
        input.extend(SplitMix(i as u64).bytes(256));
        let name = format!("seed-{i:02}-{}.bin", op.replace(' ', "-"));
        std::fs::write(dir.join(name), input).expect("write a seed input");
    }
}

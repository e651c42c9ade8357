//! Consolidated clients: an unmodified CUDA program (the stand-in, `c/cuda_standin.c`)
//! loads gpushare's `libcuda.so.1` as the CUDA runtime does and runs its CUDA work in
//! gpushared's context: memory against its user's quota, copies, memsets, streams, events,
//! the default streams' order, deferred errors, and what is not supported; several users'
//! programs at once, each within its own quota.
//!
//! Needs `cc` and the workspace built (`cargo build --workspace`): `gpushared` and
//! `libcuda.so`. The two-user test needs root (it runs the programs as `daemon` and `nobody`).

use std::process::Stdio;
use std::time::Duration;

use gpushare_protocol::Command;
use gpushare_protocol::control::Role;
use gpushare_tests::cuda_program::{CudaProgram, Running, assert_passed, run};
use gpushare_tests::raw::RawClient;
use gpushare_tests::{Broker, BrokerOptions, SystemUser, other_users, wait_until};

/// Longest a stand-in run may take: far more than it needs, short of a hung test.
const RUN_TIMEOUT: Duration = Duration::from_secs(120);

/// What the driver says on stderr for each unsupported call, once per process.
const UNSUPPORTED: [&str; 3] = [
    "cuMemAllocManaged",
    "cuCtxEnablePeerAccess",
    "serves pinned device memory only",
];

/// The sections of the stand-in's `all` mode, in order.
const ALL_SECTIONS: [&str; 18] = [
    "loading",
    "init",
    "export tables",
    "library slots",
    "allocation",
    "copies",
    "memsets",
    "streams",
    "events",
    "default streams",
    "deferred errors",
    "unsupported",
    "host functions",
    "tensor maps",
    "memory pools",
    "virtual memory",
    "graphs",
    "finish",
];

fn broker_with_quota(uid: u32, quota: &str) -> Broker {
    Broker::start_with(BrokerOptions {
        policy: Some(format!(
            "[[users]]\nuid = {uid}\nmemory_quota = \"{quota}\"\n"
        )),
        ..Default::default()
    })
}

#[test]
fn an_unmodified_program_runs_its_cuda_work_in_gpushared() {
    let quota: u64 = 256 << 20;
    let broker = broker_with_quota(nix::unistd::getuid().as_raw(), "256 MiB");
    let dir = tempfile::tempdir().expect("temp dir");
    let program = CudaProgram::build(dir.path(), false);
    let out = run(
        program.command(&broker.socket, &["all", &quota.to_string()]),
        RUN_TIMEOUT,
    );
    assert_passed(&out, &ALL_SECTIONS, &broker.log_text());
    // One line per unsupported call, naming it, however often it is made; nothing else.
    let lines: Vec<&str> = out.stderr.lines().collect();
    for name in UNSUPPORTED {
        let naming = lines.iter().filter(|l| l.contains(name)).count();
        assert_eq!(naming, 1, "lines naming {name} in stderr:\n{}", out.stderr);
    }
    assert_eq!(
        lines.len(),
        UNSUPPORTED.len(),
        "stderr holds only the unsupported calls' lines:\n{}",
        out.stderr
    );
    // Its session ended with it.
    sessions_end(&broker, "the program's session ended with it");
}

/// Waits a little for every session of `broker` to end (the program's ended with it).
fn sessions_end(broker: &Broker, what: &str) {
    assert!(
        wait_until(Duration::from_secs(5), || broker
            .status()
            .clients
            .is_empty()),
        "{what}"
    );
}

/// The stand-in with `args` as `gpushare run --gpus 2` starts a program on a broker of two
/// sim GPUs: it sees both.
fn on_two_gpus(broker: &Broker, program: &CudaProgram, args: &[&str]) -> std::process::Command {
    let uuids: Vec<String> = broker
        .status()
        .devices
        .iter()
        .map(|d| d.uuid_text())
        .collect();
    let mut cmd = program.command(&broker.socket, args);
    cmd.env("GPUSHARE_GPUS", "0,1")
        .env("GPUSHARE_GPU_UUIDS", uuids.join(","))
        .env("CUDA_VISIBLE_DEVICES", uuids.join(","))
        .env("STANDIN_DEVICES", "2");
    cmd
}

/// Every section of the stand-in, run by the second process of a job of one process per GPU
/// (`gpushare run --gpus 2`'s environment, `LOCAL_RANK=1`): its device 1 is gpushared's GPU 1,
/// and everything (contexts, memory, the virtual memory API's locations, pools, graphs, the
/// export tables' digest over both devices) works there as on a program's only device.
#[test]
fn the_second_process_of_a_job_on_two_gpus_runs_everything_on_its_own_device() {
    let quota: u64 = 256 << 20;
    let broker = Broker::start_with(BrokerOptions {
        policy: Some(format!(
            "[[users]]\nuid = {}\nmemory_quota = \"256 MiB\"\n",
            nix::unistd::getuid().as_raw()
        )),
        extra_args: vec!["--sim-gpus".into(), "2".into()],
        ..Default::default()
    });
    let dir = tempfile::tempdir().expect("temp dir");
    let program = CudaProgram::build(dir.path(), false);
    let mut cmd = on_two_gpus(&broker, &program, &["all", &quota.to_string()]);
    cmd.env("LOCAL_RANK", "1");
    let out = run(cmd, RUN_TIMEOUT);
    assert_passed(&out, &ALL_SECTIONS, &broker.log_text());
}

/// The stand-in working on both devices of a broker of two sim GPUs with `policy`; its output.
fn work_on_two_gpus(policy: Option<String>) -> gpushare_tests::cuda_program::Finished {
    let broker = Broker::start_with(BrokerOptions {
        extra_args: vec!["--sim-gpus".into(), "2".into()],
        policy,
        ..Default::default()
    });
    let dir = tempfile::tempdir().expect("temp dir");
    let program = CudaProgram::build(dir.path(), false);
    let mut cmd = on_two_gpus(&broker, &program, &["gpus", "7"]);
    cmd.env("GPUSHARE_CUDA_TRACE", "1");
    let out = run(cmd, RUN_TIMEOUT);
    assert_passed(&out, &["several devices"], &broker.log_text());
    assert!(
        out.stderr
            .contains("device 1 (gpushared's GPU 1): its first work; a session of its own"),
        "device 1's session opened at its first work:\n{}",
        out.stderr
    );
    assert!(
        broker.log_text().contains(
            "peer access: GPU 0's memory of trust domain default mapped into GPU 1's context"
        ),
        "peer access enabled through gpushared:\n{}",
        broker.log_text()
    );
    sessions_end(&broker, "both sessions ended with the program");
    assert!(
        wait_until(Duration::from_secs(5), || broker
            .log_text()
            .contains("peer access ended")),
        "the other GPU's memory let go of with the program:\n{}",
        broker.log_text()
    );
    out
}

/// Said where copies between devices cannot go through device memory.
const THROUGH_HOST: &str = "copies between two devices go through host memory";

/// One process of `gpushare run --gpus 2` working on both devices (as a program that moves
/// tensors between `cuda:0` and `cuda:1` does): each device's work runs on its own GPU in a
/// session of its own, opened at the device's first call, and copies between the devices
/// arrive whole, through a window of one device's memory that the other maps.
#[test]
fn one_process_works_on_two_gpus_and_copies_between_them() {
    let out = work_on_two_gpus(None);
    assert!(!out.stderr.contains(THROUGH_HOST), "{}", out.stderr);
}

/// Where no window of device memory fits (here the user's memory on a GPU is too little for
/// its 128 MiB beside the program's 144 MiB), copies between the devices go through host
/// memory, as whole.
#[test]
fn copies_between_two_gpus_go_through_host_memory_where_no_window_fits() {
    let policy = format!(
        "[[users]]\nuid = {}\ngpu_memory_quota = \"200 MiB\"\n",
        nix::unistd::getuid().as_raw()
    );
    let out = work_on_two_gpus(Some(policy));
    assert!(out.stderr.contains(THROUGH_HOST), "{}", out.stderr);
}

/// A fault on one GPU costs a process working on both nothing on the other: a library client
/// of the same user faults GPU 0 (its worker is replaced) while the program holds memory on
/// each; afterwards the program's memory and work on GPU 1 are as before, and on GPU 0 it
/// goes on or is told its work was lost, never given wrong bytes.
#[test]
fn a_fault_on_one_gpu_leaves_a_process_s_work_on_the_other_alone() {
    let broker = Broker::start_with(BrokerOptions {
        extra_args: vec![
            "--sim-gpus".into(),
            "2".into(),
            "--allow-fault-injection".into(),
        ],
        ..Default::default()
    });
    let dir = tempfile::tempdir().expect("temp dir");
    let program = CudaProgram::build(dir.path(), false);
    let mut cmd = on_two_gpus(&broker, &program, &["gpus-hold", "9"]);
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut running = Running::spawn(cmd);
    running.wait_for_line("holding", RUN_TIMEOUT);
    let mut gpus: Vec<u32> = broker.status().clients.iter().map(|c| c.gpu).collect();
    gpus.sort_unstable();
    assert_eq!(gpus, [0, 1], "the program has a session on each GPU");
    let culprit = gpushare::Client::connect_with(gpushare::ConnectOptions {
        gpu: Some(0),
        ..broker.options("culprit")
    })
    .expect("connect the culprit");
    gpushare_tests::faults::fault(&culprit, false);
    assert!(culprit.synchronize().is_err(), "the culprit sees its fault");
    assert!(
        broker.wait_for_log("a new device worker took over", Duration::from_secs(10)),
        "GPU 0's worker replaced"
    );
    running.send_line("go");
    let out = running.finish(RUN_TIMEOUT);
    let said = |d: u32| {
        out.stdout
            .lines()
            .find_map(|l| l.strip_prefix(&format!("device {d}: ")))
            .map(str::to_owned)
    };
    let what = format!("{}{}{}", out.stdout, out.stderr, broker.log_text());
    assert!(out.status.success(), "{what}");
    assert_eq!(said(1).as_deref(), Some("ok"), "GPU 1 untouched: {what}");
    assert!(
        matches!(said(0).as_deref(), Some("ok" | "CUDA_ERROR_LAUNCH_FAILED")),
        "GPU 0 goes on or says its work was lost: {what}"
    );
}

#[test]
fn a_program_that_loads_and_unloads_modules_does_not_grow() {
    let broker = Broker::start();
    let dir = tempfile::tempdir().expect("temp dir");
    let program = CudaProgram::build(dir.path(), false);
    // 150 cycles of a 256 KiB image: kept, they would be 37.5 MiB.
    let out = run(
        program.command(&broker.socket, &["modules", "150", "262144"]),
        RUN_TIMEOUT,
    );
    assert!(out.status.success(), "{}\n{}", out.stdout, out.stderr);
    let rss: Vec<i64> = out
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("rss "))
        .map(|r| {
            r.split_whitespace()
                .filter_map(|w| w.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    let [first, last] = rss[..] else {
        panic!("no `rss FIRST LAST` line:\n{}", out.stdout);
    };
    assert!(
        last - first < 16 << 10,
        "the program grew from {first} kB to {last} kB over 135 load/unload cycles"
    );
    assert!(
        wait_until(Duration::from_secs(5), || broker.status().users.is_empty()),
        "the module images went with the program"
    );
}

#[test]
fn without_gpushared_cuinit_fails_and_says_why_once() {
    let dir = tempfile::tempdir().expect("temp dir");
    let program = CudaProgram::build(dir.path(), false);
    let out = run(
        program.command(&dir.path().join("no-broker.sock"), &["noinit"]),
        RUN_TIMEOUT,
    );
    assert_passed(&out, &["loading", "noinit"], "(no broker)");
    let lines: Vec<&str> = out.stderr.lines().collect();
    assert!(
        lines.len() == 1 && lines[0].contains("gpushared"),
        "one line on stderr that names gpushared:\n{}",
        out.stderr
    );
}

#[test]
fn two_users_programs_run_at_once_each_within_its_own_quota() {
    let test = "two_users_programs_run_at_once_each_within_its_own_quota";
    let Some((a, b)) = other_users(test) else {
        return;
    };
    let quotas: [(&SystemUser, u64, &str); 2] =
        [(&a, 96 << 20, "96 MiB"), (&b, 160 << 20, "160 MiB")];
    let policy = quotas
        .iter()
        .map(|(u, _, q)| format!("[[users]]\nuid = {}\nmemory_quota = \"{q}\"\n", u.uid))
        .collect::<Vec<_>>()
        .join("\n");
    let broker = Broker::start_with(BrokerOptions {
        policy: Some(policy),
        ..Default::default()
    });
    // Where both users reach the program and the driver.
    let program = CudaProgram::build_for_other_users(&broker);

    let mut running: Vec<(Running, &SystemUser, u64)> = quotas
        .iter()
        .enumerate()
        .map(|(i, &(user, quota, _))| {
            let mut cmd = program.command(
                &broker.socket,
                &["user", &quota.to_string(), &(i + 1).to_string()],
            );
            cmd.stdin(Stdio::piped()).current_dir("/");
            user.apply(&mut cmd);
            (Running::spawn(cmd), user, quota)
        })
        .collect();
    // Both hold half their quota at the same time, each seen as its own user.
    for (r, _, _) in &mut running {
        r.wait_for_line("holding", RUN_TIMEOUT);
    }
    let status = broker.status();
    for &(_, user, quota) in &running {
        let mine: Vec<_> = status
            .clients
            .iter()
            .filter(|c| c.uid == user.uid)
            .collect();
        assert!(
            mine.len() == 1
                && mine[0].consolidated
                && mine[0].memory_quota == Some(quota)
                && mine[0].memory_used == quota / 2,
            "{}'s program as the broker sees it: {mine:?}",
            user.name
        );
    }
    for (r, _, _) in &mut running {
        r.send_line("go");
    }
    for (r, user, _) in running {
        let out = r.finish(RUN_TIMEOUT);
        assert!(
            out.stderr.is_empty(),
            "{}'s program said on stderr:\n{}",
            user.name,
            out.stderr
        );
        assert_passed(
            &out,
            &[
                "loading",
                "init",
                "allocation",
                "holding",
                "copies",
                "memsets",
                "finish",
            ],
            &broker.log_text(),
        );
    }
}

/// The legacy order as gpushared keeps it, spoken raw: event records are operations on their
/// stream like any other. Times are the sim device's modelled ones, exact.
#[test]
fn event_records_keep_cuda_legacy_stream_order() {
    let broker = Broker::start_with(BrokerOptions {
        backend: Some("sim".into()),
        ..Default::default()
    });
    let raw = RawClient::connect_as(&broker.socket, Role::Consolidated);
    let ok = |cmd: Command| {
        let c = raw.submit_one(cmd).expect("a completion");
        assert_eq!(c.status, 0, "{cmd:?}");
        c.result
    };
    let len = 32 << 20;
    let dst = ok(Command::Alloc { bytes: len });
    let (blocking, non_blocking, other_blocking) = (1, 2, 3);
    for (stream, flags) in [(blocking, 0), (non_blocking, 1), (other_blocking, 0)] {
        ok(Command::StreamCreateAs {
            stream,
            flags,
            priority: 0,
        });
    }
    for event in [1, 2, 3] {
        ok(Command::EventCreateAs { event, flags: 0 });
    }
    // How far a memset on `work` moves events recorded on `watch` before and after it.
    let moved = |watch, work, between: &dyn Fn()| {
        ok(Command::EventRecord {
            stream: watch,
            event: 1,
        });
        ok(Command::Memset {
            stream: work,
            dst,
            value: 1,
            len,
        });
        between();
        ok(Command::EventRecord {
            stream: watch,
            event: 2,
        });
        ok(Command::EventElapsed { start: 1, end: 2 })
    };
    let nothing = || {};
    assert!(
        moved(0, blocking, &nothing) > 0,
        "stream 0 after a blocking stream"
    );
    assert_eq!(
        moved(0, non_blocking, &nothing),
        0,
        "not after a non-blocking one"
    );
    assert!(
        moved(blocking, 0, &nothing) > 0,
        "a blocking stream after stream 0"
    );
    assert_eq!(
        moved(non_blocking, 0, &nothing),
        0,
        "a non-blocking one is not"
    );
    // Through stream 0: a record there orders it after the blocking stream's work, and the
    // other blocking stream after that record.
    let record_on_0 = || {
        ok(Command::EventRecord {
            stream: 0,
            event: 3,
        });
    };
    assert!(
        moved(other_blocking, blocking, &record_on_0) > 0,
        "one blocking stream after another's work, through a record on stream 0"
    );
}

/// A synchronization with nothing to wait for costs no trip to gpushared: after a copy to
/// pageable memory (which waited for its stream, and which CuPy's `.get()` follows with a
/// stream synchronization), the program's syncs and queries of that stream, and
/// context syncs after one that waited, reach gpushared not at all; work sent after them, or
/// on another stream, is waited for as before (the stand-in's `quiet-syncs` checks that with
/// kernels that run 200 ms in real time).
#[test]
fn synchronizations_with_nothing_to_wait_for_are_answered_in_the_program() {
    let broker = Broker::start_with(BrokerOptions {
        extra_args: vec!["--sim-realtime".into()],
        ..Default::default()
    });
    let dir = tempfile::tempdir().expect("temp dir");
    let program = CudaProgram::build(dir.path(), false);
    let mut cmd = program.command(&broker.socket, &["quiet-syncs", "200000"]);
    cmd.stdin(Stdio::piped());
    let mut running = Running::spawn(cmd);
    let commands = || -> u64 { broker.status().clients.iter().map(|c| c.commands).sum() };
    running.wait_for_line("copied", RUN_TIMEOUT);
    let before = commands();
    running.send_line("go");
    running.wait_for_line("synced", RUN_TIMEOUT);
    let after = commands();
    running.send_line("go");
    // 2,000 stream syncs and queries and 1,000 context syncs: only the first context sync
    // (the copy waited for one stream, not all) has to ask.
    assert!(
        after - before <= 1,
        "{} commands reached gpushared for 3,000 synchronizations with nothing to wait for",
        after - before
    );
    let out = running.finish(RUN_TIMEOUT);
    assert_passed(&out, &["quiet syncs"], &broker.log_text());
}

/// A timing event's record behind work on its way returns once that work has reached the
/// device (as CUDA's record returns with the event queued, so that a GPU timer which holds the
/// stream with a kernel the host lets go times the work alone): it asks gpushared one question,
/// whose answer comes from the device worker behind the work. It does not wait for the work to
/// finish, and a record of an untimed event, or of a timing event with nothing sent since a
/// wait or right after a question the program waited for (a timer's start), asks nothing.
#[test]
fn a_timing_event_recorded_behind_work_returns_once_the_work_reached_the_device() {
    let broker = Broker::start_with(BrokerOptions {
        extra_args: vec!["--sim-realtime".into()],
        ..Default::default()
    });
    let dir = tempfile::tempdir().expect("temp dir");
    let program = CudaProgram::build(dir.path(), false);
    let mut cmd = program.command(&broker.socket, &["timer-records", "200000"]);
    cmd.stdin(Stdio::piped());
    let mut running = Running::spawn(cmd);
    let commands = || -> u64 { broker.status().clients.iter().map(|c| c.commands).sum() };
    running.wait_for_line("ready", RUN_TIMEOUT);
    let ready = commands();
    running.send_line("go");
    running.wait_for_line("untimed", RUN_TIMEOUT);
    let untimed = commands() - ready;
    running.send_line("go");
    running.wait_for_line("timed", RUN_TIMEOUT);
    let timed = commands() - ready - untimed;
    running.send_line("go");
    running.wait_for_line("after a question", RUN_TIMEOUT);
    let after_question = commands() - ready - untimed - timed;
    running.send_line("go");
    // Untimed: the launch, the record, the sync. Timed: the start's record (after a wait:
    // nothing to wait for), the launch, the record and its question, the program's query of
    // the event (the kernel still ran), the sync. After a question: the launch, the query,
    // the record, the sync.
    assert_eq!(
        (untimed, timed, after_question),
        (3, 6, 4),
        "commands that reached gpushared in each phase"
    );
    let out = running.finish(RUN_TIMEOUT);
    assert_passed(&out, &["timer records"], &broker.log_text());
}

/// The wait of a timing event's record is bounded: behind a kernel the scheduler holds (FAIR
/// one kernel at a time, another client connected, the kernel before it running 2 s), the
/// record returns at once, not when the held kernel is granted (the program checks that it
/// waited less than half of that).
#[test]
fn a_timing_event_recorded_behind_held_work_does_not_wait_for_it() {
    let broker = Broker::start_with(BrokerOptions {
        policy: Some("scheduler = \"fair\"\n[fair]\nquantum_us = 0\n".into()),
        extra_args: vec!["--sim-realtime".into()],
        ..Default::default()
    });
    let _other = broker.client_named("other");
    let dir = tempfile::tempdir().expect("temp dir");
    let program = CudaProgram::build(dir.path(), false);
    let out = run(
        program.command(&broker.socket, &["timer-held", "2000000"]),
        RUN_TIMEOUT,
    );
    assert_passed(&out, &["timer held"], &broker.log_text());
}

/// A program that exits while one of its streams waits for a host function that never
/// returns leaves nothing behind: gpushared lets the stream go and the session ends.
#[test]
fn a_stream_waiting_for_a_host_function_does_not_outlive_its_program() {
    let broker = Broker::start();
    let dir = tempfile::tempdir().expect("temp dir");
    let program = CudaProgram::build(dir.path(), false);
    let out = run(program.command(&broker.socket, &["host-hang"]), RUN_TIMEOUT);
    assert!(
        out.stdout.contains("queued"),
        "the program queued its work: {}",
        out.stdout
    );
    assert!(
        gpushare_tests::wait_until(Duration::from_secs(10), || broker
            .status()
            .clients
            .is_empty()),
        "the session ended with the program; broker log:\n{}",
        broker.log_text()
    );
}

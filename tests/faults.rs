//! GPU fault containment: a client whose kernel faults (illegal address) or never ends is
//! evicted; the context is recreated; every other client is told exactly what it lost, with
//! one typed error, and carries on; the broker never goes down.
//!
//! The faults are real on the GPU (`GPUSHARE_TEST_BACKEND=cuda`: an illegal-address store and
//! a kernel that spins forever) and modelled by the sim device in CI (a poisoned device and a
//! stream that never drains). Both need `--allow-fault-injection`.
//!
//! A client that connects with `rebuild` needs no recovery code at all: the library makes its
//! device state again after the fault (same handles, same device addresses) and only the
//! request that met the fault fails.

use std::time::{Duration, Instant};

use gpushare::{
    Client, Command, ConnectOptions, DeviceBuffer, DevicePtr, Error, ErrorCode, Event, Function,
    Kernel, Module, ModuleFormat, RebuildError, Stream,
};
use gpushare_tests::{Broker, BrokerOptions, SCALE_ADD_PTX, host_gemm, pattern, test_backend};

fn broker(extra: &[&str]) -> Broker {
    let mut extra_args = vec!["--allow-fault-injection".to_string()];
    extra_args.extend(extra.iter().map(|s| s.to_string()));
    let broker = Broker::start_with(BrokerOptions {
        backend: Some(test_backend()),
        extra_args,
        ..Default::default()
    });
    broker.dump_log_if_stuck(Duration::from_secs(60));
    broker
}

/// Fills a fresh buffer with `value` and checks it came back: the client works.
fn verified_fill(client: &Client, value: f32) -> gpushare::Result<()> {
    let buf = client.alloc::<f32>(4096)?;
    client.default_stream().launch(Kernel::FillF32 {
        dst: buf.ptr(),
        n: 4096,
        value,
    })?;
    let back = buf.to_vec()?;
    assert!(back.iter().all(|&v| v == value), "fill result wrong");
    Ok(())
}

/// Like [`verified_fill`], for a client that may not have noticed a reset yet: its first
/// attempt may fail with `DeviceReset` (its cached handles were lost), never more.
fn fill_after_reset(client: &Client, value: f32) -> gpushare::Result<()> {
    match verified_fill(client, value) {
        Err(e) if e.code() == Some(ErrorCode::DeviceReset) => verified_fill(client, value),
        other => other,
    }
}

fn fault(client: &Client, hang: bool) {
    client
        .default_stream()
        .launch(Kernel::Fault { hang })
        .expect("fault kernel accepted");
}

/// How the broker got out of a fault.
enum Recovery {
    /// The context was recreated and the sessions went on (when the driver allows it).
    InPlace(Instant),
    /// The driver keeps the error for the process: gpushared restarted itself; the victim
    /// reconnected, and this is its new session.
    Restarted(Instant, Client),
}

/// Waits until the victim's lost buffer fails with `DeviceReset` (or its session ends because
/// the broker restarts), then until it works again.
fn wait_for_recovery(victim: &Client, old: &gpushare::DeviceBuffer<f32>) -> Recovery {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match old.to_vec() {
            Err(e) if e.code() == Some(ErrorCode::DeviceReset) => break,
            Err(gpushare::Error::BrokerRestarting(_)) => loop {
                if let Ok(back) = victim.reconnect()
                    && verified_fill(&back, 7.0).is_ok()
                {
                    return Recovery::Restarted(Instant::now(), back);
                }
                assert!(Instant::now() < deadline, "broker never came back");
                std::thread::sleep(Duration::from_millis(1));
            },
            Err(e) => panic!("victim got {e} instead of DeviceReset"),
            Ok(_) => assert!(Instant::now() < deadline, "no reset within 30 s"),
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    loop {
        match verified_fill(victim, 7.0) {
            Ok(()) => return Recovery::InPlace(Instant::now()),
            Err(e) => {
                assert!(Instant::now() < deadline, "victim never recovered: {e}");
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
}

#[test]
fn an_illegal_address_evicts_only_the_culprit_and_the_others_learn_what_they_lost() {
    let broker = broker(&[]);
    let victim = broker.client_named("victim");
    let other = broker.client_named("bystander");
    let old = victim.alloc::<f32>(1024).expect("alloc");
    old.copy_from_host(&[1.0; 1024]).expect("upload");
    let kept_stream = victim.create_stream().expect("stream");
    verified_fill(&victim, 1.0).expect("victim works");
    verified_fill(&other, 2.0).expect("bystander works");
    // On a GPU, one helper keeps the driver initialised, and the restarted image keeps it.
    let holders = broker.cuda_holders();
    let holder_off = std::env::var_os("GPUSHARE_NO_CUDA_HOLDER").is_some_and(|v| v != "0");
    if test_backend() == "cuda" && !holder_off {
        assert_eq!(holders.len(), 1, "one CUDA driver holder: {holders:?}");
    }

    // The culprit is another process (after a restart, gpushared refuses the culprit's
    // process, and the victims here live in this one).
    let mut culprit = Scripted::start(&broker);
    assert!(culprit.run("connect").starts_with("connected"));
    let faulted_at = Instant::now();
    let said = culprit.run("illegal");
    assert!(said.starts_with("error"), "the fault shows: {said}");
    let back_at = match wait_for_recovery(&victim, &old) {
        Recovery::InPlace(at) => at,
        Recovery::Restarted(at, back) => {
            let recovery = at - faulted_at;
            println!(
                "illegal address ({}): the driver cannot recover in place; gpushared restarted, victim reconnected and running again {:.1} ms after the fault",
                test_backend(),
                recovery.as_secs_f64() * 1e3
            );
            assert!(broker.wait_for_log("restarting gpushared", Duration::from_secs(5)));
            assert!(
                broker.wait_for_log("caused by client", Duration::from_secs(5)),
                "culprit named"
            );
            // Where the time went.
            for line in broker.log_text().lines().filter(|l| {
                ["GPU fault", "restarting", "stopped", "device open", "ready"]
                    .iter()
                    .any(|k| l.contains(k))
            }) {
                println!("  {line}");
            }
            verified_fill(&back, 8.0).expect("works after the restart");
            assert_eq!(
                broker.cuda_holders(),
                holders,
                "the restarted image kept the same driver holder"
            );
            let e = other.nop().expect_err("the bystander's session ended too");
            assert!(e.is_fatal(), "{e}");
            verified_fill(&other.reconnect().expect("reconnect"), 9.0).expect("bystander back");
            let fatal = culprit.run("wait-fatal");
            assert!(fatal.contains("restarts"), "{fatal}");
            let refused = culprit.run("reconnect");
            assert!(
                refused.contains("evicted"),
                "the culprit stays out: {refused}"
            );
            return;
        }
    };
    let recovery = back_at - faulted_at;
    println!(
        "illegal address ({}): fault -> victim running again in {:.1} ms (context recreated in place)",
        test_backend(),
        recovery.as_secs_f64() * 1e3
    );

    // The culprit is evicted, with the reason.
    let fatal = culprit.run("wait-fatal");
    assert!(
        fatal.contains("evicted") && fatal.contains("faulted the GPU"),
        "{fatal}"
    );

    // The victim was told exactly what it lost.
    let mut reset = None;
    assert!(
        gpushare_tests::wait_until(Duration::from_secs(5), || {
            reset = victim.take_device_reset();
            reset.is_some()
        }),
        "a reset notice"
    );
    let reset = reset.expect("a reset notice");
    assert!(
        reset
            .lost
            .buffers
            .iter()
            .any(|&(p, n)| p == old.ptr() && n == 4096),
        "{reset:?}"
    );
    assert_eq!(reset.lost.streams, vec![kept_stream.id()], "{reset:?}");
    assert!(reset.reason.contains("reset"), "{}", reset.reason);
    // Commands naming lost handles fail with the same typed error; releasing them is fine.
    let e = kept_stream.synchronize().expect_err("lost stream");
    assert_eq!(e.code(), Some(ErrorCode::DeviceReset));
    drop(old);
    drop(kept_stream);
    victim
        .synchronize()
        .expect("freeing lost handles is not an error");

    // Everyone else carries on, and new clients are welcome.
    fill_after_reset(&other, 3.0).expect("bystander works after the reset");
    assert!(
        gpushare_tests::wait_until(Duration::from_secs(5), || other
            .take_device_reset()
            .is_some()),
        "bystander told too"
    );
    verified_fill(&broker.client(), 4.0).expect("a new client works");
    assert!(
        recovery < Duration::from_secs(5),
        "recovery took {recovery:?}"
    );
    assert!(broker.wait_for_log("device context recreated", Duration::from_secs(5)));
}

/// Work a reset took before the client synchronized it never reads as done: the next sync
/// that covers it fails with `DeviceReset`, once. Work the client saw finish (a sync, or an
/// event recorded after it) is not reported again.
#[test]
fn the_first_sync_after_a_reset_that_took_unsynced_work_fails_once() {
    if test_backend() != "sim" {
        let _ = std::io::Write::write_all(
            &mut std::io::stderr(),
            b"SKIPPED: on this device a fault restarts gpushared, ending every session\n",
        );
        return;
    }
    let broker = broker(&[]);
    let unsynced = broker.client_named("unsynced");
    let synced = broker.client_named("synced");
    let evented = broker.client_named("evented");
    let fill = |c: &Client, buf: &gpushare::DeviceBuffer<f32>| {
        c.default_stream()
            .launch(Kernel::FillF32 {
                dst: buf.ptr(),
                n: 1024,
                value: 3.0,
            })
            .expect("launch");
    };
    let a = unsynced.alloc::<f32>(1024).expect("alloc");
    fill(&unsynced, &a);
    let b = synced.alloc::<f32>(1024).expect("alloc");
    fill(&synced, &b);
    synced.synchronize().expect("sync");
    let c = evented.alloc::<f32>(1024).expect("alloc");
    fill(&evented, &c);
    let done = evented.create_event().expect("event");
    done.record(&evented.default_stream()).expect("record");
    done.synchronize().expect("event sync");

    let mut culprit = Scripted::start(&broker);
    assert!(culprit.run("connect").starts_with("connected"));
    assert!(culprit.run("illegal").starts_with("error"));
    for client in [&unsynced, &synced, &evented] {
        assert!(
            gpushare_tests::wait_until(Duration::from_secs(5), || client
                .take_device_reset()
                .is_some()),
            "each is told of the reset"
        );
    }
    let e = unsynced.synchronize().expect_err("the fill the reset took");
    assert_eq!(e.code(), Some(ErrorCode::DeviceReset), "{e}");
    unsynced.synchronize().expect("said once");
    synced.synchronize().expect("its work had finished");
    evented
        .synchronize()
        .expect("its work had finished (an event said so)");
}

#[test]
fn a_kernel_that_never_ends_is_stopped_by_the_watchdog() {
    let broker = broker(&["--kernel-timeout", "1"]);
    let victim = broker.client_named("victim");
    let old = victim.alloc::<f32>(256).expect("alloc");
    let mut culprit = Scripted::start(&broker);
    assert!(culprit.run("connect").starts_with("connected"));
    let started = Instant::now();
    assert_eq!(culprit.run("hang"), "ok");
    // On the sim the others keep working next to the hung kernel. On a GPU they may not:
    // streams share a few hardware queues, so work queued behind the hang can stall too.
    let beside = verified_fill(&victim, 5.0);
    if test_backend() == "sim" {
        beside.expect("victim works next to a hung kernel");
    } else {
        println!("victim next to the hung kernel: {beside:?}");
    }
    let fatal = culprit.run("wait-fatal");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(900),
        "cut off after {waited:?}"
    );
    println!(
        "hang ({}): culprit cut off after {:.2} s (timeout 1 s): {fatal}",
        test_backend(),
        waited.as_secs_f64()
    );
    if fatal.contains("restarts") {
        // The driver would not tear the context down under a running kernel: the broker
        // restarted itself instead. Everyone was told why, and can reconnect.
        let e = victim.nop().expect_err("victim's session ended too");
        assert!(e.is_fatal(), "{e}");
        let mut back = None;
        assert!(
            gpushare_tests::wait_until(Duration::from_secs(30), || {
                back = victim.reconnect().ok();
                back.is_some()
            }),
            "broker back after the restart:\n{}",
            broker.log_text()
        );
        let back = back.expect("reconnected");
        verified_fill(&back, 6.0).expect("works after the restart");
        println!(
            "hang ({}): broker restarted and serving again {:.2} s after the hang began",
            test_backend(),
            started.elapsed().as_secs_f64()
        );
        assert!(broker.wait_for_log("restarting gpushared", Duration::from_secs(5)));
        let refused = culprit.run("reconnect");
        assert!(
            refused.contains("evicted"),
            "the culprit stays out: {refused}"
        );
        return;
    }
    assert!(
        fatal.contains("evicted") && fatal.contains("made no progress"),
        "{fatal}"
    );
    assert!(waited < Duration::from_secs(15), "cut off after {waited:?}");
    let e = old.to_vec().expect_err("victim's buffer lost in the reset");
    assert_eq!(e.code(), Some(ErrorCode::DeviceReset));
    fill_after_reset(&victim, 6.0).expect("victim works after the reset");
    assert!(broker.wait_for_log("made no progress", Duration::from_secs(5)));
}

#[test]
fn unattributable_faults_put_suspects_on_probation_and_a_second_fault_names_the_culprit() {
    // Two clients have work in flight when the fault comes: `slow` has a kernel still running
    // (a hang, with the watchdog set long) and `culprit` faults. Neither can be blamed alone.
    if test_backend() != "sim" {
        // The CUDA driver keeps a sticky error for the rest of the process, so gpushared
        // restarts instead of recovering in place, and there is no probation to test.
        let _ = std::io::Write::write_all(
            &mut std::io::stderr(),
            b"SKIPPED probation test: needs in-place recovery, which this driver does not allow\n",
        );
        return;
    }
    let broker = broker(&["--kernel-timeout", "600", "--fault-probation", "60"]);
    let slow = broker.client_named("slow");
    let culprit = broker.client_named("culprit");
    fault(&slow, true);
    slow.nop().expect("the hang is queued"); // a round trip: the launch was processed
    fault(&culprit, false);
    let _ = culprit.synchronize();
    assert!(
        broker.wait_for_log("suspects run one at a time", Duration::from_secs(10)),
        "probation started:\n{}",
        broker.log_text()
    );
    // Nobody was evicted: both carry on (serialized), having lost their state.
    fill_after_reset(&slow, 1.0).expect("suspect 1 works on probation");
    fill_after_reset(&culprit, 2.0).expect("suspect 2 works on probation");

    // The second fault has one suspect running: it is evicted, the other keeps going.
    fault(&culprit, false);
    let _ = culprit.synchronize();
    assert!(
        gpushare_tests::wait_until(Duration::from_secs(10), || matches!(
            culprit.nop(),
            Err(gpushare::Error::Evicted(_))
        )),
        "second fault names the culprit:\n{}",
        broker.log_text()
    );
    fill_after_reset(&slow, 3.0).expect("the innocent suspect carries on");
    assert!(
        !matches!(slow.nop(), Err(gpushare::Error::Evicted(_))),
        "innocent suspect kept"
    );
}

#[test]
fn fault_injection_is_refused_unless_the_broker_allows_it() {
    let broker = Broker::start_with(BrokerOptions {
        backend: Some(test_backend()),
        ..Default::default()
    });
    let client = broker.client();
    client
        .default_stream()
        .launch(Kernel::Fault { hang: false })
        .expect("submitted");
    let e = client.synchronize().expect_err("refused");
    assert_eq!(e.code(), Some(ErrorCode::NotSupported));
    verified_fill(&client, 1.0).expect("nothing happened");
}

/// A client process driven line by line (`gpushare-testclient script`).
struct Scripted {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    lines: std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
}

impl Scripted {
    fn start(broker: &Broker) -> Scripted {
        use std::io::BufRead;
        use std::process::Stdio;
        let mut child = broker
            .command("gpushare-testclient")
            .arg("script")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn test client");
        let stdin = child.stdin.take().expect("stdin");
        let lines = std::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
        Scripted {
            child,
            stdin,
            lines,
        }
    }

    fn run(&mut self, command: &str) -> String {
        use std::io::Write;
        writeln!(self.stdin, "{command}").expect("write command");
        self.stdin.flush().expect("flush");
        self.lines
            .next()
            .and_then(Result::ok)
            .unwrap_or_else(|| panic!("no answer to {command}"))
    }
}

impl Drop for Scripted {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn restart_broker() -> Broker {
    broker(&["--sim-restart-on-fault", "--fault-probation", "60"])
}

#[test]
fn after_a_restart_the_culprit_process_is_refused_and_the_others_come_back() {
    // The sim device behaves like the CUDA driver here: no recovery in place.
    let broker = restart_broker();
    let mut victim = Scripted::start(&broker);
    let mut culprit = Scripted::start(&broker);
    assert!(victim.run("connect").starts_with("connected"));
    assert!(culprit.run("connect").starts_with("connected"));
    assert_eq!(victim.run("fill"), "ok");

    let said = culprit.run("illegal");
    assert!(said.starts_with("error"), "{said}");
    let fatal = victim.run("wait-fatal");
    assert!(fatal.contains("restarts"), "victim told why: {fatal}");
    assert!(broker.wait_for_log("restarting gpushared", Duration::from_secs(5)));

    // The broker is back (same pid); the victim reconnects and works, the culprit is refused.
    let back = victim.run("reconnect");
    assert!(back.starts_with("connected"), "{back}");
    assert_eq!(victim.run("fill"), "ok");
    let refused = culprit.run("reconnect");
    assert!(
        refused.starts_with("refused PermissionDenied") && refused.contains("evicted"),
        "{refused}"
    );
    assert!(broker.wait_for_log(
        "carried over from before the restart",
        Duration::from_secs(5)
    ));
}

#[test]
fn across_a_restart_suspects_run_on_probation_and_a_second_fault_names_the_culprit() {
    let broker = restart_broker();
    let mut slow = Scripted::start(&broker);
    let mut culprit = Scripted::start(&broker);
    assert!(slow.run("connect").starts_with("connected"));
    assert!(culprit.run("connect").starts_with("connected"));
    // Both have work in flight when the fault comes: nobody can be blamed alone.
    assert_eq!(slow.run("hang"), "ok");
    assert!(culprit.run("illegal").starts_with("error"));
    assert!(slow.run("wait-fatal").starts_with("fatal"));
    assert!(broker.wait_for_log("restarting gpushared", Duration::from_secs(5)));

    // Both come back, on probation.
    assert!(slow.run("reconnect").starts_with("connected"));
    assert!(culprit.run("reconnect").starts_with("connected"));
    assert!(broker.wait_for_log("on probation", Duration::from_secs(5)));
    assert_eq!(slow.run("fill"), "ok");

    // The second fault has one suspect running: after the next restart it is refused and
    // the other carries on.
    assert!(culprit.run("illegal").starts_with("error"));
    assert!(slow.run("wait-fatal").starts_with("fatal"));
    assert!(slow.run("reconnect").starts_with("connected"));
    assert_eq!(slow.run("fill"), "ok");
    let refused = culprit.run("reconnect");
    assert!(
        refused.contains("evicted"),
        "{refused}\n{}",
        broker.log_text()
    );
}

/// An inference server as a user writes it, with no recovery code: weights uploaded once, a
/// stream, an event, and (on a GPU) a module whose launch parameters hold raw device
/// addresses, packed once at start.
struct Server {
    client: Client,
    a: DeviceBuffer<f32>,
    b: DeviceBuffer<f32>,
    c: DeviceBuffer<f32>,
    stream: Stream,
    done: Event,
    module: Option<ModuleWork>,
    /// More weights, `GPUSHARE_TEST_REBUILD_MIB` of them (none unless set): for measuring
    /// how the rebuild time grows with what there is to upload again.
    bulk: Option<(DeviceBuffer<u8>, Vec<u8>)>,
}

/// A module function and what it works on: y = 1.5·x, with y's and x's addresses packed into
/// its parameters once.
struct ModuleWork {
    module: Module,
    function: Function,
    y: DeviceBuffer<f32>,
    x: DeviceBuffer<f32>,
    params: Vec<u8>,
}

/// What one request computes: the GEMM's C, and the module's y (empty without a module).
type Results = (Vec<f32>, Vec<f32>);

const M: u32 = 64;
const K: u32 = 48;
const N: u32 = 40;
const MODULE_N: usize = 10_000;

impl Server {
    fn start(broker: &Broker) -> Server {
        let client = rebuilding_client(broker, "server");
        assert!(client.rebuilds_state());
        let (m, n, k) = (M as usize, N as usize, K as usize);
        let a = client.alloc::<f32>(m * k).expect("alloc");
        let b = client.alloc::<f32>(k * n).expect("alloc");
        let c = client.alloc::<f32>(m * n).expect("alloc");
        a.copy_from_host(&pattern(m * k, 1))
            .expect("upload weights");
        b.copy_from_host(&pattern(k * n, 2))
            .expect("upload weights");
        let stream = client.create_stream().expect("stream");
        let done = client.create_event().expect("event");
        let module = (client.session().backend == "cuda").then(|| {
            let module = client
                .load_module(ModuleFormat::Ptx, SCALE_ADD_PTX.as_bytes())
                .expect("load PTX");
            let f = module.function("scale_add").expect("function");
            let x = client.alloc::<f32>(MODULE_N).expect("alloc");
            let y = client.alloc::<f32>(MODULE_N).expect("alloc");
            x.copy_from_host(&pattern(MODULE_N, 3)).expect("upload");
            let mut params = Vec::new();
            params.extend_from_slice(&y.ptr().to_le_bytes());
            params.extend_from_slice(&x.ptr().to_le_bytes());
            params.extend_from_slice(&1.5f32.to_le_bytes());
            params.extend_from_slice(&(MODULE_N as u32).to_le_bytes());
            ModuleWork {
                module,
                function: f,
                y,
                x,
                params,
            }
        });
        let bulk = std::env::var("GPUSHARE_TEST_REBUILD_MIB")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|&mib| mib > 0)
            .map(|mib| {
                let bytes: Vec<u8> = (0..mib << 20).map(|i| (i % 251) as u8).collect();
                let buf = client.alloc::<u8>(bytes.len()).expect("alloc");
                buf.copy_from_host(&bytes).expect("upload");
                (buf, bytes)
            });
        Server {
            client,
            a,
            b,
            c,
            stream,
            done,
            module,
            bulk,
        }
    }

    /// One request: C = A·B (and y = 1.5·x with the module), read back.
    fn infer(&self) -> gpushare::Result<Results> {
        self.stream.launch(Kernel::GemmF32 {
            a: self.a.ptr(),
            b: self.b.ptr(),
            c: self.c.ptr(),
            m: M,
            n: N,
            k: K,
            alpha: 1.0,
            beta: 0.0,
        })?;
        if let Some(w) = &self.module {
            w.y.memset(&self.stream, 0)?;
            let blocks = (MODULE_N as u32).div_ceil(256);
            self.client.launch_function(
                &self.stream,
                &w.function,
                [blocks, 1, 1],
                [256, 1, 1],
                0,
                &w.params,
            )?;
        }
        self.done.record(&self.stream)?;
        self.done.synchronize()?;
        if let Some((buf, bytes)) = &self.bulk {
            let mut tail = vec![0u8; 4096];
            let at = bytes.len() - tail.len();
            self.client
                .copy_to_host_raw(0, &mut tail, buf.ptr() + at as u64)?;
            assert_eq!(tail, bytes[at..], "the bulk weights' last page");
        }
        let module_out = match &self.module {
            Some(w) => w.y.to_vec()?,
            None => Vec::new(),
        };
        Ok((self.c.to_vec()?, module_out))
    }

    /// Every device address and handle id the user holds.
    fn handles(&self) -> Vec<u64> {
        let mut h = vec![
            self.a.ptr(),
            self.b.ptr(),
            self.c.ptr(),
            self.stream.id() as u64,
            self.done.id() as u64,
        ];
        if let Some(w) = &self.module {
            h.extend([w.module.id(), w.function.id(), w.y.ptr(), w.x.ptr()]);
        }
        h
    }
}

/// The server's GEMM on the host.
fn reference_gemm() -> Vec<f32> {
    let (m, n, k) = (M as usize, N as usize, K as usize);
    host_gemm(&pattern(m * k, 1), &pattern(k * n, 2), m, n, k)
}

fn assert_close(got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-3 * w.abs().max(1.0),
            "element {i}: {g} != {w}"
        );
    }
}

/// The same results, bit for bit (the same device computes them from the same inputs).
fn assert_same(got: &Results, want: &Results) {
    for (name, g, w) in [("GEMM", &got.0, &want.0), ("module", &got.1, &want.1)] {
        assert_eq!(g.len(), w.len(), "{name} result length");
        let wrong: Vec<usize> = (0..g.len()).filter(|&i| g[i] != w[i]).collect();
        if let Some(&i) = wrong.first() {
            panic!(
                "{name}: {} of {} values differ after the rebuild; element {i}: {} != {}",
                wrong.len(),
                g.len(),
                g[i],
                w[i]
            );
        }
    }
}

/// Runs the server's requests until one succeeds; returns it, the errors before it, and when
/// the first error came.
fn serve_until_correct(server: &Server) -> (Results, Vec<Error>, Option<Instant>) {
    let mut failed = Vec::new();
    let mut first_failure = None;
    loop {
        match server.infer() {
            Ok(r) => return (r, failed, first_failure),
            Err(e) => {
                first_failure.get_or_insert_with(Instant::now);
                assert!(
                    failed.is_empty(),
                    "a second request failed after {failed:?}: {e}"
                );
                failed.push(e);
            }
        }
    }
}

/// A client with rebuild on is faulted out from under (by another process's kernel) and goes
/// on computing the same results with the same handles and addresses; a client without it
/// sees what it always did.
fn a_rebuilding_client_survives(broker: &Broker, path: &str) {
    let server = Server::start(broker);
    let plain = broker.client_named("plain");
    let plain_buf = plain.alloc::<f32>(1024).expect("alloc");
    plain_buf.copy_from_host(&[1.0; 1024]).expect("upload");
    let before = server.infer().expect("the server works");
    assert_close(&before.0, &reference_gemm());
    if let Some(y) = before.1.first() {
        assert_eq!(*y, 1.5 * pattern(1, 3)[0]);
    }
    let handles = server.handles();
    let recorded = server.client.rebuild_memory();
    assert!(
        recorded >= u64::from(M * K + K * N) * 4,
        "shadows of the uploaded weights: {recorded} bytes"
    );

    let mut culprit = Scripted::start(broker);
    assert!(culprit.run("connect").starts_with("connected"));
    let faulted_at = Instant::now();
    assert!(
        culprit.run("illegal").starts_with("error"),
        "the fault shows"
    );

    // The server just goes on serving: the request that met the fault fails, once, and
    // says why; the next one is right.
    let (after, failed, failed_at) = serve_until_correct(&server);
    let took = faulted_at.elapsed();
    println!(
        "rebuild ({}, {path}): fault -> the rebuilt client's next correct result in {:.1} ms (the failed request returned, rebuilt, after {:.1} ms; record: {} KiB of host memory)",
        test_backend(),
        took.as_secs_f64() * 1e3,
        failed_at.map_or(0.0, |at| (at - faulted_at).as_secs_f64() * 1e3),
        recorded / 1024
    );
    assert_eq!(
        failed.len(),
        1,
        "exactly the request that met the fault fails"
    );
    assert!(matches!(failed[0], Error::Rebuilt(_)), "{:?}", failed[0]);
    assert_eq!(failed[0].code(), Some(ErrorCode::DeviceReset));
    assert!(!failed[0].is_fatal());
    let said = failed[0].to_string();
    assert!(
        said.contains("work submitted before the fault was lost")
            && said.contains("state was rebuilt from host data"),
        "{said}"
    );
    assert_same(&after, &before);
    assert_eq!(
        server.handles(),
        handles,
        "the same handles and device addresses"
    );
    assert_eq!(server.client.rebuilds(), 1);
    if test_backend() == "cuda" {
        // Placed memory is charged what it takes on the GPU (whole 2 MiB granules), so
        // placing it cannot get around a quota.
        let id = server.client.session().client_id;
        let status = broker.status();
        let used = status
            .clients
            .iter()
            .find(|c| c.client_id == id)
            .map_or(0, |c| c.memory_used);
        assert!(used >= 2 << 20, "placed memory charged {used} bytes");
    }
    for _ in 0..3 {
        assert_same(&server.infer().expect("keeps working"), &before);
    }
    assert!(took < Duration::from_secs(10), "rebuilt after {took:?}");

    // Without rebuild nothing changed: the lost buffer stays lost (reset in place) or the
    // session is over (restart).
    if broker.log_contains("restarting gpushared") {
        let e = plain.nop().expect_err("the plain client's session ended");
        assert!(e.is_fatal(), "{e}");
        assert_eq!(plain.rebuilds(), 0);
    } else {
        for _ in 0..2 {
            let e = plain_buf.to_vec().expect_err("not rebuilt");
            assert_eq!(e.code(), Some(ErrorCode::DeviceReset), "{e}");
        }
        assert!(plain.take_device_reset().is_some(), "told what it lost");
        let fatal = culprit.run("wait-fatal");
        assert!(fatal.contains("evicted"), "{fatal}");
    }
}

#[test]
fn a_rebuilding_client_survives_another_clients_fault_with_the_same_handles_and_addresses() {
    // In place on the sim device; on a GPU gpushared restarts and the client reconnects.
    let broker = broker(&[]);
    let path = if test_backend() == "sim" {
        "reset in place"
    } else {
        "restart"
    };
    a_rebuilding_client_survives(&broker, path);
}

#[test]
fn across_a_restart_a_rebuilding_client_reconnects_and_rebuilds_by_itself() {
    if test_backend() != "sim" {
        let _ = std::io::Write::write_all(
            &mut std::io::stderr(),
            b"SKIPPED restart rebuild test: on this device the test above restarts already\n",
        );
        return;
    }
    let broker = restart_broker();
    a_rebuilding_client_survives(&broker, "restart");
    assert!(broker.log_contains("restarting gpushared"));
}

/// A client of `broker` that rebuilds its device state by itself after a reset.
fn rebuilding_client(broker: &Broker, name: &str) -> Client {
    Client::connect_with(ConnectOptions {
        rebuild: true,
        ..broker.options(name)
    })
    .expect("connect with rebuild")
}

/// Waits until a client of this process holds `bytes` at `ptr` (the broker may be resetting
/// or restarting meanwhile).
fn squat(broker: &Broker, ptr: DevicePtr, bytes: u64) -> Client {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(c) = Client::connect_with(broker.options("squatter")) {
            loop {
                match c.submit_wait(Command::AllocAt { bytes, ptr }) {
                    Ok((at, _)) => {
                        assert_eq!(at, ptr);
                        return c;
                    }
                    Err(e) if e.is_fatal() => break,
                    Err(e) => assert_ne!(e.code(), Some(ErrorCode::AddressUnavailable), "{e}"),
                }
                assert!(Instant::now() < deadline, "never got {ptr:#x}");
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        assert!(Instant::now() < deadline, "broker never came back");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_rebuild_that_cannot_get_an_address_back_fails_with_a_typed_error_naming_it() {
    let broker = broker(&[]);
    let server = Server::start(&broker);
    server.infer().expect("the server works");
    let taken = server.a.ptr();
    let mut culprit = Scripted::start(&broker);
    assert!(culprit.run("connect").starts_with("connected"));
    assert!(culprit.run("illegal").starts_with("error"));
    // Before the server (idle meanwhile) rebuilds, someone else takes one of its addresses.
    let _squatter = squat(&broker, taken + 256, 256);

    let e = server.infer().expect_err("cannot rebuild");
    match &e {
        Error::RebuildFailed(RebuildError::AddressUnavailable { ptr, bytes, .. }) => {
            assert_eq!((*ptr, *bytes), (taken, server.a.byte_len()));
        }
        other => panic!("expected an unavailable address, got {other:?}"),
    }
    assert_eq!(e.code(), Some(ErrorCode::AddressUnavailable));
    assert!(e.is_fatal());
    assert!(e.to_string().contains(&format!("{taken:#x}")), "{e}");
    // It stays so: no later call computes with a buffer that is not there.
    for _ in 0..2 {
        let again = server.infer().expect_err("still unusable");
        assert!(
            matches!(again, Error::RebuildFailed(RebuildError::AddressUnavailable { ptr, .. }) if ptr == taken),
            "{again:?}"
        );
    }
    // A fresh session works.
    let fresh = server.client.reconnect().expect("reconnect");
    verified_fill(&fresh, 2.0).expect("a new session works");
}

#[test]
fn through_the_c_abi_a_rebuilding_client_keeps_its_raw_handles() {
    use gpushare::ffi;
    use std::ffi::{CStr, CString};
    let broker = broker(&[]);
    let path = CString::new(broker.socket.as_os_str().as_encoded_bytes()).expect("no NUL");
    let mut c = std::ptr::null_mut();
    // SAFETY: valid C strings and out-pointer.
    let rc =
        unsafe { ffi::gpushare_connect_with_flags(path.as_ptr(), c"c".as_ptr(), 0x80, &mut c) };
    assert_eq!(
        rc,
        ffi::GPUSHARE_E_INVALID_ARGUMENT,
        "unknown flags refused"
    );
    assert!(c.is_null());
    // SAFETY: as above.
    let rc = unsafe {
        let flags = ffi::GPUSHARE_CONNECT_REBUILD;
        ffi::gpushare_connect_with_flags(path.as_ptr(), c"c-server".as_ptr(), flags, &mut c)
    };
    assert_eq!(rc, ffi::GPUSHARE_OK);
    let n = 4096usize;
    let x = pattern(n, 5);
    let (mut ptr, mut out, mut stream) = (0u64, 0u64, 0u32);
    // SAFETY: a live client, valid out-pointers, `x` holds n floats.
    unsafe {
        assert_eq!(ffi::gpushare_alloc(c, (n * 4) as u64, &mut ptr), 0);
        assert_eq!(ffi::gpushare_alloc(c, 4, &mut out), 0);
        let rc = ffi::gpushare_copy_htod(c, 0, ptr, x.as_ptr().cast(), n * 4);
        assert_eq!(rc, 0);
        assert_eq!(ffi::gpushare_stream_create(c, &mut stream), 0);
    }
    // One request, as a C program writes it: the first failing status is the answer.
    let sum = || -> (i32, f32) {
        let mut v = 0f32;
        // SAFETY: a live client; `v` holds 4 bytes.
        let rc = unsafe {
            [
                ffi::gpushare_reduce_sum_f32(c, stream, ptr, out, n as u64),
                ffi::gpushare_stream_synchronize(c, stream),
                ffi::gpushare_copy_dtoh(c, stream, (&mut v as *mut f32).cast(), out, 4),
            ]
        };
        (rc.into_iter().find(|&r| r != 0).unwrap_or(0), v)
    };
    let (rc, before) = sum();
    assert_eq!(rc, 0);
    assert!(before > 0.0);

    let mut culprit = Scripted::start(&broker);
    assert!(culprit.run("connect").starts_with("connected"));
    assert!(culprit.run("illegal").starts_with("error"));
    let (rc, _) = sum();
    assert_eq!(rc, ffi::GPUSHARE_E_DEVICE_RESET, "the request that met it");
    // SAFETY: the message lives until the next call on this thread.
    let said = unsafe { CStr::from_ptr(ffi::gpushare_last_error_message()) };
    assert!(
        said.to_string_lossy().contains("state was rebuilt"),
        "{said:?}"
    );
    // The same raw pointers and stream id, the same sum.
    assert_eq!(sum(), (0, before));
    // SAFETY: a live client, not used again.
    unsafe {
        assert_eq!(ffi::gpushare_free(c, ptr), 0);
        assert_eq!(ffi::gpushare_stream_destroy(c, stream), 0);
        ffi::gpushare_disconnect(c);
    }
}

/// Several threads share one rebuilding client, each working on its own stream, when another
/// client faults the GPU: a call that meets the reset fails with `Rebuilt` (never the raw
/// reset error), promptly, whichever thread did the rebuild; then every stream works.
#[test]
fn every_thread_of_a_rebuilding_client_that_meets_a_reset_gets_rebuilt_promptly() {
    threads_of_a_rebuilding_client_meet_a_fault(&broker(&[]), Duration::from_secs(2));
}

/// With rebuild on, work one thread submitted before a reset, which another thread's call
/// then rebuilt after, never reads as done: that thread's first wait (here a read of the
/// buffer the lost kernel was to fill) fails with `Rebuilt`, once, instead of returning the
/// buffer's restored, stale bytes.
#[test]
fn work_lost_before_another_threads_rebuild_is_reported_to_the_thread_that_waits_for_it() {
    let broker = broker(&[]);
    let client = rebuilding_client(&broker, "two-threads");
    let stream = client.create_stream().expect("stream");
    let out = client.alloc::<f32>(1024).expect("alloc");
    out.copy_from_host(&[1.0; 1024]).expect("upload");
    let (submitted, wait_submitted) = std::sync::mpsc::channel();
    let (rebuilt, wait_rebuilt) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|s| {
        let (stream, out, client) = (&stream, &out, &client);
        let worker = s.spawn(move || {
            for on in [stream, &client.default_stream()] {
                on.launch(Kernel::FillF32 {
                    dst: out.ptr(),
                    n: 1024,
                    value: 3.0,
                })
                .expect("launch");
            }
            let _ = submitted.send(());
            // Another thread meets the fault and rebuilds meanwhile.
            let _ = wait_rebuilt.recv();
            let first = out.to_vec();
            let then = out.to_vec();
            let stream_after = stream.synchronize();
            (first, then, stream_after)
        });
        wait_submitted.recv().expect("the worker submitted");
        let mut culprit = Scripted::start(&broker);
        assert!(culprit.run("connect").starts_with("connected"));
        let said = culprit.run("illegal");
        // This thread's next calls meet the reset (or the restart) and rebuild.
        let deadline = Instant::now() + Duration::from_secs(30);
        let met = loop {
            match client.nop() {
                Err(e) => break e,
                Ok(()) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(2));
                }
                Ok(()) => break Error::Protocol("no reset met in 30 s".into()),
            }
        };
        let _ = rebuilt.send(());
        let (first, then, stream_after) = worker.join().expect("worker");
        assert!(said.starts_with("error"), "the fault shows: {said}");
        assert!(matches!(met, Error::Rebuilt(_)), "{met:?}");
        assert_eq!(client.rebuilds(), 1);
        let e = first
            .map(|v| v.len())
            .expect_err("the fill the reset took is not read as done");
        assert!(matches!(e, Error::Rebuilt(_)), "{e:?}");
        // Told once: from now on it reads what the rebuild restored (the last upload).
        assert_eq!(then.expect("read after the report"), vec![1.0; 1024]);
        stream_after.expect("the worker was told already");
    });
}

#[test]
fn every_thread_of_a_rebuilding_client_that_meets_a_restart_gets_rebuilt() {
    if test_backend() != "sim" {
        return; // the test above restarts already
    }
    let broker = restart_broker();
    threads_of_a_rebuilding_client_meet_a_fault(&broker, Duration::from_secs(10));
    assert!(broker.log_contains("restarting gpushared"));
}

fn threads_of_a_rebuilding_client_meet_a_fault(broker: &Broker, within: Duration) {
    let client = rebuilding_client(broker, "threads");
    const THREADS: usize = 4;
    let work: Vec<(Stream, DeviceBuffer<f32>)> = (0..THREADS)
        .map(|_| {
            let buf = client.alloc::<f32>(1024).expect("alloc");
            buf.copy_from_host(&[2.0; 1024]).expect("upload");
            (client.create_stream().expect("stream"), buf)
        })
        .collect();
    let mut culprit = Scripted::start(broker);
    assert!(culprit.run("connect").starts_with("connected"));
    let stop = std::sync::atomic::AtomicBool::new(false);
    let errors: Vec<(Error, Duration)> = std::thread::scope(|s| {
        let threads: Vec<_> = work
            .iter()
            .map(|(stream, buf)| {
                let stop = &stop;
                s.spawn(move || {
                    let mut errors = Vec::new();
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let started = Instant::now();
                        let r = stream
                            .launch(Kernel::FillF32 {
                                dst: buf.ptr(),
                                n: 1024,
                                value: 3.0,
                            })
                            .and_then(|()| stream.synchronize());
                        if let Err(e) = r {
                            errors.push((e, started.elapsed()));
                        }
                    }
                    errors
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(20));
        let said = culprit.run("illegal");
        if said.starts_with("error") {
            std::thread::sleep(Duration::from_millis(300) + within / 4);
        }
        // Stopped before any assertion: a panic here would wait for them forever.
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let errors = threads
            .into_iter()
            .flat_map(|t| t.join().expect("thread"))
            .collect();
        assert!(said.starts_with("error"), "the fault shows: {said}");
        errors
    });
    for (e, took) in &errors {
        assert!(
            matches!(e, Error::Rebuilt(_)),
            "a call that met the reset: {e:?} after {took:?}"
        );
        assert!(*took < within, "answered after {took:?}");
    }
    assert!(
        (1..=THREADS).contains(&errors.len()),
        "at most one failed call per thread: {errors:?}"
    );
    assert_eq!(client.rebuilds(), 1, "one rebuild for all of them");
    for (stream, buf) in &work {
        stream
            .launch(Kernel::FillF32 {
                dst: buf.ptr(),
                n: 1024,
                value: 4.0,
            })
            .expect("launch");
        stream.synchronize().expect("the stream works again");
        assert!(buf.to_vec().expect("read").iter().all(|&v| v == 4.0));
    }
}

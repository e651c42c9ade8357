//! A client process for integration tests, with behaviours a well-made client would not have.
//!
//! `gpushare-testclient MODE [BYTES]`, socket from GPUSHARE_SOCKET:
//! - `hold BYTES`: allocate BYTES in 1 MiB pieces, fill them, print `ready`, then sleep.
//! - `busy`: print `ready`, then launch spin kernels and copies forever.
//! - `spin-wide`: print `ready`, then launch 1 ms spin kernels of 1,024 blocks (as wide as
//!   any GPU) forever, never synchronizing (the ring's back-pressure paces it).
//! - `flood`: submit no-ops forever without ever reading a completion.
//! - `wait-shutdown`: print `ready`, then synchronize in a loop until an error; print it.
//! - `churn SEED`: print `ready`, then random work forever (allocations of random sizes,
//!   frees, copies both ways, fills, axpys, spins, syncs), from a seeded RNG.
//! - `full-ring`: a raw client that fills its submission ring with no-ops and never reads a
//!   completion, so both rings stay full; prints `ready` once they are.
//! - `own VALUE N`: allocate N floats, fill them with VALUE, print `ready PTR BYTES`; then for
//!   every `check` line on stdin print `intact` or `changed AT VALUE`; exit at end of input.
//! - `raw-attack PTR BYTES`: a raw client that aims ring entries (copies, memset, launches,
//!   free) at device memory it does not own; prints `NAME STATUS` per entry, then
//!   `arena-clean true|false` (whether its arena still holds the sentinel it wrote before, i.e.
//!   none of the victim's bytes reached it) and `own-readback true|false` (the same copy of
//!   its own buffer works).
//! - `peek PID…`: try to list `/proc/PID/fd` and open each descriptor; print `PID denied` or
//!   `PID opened N`.
//! - `connect-probe [CLASS]`: connect (asking for CLASS), print `connected ID CLASS`, or
//!   `refused errno=N: …` (socket) or `refused code=CODE: …` (broker).
//! - `admin-evict ID` / `admin-quota ID BYTES` / `admin-class ID CLASS`: as a monitor, try the
//!   admin action and print `ok` or the error (for permission tests run as another user).

use std::io::{BufRead, Write};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use gpushare::{Client, Command, ConnectOptions, Kernel, PriorityClass};
use gpushare_tests::raw::RawClient;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[path = "gpushare-testclient/attack.rs"]
mod attack;

use attack::raw_attack;

fn main() {
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_default();
    if let Some(action) = mode.strip_prefix("admin-") {
        let id: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(0);
        let class: Option<PriorityClass> = match action {
            "class" => args.next().and_then(|s| s.parse().ok()),
            _ => None,
        };
        let outcome = gpushare::Monitor::connect(&gpushare_protocol::socket_path_from_env())
            .and_then(|mut m| match action {
                "evict" => m.admin_evict(id, "testing"),
                "class" => m.admin_set(id, class, None, None),
                _ => m.admin_set(
                    id,
                    None,
                    None,
                    Some(args.next().and_then(|s| s.parse().ok())),
                ),
            });
        match outcome {
            Ok(()) => println!("ok"),
            Err(e) => println!("error: {e}"),
        }
        return;
    }
    match mode.as_str() {
        "full-ring" => return full_ring(),
        "raw-attack" => {
            let ptr = parse_ptr(args.next());
            let bytes: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(4096);
            return raw_attack(ptr, bytes);
        }
        "peek" => {
            for pid in args {
                println!("{pid} {}", peek(&pid));
            }
            return;
        }
        "connect-probe" => {
            let class = args.next().and_then(|s| s.parse().ok());
            return connect_probe(class);
        }
        "script" => return script(),
        _ => {}
    }
    let client = match Client::connect() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("connect: {e}");
            std::process::exit(2);
        }
    };
    let ready = || {
        println!("ready");
        let _ = std::io::stdout().flush();
    };
    match mode.as_str() {
        "hold" => {
            let bytes: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(1 << 20);
            let mut held = Vec::new();
            let stream = client.default_stream();
            for _ in 0..bytes.div_ceil(1 << 20) {
                let buf = client.alloc::<f32>(1 << 18).expect("alloc");
                stream
                    .launch(Kernel::FillF32 {
                        dst: buf.ptr(),
                        n: 1 << 18,
                        value: 1.0,
                    })
                    .expect("fill");
                held.push(buf);
            }
            stream.synchronize().expect("sync");
            ready();
            loop {
                std::thread::sleep(Duration::from_secs(60));
            }
        }
        "busy" => {
            let stream = client.create_stream().expect("stream");
            let buf = client.alloc::<f32>(1 << 16).expect("alloc");
            ready();
            loop {
                stream
                    .launch(Kernel::Spin {
                        micros: 100,
                        blocks: 4,
                    })
                    .expect("spin");
                buf.copy_from_host(&vec![2.0; 1 << 16]).expect("copy");
            }
        }
        "spin-wide" => {
            let stream = client.default_stream();
            ready();
            loop {
                stream
                    .launch(Kernel::Spin {
                        micros: 1000,
                        blocks: 1024,
                    })
                    .expect("spin");
            }
        }
        "flood" => {
            ready();
            loop {
                if client.submit_async(Command::Nop).is_err() {
                    // Only the ring being full ends up here... or the broker going away.
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
        "wait-shutdown" => {
            ready();
            loop {
                if let Err(e) = client.synchronize() {
                    println!("error: {e}");
                    let _ = std::io::stdout().flush();
                    std::process::exit(0);
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        "churn" => {
            let seed: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(0);
            ready();
            churn(&client, seed);
        }
        "own" => {
            let value: f32 = args.next().and_then(|s| s.parse().ok()).unwrap_or(1.0);
            let n: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(1024);
            let buf = client.alloc::<f32>(n).expect("alloc");
            client
                .default_stream()
                .launch(Kernel::FillF32 {
                    dst: buf.ptr(),
                    n: n as u64,
                    value,
                })
                .expect("fill");
            client.synchronize().expect("sync");
            println!("ready {:#x} {}", buf.ptr(), buf.byte_len());
            let _ = std::io::stdout().flush();
            for line in std::io::stdin().lock().lines().map_while(Result::ok) {
                if line.trim() != "check" {
                    continue;
                }
                let got = buf.to_vec().expect("read back");
                match got.iter().position(|&v| v != value) {
                    None => println!("intact"),
                    Some(at) => println!("changed {at} {}", got[at]),
                }
                let _ = std::io::stdout().flush();
            }
        }
        other => {
            eprintln!("unknown mode `{other}`");
            std::process::exit(2);
        }
    }
}

fn parse_ptr(arg: Option<String>) -> u64 {
    let arg = arg.unwrap_or_default();
    match arg.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).unwrap_or(0),
        None => arg.parse().unwrap_or(0),
    }
}

/// Random work until killed.
fn churn(client: &Client, seed: u64) -> ! {
    let mut rng = StdRng::seed_from_u64(seed);
    let stream = client.create_stream().expect("stream");
    let mut live: Vec<gpushare::DeviceBuffer<f32>> = Vec::new();
    loop {
        match rng.random_range(0..8) {
            0 | 1 => {
                let log2 = rng.random_range(4..19);
                let n = rng.random_range(1..(1usize << log2));
                if let Ok(b) = client.alloc::<f32>(n) {
                    live.push(b);
                }
            }
            2 if !live.is_empty() => {
                let i = rng.random_range(0..live.len());
                drop(live.swap_remove(i));
            }
            3 if !live.is_empty() => {
                let b = &live[rng.random_range(0..live.len())];
                let _ = b.copy_from_host(&vec![rng.random::<f32>(); b.len()]);
            }
            4 if !live.is_empty() => {
                let b = &live[rng.random_range(0..live.len())];
                let _ = b.to_vec();
            }
            5 if live.len() >= 2 => {
                let (x, y) = (&live[0], &live[live.len() - 1]);
                let n = x.len().min(y.len()) as u64;
                let _ = stream.launch(Kernel::FillF32 {
                    dst: x.ptr(),
                    n,
                    value: 1.0,
                });
                let _ = stream.launch(Kernel::AxpyF32 {
                    x: x.ptr(),
                    y: y.ptr(),
                    n,
                    alpha: 2.0,
                });
            }
            6 => {
                let _ = stream.launch(Kernel::Spin {
                    micros: rng.random_range(10..500),
                    blocks: 4,
                });
            }
            _ => {
                for _ in 0..rng.random_range(1..64) {
                    let _ = client.submit_async(Command::Nop);
                }
                let _ = stream.synchronize();
            }
        }
        if live.len() > 32 {
            live.truncate(16);
        }
    }
}

/// Fills both rings and never reads a completion.
fn full_ring() {
    let raw = RawClient::connect(&gpushare_protocol::socket_path_from_env());
    let sq = raw.layout.sq_entries;
    let mut tail = 0u32;
    let mut announced = false;
    let start = Instant::now();
    loop {
        let head = raw.sq_head().load(Ordering::Acquire);
        while tail.wrapping_sub(head) < sq {
            raw.write_entry(tail, Command::Nop.encode(u64::from(tail)));
            tail = tail.wrapping_add(1);
        }
        raw.publish(tail);
        let cq_full = raw
            .cq_tail()
            .load(Ordering::Acquire)
            .wrapping_sub(raw.cq_head().load(Ordering::Relaxed))
            >= raw.layout.cq_entries;
        if !announced && (cq_full || start.elapsed() > Duration::from_secs(2)) {
            println!("ready");
            let _ = std::io::stdout().flush();
            announced = true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Lists `/proc/PID/fd` and opens every descriptor it can.
fn peek(pid: &str) -> String {
    let dir = match std::fs::read_dir(format!("/proc/{pid}/fd")) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => return "denied".into(),
        Err(e) => return format!("error {e}"),
    };
    let opened = dir
        .map_while(Result::ok)
        .filter(|e| std::fs::File::open(e.path()).is_ok())
        .count();
    format!("opened {opened}")
}

fn connect_probe(class: Option<PriorityClass>) {
    let opts = ConnectOptions {
        class,
        ..ConnectOptions::default()
    };
    match Client::connect_with(opts) {
        Ok(c) => println!(
            "connected {} {}",
            c.session().client_id,
            c.session().class.as_str()
        ),
        Err(gpushare::Error::Connect { cause, .. }) => println!(
            "refused errno={}: {cause}",
            cause.raw_os_error().unwrap_or(0)
        ),
        Err(e) => match e.code() {
            Some(code) => println!("refused code={code:?}: {e}"),
            None => println!("failed: {e}"),
        },
    }
    let _ = std::io::stdout().flush();
}

/// Runs commands read from stdin, one per line, printing one result line each (for tests
/// that drive a client process step by step, across broker restarts):
/// `connect`, `reconnect` (until the broker answers), `hang`, `illegal`, `illegal-unseen`
/// (the faulting kernel is on the device, and nobody has synchronized since), `fill`,
/// `read-at PTR N` (a module kernel reads N floats at device address PTR), `wait-fatal`
/// (until the session ends), `monitors N` (open N monitor connections and hold them:
/// `monitors N` or `refused after K: …`), `drop-monitors`, `load-image BYTES SEED` (a sim
/// module of BYTES, distinct per SEED: `loaded` or the error), `unload-all`.
fn script() {
    use std::io::BufRead;
    let say = |line: String| {
        println!("{line}");
        let _ = std::io::stdout().flush();
    };
    let mut client: Option<Client> = None;
    let mut monitors: Vec<gpushare::Monitor> = Vec::new();
    let mut modules: Vec<gpushare::Module> = Vec::new();
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let result = match (line.trim(), client.as_ref()) {
            (cmd, _) if cmd.starts_with("monitors ") => {
                let n: usize = cmd[9..].trim().parse().unwrap_or(0);
                let path = gpushare_protocol::socket_path_from_env();
                let mut outcome = format!("monitors {n}");
                for i in 0..n {
                    match gpushare::Monitor::connect(&path) {
                        Ok(m) => monitors.push(m),
                        Err(e) => {
                            outcome = format!("refused after {i}: {e}");
                            break;
                        }
                    }
                }
                outcome
            }
            ("drop-monitors", _) => {
                monitors.clear();
                "dropped".into()
            }
            (cmd, Some(c)) if cmd.starts_with("load-image ") => {
                let mut words = cmd.split_whitespace().skip(1);
                let bytes: usize = words.next().and_then(|w| w.parse().ok()).unwrap_or(0);
                let seed = words.next().unwrap_or("0");
                // A sim module, padded with blank lines (which it ignores) to `bytes`.
                let mut image = format!("gpushare-sim-module 1\nkernel k{seed}\n").into_bytes();
                image.resize(bytes.max(image.len()), b'\n');
                match c.load_module(gpushare::ModuleFormat::Ptx, &image) {
                    Ok(m) => {
                        modules.push(m);
                        "loaded".into()
                    }
                    Err(e) => format!("error {e}"),
                }
            }
            ("unload-all", _) => {
                modules.clear();
                "unloaded".into()
            }
            ("connect", _) | ("reconnect", _) => {
                let deadline = std::time::Instant::now() + Duration::from_secs(20);
                loop {
                    match Client::connect() {
                        Ok(c) => {
                            let id = c.session().client_id;
                            client = Some(c);
                            break format!("connected {id}");
                        }
                        Err(gpushare::Error::Rejected(w)) => {
                            client = None;
                            break format!("refused {:?}: {}", w.code, w.message);
                        }
                        Err(e)
                            if line.trim() == "connect" || std::time::Instant::now() > deadline =>
                        {
                            client = None;
                            break format!("error {e}");
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(5)),
                    }
                }
            }
            (_, None) => "error not connected".to_string(),
            ("hang", Some(c)) => match c
                .default_stream()
                .launch(Kernel::Fault { hang: true })
                .and_then(|()| c.nop())
            {
                Ok(()) => "ok".into(),
                Err(e) => format!("error {e}"),
            },
            ("illegal", Some(c)) => match c
                .default_stream()
                .launch(Kernel::Fault { hang: false })
                .and_then(|()| c.synchronize())
            {
                Ok(()) => "ok".into(),
                Err(e) => format!("error {e}"),
            },
            ("illegal-unseen", Some(c)) => {
                // The event query answers only after the device has taken the launch before
                // it; without a synchronization, nobody has seen the fault yet.
                let poison = || -> gpushare::Result<()> {
                    let stream = c.default_stream();
                    stream.launch(Kernel::Fault { hang: false })?;
                    let event = c.create_event()?;
                    event.record(&stream)?;
                    event.query().map(drop)
                };
                match poison() {
                    Ok(()) => "ok".into(),
                    Err(e) => format!("error {e}"),
                }
            }
            ("fill", Some(c)) => {
                let fill = || -> gpushare::Result<bool> {
                    let buf = c.alloc::<f32>(1024)?;
                    c.default_stream().launch(Kernel::FillF32 {
                        dst: buf.ptr(),
                        n: 1024,
                        value: 3.0,
                    })?;
                    let right = buf.to_vec()?.iter().all(|&v| v == 3.0);
                    // Nothing left in flight afterwards (the fault tests rely on it).
                    c.synchronize()?;
                    Ok(right)
                };
                match fill() {
                    Ok(true) => "ok".into(),
                    Ok(false) => "error wrong values".into(),
                    Err(e) => format!("error {e}"),
                }
            }
            (cmd, Some(c)) if cmd.starts_with("read-at ") => read_at(c, cmd),
            ("wait-fatal", Some(c)) => {
                let deadline = std::time::Instant::now() + Duration::from_secs(20);
                loop {
                    match c.nop() {
                        Err(e) if e.is_fatal() => break format!("fatal {e}"),
                        _ if std::time::Instant::now() > deadline => {
                            break "error still alive".into();
                        }
                        _ => std::thread::sleep(Duration::from_millis(5)),
                    }
                }
            }
            (other, _) => format!("error unknown command {other}"),
        };
        say(result);
    }
}

/// `read-at PTR N`: a module kernel (`scale_add`, y = x + y) reads `n` floats at `ptr`, an
/// address this client never allocated, into a buffer of its own; says their sum, or the
/// error. (Within one GPU context nothing stops a kernel doing this; across trust domains the
/// hardware does.)
fn read_at(c: &Client, cmd: &str) -> String {
    let mut words = cmd.split_whitespace().skip(1);
    let ptr = parse_ptr(words.next().map(str::to_string));
    let n: u32 = words.next().and_then(|s| s.parse().ok()).unwrap_or(1024);
    let run = || -> gpushare::Result<f64> {
        let module = c.load_module(
            gpushare::ModuleFormat::Ptx,
            gpushare_tests::SCALE_ADD_PTX.as_bytes(),
        )?;
        let f = module.function("scale_add")?;
        let y = c.alloc::<f32>(n as usize)?;
        y.copy_from_host(&vec![0.0; n as usize])?;
        let mut params = Vec::new();
        params.extend_from_slice(&y.ptr().to_le_bytes());
        params.extend_from_slice(&ptr.to_le_bytes());
        params.extend_from_slice(&1.0f32.to_le_bytes());
        params.extend_from_slice(&n.to_le_bytes());
        let stream = c.default_stream();
        c.launch_function(
            &stream,
            &f,
            [n.div_ceil(256), 1, 1],
            [256, 1, 1],
            0,
            &params,
        )?;
        c.synchronize()?;
        Ok(y.to_vec()?.iter().map(|&v| v as f64).sum())
    };
    match run() {
        Ok(sum) => format!("read {sum}"),
        Err(e) => format!("error {e}"),
    }
}

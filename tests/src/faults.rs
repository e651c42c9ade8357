//! What the fault tests share: a broker that allows fault injection, clients that check they
//! work, and a client in another process driven line by line (the culprit of most faults:
//! after a restart gpushared refuses the culprit's process, and the victims live in the
//! test's).

use std::time::Duration;

use gpushare::{Client, ConnectOptions, ErrorCode, Kernel};

use crate::{Broker, BrokerOptions, test_backend};

pub fn broker(extra: &[&str]) -> Broker {
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

/// A broker that holds the device in its own process and so restarts after a fault (the
/// sim device behaves like the CUDA driver there).
pub fn restart_broker() -> Broker {
    broker(&[
        "--in-process-device",
        "--sim-restart-on-fault",
        "--fault-probation",
        "60",
    ])
}

/// A client of `broker` that rebuilds its device state by itself after a reset.
pub fn rebuilding_client(broker: &Broker, name: &str) -> Client {
    Client::connect_with(ConnectOptions {
        rebuild: true,
        ..broker.options(name)
    })
    .expect("connect with rebuild")
}

/// Fills a fresh buffer with `value` and checks it came back: the client works.
pub fn verified_fill(client: &Client, value: f32) -> gpushare::Result<()> {
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
/// attempt may fail with `DeviceReset` (its cached handles were lost) or `WorkLost` (work it
/// had on the GPU was stopped), never more.
pub fn fill_after_reset(client: &Client, value: f32) -> gpushare::Result<()> {
    match verified_fill(client, value) {
        Err(e) if matches!(e.code(), Some(ErrorCode::DeviceReset | ErrorCode::WorkLost)) => {
            verified_fill(client, value)
        }
        other => other,
    }
}

pub fn fault(client: &Client, hang: bool) {
    client
        .default_stream()
        .launch(Kernel::Fault { hang })
        .expect("fault kernel accepted");
}

/// Returns once the device has taken the work queued so far on the client's default stream:
/// an event query is answered behind it (a round trip to gpushared alone is not enough; its
/// device worker may not have taken the work yet).
pub fn on_the_device(client: &Client) {
    let event = client.create_event().expect("event");
    event.record(&client.default_stream()).expect("record");
    let _ = event.query();
}

/// A client process driven line by line (`gpushare-testclient script`).
pub struct Scripted {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    lines: std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
}

impl Scripted {
    pub fn start(broker: &Broker) -> Scripted {
        Scripted::spawn(broker.command("gpushare-testclient"))
    }

    /// The same, running as another Unix user.
    pub fn start_as(broker: &Broker, user: &crate::SystemUser) -> Scripted {
        Scripted::spawn(broker.command_as(user, "gpushare-testclient"))
    }

    fn spawn(mut command: std::process::Command) -> Scripted {
        use std::io::BufRead;
        use std::process::Stdio;
        let mut child = command
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

    pub fn run(&mut self, command: &str) -> String {
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

/// Prints ten faults' times (fault -> the victim's next correct result), sorted, and the lines
/// of the broker's log from `from` on that name one of `keys`: where the last fault's time went.
pub fn report_fault_times(
    what: &str,
    telemetry: &gpushare_protocol::stats::TelemetryStatus,
    took: &mut [Duration],
    log: &str,
    from: usize,
    keys: &[&str],
) {
    took.sort();
    let ms = |d: &Duration| format!("{:.0}", d.as_secs_f64() * 1e3);
    let at = |q: f64| took.get((took.len().saturating_sub(1) as f64 * q) as usize);
    println!(
        "{what}, telemetry {} ({:?}): fault -> victim's next correct result, ms: median {}, max {}, all {:?}",
        if telemetry.enabled { "on" } else { "off" },
        telemetry.reason,
        at(0.5).map(ms).unwrap_or_default(),
        at(1.0).map(ms).unwrap_or_default(),
        took.iter().map(ms).collect::<Vec<_>>()
    );
    for line in log[from.min(log.len())..]
        .lines()
        .filter(|l| keys.iter().any(|k| l.contains(k)))
    {
        println!("  {line}");
    }
}

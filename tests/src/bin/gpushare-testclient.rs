//! A client process for integration tests, with behaviours a well-made client would not have.
//!
//! `gpushare-testclient MODE [BYTES]`, socket from GPUSHARE_SOCKET:
//! - `hold BYTES`: allocate BYTES in 1 MiB pieces, fill them, print `ready`, then sleep.
//! - `busy`: print `ready`, then launch spin kernels and copies forever.
//! - `flood`: submit no-ops forever without ever reading a completion.
//! - `wait-shutdown`: print `ready`, then synchronize in a loop until an error; print it.
//! - `admin-evict ID` / `admin-quota ID BYTES`: as a monitor, try the admin action and print
//!   `ok` or the error (for permission tests run as another user).

use std::io::Write;
use std::time::Duration;

use gpushare::{Client, Command, Kernel};

fn main() {
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_default();
    if let Some(action) = mode.strip_prefix("admin-") {
        let id: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(0);
        let outcome = gpushare::Monitor::connect(&gpushare_protocol::socket_path_from_env())
            .and_then(|mut m| match action {
                "evict" => m.admin_evict(id, "testing"),
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
        other => {
            eprintln!("unknown mode `{other}`");
            std::process::exit(2);
        }
    }
}

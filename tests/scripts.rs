//! The logic in the scripts: `scripts/test-summary.awk`, the line `scripts/test.sh` ends with,
//! read from real `cargo test` output.

use std::io::Write;
use std::process::{Command, Stdio};

fn summary(log: &str) -> String {
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/test-summary.awk");
    let mut awk = Command::new("awk")
        .arg("-f")
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run awk");
    awk.stdin
        .take()
        .expect("stdin")
        .write_all(log.as_bytes())
        .expect("feed awk");
    let out = awk.wait_with_output().expect("awk");
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_summary_counts_every_binary_and_names_failures_and_skips() {
    let log = "\
     Running unittests src/lib.rs (target/debug/deps/gpushare_broker-83b45958d46034e3)
running 3 tests
test a ... ok
test b ... ok
test slow ... ignored
test result: ok. 2 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.01s
     Running telemetry.rs (target/debug/deps/telemetry-0a1b2c3d4e5f6789)
running 2 tests
SKIPPED telemetry: not running as root (eBPF needs CAP_BPF and CAP_PERFMON)
SKIPPED telemetry_sweeps (no usable GPU): no GPU
test counts ... ok
test sweeps ... FAILED
test result: FAILED. 1 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.20s
   Doc-tests gpushare
running 1 test
test client-lib/src/lib.rs - (line 5) ... ok
test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.30s
";
    let line = summary(log);
    assert_eq!(line.lines().count(), 1, "{line}");
    assert!(
        line.starts_with("2 passed, 1 failed, 3 skipped over 3 test binaries"),
        "{line}"
    );
    assert!(
        line.contains("; telemetry: telemetry_sweeps (no usable GPU)"),
        "a message that only starts like the binary's name gets it: {line}"
    );
    assert!(line.contains("failed: telemetry::sweeps"), "{line}");
    assert!(
        line.contains("telemetry: not running as root")
            && line.contains("gpushare_broker: slow (ignored)"),
        "{line}"
    );
}

#[test]
fn a_clean_run_is_one_plain_line() {
    let log = "     Running x.rs (target/debug/deps/x-0123456789abcdef)\n\
               test result: ok. 4 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out\n";
    assert_eq!(
        summary(log),
        "4 passed, 0 failed, 0 skipped over 1 test binary\n"
    );
}

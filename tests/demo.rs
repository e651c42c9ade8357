//! The README's demo, `gpushare-demo tour` (what `scripts/demo.sh` runs once it has built
//! gpushare): it must run through, with every result checked, and show what it promises: the
//! interactive client's latency alone, beside a trainer under FIFO and under the priority
//! policy with the trainer's throughput, a quota refusal, a `gpushare top -b` frame with every
//! client in it, and whether telemetry is on. How large the latencies come out is not checked:
//! that depends on the machine.

use gpushare_tests::{binary, test_backend};

#[test]
fn the_tour_shows_each_case_a_quota_refusal_and_every_client_in_top() {
    let out = std::process::Command::new(binary("gpushare-demo"))
        .args(["tour", "--backend", &test_backend(), "--seconds", "0.6"])
        .arg("--no-telemetry")
        .env_remove("GPUSHARE_SOCKET")
        .output()
        .expect("run gpushare-demo tour");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");

    // The table: one row per case, each with a p50 and a p99, the trainer's steps/s beside it.
    for (case, trainer) in [
        ("alone", false),
        ("beside a trainer, fifo", true),
        ("beside a trainer, priority", true),
    ] {
        let row = stdout
            .lines()
            .find(|l| l.trim_start().starts_with(case) && l.contains(" ms"))
            .unwrap_or_else(|| panic!("no row for {case}:\n{stdout}"));
        let cells: Vec<&str> = row[row.find(case).unwrap_or(0) + case.len()..]
            .split_whitespace()
            .collect();
        assert_eq!(cells.len(), 5, "{row}");
        for latency in [cells[0], cells[2]] {
            assert!(latency.parse::<f64>().is_ok_and(|v| v > 0.0), "{row}");
        }
        assert_eq!(
            cells[4].parse::<f64>().is_ok_and(|v| v > 0.0),
            trainer,
            "{row}"
        );
    }
    assert!(
        stdout.contains("policy priority") && stdout.contains("refused ("),
        "{stdout}"
    );
    let frame: Vec<&str> = stdout
        .lines()
        .skip_while(|l| !l.contains("gpushare top -b -n 1"))
        .collect();
    for (name, class) in [
        ("interactive", "high"),
        ("trainer", "best-effort"),
        ("notebook", "normal"),
    ] {
        assert!(
            frame.iter().any(|l| {
                let cells: Vec<&str> = l.split_whitespace().collect();
                cells.get(2) == Some(&name) && cells.get(4) == Some(&class)
            }),
            "no {name} row in the top frame:\n{stdout}"
        );
    }
    assert!(
        stdout.contains("telemetry: off — disabled with --no-telemetry"),
        "{stdout}"
    );
    assert!(
        stdout.contains("verified; broker stopped cleanly"),
        "{stdout}"
    );
}

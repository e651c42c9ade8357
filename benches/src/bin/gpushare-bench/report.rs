//! Markdown tables from the results, with gpushare/direct and MPS/direct ratios.

use std::fmt::Write;

use serde_json::Value;

use crate::table::Table;
use crate::workload::COPY_SIZES;
use crate::{Mode, colocate_setup_label};

fn get(v: &Value, path: &[&str]) -> Option<f64> {
    let mut cur = v;
    for p in path {
        cur = cur.get(*p)?;
    }
    cur.as_f64()
}

fn fmt(x: Option<f64>, digits: usize) -> String {
    x.map_or("n/a".into(), |v| format!("{v:.digits$}"))
}

fn ratio(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if b != 0.0 => format!("{:.3}", a / b),
        _ => "n/a".into(),
    }
}

/// The table of one scenario: a label per row, the three modes' values, and the two ratios to
/// direct.
fn modes_table() -> Table {
    Table::new(&[
        "",
        "direct",
        "gpushare",
        "MPS",
        "gpushare / direct",
        "MPS / direct",
    ])
}

/// One row of a [`modes_table`]: the figure at `path` in each mode, and the ratios.
fn row(t: &mut Table, label: &str, r: &Value, path: &[&str], digits: usize) {
    let d = get(&r["direct"], path);
    let g = get(&r["gpushare"], path);
    let m = get(&r["mps"], path);
    t.row([
        label.to_string(),
        fmt(d, digits),
        fmt(g, digits),
        fmt(m, digits),
        ratio(g, d),
        ratio(m, d),
    ]);
}

pub fn markdown(doc: &Value) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Machine: {}. Each figure is the median of {} rounds in which the modes took turns.\n",
        doc["machine"].as_str().unwrap_or("?"),
        doc["rounds"]
    );
    if let Some(args) = doc["broker_args"].as_array().filter(|a| !a.is_empty()) {
        let args: Vec<&str> = args.iter().filter_map(|a| a.as_str()).collect();
        let _ = writeln!(out, "gpushared ran with: `{}`\n", args.join(" "));
    }
    let results = &doc["results"];
    for (mode, v) in results
        .as_object()
        .into_iter()
        .flatten()
        .flat_map(|(s, m)| m.as_object().into_iter().flatten().map(move |x| (s, x)))
    {
        if let Some(e) = v.1.get("error") {
            let _ = writeln!(out, "- {} / {}: FAILED: {}", mode, v.0, e);
        }
    }
    if let Some(r) = results.get("launch") {
        let _ = writeln!(out, "\n### launch (empty kernel)");
        let mut t = modes_table();
        row(
            &mut t,
            "async launches / s",
            r,
            &["async_launches_per_s"],
            0,
        );
        row(&mut t, "launch + sync p50 (µs)", r, &["sync_p50_us"], 2);
        row(&mut t, "launch + sync p99 (µs)", r, &["sync_p99_us"], 2);
        row(&mut t, "launch + sync mean (µs)", r, &["sync_mean_us"], 2);
        t.render(&mut out);
        let added = |q: &str| match (get(&r["gpushare"], &[q]), get(&r["direct"], &[q])) {
            (Some(g), Some(d)) => format!("{:+.2} µs", g - d),
            _ => "n/a".into(),
        };
        let _ = writeln!(
            out,
            "\nAdded synchronous latency through gpushare: p50 {}, mean {}.",
            added("sync_p50_us"),
            added("sync_mean_us")
        );
    }
    if let Some(r) = results.get("copy") {
        for (kind, what) in [
            (
                "pinned",
                "pinned host memory (direct) vs page-locked arena host buffer (gpushare)",
            ),
            (
                "pageable",
                "pageable host memory (direct) vs staged through the arena (gpushare)",
            ),
        ] {
            let _ = writeln!(out, "\n### copy, {what}: GB/s");
            let mut t = modes_table();
            for (label, _) in COPY_SIZES {
                let h2d = format!("{label} H→D");
                row(&mut t, &h2d, r, &[kind, label, "htod_gbps"], 2);
                let d2h = format!("{label} D→H");
                row(&mut t, &d2h, r, &[kind, label, "dtoh_gbps"], 2);
            }
            t.render(&mut out);
        }
    }
    if let Some(r) = results.get("probe").and_then(|r| r.get("direct")) {
        let _ = writeln!(out, "\n### probe: single driver calls, median µs (direct)");
        let mut t = Table::new(&["call", "µs"]);
        for (k, v) in r.as_object().into_iter().flatten() {
            t.row([k.clone(), fmt(v.as_f64(), 2)]);
        }
        t.render(&mut out);
    }
    if let Some(t) = results.get("trace") {
        trace(&mut out, t);
    }
    if let Some(c) = results.get("colocate") {
        colocate(&mut out, c);
    }
    if let Some(r) = results.get("iteration") {
        let _ = writeln!(out, "\n### iteration: ms per iteration (mean; p50 in JSON)");
        let mut t = modes_table();
        for it in crate::workload::iterations() {
            row(&mut t, it.what, r, &[it.name, "mean_ms"], 3);
        }
        t.render(&mut out);
    }
    out
}

/// The colocate tables: one per number of best-effort clients, every setup a row.
fn colocate(out: &mut String, c: &Value) {
    let m = &c["median"];
    let _ = writeln!(
        out,
        "\n### colocate: high-priority `{}` requests (Poisson, mean gap {} ms) beside best-effort \
         clients ({}), {} s per setup, gpushare scheduler `{}`\n",
        c["high_workload"].as_str().unwrap_or("?"),
        c["hp_gap_ms"],
        c["be_workloads"]
            .as_array()
            .map(|a| a
                .iter()
                .filter_map(|w| w.as_str())
                .collect::<Vec<_>>()
                .join(", "))
            .unwrap_or_default(),
        c["seconds"],
        c["scheduler"].as_str().unwrap_or("?"),
    );
    let mut failed = false;
    for (key, v) in m.as_object().into_iter().flatten() {
        if let Some(e) = v.get("error") {
            let _ = writeln!(out, "- {key}: FAILED: {e}");
            failed = true;
        }
    }
    if failed {
        // A paragraph right after a list item would continue the item.
        out.push('\n');
    }
    let dedicated_p99 = get(m, &["dedicated", "high", "p99_ms"]);
    let standalone =
        |workload: &str| get(m, &[&format!("standalone {workload}"), "be", "it_per_s"]);
    let be_workloads: Vec<String> = c["be_workloads"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|w| w.as_str().map(String::from))
        .collect();
    let _ = writeln!(
        out,
        "Standalone best-effort throughput (direct CUDA, alone):\n"
    );
    for w in &be_workloads {
        let _ = writeln!(out, "- {w}: {} it/s", fmt(standalone(w), 1));
    }
    let counts: Vec<u64> = c["be_counts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_u64)
        .collect();
    for (i, n) in counts.into_iter().enumerate() {
        let _ = writeln!(out, "\n{n} best-effort client(s):");
        let mut table = Table::new(&[
            "setup",
            "HP p50 ms",
            "HP p99 ms",
            "HP p99 / dedicated",
            "HP served / offered",
            "BE it/s each",
            "BE / standalone (sum)",
            "total (HP served + BE sum)",
        ]);
        let mut setups = vec![("dedicated".to_string(), 0usize)];
        if n == counts_first(c) {
            setups.push(("gpushare alone".to_string(), 0));
        }
        let shares: Vec<f64> = c["sm_shares"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_f64).collect())
            .unwrap_or_else(|| vec![1.0]);
        for mode in [Mode::Direct, Mode::Mps] {
            setups.push((
                format!("{n} best-effort, {}", colocate_setup_label(mode, 1.0)),
                n as usize,
            ));
        }
        for &share in &shares {
            let label = colocate_setup_label(Mode::Broker, share);
            setups.push((format!("{n} best-effort, {label}"), n as usize));
        }
        for (key, be_n) in setups {
            let Some(v) = m.get(&key).filter(|v| v.get("error").is_none()) else {
                continue;
            };
            let p99 = get(v, &["high", "p99_ms"]);
            let served = match (get(v, &["high", "requests"]), get(v, &["high", "offered"])) {
                (Some(a), Some(b)) if b > 0.0 => Some(a / b),
                _ => None,
            };
            let mut each = Vec::new();
            let mut share = 0.0;
            for i in 0..be_n {
                let it = get(v, &[&format!("be{i}"), "it_per_s"]);
                each.push(fmt(it, 1));
                let w = &be_workloads[i % be_workloads.len().max(1)];
                if let (Some(it), Some(alone)) = (it, standalone(w)) {
                    share += it / alone;
                }
            }
            table.row([
                key,
                fmt(get(v, &["high", "p50_ms"]), 3),
                fmt(p99, 3),
                ratio(p99, dedicated_p99),
                fmt(served, 3),
                if each.is_empty() {
                    "–".into()
                } else {
                    each.join(" / ")
                },
                if be_n == 0 {
                    "–".into()
                } else {
                    format!("{share:.3}")
                },
                fmt(served.map(|s| s + share), 3),
            ]);
        }
        table.render(out);
        slowest_requests(out, c, n, i == 0);
    }
}

/// The slowest high-priority requests through gpushare beside `n` best-effort clients, each
/// round's: what a p99 is made of (a few requests of a round's thousands) is kept in no median.
/// With `alone`, also those of the client alone, dedicated and through gpushare (the same
/// arrivals: which requests the broker alone makes slow).
fn slowest_requests(out: &mut String, c: &Value, n: u64, alone: bool) {
    let prefix = format!("{n} best-effort, gpushare");
    let wanted = |key: &str| {
        key.starts_with(&prefix) || (alone && (key == "dedicated" || key == "gpushare alone"))
    };
    let mut lines = Vec::new();
    for (r, round) in c["rounds"].as_array().into_iter().flatten().enumerate() {
        for (key, v) in round.as_object().into_iter().flatten() {
            let Some(worst) = v["high"]["worst"].as_array() else {
                continue;
            };
            if !wanted(key) {
                continue;
            }
            let list: Vec<&str> = worst.iter().take(3).filter_map(Value::as_str).collect();
            if !list.is_empty() {
                lines.push(format!("- {key}, round {}: {}", r + 1, list.join("; ")));
            }
        }
    }
    if !lines.is_empty() {
        let _ = writeln!(
            out,
            "\nSlowest high-priority requests (latency at its arrival's offset, \
             its own service time, and how long the client was idle before it):\n"
        );
        for l in lines {
            let _ = writeln!(out, "{l}");
        }
    }
}

/// The trace table: mean JCT per policy and its ratio to SRTF's.
fn trace(out: &mut String, t: &Value) {
    let m = &t["median"];
    let srtf = get(m, &["srtf", "mean_jct_ms"]);
    let _ = writeln!(
        out,
        "\n### trace: {} jobs arriving online (Salus-style), job completion time",
        t["jobs"]
    );
    let mut table = Table::new(&[
        "policy",
        "mean JCT ms",
        "mean JCT, short jobs ms",
        "p50 JCT ms",
        "max JCT ms",
        "makespan ms",
        "mean JCT / SRTF's",
        "iteration p50 µs (launch / sync / end)",
    ]);
    for policy in t["policies"].as_array().into_iter().flatten() {
        let Some(p) = policy.as_str() else { continue };
        let v = &m[p];
        if let Some(e) = v.get("error") {
            table.row([p.to_string(), format!("FAILED: {e}")]);
            continue;
        }
        let mean = get(v, &["mean_jct_ms"]);
        table.row([
            p.to_string(),
            fmt(mean, 1),
            fmt(get(v, &["mean_jct_short_ms"]), 1),
            fmt(get(v, &["p50_jct_ms"]), 1),
            fmt(get(v, &["max_jct_ms"]), 1),
            fmt(get(v, &["makespan_ms"]), 1),
            ratio(mean, srtf),
            format!(
                "{} ({} / {} / {})",
                fmt(get(v, &["iteration_p50_us"]), 0),
                fmt(get(v, &["launch_p50_us"]), 0),
                fmt(get(v, &["sync_p50_us"]), 0),
                fmt(get(v, &["end_iteration_p50_us"]), 0),
            ),
        ]);
    }
    table.render(out);
    let _ = writeln!(
        out,
        "\nGPU work in the trace: {} ms.",
        fmt(
            get(m, &["srtf", "gpu_work_ms"]).or(get(m, &["fifo", "gpu_work_ms"])),
            0
        )
    );
}

fn counts_first(c: &Value) -> u64 {
    c["be_counts"]
        .as_array()
        .and_then(|a| a.first())
        .and_then(Value::as_u64)
        .unwrap_or(0)
}

/// The element-wise median of several results of the same shape.
pub fn median_of(values: &[Value]) -> Value {
    let Some(first) = values.first() else {
        return Value::Null;
    };
    match first {
        Value::Object(map) => Value::Object(
            map.keys()
                .map(|k| {
                    let column: Vec<Value> =
                        values.iter().filter_map(|v| v.get(k).cloned()).collect();
                    (k.clone(), median_of(&column))
                })
                .collect(),
        ),
        Value::Number(_) => {
            let mut xs: Vec<f64> = values.iter().filter_map(Value::as_f64).collect();
            serde_json::json!(crate::workload::median(&mut xs))
        }
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::table::tables;

    #[test]
    fn the_median_of_two_rounds_is_their_mean() {
        let rounds = [
            json!({ "p99_ms": 1.0, "n": 3 }),
            json!({ "p99_ms": 0.5, "n": 5 }),
        ];
        assert_eq!(median_of(&rounds), json!({ "p99_ms": 0.75, "n": 4.0 }));
        let three = [json!(3.0), json!(1.0), json!(2.0)];
        assert_eq!(median_of(&three), json!(2.0));
    }

    /// A results document with every scenario, a failed trace policy whose message holds a
    /// `|`, and a failed colocate setup.
    fn every_scenario() -> Value {
        let launch = json!({
            "direct": { "async_launches_per_s": 300000.0, "sync_p50_us": 8.5,
                        "sync_p99_us": 14.0, "sync_mean_us": 8.9 },
            "gpushare": { "async_launches_per_s": 280000.0, "sync_p50_us": 9.5,
                          "sync_p99_us": 16.0, "sync_mean_us": 9.9 },
            "mps": { "async_launches_per_s": 290000.0, "sync_p50_us": 8.6,
                     "sync_p99_us": 15.0, "sync_mean_us": 9.0 },
        });
        let mut copy = json!({});
        for mode in ["direct", "gpushare", "mps"] {
            for kind in ["pinned", "pageable"] {
                for (label, _) in COPY_SIZES {
                    copy[mode][kind][label] = json!({ "htod_gbps": 50.0, "dtoh_gbps": 51.0 });
                }
            }
        }
        let mut iteration = json!({ "direct": {}, "gpushare": {}, "mps": {} });
        for it in crate::workload::iterations() {
            for (mode, ms) in [("direct", 0.5), ("gpushare", 0.51), ("mps", 0.52)] {
                iteration[mode][it.name] = json!({ "mean_ms": ms });
            }
        }
        json!({
            "machine": "a test machine",
            "rounds": 3,
            "broker_args": ["--no-telemetry"],
            "results": {
                "launch": launch,
                "copy": copy,
                "probe": { "direct": { "launch_us": 3.7, "event_record_us": 1.2 } },
                "iteration": iteration,
                "trace": {
                    "jobs": 24,
                    "policies": ["fifo", "srtf", "pack"],
                    "median": {
                        "fifo": { "mean_jct_ms": 360.0, "mean_jct_short_ms": 170.0,
                                  "p50_jct_ms": 216.0, "max_jct_ms": 900.0,
                                  "makespan_ms": 1600.0, "gpu_work_ms": 1289.0 },
                        "srtf": { "mean_jct_ms": 280.0, "iteration_p50_us": 1258.0,
                                  "launch_p50_us": 3.0, "sync_p50_us": 1247.0,
                                  "end_iteration_p50_us": 5.0 },
                        "pack": { "error": "worker exited | status 1" },
                    },
                },
                "colocate": {
                    "high_workload": "mlp_infer",
                    "hp_gap_ms": 2.0,
                    "be_workloads": ["mlp_train", "transformer"],
                    "be_counts": [1, 4],
                    "sm_shares": [1.0, 0.25],
                    "seconds": 5,
                    "scheduler": "priority",
                    "rounds": [{
                        "1 best-effort, gpushare": { "high": { "worst": [
                            "2.280 ms at 1534 ms (service 2.270, idle 0.00 before)",
                            "0.900 ms at 20 ms (service 0.890, idle 12.40 before)" ] } },
                        "1 best-effort, time-slicing": { "high": { "worst": [
                            "9.000 ms at 5 ms (service 9.000)" ] } },
                        "dedicated": { "high": { "worst": [
                            "0.500 ms at 30 ms (service 0.490, idle 0.10 before)" ] } },
                    }],
                    "median": {
                        "dedicated": { "high": { "p50_ms": 0.16, "p99_ms": 0.27,
                                                 "requests": 100.0, "offered": 100.0 } },
                        "gpushare alone": { "high": { "p50_ms": 0.16, "p99_ms": 0.35,
                                                      "requests": 100.0, "offered": 100.0 } },
                        "standalone mlp_train": { "be": { "it_per_s": 1582.0 } },
                        "standalone transformer": { "be": { "it_per_s": 1352.0 } },
                        "1 best-effort, time-slicing": {
                            "high": { "p50_ms": 0.8, "p99_ms": 4.0, "requests": 90.0,
                                      "offered": 100.0 },
                            "be0": { "it_per_s": 1200.0 } },
                        "1 best-effort, mps": {
                            "high": { "p50_ms": 0.6, "p99_ms": 2.0, "requests": 100.0,
                                      "offered": 100.0 },
                            "be0": { "it_per_s": 1500.0 } },
                        "1 best-effort, gpushare": {
                            "high": { "p50_ms": 0.2, "p99_ms": 0.5, "requests": 100.0,
                                      "offered": 100.0 },
                            "be0": { "it_per_s": 1000.0 } },
                        "1 best-effort, gpushare, BE on 25% of SMs": {
                            "error": "no green contexts | whole GPU" },
                        "4 best-effort, gpushare": {
                            "high": { "p50_ms": 0.3, "p99_ms": 0.8, "requests": 100.0,
                                      "offered": 100.0 },
                            "be0": { "it_per_s": 400.0 }, "be1": { "it_per_s": 300.0 },
                            "be2": { "it_per_s": 400.0 }, "be3": { "it_per_s": 300.0 } },
                    },
                },
            },
        })
    }

    #[test]
    fn every_table_of_the_report_renders() {
        let md = markdown(&every_scenario());
        let found = tables(&md);
        let headers: Vec<&str> = found.iter().map(|(h, _)| h[0].as_str()).collect();
        // launch, pinned and pageable copies, probe, trace, colocate with 1 and 4 best-effort
        // clients, iteration.
        assert_eq!(
            headers,
            ["", "", "", "call", "policy", "setup", "setup", ""],
            "{md}"
        );
        let rows = |i: usize| found[i].1.iter().map(|r| r[0].as_str()).collect::<Vec<_>>();
        assert_eq!(rows(0)[0], "async launches / s");
        assert_eq!(rows(1).len(), 2 * COPY_SIZES.len());
        assert_eq!(rows(4), ["fifo", "srtf", "pack"]);
        assert_eq!(found[4].1[2][1], "FAILED: \"worker exited \\| status 1\"");
        assert_eq!(
            rows(5),
            [
                "dedicated",
                "gpushare alone",
                "1 best-effort, time-slicing",
                "1 best-effort, mps",
                "1 best-effort, gpushare"
            ]
        );
        assert_eq!(rows(6), ["dedicated", "4 best-effort, gpushare"]);
        // Each round's slowest requests through gpushare, and no other setup's.
        assert!(
            md.contains(
                "- 1 best-effort, gpushare, round 1: 2.280 ms at 1534 ms (service 2.270, idle 0.00 before); \
                 0.900 ms at 20 ms (service 0.890, idle 12.40 before)"
            ),
            "{md}"
        );
        assert!(!md.contains("9.000 ms"), "{md}");
        // The client alone, dedicated, once (under the first table), for the same arrivals.
        assert_eq!(
            md.matches("- dedicated, round 1: 0.500 ms at 30 ms")
                .count(),
            1,
            "{md}"
        );
        assert_eq!(rows(7).len(), crate::workload::iterations().len());
        // A failed setup is listed before the paragraph that follows it, with a blank line
        // between, so the paragraph does not continue the list item.
        assert!(
            md.contains("whole GPU\"\n\nStandalone best-effort throughput"),
            "{md}"
        );
    }
}

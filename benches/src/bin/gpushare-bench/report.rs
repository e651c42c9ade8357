//! Markdown tables from the results, with gpushare/direct and MPS/direct ratios.

use std::fmt::Write;

use serde_json::Value;

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

/// One table row: label, the three modes' values, and the two ratios to direct.
fn row(out: &mut String, label: &str, r: &Value, path: &[&str], digits: usize) {
    let d = get(&r["direct"], path);
    let g = get(&r["gpushare"], path);
    let m = get(&r["mps"], path);
    let _ = writeln!(
        out,
        "| {label} | {} | {} | {} | {} | {} |",
        fmt(d, digits),
        fmt(g, digits),
        fmt(m, digits),
        ratio(g, d),
        ratio(m, d)
    );
}

const HEAD: &str =
    "| | direct | gpushare | MPS | gpushare / direct | MPS / direct |\n|---|---|---|---|---|---|\n";

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
        let _ = writeln!(out, "\n### launch (empty kernel)\n\n{HEAD}");
        row(
            &mut out,
            "async launches / s",
            r,
            &["async_launches_per_s"],
            0,
        );
        row(&mut out, "launch + sync p50 (µs)", r, &["sync_p50_us"], 2);
        row(&mut out, "launch + sync p99 (µs)", r, &["sync_p99_us"], 2);
        row(&mut out, "launch + sync mean (µs)", r, &["sync_mean_us"], 2);
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
            let _ = writeln!(out, "\n### copy, {what}: GB/s\n\n{HEAD}");
            for (label, _) in COPY_SIZES {
                row(
                    &mut out,
                    &format!("{label} H→D"),
                    r,
                    &[kind, label, "htod_gbps"],
                    2,
                );
                row(
                    &mut out,
                    &format!("{label} D→H"),
                    r,
                    &[kind, label, "dtoh_gbps"],
                    2,
                );
            }
        }
    }
    if let Some(r) = results.get("probe").and_then(|r| r.get("direct")) {
        let _ = writeln!(
            out,
            "\n### probe: single driver calls, median µs (direct)\n\n| call | µs |\n|---|---|"
        );
        for (k, v) in r.as_object().into_iter().flatten() {
            let _ = writeln!(out, "| {k} | {} |", fmt(v.as_f64(), 2));
        }
    }
    if let Some(t) = results.get("trace") {
        trace(&mut out, t);
    }
    if let Some(c) = results.get("colocate") {
        colocate(&mut out, c);
    }
    if let Some(r) = results.get("iteration") {
        let _ = writeln!(
            out,
            "\n### iteration: ms per iteration (mean; p50 in JSON)\n\n{HEAD}"
        );
        for it in crate::workload::iterations() {
            row(&mut out, it.what, r, &[it.name, "mean_ms"], 3);
        }
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
    for (key, v) in m.as_object().into_iter().flatten() {
        if let Some(e) = v.get("error") {
            let _ = writeln!(out, "- {key}: FAILED: {e}");
        }
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
        "Standalone best-effort throughput (direct CUDA, alone):"
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
    for n in counts {
        let _ = writeln!(
            out,
            "\n{n} best-effort client(s):\n\n| setup | HP p50 ms | HP p99 ms | HP p99 / dedicated | \
             HP served / offered | BE it/s each | BE / standalone (sum) | total (HP served + BE sum) |\n\
             |---|---|---|---|---|---|---|---|"
        );
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
            let _ = writeln!(
                out,
                "| {key} | {} | {} | {} | {} | {} | {} | {} |",
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
            );
        }
    }
}

/// The trace table: mean JCT per policy and its ratio to SRTF's.
fn trace(out: &mut String, t: &Value) {
    let m = &t["median"];
    let srtf = get(m, &["srtf", "mean_jct_ms"]);
    let _ = writeln!(
        out,
        "\n### trace: {} jobs arriving online (Salus-style), job completion time\n\n\
         | policy | mean JCT ms | mean JCT, short jobs ms | p50 JCT ms | max JCT ms | makespan ms | mean JCT / SRTF's | iteration p50 µs (launch / sync / end) |\n\
         |---|---|---|---|---|---|---|---|",
        t["jobs"]
    );
    for policy in t["policies"].as_array().into_iter().flatten() {
        let Some(p) = policy.as_str() else { continue };
        let v = &m[p];
        if let Some(e) = v.get("error") {
            let _ = writeln!(out, "| {p} | FAILED: {e} | | | | | | |");
            continue;
        }
        let mean = get(v, &["mean_jct_ms"]);
        let _ = writeln!(
            out,
            "| {p} | {} | {} | {} | {} | {} | {} | {} ({} / {} / {}) |",
            fmt(mean, 1),
            fmt(get(v, &["mean_jct_short_ms"]), 1),
            fmt(get(v, &["p50_jct_ms"]), 1),
            fmt(get(v, &["max_jct_ms"]), 1),
            fmt(get(v, &["makespan_ms"]), 1),
            ratio(mean, srtf),
            fmt(get(v, &["iteration_p50_us"]), 0),
            fmt(get(v, &["launch_p50_us"]), 0),
            fmt(get(v, &["sync_p50_us"]), 0),
            fmt(get(v, &["end_iteration_p50_us"]), 0),
        );
    }
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
            serde_json::json!(crate::workload::percentile(&mut xs, 50.0))
        }
        other => other.clone(),
    }
}

//! `gpushare-demo`: a client that runs verified vector adds and GEMMs through the broker and
//! prints a one-line summary. Several of them in different classes make the README's demo and
//! the multi-client tests.

use std::process::ExitCode;
use std::time::Instant;

use clap::{Parser, ValueEnum};
use gpushare::{Client, ConnectOptions, Kernel, PriorityClass};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Workload {
    /// c = a + b, then y += 2·a, checked element by element.
    Vecadd,
    /// C = A·B checked against a host reference.
    Gemm,
    /// Both, alternating.
    Mixed,
}

/// A gpushare demo client that checks its own results.
#[derive(Debug, Parser)]
#[command(name = "gpushare-demo", version, about)]
struct Args {
    /// Name shown in `gpushare status`.
    #[arg(long, default_value = "demo")]
    name: String,
    /// Ask for this class (a client can only lower the class its policy grants).
    #[arg(long, value_parser = parse_class)]
    class: Option<PriorityClass>,
    #[arg(long, value_enum, default_value_t = Workload::Mixed)]
    workload: Workload,
    #[arg(long, default_value_t = 50)]
    iterations: u32,
    /// Vector length; GEMMs are about sqrt(size) on a side.
    #[arg(long, default_value_t = 65536)]
    size: usize,
    /// Print the summary as JSON.
    #[arg(long)]
    json: bool,
}

fn parse_class(s: &str) -> Result<PriorityClass, String> {
    s.parse()
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(summary) => {
            if args.json {
                println!("{}", serde_json::to_string(&summary).unwrap_or_default());
            } else {
                println!(
                    "{} (client {}, class {}): {} iterations, {} vector adds and {} GEMMs verified, {} mismatches, {:.2} s wall, {} device elapsed",
                    args.name,
                    summary["client_id"],
                    summary["class"].as_str().unwrap_or("?"),
                    summary["iterations"],
                    summary["vecadds"],
                    summary["gemms"],
                    summary["mismatches"],
                    summary["wall_s"].as_f64().unwrap_or(0.0),
                    summary["device_time"].as_str().unwrap_or("?"),
                );
            }
            if summary["mismatches"].as_u64() == Some(0) {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("gpushare-demo {}: {e:#}", args.name);
            ExitCode::FAILURE
        }
    }
}

fn pattern(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 1000) as f32 / 100.0)
        .collect()
}

fn run(args: &Args) -> anyhow::Result<serde_json::Value> {
    let client = Client::connect_with(ConnectOptions {
        name: args.name.clone(),
        class: args.class,
        ..Default::default()
    })?;
    let session = client.session().clone();
    let stream = client.create_stream()?;
    let start_event = client.create_event()?;
    let end_event = client.create_event()?;
    let started = Instant::now();
    start_event.record(&stream)?;

    let n = args.size.max(1);
    let a = client.alloc::<f32>(n)?;
    let b = client.alloc::<f32>(n)?;
    let c = client.alloc::<f32>(n)?;
    let side = ((n as f64).sqrt() as usize).clamp(1, 256);
    let ga = client.alloc::<f32>(side * side)?;
    let gb = client.alloc::<f32>(side * side)?;
    let gc = client.alloc::<f32>(side * side)?;

    let (mut vecadds, mut gemms, mut mismatches) = (0u64, 0u64, 0u64);
    for it in 0..args.iterations {
        let do_vec = matches!(args.workload, Workload::Vecadd)
            || (args.workload == Workload::Mixed && it % 2 == 0);
        if do_vec {
            let (ha, hb) = (pattern(n, it), pattern(n, it + 7));
            a.copy_from_host(&ha)?;
            b.copy_from_host(&hb)?;
            stream.launch(Kernel::VecAddF32 {
                a: a.ptr(),
                b: b.ptr(),
                c: c.ptr(),
                n: n as u64,
            })?;
            stream.launch(Kernel::AxpyF32 {
                x: a.ptr(),
                y: c.ptr(),
                n: n as u64,
                alpha: 2.0,
            })?;
            stream.synchronize()?;
            let got = c.to_vec()?;
            mismatches += got
                .iter()
                .zip(ha.iter().zip(&hb))
                .filter(|(g, (x, y))| **g != *x + *y + 2.0 * *x)
                .count() as u64;
            vecadds += 1;
        } else {
            let (ha, hb) = (pattern(side * side, it), pattern(side * side, it + 3));
            ga.copy_from_host(&ha)?;
            gb.copy_from_host(&hb)?;
            let s = side as u32;
            stream.launch(Kernel::GemmF32 {
                a: ga.ptr(),
                b: gb.ptr(),
                c: gc.ptr(),
                m: s,
                n: s,
                k: s,
                alpha: 1.0,
                beta: 0.0,
            })?;
            stream.synchronize()?;
            let got = gc.to_vec()?;
            for i in 0..side {
                for j in 0..side {
                    let want: f64 = (0..side)
                        .map(|p| ha[i * side + p] as f64 * hb[p * side + j] as f64)
                        .sum();
                    let g = got[i * side + j] as f64;
                    if (g - want).abs() > 1e-3 * want.abs().max(1.0) {
                        mismatches += 1;
                    }
                }
            }
            gemms += 1;
        }
    }
    end_event.record(&stream)?;
    stream.synchronize()?;
    let device_ns = end_event.elapsed_since(&start_event)?.as_nanos() as u64;
    Ok(serde_json::json!({
        "name": args.name,
        "client_id": session.client_id,
        "class": session.class.as_str(),
        "backend": session.backend,
        "iterations": args.iterations,
        "vecadds": vecadds,
        "gemms": gemms,
        "mismatches": mismatches,
        "wall_s": started.elapsed().as_secs_f64(),
        "device_time_ns": device_ns,
        "device_time": format!("{:.2} ms", device_ns as f64 / 1e6),
    }))
}

//! The same work through a real `gpushared` with the gpushare client library.

use std::time::Instant;

use anyhow::Result;
use gpushare::{Client, ConnectOptions, ModuleFormat};
use gpushare_broker::device::cuda::BUILTIN_PTX;
use gpushare_protocol::Kernel;
use serde_json::{Value, json};

use crate::workload::{self, COPY_SIZES};

fn connect(host_buffers: u64) -> Result<Client> {
    Ok(Client::connect_with(ConnectOptions {
        name: "gpushare-bench".into(),
        host_buffers,
        ..Default::default()
    })?)
}

pub fn launch(quick: bool) -> Result<Value> {
    let client = connect(0)?;
    // With GPUSHARE_BENCH_COMPANION set, an idle second client shares the GPU, so a
    // scheduling policy other than FIFO gates every launch (a lone client is not gated).
    let _companion = match std::env::var_os("GPUSHARE_BENCH_COMPANION") {
        Some(_) => Some(connect(0)?),
        None => None,
    };
    let stream = client.create_stream()?;
    let module = client.load_module(ModuleFormat::Ptx, BUILTIN_PTX.as_bytes())?;
    let f = module.function("gpushare_empty")?;
    let launch = || Ok(client.launch_function(&stream, &f, [1, 1, 1], [1, 1, 1], 0, &[])?);
    workload::measure_launches(quick, launch, || Ok(stream.synchronize()?))
}

pub fn copy(quick: bool) -> Result<Value> {
    let max = COPY_SIZES.iter().map(|s| s.1).max().unwrap_or(0);
    let client = connect(max as u64)?;
    let stream = client.create_stream()?;
    let dev = client.alloc::<u8>(max)?;
    let mut host = client.host_buffer(max)?;
    host.as_mut_slice().fill(0x5a);
    let mut pageable = vec![0x5au8; max];
    let mut pinned_out = serde_json::Map::new();
    let mut pageable_out = serde_json::Map::new();
    for (label, size) in COPY_SIZES {
        let reps = workload::copy_reps(size, quick);
        let time = |f: &dyn Fn() -> Result<()>| -> Result<f64> {
            f()?;
            stream.synchronize()?;
            let t = Instant::now();
            for _ in 0..reps {
                f()?;
            }
            stream.synchronize()?;
            Ok((size * reps) as f64 / t.elapsed().as_secs_f64() / 1e9)
        };
        let htod = time(&|| {
            Ok(client.copy_host_buffer_range_to_device(&stream, &host, 0..size, dev.ptr())?)
        })?;
        let dtoh = time(&|| {
            Ok(client.copy_device_to_host_buffer_range(&stream, dev.ptr(), &host, 0..size)?)
        })?;
        pinned_out.insert(label.into(), json!({"htod_gbps": htod, "dtoh_gbps": dtoh}));
        let htod =
            time(&|| Ok(client.copy_to_device_raw(stream.id(), dev.ptr(), &pageable[..size])?))?;
        let dst = pageable.as_mut_ptr() as usize;
        let dtoh = time(&|| {
            // SAFETY: `dst` is `pageable`, alive and not otherwise borrowed during the loop.
            let slice = unsafe { std::slice::from_raw_parts_mut(dst as *mut u8, size) };
            Ok(client.copy_to_host_raw(stream.id(), slice, dev.ptr())?)
        })?;
        pageable_out.insert(label.into(), json!({"htod_gbps": htod, "dtoh_gbps": dtoh}));
    }
    drop(pageable);
    Ok(json!({"pinned": pinned_out, "pageable": pageable_out}))
}

/// Allocates an iteration's buffers through `client`, zeroed, and builds its kernels (the
/// buffers must outlive the kernels' use).
pub fn prepare_iteration(
    client: &Client,
    stream: &gpushare::Stream,
    it: &workload::Iteration,
) -> Result<(Vec<gpushare::DeviceBuffer<f32>>, Vec<Kernel>)> {
    let buffers: Vec<gpushare::DeviceBuffer<f32>> = it
        .buffers
        .iter()
        .map(|b| client.alloc::<f32>(b.elems))
        .collect::<Result<_, _>>()?;
    for b in &buffers {
        b.memset(stream, 0)?;
    }
    let ptrs: Vec<u64> = buffers.iter().map(|b| b.ptr()).collect();
    let kernels = (it.kernels)(&ptrs);
    Ok((buffers, kernels))
}

pub fn iteration(quick: bool) -> Result<Value> {
    let client = connect(0)?;
    let stream = client.create_stream()?;
    let mut out = serde_json::Map::new();
    for it in workload::iterations() {
        let (_buffers, kernels) = prepare_iteration(&client, &stream, &it)?;
        let run = || -> Result<f64> {
            let t = Instant::now();
            for k in &kernels {
                stream.launch(*k)?;
            }
            stream.synchronize()?;
            Ok(t.elapsed().as_secs_f64() * 1e3)
        };
        out.insert(it.name.into(), workload::time_iterations(quick, run)?);
    }
    Ok(Value::Object(out))
}

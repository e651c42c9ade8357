//! A client that connects with `rebuild` needs no recovery code: after another client's
//! fault the library makes its device state again (same handles, same device addresses) and
//! only the request that met the fault fails, once. Also what happens when an address cannot
//! be had back, and the same through the C ABI. Threads sharing such a client are in
//! `rebuild_threads.rs`.

use std::time::{Duration, Instant};

use gpushare::{
    Client, Command, DeviceBuffer, DevicePtr, Error, ErrorCode, Event, Function, Kernel, Module,
    ModuleFormat, RebuildError, Stream,
};
use gpushare_tests::faults::{Scripted, broker, rebuilding_client, restart_broker, verified_fill};
use gpushare_tests::{Broker, SCALE_ADD_PTX, host_gemm, pattern, test_backend};

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

/// A client with rebuild on is faulted out from under (by another process's kernel, and a
/// gpushared that restarts) and goes on computing the same results with the same handles and
/// addresses; a client without it sees what it always did.
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

    // Without rebuild the session is over.
    assert!(broker.log_contains("restarting gpushared"));
    let e = plain.nop().expect_err("the plain client's session ended");
    assert!(e.is_fatal(), "{e}");
    assert_eq!(plain.rebuilds(), 0);
    drop((plain_buf, culprit));
}

#[test]
fn in_place_a_rebuilding_client_has_nothing_to_rebuild() {
    // In place: the device worker is replaced, its spare mapping every client's memory; the
    // server, idle at the fault, notices nothing.
    let broker = broker(&[]);
    let server = Server::start(&broker);
    let before = server.infer().expect("the server works");
    let handles = server.handles();
    let holder = broker.device_holder();
    let mut culprit = Scripted::start(&broker);
    assert!(culprit.run("connect").starts_with("connected"));
    assert!(culprit.run("illegal").starts_with("error"));
    assert!(gpushare_tests::wait_until(Duration::from_secs(30), || {
        broker.device_holder() != holder && broker.log_contains("device context recreated")
    }));
    for _ in 0..3 {
        assert_same(&server.infer().expect("keeps working"), &before);
    }
    assert_eq!(server.handles(), handles);
    assert_eq!(server.client.rebuilds(), 0, "nothing was lost");
    assert!(!broker.log_contains("restarting gpushared"));
}

#[test]
fn across_a_restart_a_rebuilding_client_reconnects_and_rebuilds_by_itself() {
    // gpushared holding the context itself restarts after a fault (the sim device behaves
    // like the CUDA driver there).
    let broker = restart_broker();
    a_rebuilding_client_survives(&broker, "restart");
    assert!(broker.log_contains("restarting gpushared"));
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
    // Only a restart loses memory (in place, nothing is rebuilt).
    let broker = restart_broker();
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
    // A restart loses the device state, which the client rebuilds.
    let broker = restart_broker();
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

//! The device worker process (`gpushared --device-worker`): it opens one device (a GPU
//! through CUDA, or the sim device), holds its context, and runs the device calls gpushared
//! sends it, one thread per channel. It holds nothing else: when its context is lost to a
//! fault, gpushared kills it and a spare takes its place, while the sessions, the sockets and
//! the telemetry live on in gpushared.

use std::collections::HashMap;
use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use gpushare_protocol::control::{decode_prefix, encode_into};
use gpushare_protocol::socket::{recv_message, send_message};

mod execute;

use self::execute::failed;

use super::channel::{Next, WorkerEnd};
use super::process::WORKER_FD_ENV;
use super::wire::{
    Answer, Envelope, FromWorker, Handle, Payload, Span, ToWorker, WorkerBackend, WorkerSpec,
};
use crate::device::cuda::CudaDevice;
use crate::device::sim::{SimDevice, SimOptions};
use crate::device::{Device, DeviceError, DeviceResult};
use crate::shm::{ArenaSlice, HostRegion};

/// How long a channel thread waits for a region or blob that the control socket is still
/// bringing (gpushared sends it, and waits for its acknowledgement, first; this is a bound).
const ARRIVAL_WAIT: Duration = Duration::from_secs(5);

/// Runs the worker; never returns.
pub fn run() -> ! {
    let code = match start() {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("gpushared device worker: {e}");
            1
        }
    };
    std::process::exit(code)
}

fn start() -> Result<(), String> {
    // Started as /proc/self/exe, it would be called `exe` in ps and top.
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes, which this is.
    unsafe { libc::prctl(libc::PR_SET_NAME, c"gpushare-worker".as_ptr()) };
    let raw: i32 = std::env::var(WORKER_FD_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("{WORKER_FD_ENV} does not name a descriptor"))?;
    // SAFETY: gpushared passed us this descriptor, open across exec, and nothing else here
    // owns it.
    let control = unsafe { OwnedFd::from_raw_fd(raw) };
    let spec = match recv_message::<ToWorker>(control.as_fd()) {
        Ok((ToWorker::Start(spec), _)) => spec,
        Ok((other, _)) => return Err(format!("expected a start message, got {other:?}")),
        Err(e) => return Err(format!("no start message: {e}")),
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(&spec.log))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colours only on a terminal: a log file or the journal gets plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
    let span = tracing::info_span!("worker", device = %spec.label);
    let _entered = span.enter();
    if let Some(k) = &spec.builtins {
        crate::device::cuda::adopt_builtins(k.cc, k.ptx.clone());
    }
    match spec.backend {
        WorkerBackend::Cuda { ordinal } => match CudaDevice::open(ordinal) {
            Ok(device) => {
                if spec.fault_injection
                    && let Err(e) = device.prepare_fault_injection()
                {
                    tracing::warn!(error = %e, "cannot load the fault-injection kernels");
                }
                serve(device, control, &spec)
            }
            Err(e) => {
                let reason = e.to_string();
                let _ = send_message(
                    control.as_fd(),
                    &FromWorker::Failed {
                        reason: reason.clone(),
                    },
                    &[],
                );
                Err(reason)
            }
        },
        WorkerBackend::Sim {
            index,
            memory,
            realtime,
        } => serve(
            SimDevice::new(SimOptions {
                index,
                memory,
                realtime,
                ..SimOptions::default()
            }),
            control,
            &spec,
        ),
    }
}

/// A stream slot: taken out when the stream is destroyed.
type StreamSlot<S> = Arc<Mutex<Option<S>>>;

/// Everything the worker made for gpushared, by handle.
struct Worker<D: Device> {
    device: D,
    next: AtomicU64,
    streams: Mutex<HashMap<Handle, StreamSlot<D::Stream>>>,
    events: Mutex<HashMap<Handle, Arc<Mutex<D::Event>>>>,
    modules: Mutex<HashMap<Handle, Arc<D::Module>>>,
    functions: Mutex<HashMap<Handle, Arc<D::Function>>>,
    /// Client memory gpushared shares with us, by region id; and payloads too big for a
    /// channel, by blob id.
    regions: Mutex<HashMap<u64, Arc<HostRegion>>>,
    blobs: Mutex<HashMap<u64, Arc<HostRegion>>>,
    arrived: Condvar,
    stop: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs a little of everything a client's first requests need (a stream, memory, a built-in
/// kernel, cuBLAS), so that a spare taking over after a fault answers its first clients as
/// fast as a worker that has served for a while. It gives everything back, leaving no
/// memory held (rebuilding clients want their old addresses free).
fn warm_up<D: Device>(device: &D) {
    let started = std::time::Instant::now();
    let warmed = (|| -> DeviceResult<()> {
        let mut stream = device.create_stream(gpushare_protocol::PriorityClass::Normal)?;
        let ran = device.alloc(1 << 20).and_then(|buf| {
            let ran = (|| {
                device.launch(
                    &mut stream,
                    &gpushare_protocol::Kernel::FillF32 {
                        dst: buf,
                        n: 1 << 16,
                        value: 0.0,
                    },
                )?;
                // Zeros in bf16 too; the product lands in the buffer's second half.
                device.launch(
                    &mut stream,
                    &gpushare_protocol::Kernel::GemmBf16 {
                        a: buf,
                        b: buf,
                        c: buf + (512 << 10),
                        m: 64,
                        n: 64,
                        k: 64,
                        alpha: 1.0,
                        beta: 0.0,
                    },
                )?;
                device.sync_stream(&mut stream)
            })();
            let _ = device.free(buf);
            ran
        });
        device.destroy_stream(stream);
        ran
    })();
    match warmed {
        Ok(()) => tracing::debug!(took = ?started.elapsed(), "device warmed up"),
        Err(e) => {
            tracing::debug!(error = %e, took = ?started.elapsed(), "device warm-up cut short")
        }
    }
}

fn serve<D: Device>(device: D, control: OwnedFd, spec: &WorkerSpec) -> Result<(), String> {
    let ready = FromWorker::Ready {
        info: device.info().clone(),
        backend: device.backend().to_string(),
        sm_partitions: device.sm_partitions(),
        builtins: crate::device::cuda::compiled_builtins()
            .map(|(cc, ptx)| super::wire::BuiltinKernels { cc, ptx }),
    };
    send_message(control.as_fd(), &ready, &[]).map_err(|e| e.to_string())?;
    tracing::debug!(label = %spec.label, "device worker ready");
    let worker = Arc::new(Worker {
        device,
        next: AtomicU64::new(1),
        streams: Mutex::default(),
        events: Mutex::default(),
        modules: Mutex::default(),
        functions: Mutex::default(),
        regions: Mutex::default(),
        blobs: Mutex::default(),
        arrived: Condvar::new(),
        stop: AtomicBool::new(false),
    });
    // Beside serving, not before: a spare is ready to take over as soon as its context is
    // made, and warms up while it waits.
    {
        let worker = worker.clone();
        let _ = std::thread::Builder::new()
            .name("gpushare-warm-up".into())
            .spawn(move || warm_up(&worker.device));
    }
    loop {
        let (msg, mut fds) = match recv_message::<ToWorker>(control.as_fd()) {
            Ok(m) => m,
            // gpushared is gone (or said something we cannot read): nothing left to serve.
            Err(_) => {
                worker.stop.store(true, Ordering::Release);
                return Ok(());
            }
        };
        let answer = match worker.control(msg, fds.pop()) {
            Ok(()) => FromWorker::Ack,
            Err(reason) => FromWorker::Refused { reason },
        };
        if send_message(control.as_fd(), &answer, &[]).is_err() {
            worker.stop.store(true, Ordering::Release);
            return Ok(());
        }
    }
}

impl<D: Device> Worker<D> {
    /// One control message.
    fn control(self: &Arc<Self>, msg: ToWorker, fd: Option<OwnedFd>) -> Result<(), String> {
        let need_fd =
            |fd: Option<OwnedFd>| fd.ok_or_else(|| "no descriptor came with it".to_string());
        match msg {
            ToWorker::Start(_) => Err("already started".into()),
            ToWorker::OpenChannel { id } => {
                let end = WorkerEnd::open(&need_fd(fd)?).map_err(|e| e.to_string())?;
                let worker = self.clone();
                std::thread::Builder::new()
                    .name(format!("gpushare-worker-{id}"))
                    .spawn(move || worker.serve_channel(end))
                    .map(drop)
                    .map_err(|e| format!("cannot start the channel's thread: {e}"))
            }
            ToWorker::ShareMemory { region, len, at } => {
                let mapped = HostRegion::map(&need_fd(fd)?, len, at).map_err(|e| e.to_string())?;
                lock(&self.regions).insert(region, Arc::new(mapped));
                self.arrived.notify_all();
                Ok(())
            }
            ToWorker::UnshareMemory { region } => {
                lock(&self.regions).remove(&region);
                Ok(())
            }
            ToWorker::Blob { id, len } => {
                let mapped = HostRegion::map(&need_fd(fd)?, len, 0).map_err(|e| e.to_string())?;
                lock(&self.blobs).insert(id, Arc::new(mapped));
                self.arrived.notify_all();
                Ok(())
            }
            ToWorker::AddressFloor { end } => {
                crate::device::sim::memory::skip_addresses_below(end);
                Ok(())
            }
        }
    }

    /// Serves one channel until gpushared closes it.
    fn serve_channel(&self, mut end: WorkerEnd) {
        let stop = || self.stop.load(Ordering::Acquire);
        while let Next::Request = end.next(&stop) {
            let Some((request, reply)) = end.areas() else {
                return; // gpushared closed the channel
            };
            let answer = match decode_prefix::<Envelope>(request) {
                Ok((envelope, used)) => self.answer(envelope, &request[used..]),
                Err(e) => failed(DeviceError::InvalidArgument(format!(
                    "a request that does not decode: {e}"
                ))),
            };
            let len = encode_into(&answer, reply).unwrap_or_else(|e| {
                let fallback = failed(DeviceError::Failed(format!(
                    "an answer that does not fit its channel: {e}"
                )));
                encode_into(&fallback, reply).unwrap_or(0)
            });
            end.answer(len);
        }
    }

    fn answer(&self, envelope: Envelope, rest: &[u8]) -> Answer {
        let blob;
        let payload: &[u8] = match envelope.payload {
            Payload::None => &[],
            Payload::Inline(n) => match rest.get(..n as usize) {
                Some(p) => p,
                None => {
                    return failed(DeviceError::InvalidArgument(
                        "a payload longer than its request".into(),
                    ));
                }
            },
            Payload::Blob(id) => {
                blob = match self.take_blob(id) {
                    Ok(b) => b,
                    Err(e) => return failed(e),
                };
                let whole = blob.whole();
                let mut bytes = vec![0u8; whole.len()];
                whole.read_into(&mut bytes);
                return self.run(envelope.request, &bytes);
            }
        };
        self.run(envelope.request, payload)
    }

    fn take_blob(&self, id: u64) -> DeviceResult<Arc<HostRegion>> {
        let blobs = lock(&self.blobs);
        let (mut blobs, _) = self
            .arrived
            .wait_timeout_while(blobs, ARRIVAL_WAIT, |b| !b.contains_key(&id))
            .unwrap_or_else(|e| e.into_inner());
        blobs
            .remove(&id)
            .ok_or_else(|| DeviceError::InvalidArgument(format!("payload {id} never came")))
    }

    fn region(&self, id: u64) -> DeviceResult<Arc<HostRegion>> {
        let regions = lock(&self.regions);
        let (regions, _) = self
            .arrived
            .wait_timeout_while(regions, ARRIVAL_WAIT, |r| !r.contains_key(&id))
            .unwrap_or_else(|e| e.into_inner());
        regions
            .get(&id)
            .cloned()
            .ok_or_else(|| DeviceError::InvalidArgument(format!("memory region {id} unknown")))
    }

    fn slice<'r>(&self, region: &'r HostRegion, span: Span) -> DeviceResult<ArenaSlice<'r>> {
        region
            .slice(span.offset, span.len)
            .ok_or_else(|| DeviceError::InvalidArgument("a copy outside its region".into()))
    }

    fn handle(&self) -> Handle {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    fn stream(&self, id: Handle) -> DeviceResult<StreamSlot<D::Stream>> {
        lock(&self.streams)
            .get(&id)
            .cloned()
            .ok_or_else(|| DeviceError::InvalidArgument(format!("no stream {id}")))
    }

    fn event(&self, id: Handle) -> DeviceResult<Arc<Mutex<D::Event>>> {
        lock(&self.events)
            .get(&id)
            .cloned()
            .ok_or_else(|| DeviceError::InvalidArgument(format!("no event {id}")))
    }

    fn module(&self, id: Handle) -> DeviceResult<Arc<D::Module>> {
        lock(&self.modules)
            .get(&id)
            .cloned()
            .ok_or_else(|| DeviceError::InvalidArgument(format!("no module {id}")))
    }

    fn function(&self, id: Handle) -> DeviceResult<Arc<D::Function>> {
        lock(&self.functions)
            .get(&id)
            .cloned()
            .ok_or_else(|| DeviceError::InvalidArgument(format!("no function {id}")))
    }
}

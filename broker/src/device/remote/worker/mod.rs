//! The device worker process (`gpushared --device-worker`): it opens one device (a GPU
//! through CUDA, or the sim device), holds its context, and runs the device calls gpushared
//! sends it on its [`Executor`], one thread per channel. It holds nothing else: when its context is lost to a
//! fault, gpushared kills it and a spare takes its place, while the sessions, the sockets and
//! the telemetry live on in gpushared.

use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use gpushare_protocol::control::{decode_prefix, encode_into};
use gpushare_protocol::socket::{recv_message, send_message};

use super::channel::{Next, WorkerEnd};
use super::process::WORKER_FD_ENV;
use super::wire::{Envelope, FromWorker, Payload, ToWorker, WorkerBackend, WorkerSpec};
use crate::device::call::Answer;
use crate::device::cuda::CudaDevice;
use crate::device::link::Space;
use crate::device::sim::{SimDevice, SimOptions};
use crate::device::{Backend, DeviceError, DeviceResult, Executor};

mod warm;
mod zone;

pub(crate) use self::zone::ZONE_START;

use self::warm::{Warmed, waits_for_warm_up, warm_up};

/// Runs the worker; never returns.
pub fn run() -> ! {
    let code = match start() {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("gpushared device worker: {e}");
            1
        }
    };
    crate::timeline::flush();
    std::process::exit(code)
}

fn start() -> Result<(), String> {
    // A terminal's hangup or Ctrl-C, or a signal to gpushared's process group, reaches the
    // workers too: gpushared answers those (a reload, a drained stop, which ends its workers
    // by closing their sockets), so a worker must not die of them with clients' work on it.
    for sig in [libc::SIGHUP, libc::SIGINT] {
        // SAFETY: setting a signal's disposition to SIG_IGN touches no memory of ours.
        unsafe { libc::signal(sig, libc::SIG_IGN) };
    }
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
    crate::device::cuda::compile_builtins_anyway();
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

/// The worker: its executor, and whether gpushared is gone.
struct Worker<B: Backend> {
    executor: Executor<B>,
    stop: AtomicBool,
    warmed: Warmed,
}

/// The first `len` bytes of a payload memfd (whole pages long: see
/// `calls::payload_memfd`).
fn read_payload(fd: &OwnedFd, len: u64) -> Result<Vec<u8>, String> {
    let pages = len.div_ceil(4096) * 4096;
    let region = crate::shm::HostRegion::map(fd, pages, 0).map_err(|e| e.to_string())?;
    let whole = region.whole();
    let mut bytes = vec![0u8; whole.len()];
    whole.read_into(&mut bytes);
    bytes.truncate(len as usize);
    Ok(bytes)
}

/// Where to map a client's region that may go anywhere (`at` 0): the zone.
fn zone_if_anywhere(at: u64, len: u64) -> u64 {
    if at == 0 { zone::place(len) } else { at }
}

/// Reserves the address range clients' memory lives at: where the worker this one may
/// replace has it, or (the first) where gpushared prefers if that is free, else where the
/// driver likes.
fn reserve<B: Backend>(device: &B, spec: &WorkerSpec) -> DeviceResult<Space> {
    let granularity = device.granularity()?;
    let size = spec
        .space
        .map_or_else(|| Space::size_for(device.info().total_memory), |s| s.size);
    let base = match (spec.space, spec.prefer_base) {
        (Some(s), _) => device.reserve(s.base, size)?,
        (None, Some(at)) => match device.reserve(at.next_multiple_of(granularity.max(1)), size) {
            Ok(base) => base,
            Err(_) => device.reserve(0, size)?,
        },
        (None, None) => device.reserve(0, size)?,
    };
    Ok(Space {
        base,
        size,
        granularity,
    })
}

fn serve<B: Backend>(device: B, control: OwnedFd, spec: &WorkerSpec) -> Result<(), String> {
    let space = match reserve(&device, spec) {
        Ok(s) => s,
        Err(e) => {
            let reason = format!("cannot reserve the address range for clients' memory: {e}");
            let _ = send_message(
                control.as_fd(),
                &FromWorker::Failed {
                    reason: reason.clone(),
                },
                &[],
            );
            return Err(reason);
        }
    };
    let ready = FromWorker::Ready {
        space,
        info: device.info().clone(),
        backend: device.backend().to_string(),
        sm_partitions: device.sm_partitions(),
        builtins: crate::device::cuda::compiled_builtins()
            .map(|(cc, ptx)| super::wire::BuiltinKernels { cc, ptx }),
    };
    send_message(control.as_fd(), &ready, &[]).map_err(|e| e.to_string())?;
    tracing::debug!(label = %spec.label, "device worker ready");
    let worker = Arc::new(Worker {
        executor: Executor::new(device),
        stop: AtomicBool::new(false),
        warmed: Warmed::default(),
    });
    // Beside serving, not before: a spare is ready to take over as soon as its context is
    // made, and warms up while it waits. Modules wait for it (`Warmed`).
    {
        let warming = worker.clone();
        let spawned = std::thread::Builder::new()
            .name("gpushare-warm-up".into())
            .spawn(move || {
                warm_up(warming.executor.backend());
                warming.warmed.set();
            });
        if spawned.is_err() {
            worker.warmed.set();
        }
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
        let (answer, fd) = match worker.control(msg, fds.pop()) {
            Ok(Some(fd)) => (FromWorker::Chunk, Some(fd)),
            Ok(None) => (FromWorker::Ack, None),
            Err(reason) => (FromWorker::Refused { reason }, None),
        };
        let raw: Vec<_> = fd.iter().map(|f| f.as_raw_fd()).collect();
        if send_message(control.as_fd(), &answer, &raw).is_err() {
            worker.stop.store(true, Ordering::Release);
            return Ok(());
        }
    }
}

impl<B: Backend> Worker<B> {
    /// One control message; a chunk made answers with its descriptor.
    fn control(
        self: &Arc<Self>,
        msg: ToWorker,
        fd: Option<OwnedFd>,
    ) -> Result<Option<OwnedFd>, String> {
        let need_fd =
            |fd: Option<OwnedFd>| fd.ok_or_else(|| "no descriptor came with it".to_string());
        match msg {
            ToWorker::Start(_) => Err("already started".into()),
            ToWorker::OpenChannel { id } => {
                let at = zone::place(super::channel::CHANNEL_LEN);
                let end = WorkerEnd::open(&need_fd(fd)?, at).map_err(|e| e.to_string())?;
                let worker = self.clone();
                let name = format!("gpushare-worker-{id}");
                zone::spawn(&name, Box::new(move || worker.serve_channel(end)))
                    .map(|()| None)
                    .map_err(|e| format!("cannot start the channel's thread: {e}"))
            }
            ToWorker::ShareMemory {
                region,
                len,
                at,
                offset,
            } => self
                .executor
                .share_region(
                    region,
                    &need_fd(fd)?,
                    len,
                    zone_if_anywhere(at, len),
                    offset,
                )
                .map(|()| None)
                .map_err(|e| e.to_string()),
            ToWorker::UnshareMemory { region } => {
                self.executor.unshare_region(region);
                Ok(None)
            }
            ToWorker::Blob { id, len } => self
                .executor
                .add_blob(id, &need_fd(fd)?, len, zone::place(len))
                .map(|()| None)
                .map_err(|e| e.to_string()),
            ToWorker::CreateChunk { at, size } => self
                .executor
                .create_chunk(at, size)
                .map(Some)
                .map_err(|e| e.to_string()),
            ToWorker::MakeMemory { size } => self
                .executor
                .make_memory(size)
                .map(Some)
                .map_err(|e| e.to_string()),
            ToWorker::ImportChunk { at, size } => self
                .executor
                .import_chunk(at, size, need_fd(fd)?.as_fd())
                .map(|()| None)
                .map_err(|e| e.to_string()),
            ToWorker::Mirror { call, len } => {
                if waits_for_warm_up(&call) {
                    self.warmed.wait();
                }
                let payload = match fd {
                    Some(fd) if len > 0 => read_payload(&fd, len)?,
                    _ => Vec::new(),
                };
                match self.executor.run(call, &payload).reply.ok() {
                    Ok(_) => Ok(None),
                    Err(e) => Err(e.to_string()),
                }
            }
            ToWorker::ReleaseChunk { at, size } => self
                .executor
                .release_chunk(at, size)
                .map(|()| None)
                .map_err(|e| e.to_string()),
            ToWorker::ReservePeer { base, size } => self
                .executor
                .reserve_peer(base, size)
                .map(|()| None)
                .map_err(|e| e.to_string()),
            ToWorker::ImportPeerChunk { at, size } => self
                .executor
                .import_peer_chunk(at, size, need_fd(fd)?.as_fd())
                .map(|()| None)
                .map_err(|e| e.to_string()),
        }
    }

    /// Serves one channel until gpushared closes it.
    fn serve_channel(&self, mut end: WorkerEnd) {
        let stop = || self.stop.load(Ordering::Acquire);
        while let Next::Request = end.next(&stop) {
            crate::timeline::point("worker", "got");
            let Some(request) = end.request() else {
                return;
            };
            let answer = match decode_prefix::<Envelope>(request) {
                Ok((envelope, used)) => self.answer(envelope, &request[used..]),
                Err(e) => Answer::failed(DeviceError::InvalidArgument(format!(
                    "a call that does not decode: {e}"
                ))),
            };
            let Some(reply) = end.reply() else {
                return; // gpushared closed the channel
            };
            let len = encode_into(&answer, reply).unwrap_or_else(|e| {
                let fallback = Answer::failed(DeviceError::Failed(format!(
                    "an answer that does not fit its channel: {e}"
                )));
                encode_into(&fallback, reply).unwrap_or(0)
            });
            end.answer(len);
            crate::timeline::point("worker", "replied");
        }
    }

    fn answer(&self, envelope: Envelope, rest: &[u8]) -> Answer {
        if waits_for_warm_up(&envelope.call) {
            self.warmed.wait();
        }
        match envelope.payload {
            Payload::None => self.executor.run(envelope.call, &[]),
            Payload::Inline(n) => match rest.get(..n as usize) {
                Some(p) => self.executor.run(envelope.call, p),
                None => Answer::failed(DeviceError::InvalidArgument(
                    "a payload longer than its call".into(),
                )),
            },
            Payload::Blob(id) => match self.executor.take_blob(id) {
                Ok(bytes) => self.executor.run(envelope.call, &bytes),
                Err(e) => Answer::failed(e),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_payload_of_any_length_comes_back_whole() {
        for len in [1usize, 4095, 4096, 844_568] {
            let bytes: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let fd = super::super::calls::payload_memfd(&bytes).expect("memfd");
            assert_eq!(read_payload(&fd, len as u64).expect("read"), bytes, "{len}");
        }
    }
}

//! Page-locked host memory a consolidated client shares (ShareHostMemory) is refused unless it
//! is a sealed memfd of the size announced, never lands over gpushared's own mappings nor
//! where its stack grows, keeps to its bounds, and is gone with the client; other clients'
//! memory, shared or not, is served correctly throughout.

use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::time::Duration;

use gpushare::ErrorCode;
use gpushare_protocol::Command;
use gpushare_protocol::control::{BrokerMessage, ClientMessage, HostRegionGrant};
use gpushare_protocol::error::WireError;
use gpushare_tests::hostile::{Bystander, consolidated, sim_broker, status_of};
use gpushare_tests::raw::RawClient;
use gpushare_tests::{Broker, mappings, wait_until};

const SECOND: Duration = Duration::from_secs(1);

/// A memfd of `len` bytes with `seals`, named so that its mappings can be found.
fn memfd(len: usize, seals: nix::fcntl::SealFlag) -> OwnedFd {
    use nix::sys::memfd::{MFdFlags, memfd_create};
    let fd = memfd_create(
        "gpushare-hostile",
        MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING,
    )
    .expect("memfd");
    nix::unistd::ftruncate(&fd, len as i64).expect("size");
    if !seals.is_empty() {
        nix::fcntl::fcntl(fd.as_fd(), nix::fcntl::FcntlArg::F_ADD_SEALS(seals)).expect("seal");
    }
    fd
}

fn sealed(len: usize) -> OwnedFd {
    memfd(len, nix::fcntl::SealFlag::F_SEAL_SHRINK)
}

fn share(
    raw: &RawClient,
    bytes: u64,
    at: u64,
    fds: &[RawFd],
) -> Result<HostRegionGrant, WireError> {
    share_from(raw, bytes, 0, at, fds)
}

/// Shares `bytes` from `offset` of the file.
fn share_from(
    raw: &RawClient,
    bytes: u64,
    offset: u64,
    at: u64,
    fds: &[RawFd],
) -> Result<HostRegionGrant, WireError> {
    match raw.request(
        &ClientMessage::ShareHostMemory {
            request: 1,
            bytes,
            at,
            offset,
        },
        fds,
    ) {
        Some(BrokerMessage::HostShared { result, .. }) => result,
        other => panic!("ShareHostMemory({bytes}, {at:#x}) answered {other:?}"),
    }
}

fn unshare(raw: &RawClient, region: u32) -> Result<(), WireError> {
    match raw.request(
        &ClientMessage::UnshareHostMemory { request: 2, region },
        &[],
    ) {
        Some(BrokerMessage::HostUnshared { result, .. }) => result,
        other => panic!("UnshareHostMemory({region}) answered {other:?}"),
    }
}

/// Another consolidated client's page-locked memory works: shared, copied to the device and
/// back, byte for byte.
fn assert_dma_works(broker: &Broker) {
    let good = consolidated(broker);
    let len = 8192;
    let fd = sealed(len);
    // SAFETY: a fresh memfd of `len` bytes, sealed against shrinking, mapped only here and by
    // the broker.
    let mut map = unsafe { memmap2::MmapOptions::new().len(len).map_mut(&fd) }.expect("map");
    let data: Vec<u8> = (0..len / 2).map(|i| (i * 7 % 251) as u8).collect();
    map[..len / 2].copy_from_slice(&data);
    let grant = share(&good, len as u64, 0, &[fd.as_raw_fd()]).expect("shared");
    let buf = good
        .submit_one(Command::Alloc { bytes: 4096 })
        .expect("alloc")
        .result;
    for cmd in [
        Command::CopyHtoDHost {
            stream: 0,
            region: grant.region,
            offset: 0,
            dst: buf,
            len: 4096,
        },
        Command::CopyDtoHHost {
            stream: 0,
            src: buf,
            region: grant.region,
            offset: 4096,
            len: 4096,
        },
        Command::StreamSync { stream: 0 },
    ] {
        assert_eq!(status_of(&good, cmd), 0, "{cmd:?}");
    }
    assert!(map[len / 2..] == data[..], "the bytes came back");
}

#[test]
fn hostile_host_memory_is_refused_or_kept_apart_from_the_brokers_own() {
    use nix::fcntl::SealFlag;
    let broker = sim_broker();
    let bystander = Bystander::new(&broker);
    let fds_before = broker.fd_count();
    let raw = consolidated(&broker);
    let page = 4096usize;

    // Refused: no descriptor, a write-sealed memfd, one shorter than announced, sizes that are
    // no whole pages or past the limit, and descriptors that are neither a memfd nor a tmpfs
    // file (an unsealed memfd is one: see the shrinking test below).
    let fail = |bytes: u64, fds: &[RawFd], why: &str| {
        let e = share(&raw, bytes, 0, fds).expect_err(why);
        assert!(
            matches!(
                e.code,
                ErrorCode::InvalidArgument | ErrorCode::TooManyHandles
            ),
            "{why}: {e:?}"
        );
    };
    fail(4096, &[], "no descriptor");
    let write_sealed = memfd(page, SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_WRITE);
    fail(4096, &[write_sealed.as_raw_fd()], "write-sealed");
    let short = sealed(page);
    fail(8192, &[short.as_raw_fd()], "shorter than announced");
    fail(100, &[short.as_raw_fd()], "not whole pages");
    fail(0, &[short.as_raw_fd()], "empty");
    fail(1 << 50, &[short.as_raw_fd()], "past the limit");
    let e = share_from(&raw, 4096, 100, 0, &[short.as_raw_fd()]).expect_err("offset");
    assert_eq!(
        e.code,
        ErrorCode::InvalidArgument,
        "an offset of no whole pages"
    );
    let (pipe_r, pipe_w) = nix::unistd::pipe().expect("pipe");
    fail(4096, &[pipe_r.as_raw_fd()], "a pipe");
    // On disk, not tmpfs (the target directory).
    let file = tempfile::tempfile_in(env!("CARGO_TARGET_TMPDIR")).expect("file");
    file.set_len(4096).expect("size");
    fail(4096, &[file.as_raw_fd()], "a file on disk");
    fail(4096, &[raw.sock.as_fd().as_raw_fd()], "a socket");
    let null = std::fs::File::open("/dev/null").expect("/dev/null");
    fail(4096, &[null.as_raw_fd()], "/dev/null");

    // Placed where it asks only where the process that holds the GPU context (a device
    // worker; gpushared itself with --in-process-device) has nothing: never over its own
    // mappings (code, heap, stack, other clients' regions), nor where its stack grows. The
    // broker maps it too, by the same rule, and keeps every mapping it had.
    let holder = broker.device_holder();
    let before = mappings(holder);
    let broker_before = mappings(broker.pid());
    let stack = before
        .iter()
        .find(|m| m.2 == "[stack]")
        .map(|m| m.0)
        .expect("the device holder's stack");
    let mut hints: Vec<u64> = before
        .iter()
        .chain(&broker_before)
        .filter(|m| m.2.starts_with('/') || m.2.starts_with('[') || m.2.contains("gpushare-client"))
        .map(|m| m.0)
        .collect();
    hints.extend([
        stack - 2 * page as u64,
        12345,
        0x8000_0000_0000,
        u64::MAX - 4095,
    ]);
    let mut regions = Vec::new();
    for at in hints {
        let fd = sealed(2 * page);
        match share(&raw, 2 * page as u64, at, &[fd.as_raw_fd()]) {
            Ok(grant) => {
                // The sim reaches a region at the device holder's mapping of it. Only named
                // mappings count: an anonymous one (a thread's stack) may be freed meanwhile.
                let placed = grant.device_ptr;
                assert!(
                    !before
                        .iter()
                        .filter(|m| !m.2.is_empty())
                        .any(|m| placed < m.1 && placed + 2 * page as u64 > m.0),
                    "placed at {placed:#x} over a mapping the device holder had (asked {at:#x})"
                );
                assert!(
                    placed + 2 * page as u64 <= stack.saturating_sub(8 << 20) || placed > stack,
                    "placed at {placed:#x}, where the device holder's stack (at {stack:#x}) grows"
                );
                regions.push(grant.region);
            }
            Err(e) => assert_eq!(e.code, ErrorCode::InvalidArgument, "{at:#x}: {e:?}"),
        }
    }
    for (pid, before) in [(holder, &before), (broker.pid(), &broker_before)] {
        let after = mappings(pid);
        for (lo, _, what) in before.iter().filter(|m| !m.2.is_empty()) {
            assert!(
                after.iter().any(|m| m.0 == *lo && &m.2 == what),
                "process {pid}'s mapping of {what} at {lo:#x} is gone"
            );
        }
    }
    assert!(!regions.is_empty(), "some regions were shared");

    // A shared region's bounds hold; it is gone once unshared, and unsharing twice fails.
    let c = raw
        .submit_one(Command::Alloc { bytes: 65536 })
        .expect("alloc");
    let buf = c.result;
    let region = regions[0];
    let copy_in = |offset: u64, len: u64| {
        status_of(
            &raw,
            Command::CopyHtoDHost {
                stream: 0,
                region,
                offset,
                dst: buf,
                len,
            },
        )
    };
    let copy_out = |offset: u64, len: u64| {
        status_of(
            &raw,
            Command::CopyDtoHHost {
                stream: 0,
                src: buf,
                region,
                offset,
                len,
            },
        )
    };
    assert_eq!(copy_in(0, 2 * page as u64), 0, "the whole region");
    assert_eq!(copy_out(page as u64, page as u64), 0, "its second page");
    for (offset, len) in [
        (page as u64, 2 * page as u64),
        (u64::MAX, 2),
        (2 * page as u64, 1),
    ] {
        assert_eq!(copy_in(offset, len), ErrorCode::ArenaOutOfBounds.as_u32());
        assert_eq!(copy_out(offset, len), ErrorCode::ArenaOutOfBounds.as_u32());
    }
    assert_eq!(unshare(&raw, region), Ok(()));
    assert_eq!(
        unshare(&raw, region).map_err(|e| e.code),
        Err(ErrorCode::InvalidHandle)
    );
    assert_eq!(
        unshare(&raw, 999).map_err(|e| e.code),
        Err(ErrorCode::InvalidHandle)
    );
    assert_eq!(copy_in(0, 64), ErrorCode::InvalidHandle.as_u32());

    // Extra descriptors with a request are closed, not kept.
    let fd = sealed(page);
    let spare: Vec<OwnedFd> = (0..8).map(|_| sealed(page)).collect();
    let mut fds = vec![fd.as_raw_fd()];
    fds.extend(spare.iter().map(|f| f.as_raw_fd()));
    assert!(share(&raw, page as u64, 0, &fds).is_ok());

    assert!(raw.status_ok(), "the hostile session is still answered");
    bystander.assert_unharmed(&broker);
    assert_dma_works(&broker);
    // Gone with the client: its regions' mappings and every descriptor it sent.
    drop(raw);
    drop((pipe_r, pipe_w));
    let hostile_mapped = || {
        std::iter::once(broker.pid())
            .chain(broker.worker_pids())
            .any(|pid| {
                mappings(pid)
                    .iter()
                    .any(|m| m.2.contains("gpushare-hostile"))
            })
    };
    assert!(
        wait_until(5 * SECOND, || !hostile_mapped()),
        "the hostile client's regions are unmapped, by the broker and its device workers"
    );
    assert!(
        wait_until(5 * SECOND, || broker.fd_count() <= fds_before),
        "the broker holds {} descriptors, {fds_before} before the hostile client: {:?}",
        broker.fd_count(),
        std::fs::read_dir(format!("/proc/{}/fd", broker.pid()))
            .map(|d| d
                .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .collect::<Vec<_>>())
            .unwrap_or_default()
    );
}

/// A tmpfs file a client registers as it is (NCCL's `/dev/shm` buffers) may be shrunk by the
/// client under gpushared's mappings: only that client's copies through it suffer; the broker,
/// its workers and other clients go on.
#[test]
fn a_client_that_shrinks_its_shared_tmpfs_file_harms_no_one_else() {
    let broker = sim_broker();
    let bystander = Bystander::new(&broker);
    let raw = consolidated(&broker);
    let page = 4096usize;
    let file = tempfile::Builder::new()
        .prefix("gpushare-hostile")
        .tempfile_in("/dev/shm")
        .expect("a tmpfs file");
    // Two pages and a bit from its second page: the last page only partly in the file.
    file.as_file().set_len(3 * page as u64 + 100).expect("size");
    let fd = file.as_file().as_raw_fd();
    let e = share_from(&raw, 4 * page as u64, page as u64, 0, &[fd]).expect_err("past its end");
    assert_eq!(e.code, ErrorCode::InvalidArgument);
    let grant = share_from(&raw, 3 * page as u64, page as u64, 0, &[fd]).expect("shared");
    // SAFETY: a shared mapping of the file, used only here.
    let mut map = unsafe {
        memmap2::MmapOptions::new()
            .len(4 * page)
            .map_mut(file.as_file())
    }
    .expect("map");
    map[page..2 * page].fill(0x3c);
    let buf = raw
        .submit_one(Command::Alloc { bytes: 65536 })
        .expect("alloc")
        .result;
    let region = grant.region;
    let copy_in = |offset: u64| {
        let len = page as u64;
        let c = Command::CopyHtoDHost {
            stream: 0,
            region,
            offset,
            dst: buf,
            len,
        };
        status_of(&raw, c)
    };
    let copy_out = |offset: u64| {
        let len = page as u64;
        let c = Command::CopyDtoHHost {
            stream: 0,
            src: buf,
            region,
            offset,
            len,
        };
        status_of(&raw, c)
    };
    assert_eq!(copy_in(0), 0, "the file's second page, the region's first");
    assert_eq!(copy_out(page as u64), 0);
    assert_eq!(status_of(&raw, Command::StreamSync { stream: 0 }), 0);
    assert!(
        map[2 * page..3 * page].iter().all(|&b| b == 0x3c),
        "the bytes came back through the file"
    );
    drop(map);
    // Shrunk to nothing under every mapping of it, then copied to and from again.
    file.as_file().set_len(0).expect("shrunk");
    for offset in [0, page as u64, 2 * page as u64] {
        let _ = copy_in(offset);
        let _ = copy_out(offset);
    }
    let _ = status_of(&raw, Command::StreamSync { stream: 0 });
    assert!(
        raw.status_ok(),
        "the client that shrank it is still answered"
    );
    assert_eq!(unshare(&raw, region), Ok(()));
    assert!(
        wait_until(5 * SECOND, || broker.log_text().contains("shrank a file")),
        "the log says what the client did"
    );
    bystander.assert_unharmed(&broker);
    assert_dma_works(&broker);
}

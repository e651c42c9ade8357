//! A raw protocol client that can write anything into its shared region and control socket,
//! for hostile-input tests. It speaks the handshake correctly and then misbehaves on purpose.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};

use gpushare_protocol::control::{self, BrokerMessage, ClientMessage, Hello, Role};
use gpushare_protocol::ring::{ShmLayout, SubmissionEntry};
use memmap2::{MmapOptions, MmapRaw};
use nix::sys::socket::{
    AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag, SockType, UnixAddr,
    connect, recvmsg, sendmsg, socket,
};

pub struct RawClient {
    pub sock: OwnedFd,
    pub map: MmapRaw,
    pub layout: ShmLayout,
    pub submit_wake: OwnedFd,
    pub complete_wake: OwnedFd,
}

impl RawClient {
    pub fn connect(path: &Path) -> RawClient {
        RawClient::connect_as(path, Role::Client)
    }

    /// Connects in `role` (a consolidated client's role lets it make the requests and
    /// commands a client-side CUDA driver makes).
    pub fn connect_as(path: &Path, role: Role) -> RawClient {
        let sock = socket(
            AddressFamily::Unix,
            SockType::SeqPacket,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .expect("socket");
        connect(sock.as_raw_fd(), &UnixAddr::new(path).expect("addr")).expect("connect");
        let hello = ClientMessage::Hello(Hello {
            protocol_version: gpushare_protocol::PROTOCOL_VERSION,
            role,
            client_name: "hostile".into(),
            requested_class: None,
            sq_entries: 64,
            arena_size: 64 * 1024,
            gpu: None,
        });
        send_raw(&sock, &control::encode(&hello).expect("encode"));
        let mut buf = vec![0u8; 1 << 16];
        let mut cmsg = nix::cmsg_space!([RawFd; 3]);
        let mut iov = [IoSliceMut::new(&mut buf)];
        let msg = recvmsg::<UnixAddr>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg),
            MsgFlags::empty(),
        )
        .expect("recv");
        let mut fds = Vec::new();
        for c in msg.cmsgs().expect("cmsgs") {
            if let ControlMessageOwned::ScmRights(raw) = c {
                // SAFETY: freshly received descriptors that nothing else owns.
                fds.extend(
                    raw.into_iter()
                        .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                );
            }
        }
        let n = msg.bytes;
        let welcome = match control::decode::<BrokerMessage>(&buf[..n]).expect("decode") {
            BrokerMessage::Welcome(w) => w,
            other => panic!("expected Welcome, got {other:?}"),
        };
        let layout = welcome.layout.expect("layout");
        let mut fds = fds.into_iter();
        let memfd = fds.next().expect("memfd");
        let submit_wake = fds.next().expect("eventfd");
        let complete_wake = fds.next().expect("eventfd");
        let map = MmapOptions::new()
            .len(layout.total_size())
            .map_raw(&memfd)
            .expect("mmap");
        RawClient {
            sock,
            map,
            layout,
            submit_wake,
            complete_wake,
        }
    }

    fn base(&self) -> NonNull<u8> {
        NonNull::new(self.map.as_mut_ptr()).expect("mapped")
    }

    fn word(&self, offset: usize) -> &AtomicU32 {
        // SAFETY: the offsets used are the ring index words, inside the mapping and aligned.
        unsafe { &*self.base().as_ptr().add(offset).cast::<AtomicU32>() }
    }

    /// The submission tail word (client-owned).
    pub fn sq_tail(&self) -> &AtomicU32 {
        self.word(128)
    }

    pub fn sq_head(&self) -> &AtomicU32 {
        self.word(64)
    }

    /// The completion head word (client-owned).
    pub fn cq_head(&self) -> &AtomicU32 {
        self.word(256)
    }

    pub fn cq_tail(&self) -> &AtomicU32 {
        self.word(320)
    }

    /// Writes `entry` into submission slot `index` (masked).
    pub fn write_entry(&self, index: u32, entry: SubmissionEntry) {
        let slot = (index & (self.layout.sq_entries - 1)) as usize;
        // SAFETY: the slot lies in the submission ring inside the mapping.
        unsafe {
            self.base()
                .as_ptr()
                .add(self.layout.sq_offset() + slot * 64)
                .cast::<SubmissionEntry>()
                .write_volatile(entry)
        };
    }

    /// Submits `entries` in batches of half the ring and waits (10 s at most per batch) for
    /// their completions; returns every completion that came.
    pub fn submit_all(
        &self,
        entries: &[SubmissionEntry],
    ) -> Vec<gpushare_protocol::ring::CompletionEntry> {
        let mut tail = self.sq_tail().load(Ordering::Relaxed);
        let mut done = Vec::new();
        for chunk in entries.chunks((self.layout.sq_entries as usize / 2).max(1)) {
            for e in chunk {
                self.write_entry(tail, *e);
                tail = tail.wrapping_add(1);
            }
            self.publish(tail);
            let want = done.len() + chunk.len();
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while done.len() < want && std::time::Instant::now() < deadline {
                done.extend(self.completions());
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
        }
        done
    }

    /// Reads every completion published since the last call and hands the slots back.
    pub fn completions(&self) -> Vec<gpushare_protocol::ring::CompletionEntry> {
        let tail = self.cq_tail().load(Ordering::Acquire);
        let mut head = self.cq_head().load(Ordering::Relaxed);
        let mut out = Vec::new();
        while head != tail && out.len() < self.layout.cq_entries as usize {
            let slot = (head & (self.layout.cq_entries - 1)) as usize;
            // SAFETY: the slot lies in the completion ring inside the mapping.
            let entry = unsafe {
                self.base()
                    .as_ptr()
                    .add(self.layout.cq_offset() + slot * 32)
                    .cast::<gpushare_protocol::ring::CompletionEntry>()
                    .read_volatile()
            };
            out.push(entry);
            head = head.wrapping_add(1);
        }
        self.cq_head().store(head, Ordering::Release);
        out
    }

    /// Writes arbitrary bytes at `offset` of the region.
    pub fn scribble(&self, offset: usize, bytes: &[u8]) {
        let end = (offset + bytes.len()).min(self.layout.total_size());
        let n = end.saturating_sub(offset);
        // SAFETY: clamped to the mapping.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.base().as_ptr().add(offset), n)
        };
    }

    /// Publishes entries up to `tail` and kicks the broker.
    pub fn publish(&self, tail: u32) {
        self.sq_tail().store(tail, Ordering::Release);
        let _ = nix::unistd::write(&self.submit_wake, &1u64.to_ne_bytes());
    }

    /// Sends raw bytes on the control socket.
    pub fn send_control(&self, bytes: &[u8]) {
        send_raw(&self.sock, bytes);
    }

    /// Sends a control request with `fds` attached and returns the broker's answer (device
    /// reset notices skipped); `None` when the broker closed the connection or said nothing
    /// for 10 s.
    pub fn request(&self, msg: &ClientMessage, fds: &[RawFd]) -> Option<BrokerMessage> {
        let bytes = control::encode(msg).expect("encode");
        let rights = [ControlMessage::ScmRights(fds)];
        let cmsgs: &[ControlMessage] = if fds.is_empty() { &[] } else { &rights };
        sendmsg::<UnixAddr>(
            self.sock.as_raw_fd(),
            &[IoSlice::new(&bytes)],
            cmsgs,
            MsgFlags::MSG_NOSIGNAL,
            None,
        )
        .ok()?;
        let timeout = nix::sys::time::TimeVal::new(10, 0);
        nix::sys::socket::setsockopt(
            &self.sock,
            nix::sys::socket::sockopt::ReceiveTimeout,
            &timeout,
        )
        .expect("receive timeout");
        let mut buf = vec![0u8; 1 << 20];
        loop {
            match nix::sys::socket::recv(self.sock.as_raw_fd(), &mut buf, MsgFlags::empty()) {
                Ok(0) | Err(_) => return None,
                Ok(n) => match control::decode::<BrokerMessage>(&buf[..n]) {
                    Ok(BrokerMessage::DeviceReset { .. }) => continue,
                    Ok(reply) => return Some(reply),
                    Err(_) => return None,
                },
            }
        }
    }

    /// Submits one command and returns its completion (`None` if none came in 10 s).
    pub fn submit_one(
        &self,
        cmd: gpushare_protocol::Command,
    ) -> Option<gpushare_protocol::ring::CompletionEntry> {
        let tag = self.sq_tail().load(Ordering::Relaxed) as u64 + 1;
        self.submit_all(&[cmd.encode(tag)]).into_iter().next()
    }

    /// Writes `bytes` at `offset` of the arena.
    pub fn write_arena(&self, offset: usize, bytes: &[u8]) {
        self.scribble(self.layout.arena_offset() + offset, bytes);
    }

    /// Whether the broker still answers on the control socket (a Status request).
    pub fn status_ok(&self) -> bool {
        send_raw(
            &self.sock,
            &control::encode(&ClientMessage::Status { request: 7 }).expect("encode"),
        );
        let mut buf = vec![0u8; 1 << 20];
        loop {
            match nix::sys::socket::recv(self.sock.as_raw_fd(), &mut buf, MsgFlags::empty()) {
                Ok(0) | Err(_) => return false,
                Ok(n) => match control::decode::<BrokerMessage>(&buf[..n]) {
                    Ok(BrokerMessage::Status { .. }) => return true,
                    Ok(_) => continue,
                    Err(_) => return false,
                },
            }
        }
    }
}

fn send_raw(sock: &OwnedFd, bytes: &[u8]) {
    let _ = sendmsg::<UnixAddr>(
        sock.as_raw_fd(),
        &[IoSlice::new(bytes)],
        &[],
        MsgFlags::MSG_NOSIGNAL,
        None,
    );
}

//! A raw protocol client that can write anything into its shared region and control socket,
//! for hostile-input tests. It connects with the connection core's handshake and then
//! misbehaves on purpose.

use std::io::IoSlice;
use std::os::fd::{AsRawFd, RawFd};
use std::path::Path;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};

use gpushare_conn::ControlSocket;
use gpushare_protocol::control::{BrokerMessage, ClientMessage, Hello, Role};
use gpushare_protocol::ring::{ShmLayout, SubmissionEntry};
use gpushare_protocol::wake::Wakeup;
use memmap2::{MmapOptions, MmapRaw};
use nix::sys::socket::{MsgFlags, UnixAddr, sendmsg};

pub struct RawClient {
    pub sock: ControlSocket,
    pub map: MmapRaw,
    pub layout: ShmLayout,
    pub submit_wake: Wakeup,
    pub complete_wake: Wakeup,
    /// The virtual memory API's granule, as the welcome said.
    pub memory_granularity: u64,
}

impl RawClient {
    /// Connects with the connection core's handshake; what follows is up to the test.
    pub fn connect(path: &Path) -> RawClient {
        RawClient::connect_as(path, Role::Client)
    }

    /// Connects in `role` (a consolidated client's role lets it make the requests and
    /// commands a client-side CUDA driver makes).
    pub fn connect_as(path: &Path, role: Role) -> RawClient {
        let sock = ControlSocket::connect(path).expect("connect");
        let hello = Hello {
            protocol_version: gpushare_protocol::PROTOCOL_VERSION,
            role,
            client_name: "hostile".into(),
            requested_class: None,
            sq_entries: 64,
            arena_size: 64 * 1024,
            gpu: None,
        };
        let (welcome, fds) = sock.handshake(hello).expect("welcomed");
        let layout = welcome.layout.expect("layout");
        let memory_granularity = welcome.memory_granularity;
        let mut fds = fds.into_iter();
        let memfd = fds.next().expect("memfd");
        let submit_wake = Wakeup::from_fd(fds.next().expect("eventfd"));
        let complete_wake = Wakeup::from_fd(fds.next().expect("eventfd"));
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
            memory_granularity,
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
        self.submit_wake.signal();
    }

    /// Sends raw bytes on the control socket.
    pub fn send_control(&self, bytes: &[u8]) {
        send_raw(&self.sock, bytes);
    }

    /// Sends a control request with `fds` attached and returns the broker's answer (device
    /// reset notices skipped); `None` when the broker closed the connection or said nothing
    /// for 10 s.
    pub fn request(&self, msg: &ClientMessage, fds: &[RawFd]) -> Option<BrokerMessage> {
        self.sock.send(msg, fds).ok()?;
        let timeout = nix::sys::time::TimeVal::new(10, 0);
        nix::sys::socket::setsockopt(
            &self.sock.as_fd(),
            nix::sys::socket::sockopt::ReceiveTimeout,
            &timeout,
        )
        .expect("receive timeout");
        loop {
            match self.sock.recv() {
                Ok((BrokerMessage::DeviceReset { .. }, _)) => continue,
                Ok((reply, _)) => return Some(reply),
                Err(_) => return None,
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
        if self
            .sock
            .send(&ClientMessage::Status { request: 7 }, &[])
            .is_err()
        {
            return false;
        }
        loop {
            match self.sock.recv() {
                Ok((BrokerMessage::Status { .. }, _)) => return true,
                Ok(_) => continue,
                Err(_) => return false,
            }
        }
    }
}

fn send_raw(sock: &ControlSocket, bytes: &[u8]) {
    let _ = sendmsg::<UnixAddr>(
        sock.as_fd().as_raw_fd(),
        &[IoSlice::new(bytes)],
        &[],
        MsgFlags::MSG_NOSIGNAL,
        None,
    );
}

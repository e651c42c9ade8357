//! The rings as a client drives them: submit, reap, wait (spin, then sleep on the eventfd),
//! and errors of commands nobody waited for, reported at the next synchronization.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use gpushare_protocol::command::opcode;
use gpushare_protocol::ring::CompletionEntry;
use gpushare_protocol::{Command, ErrorCode, StreamId};
use nix::poll::PollTimeout;

use crate::error::{Error, Result};
use crate::session::Session;
use crate::state::{Dead, RingState, lock, seq_of, tag_of};

/// How long [`Session::submit_and_await`] sleeps at a time once no core is spare.
const AWAIT_NAP: Duration = Duration::from_micros(50);

/// A short name of what a command does, for error messages.
pub fn op_name(op: u16) -> &'static str {
    match op {
        opcode::NOP => "nop",
        opcode::ALLOC => "allocate",
        opcode::ALLOC_AT => "allocate at an address",
        opcode::FREE => "free",
        opcode::COPY_HTOD => "copy host→device",
        opcode::COPY_DTOH => "copy device→host",
        opcode::COPY_DTOD => "copy device→device",
        opcode::MEMSET => "memset",
        opcode::STREAM_CREATE => "create stream",
        opcode::STREAM_DESTROY => "destroy stream",
        opcode::STREAM_SYNC => "synchronize stream",
        opcode::EVENT_CREATE => "create event",
        opcode::EVENT_RECORD => "record event",
        opcode::EVENT_QUERY => "query event",
        opcode::EVENT_SYNC => "synchronize event",
        opcode::EVENT_ELAPSED => "event elapsed time",
        opcode::EVENT_DESTROY => "destroy event",
        opcode::CLIENT_SYNC => "synchronize",
        opcode::ITERATION_END => "end iteration",
        opcode::DECLARE_JOB => "declare job",
        opcode::DECLARE_DEADLINE => "declare deadline",
        opcode::LAUNCH_MODULE => "launch module function",
        opcode::GOVERNED_RESERVE => "reserve memory",
        opcode::GOVERNED_RELEASE => "release memory",
        opcode::GOVERNED_TOKENS => "ask for launch tokens",
        opcode::GOVERNED_IDLE => "report idle",
        opcode::GOVERNED_WEIGHT => "ask for a weight",
        opcode::GOVERNED_HELD => "register memory held",
        _ => "launch built-in kernel",
    }
}

/// The name of a command's operation.
pub fn command_name(cmd: &Command) -> &'static str {
    op_name(cmd.encode(0).opcode)
}

impl Session {
    /// Reads every completion there is: keeps those somebody waits for, notes the first error
    /// of the others.
    fn reap(&self, ring: &mut RingState) {
        let n = match ring.rings.completions.available() {
            Ok(n) => n,
            Err(e) => {
                self.mark_dead(Dead::Protocol(e.to_string()));
                return;
            }
        };
        if n == 0 {
            return;
        }
        let mut counted = n as u64;
        for _ in 0..n {
            let c = ring.rings.completions.pop();
            ring.in_flight = ring.in_flight.saturating_sub(1);
            ring.reaped_seq = ring.reaped_seq.max(seq_of(c.user_tag));
            if ring.told.remove(&c.user_tag) {
                // Counted when its sync word answered it.
                counted -= 1;
            }
            if ring.wanted.remove(&c.user_tag) {
                ring.done.insert(c.user_tag, c);
            } else if c.status != 0 && ring.async_error.is_none() {
                if c.status == ErrorCode::DeviceReset.as_u32() {
                    self.note_handles_lost();
                }
                ring.async_error = Some(((c.user_tag & 0xff) as u16, c.status));
            }
        }
        self.completions.fetch_add(counted, Ordering::Relaxed);
        ring.rings.completions.release();
        if ring.rings.completions.producer_waiting() {
            self.submit_wake.signal();
        }
        if !ring.done.is_empty() && ring.sleepers > 0 {
            // Completions for other waiters: make sure they wake.
            self.complete_wake.signal();
        }
    }

    /// The sequence number of the last command whose completion has been read (every earlier
    /// one's has been read too), after reading what there is.
    pub fn reaped_seq(&self) -> u64 {
        let mut ring = lock(&self.ring);
        self.reap(&mut ring);
        ring.reaped_seq
    }

    /// Submits a command; returns its tag. With `wait`, the completion is kept for
    /// [`Session::finish`]; otherwise an error it carries is reported at the next sync.
    /// Waits (spin, then sleep) only while the rings are full.
    pub fn submit(&self, cmd: Command, wait: bool) -> Result<u64> {
        self.submit_with(cmd.encode(0).opcode, wait, |_| Ok(cmd))
    }

    /// Like [`Session::submit`], with the command made under the ring's lock: `make` gets the
    /// sequence number the command will have, and may write arena data that the command
    /// names, so that submission order and arena use agree. A `make` error submits nothing.
    pub fn submit_with(
        &self,
        op: u16,
        wait: bool,
        mut make: impl FnMut(u64) -> Result<Command>,
    ) -> Result<u64> {
        self.spin_then_sleep(self.spin, || {
            self.check_alive()?;
            let mut ring = lock(&self.ring);
            self.reap(&mut ring);
            let cq_room = ring.in_flight < self.layout().cq_entries;
            let sq_room = match ring.rings.submissions.free_slots() {
                Ok(n) => n > 0,
                Err(e) => {
                    drop(ring);
                    self.mark_dead(Dead::Protocol(e.to_string()));
                    return Ok(None);
                }
            };
            if !(cq_room && sq_room) {
                // Full: wait for the broker to make progress.
                return Ok(None);
            }
            let seq = ring.next_seq;
            let cmd = make(seq)?;
            let tag = tag_of(seq, op);
            let pushed = ring
                .rings
                .submissions
                .try_push(cmd.encode(tag))
                .unwrap_or(false);
            if !pushed {
                return Ok(None);
            }
            ring.next_seq += 1;
            ring.last_waited = wait;
            ring.rings.submissions.publish();
            ring.in_flight += 1;
            if wait {
                ring.wanted.insert(tag);
            }
            if ring.rings.submissions.consumer_needs_wakeup() {
                self.submit_wake.signal();
            }
            self.commands.fetch_add(1, Ordering::Relaxed);
            Ok(Some(tag))
        })
    }

    /// Waits for the completion of `tag` (submitted with `wait`).
    pub fn wait(&self, tag: u64) -> Result<CompletionEntry> {
        self.wait_spinning(tag, self.spin, false)
    }

    /// Waits for the completion of `tag`; with `told` (a stream synchronization), or for the
    /// sync word saying it succeeded, whichever comes first (the word is written before the
    /// completion, as soon as the device work is seen finished: the completion's way back
    /// through gpushared is then off the client's path). Answered by the word, the completion
    /// that follows is read and dropped like that of work nobody waits for (a failure it
    /// carried, which the broker rules out before writing the word, would be reported at the
    /// next synchronization).
    fn wait_spinning(&self, tag: u64, spin: Duration, told: bool) -> Result<CompletionEntry> {
        self.spin_then_sleep(spin, || {
            let mut ring = lock(&self.ring);
            self.reap(&mut ring);
            if let Some(c) = ring.done.remove(&tag) {
                if told {
                    ring.rings.synced.forget(tag);
                }
                return Ok(Some(c));
            }
            if !told || !ring.rings.synced.told(tag) {
                return Ok(None);
            }
            ring.rings.synced.forget(tag);
            // What was submitted before the sync completed before the word was written.
            self.reap(&mut ring);
            if let Some(c) = ring.done.remove(&tag) {
                return Ok(Some(c));
            }
            ring.wanted.remove(&tag);
            // The command is complete for the client: counted now, its completion not again.
            ring.told.insert(tag);
            self.completions.fetch_add(1, Ordering::Relaxed);
            Ok(Some(CompletionEntry {
                user_tag: tag,
                ..CompletionEntry::default()
            }))
        })
    }

    /// Whether the last command submitted was one its caller waited for (or waits for now),
    /// not work posted without waiting.
    pub fn last_waited(&self) -> bool {
        lock(&self.ring).last_waited
    }

    /// Submits `cmd` without keeping its completion, then waits until that completion has
    /// been read, or `within` has passed: says whether it was read. The broker completes a
    /// client's commands in order, so by then it has handled everything submitted before
    /// `cmd`; an error the completion carries is reported at the next sync, as a posted
    /// command's is. The wait spins (giving way when no core is spare) and never sleeps
    /// until the next completion, which work the scheduler holds back may not bring for long.
    pub fn submit_and_await(&self, cmd: Command, within: Duration) -> Result<bool> {
        let seq = seq_of(self.submit(cmd, false)?);
        let since = Instant::now();
        loop {
            if self.reaped_seq() >= seq {
                return Ok(true);
            }
            self.check_alive()?;
            let waited = since.elapsed();
            if waited >= within {
                return Ok(false);
            }
            if !gpushare_protocol::wake::spin_turn(waited) {
                std::thread::sleep(AWAIT_NAP.min(within - waited));
            }
        }
    }

    /// Waits until `done` says so, reading completions meanwhile (spin, then sleep).
    pub fn wait_until(&self, mut done: impl FnMut(&Session) -> bool) -> Result<()> {
        self.spin_then_sleep(self.spin, || {
            {
                let mut ring = lock(&self.ring);
                self.reap(&mut ring);
            }
            Ok(done(self).then_some(()))
        })
    }

    /// The one wait every caller here shares: tries `attempt` until it gives a value,
    /// spinning for `spin` first, then sleeping until a completion, news on the control
    /// socket, or a short timeout; a session that died meanwhile ends the wait. A wait that
    /// sees no completion for a while asks the broker whether it is there, and ends with
    /// `BrokerUnresponsive` if it does not answer: a long sync on a busy GPU goes on, a
    /// stopped broker is reported.
    fn spin_then_sleep<T>(
        &self,
        spin: Duration,
        mut attempt: impl FnMut() -> Result<Option<T>>,
    ) -> Result<T> {
        // The clock is read every few looks, and not before the first: a read costs as much
        // as a look, and every look sooner is an answer seen sooner.
        let mut clock = gpushare_protocol::wake::SpinClock::new();
        let mut quiet_since: Option<Instant> = None;
        let mut seen = self.completions.load(Ordering::Relaxed);
        loop {
            if let Some(value) = attempt()? {
                return Ok(value);
            }
            self.check_alive()?;
            let spun = clock.spun();
            if spun < spin && gpushare_protocol::wake::spin_turn(spun) {
                continue;
            }
            self.sleep_for_completion()?;
            let now_seen = self.completions.load(Ordering::Relaxed);
            let quiet = *quiet_since.get_or_insert_with(Instant::now);
            if now_seen != seen {
                seen = now_seen;
                quiet_since = Some(Instant::now());
            } else if quiet.elapsed() >= self.probe_after {
                self.probe()?;
                quiet_since = Some(Instant::now());
            }
        }
    }

    /// Sleeps until the broker signals a completion, the control socket has news, or a
    /// short timeout passes.
    pub(crate) fn sleep_for_completion(&self) -> Result<()> {
        {
            let mut ring = lock(&self.ring);
            ring.sleepers += 1;
            if ring.sleepers == 1 {
                ring.rings.completions.prepare_sleep();
            }
            if matches!(ring.rings.completions.available(), Ok(n) if n > 0) {
                self.finish_sleep(&mut ring);
                return Ok(());
            }
        }
        let control_news = self.complete_wake.wait_or(
            self.socket.as_fd(),
            Some(std::time::Duration::from_millis(100)),
        );
        {
            let mut ring = lock(&self.ring);
            self.finish_sleep(&mut ring);
        }
        if control_news {
            self.read_news(PollTimeout::ZERO);
        }
        self.check_alive()
    }

    fn finish_sleep(&self, ring: &mut RingState) {
        ring.sleepers -= 1;
        if ring.sleepers == 0 {
            ring.rings.completions.finish_sleep();
        }
    }

    /// Submits and waits; turns a failed status into an error.
    pub fn call(&self, cmd: Command, op: &'static str) -> Result<CompletionEntry> {
        let tag = self.submit(cmd, true)?;
        // A wait for the device spins as long as a synchronization does, whoever sends it (a
        // consolidated program's cuStreamSynchronize comes this way).
        let spin = match cmd {
            Command::StreamSync { .. } | Command::EventSync { .. } | Command::ClientSync => {
                self.sync_spin
            }
            _ => self.spin,
        };
        let c = self.finish_spinning(tag, op, spin, told_first(&cmd))?;
        self.note_quiet(&cmd, tag);
        Ok(c)
    }

    /// After `cmd` (submitted as `tag`) succeeded: if it waited for a stream's work (or all of
    /// it), that work is finished as of `tag`.
    pub(crate) fn note_quiet(&self, cmd: &Command, tag: u64) {
        let waited = match *cmd {
            Command::StreamSync { stream } | Command::CopyDtoHStaged { stream, .. } => Some(stream),
            Command::ClientSync => None,
            _ => return,
        };
        let mut ring = lock(&self.ring);
        let seq = seq_of(tag);
        if ring.quiet.is_none_or(|(_, at)| at < seq) {
            ring.quiet = Some((waited, seq));
        }
    }

    /// Whether `stream` (`None`: every stream) is known to have no work: a wait for it (or for
    /// all work) succeeded and nothing was submitted since, and no error of earlier work is
    /// pending. A synchronization then has nothing to wait for and nothing to report, and is
    /// answered here (a program's `memcpy` to pageable memory followed by a stream
    /// synchronization, as CuPy's `.get()` does, waits for gpushared once, not twice).
    pub fn quiet(&self, stream: Option<StreamId>) -> bool {
        if self.is_dead() {
            return false;
        }
        let mut ring = lock(&self.ring);
        self.reap(&mut ring);
        let Some((waited, seq)) = ring.quiet else {
            return false;
        };
        ring.next_seq == seq + 1
            && ring.async_error.is_none()
            && (waited.is_none() || waited == stream)
    }

    /// Waits for the completion of `tag` (submitted with `wait`) and turns its status into a
    /// result.
    pub fn finish(&self, tag: u64, op: &'static str) -> Result<CompletionEntry> {
        self.finish_spinning(tag, op, self.spin, false)
    }

    /// `told`: a stream synchronization, which the sync word may answer first
    /// ([`Session::wait_spinning`]).
    fn finish_spinning(
        &self,
        tag: u64,
        op: &'static str,
        spin: Duration,
        told: bool,
    ) -> Result<CompletionEntry> {
        let c = self.wait_spinning(tag, spin, told)?;
        match ErrorCode::from_u32(c.status) {
            None if c.status == 0 => Ok(c),
            Some(code) => {
                if code == ErrorCode::DeviceReset {
                    self.note_handles_lost();
                }
                Err(Error::Command { op, code })
            }
            None => Err(Error::Protocol(format!(
                "unknown status {} for {op}",
                c.status
            ))),
        }
    }

    /// Reports (and clears) the first error of a command nobody waited for.
    pub fn take_async_error(&self) -> Result<()> {
        let err = lock(&self.ring).async_error.take();
        match err {
            None => Ok(()),
            Some((op, status)) => Err(Error::Command {
                op: op_name(op),
                code: ErrorCode::from_u32(status).unwrap_or(ErrorCode::Internal),
            }),
        }
    }

    /// The first error of a command nobody waited for, without clearing it.
    pub fn pending_async_error(&self) -> Option<ErrorCode> {
        let mut ring = lock(&self.ring);
        self.reap(&mut ring);
        ring.async_error
            .map(|(_, status)| ErrorCode::from_u32(status).unwrap_or(ErrorCode::Internal))
    }

    /// Submits and waits for one command; returns its `(result, result2)`.
    pub fn submit_wait(&self, cmd: Command) -> Result<(u64, u64)> {
        self.call(cmd, command_name(&cmd))
            .map(|c| (c.result, c.result2))
    }

    /// Waits until every submitted command has completed (not necessarily executed).
    pub fn drain_in_flight(&self) -> Result<()> {
        self.spin_then_sleep(self.spin, || {
            let mut ring = lock(&self.ring);
            self.reap(&mut ring);
            Ok((ring.in_flight as usize == ring.wanted.len() + ring.done.len()).then_some(()))
        })
    }

    /// Waits for all of this session's work; reports the first error since the last sync.
    pub fn synchronize(&self) -> Result<()> {
        self.sync_with(Command::ClientSync, "synchronize")
    }

    /// Waits for a stream's work; reports the first error since the last sync.
    pub fn sync_stream(&self, stream: StreamId) -> Result<()> {
        self.sync_with(Command::StreamSync { stream }, "synchronize stream")
    }

    /// A sync reports the first error since the last one: an earlier command's, else its own.
    /// When both say a reset took the work, that is one loss, reported once.
    pub fn sync_with(&self, cmd: Command, op: &'static str) -> Result<()> {
        let synced = self
            .submit(cmd, true)
            .and_then(|tag| self.finish_spinning(tag, op, self.sync_spin, told_first(&cmd)));
        let mut ring = lock(&self.ring);
        match (&synced, ring.async_error) {
            (Err(e), Some((_, status)))
                if e.code() == Some(ErrorCode::DeviceReset)
                    && status == ErrorCode::DeviceReset.as_u32() =>
            {
                ring.async_error = None;
            }
            _ => {}
        }
        drop(ring);
        synced?;
        self.take_async_error()
    }
}

/// Whether a command's wait looks at the sync word first: a stream synchronization.
fn told_first(cmd: &Command) -> bool {
    matches!(cmd, Command::StreamSync { .. })
}

//! `gpushare top`: who uses the GPU, live.
//!
//! Shaped like bottom: [`collect`] polls the broker and derives rates, [`state`] holds what is
//! shown and how, [`draw`] renders the state and only reads it, [`input`] maps keys to state
//! changes. The interactive screen and the batch frames ([`batch`]) draw from the same state.

pub mod batch;
pub mod collect;
pub mod draw;
pub mod input;
pub mod state;
mod terminal;

use std::io::IsTerminal;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::Context;
use gpushare_tools::socket::BrokerSocket;
use ratatui::crossterm::event;

use collect::{Collector, Frame};
use input::Action;
use state::State;

/// How long the loop waits for a key before it looks at new samples and signals again.
const INPUT_POLL: Duration = Duration::from_millis(50);

/// The interactive screen, until the user quits or a signal arrives.
pub fn interactive(socket: BrokerSocket, interval: Duration) -> anyhow::Result<()> {
    if !std::io::stdout().is_terminal() || !std::io::stdin().is_terminal() {
        anyhow::bail!(
            "gpushare top needs a terminal; for scripts use `gpushare top -b` (plain text) or `gpushare top -b --json`"
        );
    }
    let stop = terminal::stop_signals().context("cannot install signal handlers")?;
    let (samples, interval_tx) = spawn_collector(socket.clone(), interval);
    let mut guard = terminal::enter().context("cannot set up the terminal")?;
    let mut state = State::new(socket.path.display().to_string(), interval);
    let mut dirty = true;
    // A hung-up terminal (its window closed, its session killed) makes the input reader
    // spin on end-of-file inside crossterm, where this loop never regains control: a watchdog
    // ends the process instead. There is no terminal left to restore.
    std::thread::Builder::new()
        .name("gpushare-top-hangup".into())
        .spawn(|| {
            loop {
                std::thread::sleep(Duration::from_millis(250));
                if terminal_hung_up() {
                    std::process::exit(1);
                }
            }
        })
        .context("cannot start the terminal watchdog")?;
    while !stop.load(Ordering::SeqCst) {
        while let Ok(sample) = samples.try_recv() {
            state.apply(sample, Instant::now());
            dirty = true;
        }
        if dirty {
            guard.terminal.draw(|f| draw::draw(f, &state))?;
            dirty = false;
        }
        if !event::poll(INPUT_POLL)? {
            continue;
        }
        match input::handle(&mut state, &event::read()?) {
            Action::Nothing => {}
            Action::Redraw => dirty = true,
            Action::Interval => {
                // A collector that is gone shows as a screen that stops changing; nothing to do.
                let _ = interval_tx.send(state.interval);
                dirty = true;
            }
            Action::Quit => break,
        }
    }
    drop(guard);
    Ok(())
}

/// Whether standard input's terminal has hung up.
fn terminal_hung_up() -> bool {
    use std::os::fd::AsFd;
    let stdin = std::io::stdin();
    let mut fds = [nix::poll::PollFd::new(
        stdin.as_fd(),
        nix::poll::PollFlags::empty(),
    )];
    match nix::poll::poll(&mut fds, nix::poll::PollTimeout::ZERO) {
        Ok(_) => fds[0].revents().is_some_and(|r| {
            r.intersects(
                nix::poll::PollFlags::POLLHUP
                    | nix::poll::PollFlags::POLLERR
                    | nix::poll::PollFlags::POLLNVAL,
            )
        }),
        Err(_) => false,
    }
}

/// Polls the broker on its own thread, so a slow or hung broker never freezes the keys.
/// Returns the samples and a sender for interval changes (each one also polls at once).
fn spawn_collector(
    socket: BrokerSocket,
    mut interval: Duration,
) -> (
    mpsc::Receiver<Result<Frame, String>>,
    mpsc::Sender<Duration>,
) {
    let (sample_tx, sample_rx) = mpsc::channel();
    let (interval_tx, interval_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut collector = Collector::new(socket);
        loop {
            if sample_tx.send(collector.poll()).is_err() {
                return;
            }
            match interval_rx.recv_timeout(interval) {
                Ok(d) => interval = d,
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            }
        }
    });
    (sample_rx, interval_tx)
}

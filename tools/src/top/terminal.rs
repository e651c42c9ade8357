//! The terminal in raw mode on the alternate screen, and putting it back on every way out:
//! a normal return or an error (the guard's `Drop`), a panic (the hook) and SIGINT, SIGTERM or
//! SIGHUP (a flag the main loop checks, so it leaves through the guard too).

use std::io::{self, Stdout};
use std::sync::Arc;
use std::sync::Once;
use std::sync::atomic::AtomicBool;

use ratatui::Terminal;
use ratatui::backend::CrosstermBackend;
use ratatui::crossterm::cursor::Show;
use ratatui::crossterm::execute;
use ratatui::crossterm::terminal::{
    EnterAlternateScreen, LeaveAlternateScreen, disable_raw_mode, enable_raw_mode,
};

pub type Tui = Terminal<CrosstermBackend<Stdout>>;

/// Restores the terminal when dropped.
pub struct Guard {
    pub terminal: Tui,
}

impl Drop for Guard {
    fn drop(&mut self) {
        restore();
    }
}

/// Enters raw mode and the alternate screen.
pub fn enter() -> io::Result<Guard> {
    install_panic_hook();
    enable_raw_mode()?;
    // From here on a failure must undo what was done.
    let setup = || -> io::Result<Tui> {
        execute!(io::stdout(), EnterAlternateScreen)?;
        let mut terminal = Terminal::new(CrosstermBackend::new(io::stdout()))?;
        terminal.hide_cursor()?;
        terminal.clear()?;
        Ok(terminal)
    };
    match setup() {
        Ok(terminal) => Ok(Guard { terminal }),
        Err(e) => {
            restore();
            Err(e)
        }
    }
}

/// Puts the terminal back; harmless when it already is.
pub fn restore() {
    let _ = disable_raw_mode();
    let _ = execute!(io::stdout(), LeaveAlternateScreen, Show);
}

fn install_panic_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            // Restore first, or the message lands on the alternate screen and vanishes.
            restore();
            previous(info);
        }));
    });
}

/// A flag that SIGINT, SIGTERM and SIGHUP set. A second signal while the flag is set exits at
/// once, in case the main loop is stuck writing to a terminal that went away.
pub fn stop_signals() -> io::Result<Arc<AtomicBool>> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [SIGINT, SIGTERM, SIGHUP] {
        signal_hook::flag::register_conditional_shutdown(sig, 1, stop.clone())?;
        signal_hook::flag::register(sig, stop.clone())?;
    }
    Ok(stop)
}

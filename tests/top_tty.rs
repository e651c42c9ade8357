//! `gpushare top` in a real terminal: tmux runs a shell, the test types the command and keys
//! into it and reads the screen back, as a person would see it. Checks the header, the client
//! rows, help, sorting and the filter; that the terminal comes back after `q` and after
//! SIGTERM; and that top rides out a broker restart.
//!
//! Needs tmux (scripts/setup.sh installs it); without it each test says SKIPPED and passes.

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use gpushare_tests::{Broker, binary};

const WIDTH: u16 = 160;
const HEIGHT: u16 = 40;
/// Debug builds on a loaded two-core machine start slowly.
const PATIENCE: Duration = Duration::from_secs(30);
/// The shell's prompt (`PS1`) as capture-pane shows it, trailing blank trimmed.
const PROMPT: &str = "READY$";

fn skip(reason: &str) {
    // Straight to the stderr handle: the harness captures `eprintln!`, and a skip must show.
    let _ = std::io::Write::write_all(
        &mut std::io::stderr(),
        format!(
            "SKIPPED {}: {reason}\n",
            std::thread::current().name().unwrap_or("top_tty")
        )
        .as_bytes(),
    );
}

/// A private tmux server with one session running a plain shell; killed when dropped.
struct Tmux {
    server: String,
    /// Holds the saved terminal settings.
    dir: tempfile::TempDir,
}

impl Tmux {
    fn start(socket: &Path) -> Option<Tmux> {
        let works = Command::new("tmux")
            .arg("-V")
            .output()
            .is_ok_and(|o| o.status.success());
        if !works {
            skip("tmux is not installed (scripts/setup.sh installs it)");
            return None;
        }
        static N: AtomicUsize = AtomicUsize::new(0);
        let server = format!(
            "gpushare-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        );
        let tmux = Tmux {
            server,
            dir: tempfile::tempdir().expect("temp dir"),
        };
        let shell = format!(
            "env GPUSHARE_SOCKET={} PS1={} bash --norc --noprofile",
            quote(&socket.to_string_lossy()),
            quote(&format!("{PROMPT} "))
        );
        let out = tmux.run(&[
            "new-session",
            "-d",
            "-s",
            "top",
            "-x",
            &WIDTH.to_string(),
            "-y",
            &HEIGHT.to_string(),
            &shell,
        ]);
        assert!(out.status.success(), "tmux new-session: {out:?}");
        // A huge history would only slow capture-pane; the screen is what matters.
        tmux.run(&["set-option", "-g", "history-limit", "100"]);
        assert!(
            tmux.wait_for(|s| s.contains(PROMPT)).is_ok(),
            "no shell prompt"
        );
        Some(tmux)
    }

    fn run(&self, args: &[&str]) -> Output {
        Command::new("tmux")
            .args(["-f", "/dev/null", "-L", &self.server])
            .args(args)
            .env_remove("TMUX")
            .stdin(Stdio::null())
            .output()
            .expect("run tmux")
    }

    /// Types a line into the shell.
    fn type_line(&self, line: &str) {
        self.run(&["send-keys", "-t", "top", "-l", line]);
        self.run(&["send-keys", "-t", "top", "Enter"]);
    }

    /// Presses keys (tmux key names: `q`, `Escape`, `Up`, `/`, …).
    fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", "top"];
        args.extend_from_slice(keys);
        self.run(&args);
    }

    fn screen(&self) -> String {
        String::from_utf8_lossy(&self.run(&["capture-pane", "-p", "-t", "top"]).stdout).into_owned()
    }

    fn format(&self, format: &str) -> String {
        String::from_utf8_lossy(
            &self
                .run(&["display-message", "-p", "-t", "top", format])
                .stdout,
        )
        .trim()
        .to_string()
    }

    /// Whether the program in the pane is on the alternate screen.
    fn alternate_screen(&self) -> bool {
        self.format("#{alternate_on}") == "1"
    }

    fn cursor_visible(&self) -> bool {
        self.format("#{cursor_flag}") == "1"
    }

    /// Waits until the screen satisfies `check`; the last screen either way.
    fn wait_for(&self, check: impl Fn(&str) -> bool) -> Result<String, String> {
        let start = Instant::now();
        loop {
            let screen = self.screen();
            if check(&screen) {
                return Ok(screen);
            }
            if start.elapsed() > PATIENCE {
                return Err(screen);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    #[track_caller]
    fn expect(&self, what: &str, check: impl Fn(&str) -> bool) -> String {
        match self.wait_for(check) {
            Ok(screen) => screen,
            Err(screen) => panic!("{what}: not on screen after {PATIENCE:?}:\n{screen}"),
        }
    }

    /// The pid of the program the shell runs in the foreground (the shell's child).
    fn foreground_pid(&self) -> Option<i32> {
        let shell = self.format("#{pane_pid}");
        std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            // pid (comm) state ppid …; comm may hold spaces, so split after its ')'.
            let ppid = stat.rsplit_once(')')?.1.split_whitespace().nth(1)?;
            (ppid == shell).then(|| e.file_name().to_str()?.parse().ok())?
        })
    }

    fn stty_file(&self) -> String {
        quote(&self.dir.path().join("stty").to_string_lossy())
    }

    /// Checks that the shell got its terminal back as it was: prompt, main screen, cursor,
    /// line settings.
    #[track_caller]
    fn expect_restored(&self) {
        let screen = self.expect("the shell prompt after top", |s| {
            s.lines().last_nonblank().trim_end() == PROMPT
        });
        assert!(
            !self.alternate_screen(),
            "still on the alternate screen:\n{screen}"
        );
        assert!(self.cursor_visible(), "cursor still hidden");
        // The answer differs from the typed line, which shows `$?`, not its value.
        self.type_line(&format!(
            "stty -g | cmp -s - {}; echo stty-diff=$?",
            self.stty_file()
        ));
        let screen = self.expect("the stty comparison", |s| {
            s.contains("stty-diff=0") || s.contains("stty-diff=1")
        });
        assert!(
            screen.contains("stty-diff=0"),
            "terminal settings changed:\n{screen}"
        );
    }

    /// Saves the terminal settings, then starts `gpushare top` and waits for its screen.
    fn start_top(&self, args: &str) -> String {
        self.type_line(&format!("stty -g > {}", self.stty_file()));
        self.type_line(&format!(
            "{} top {args}",
            quote(&binary("gpushare").to_string_lossy())
        ));
        let screen = self.expect("the top screen", |s| s.contains("gpushare top"));
        assert!(self.alternate_screen(), "top draws on the alternate screen");
        screen
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        self.run(&["kill-server"]);
    }
}

trait LastNonBlank<'a> {
    fn last_nonblank(self) -> &'a str;
}

impl<'a, I: DoubleEndedIterator<Item = &'a str>> LastNonBlank<'a> for I {
    fn last_nonblank(mut self) -> &'a str {
        self.rfind(|l| !l.trim().is_empty()).unwrap_or("")
    }
}

fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// A demo client that keeps working until the test kills it.
struct Demo(Child);

impl Demo {
    fn start(broker: &Broker, name: &str) -> Demo {
        let child = broker
            .command("gpushare-demo")
            .args(["--name", name, "--size", "4096", "--iterations", "1000000"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn gpushare-demo");
        Demo(child)
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn row<'a>(screen: &'a str, name: &str) -> Option<&'a str> {
    screen
        .lines()
        .find(|l| l.contains(name) && l.contains("library"))
}

#[test]
fn top_shows_clients_help_sorting_and_filter_and_restores_the_terminal() {
    let broker = Broker::start();
    let Some(tmux) = Tmux::start(&broker.socket) else {
        return;
    };
    let _demo = Demo::start(&broker, "tty-demo");
    let held = broker.client_named("tty-held");
    let _memory = held.alloc::<f32>(1 << 20).expect("alloc");

    tmux.start_top("-d 0.3");
    // Every check waits for a whole screen that satisfies it: a capture can land mid-redraw.
    let me = std::process::id().to_string();
    tmux.expect("the header, both clients and the footer", |s| {
        let header = s.lines().find(|l| l.contains("COMMAND")).unwrap_or("");
        let held = row(s, "tty-held").unwrap_or("");
        s.contains(&format!(
            "backend {} · policy",
            gpushare_tests::test_backend()
        )) && s.contains("· 2 clients")
            && s.contains("GPU 0 ")
            && s.contains("mem ")
            && (gpushare_tests::test_backend() != "sim" || s.contains(" / 16.0 GiB"))
            && [
                "PID", "USER", "KIND", "CLASS", "GPU%▼", "MEMORY", "QUOTA", "KERN/s", "IOCTL/s",
            ]
            .iter()
            .all(|t| header.contains(t))
            && row(s, "tty-demo").is_some()
            && held.contains(&me)
            && held.contains("4.0 MiB")
            && held.contains("normal")
            && s.contains("GPU share — ")
            && s.contains("q quit")
            && s.contains("? help")
    });

    tmux.keys(&["?"]);
    tmux.expect("help", |s| {
        s.contains("help — ? or Esc closes") && s.contains("observed: uses the GPU directly")
    });
    tmux.keys(&["Escape"]);
    tmux.expect("help closed", |s| {
        !s.contains("help — ? or Esc closes") && s.contains("q quit")
    });

    tmux.keys(&["s"]);
    tmux.expect("sorted by memory, most first", |s| {
        s.contains("MEMORY▼")
            && s.contains("sort: MEMORY▼")
            && row(s, "tty-held").is_some()
            && row(s, "tty-demo").is_some()
            && s.find("tty-held") < s.find("tty-demo")
    });
    tmux.keys(&["S"]);
    tmux.expect("reversed", |s| s.contains("sort: MEMORY▲"));

    tmux.keys(&["/"]);
    tmux.run(&["send-keys", "-t", "top", "-l", "held"]);
    tmux.expect("the filter line", |s| s.contains("/held▏"));
    tmux.keys(&["Enter"]);
    tmux.expect("only the matching row", |s| {
        s.contains("filter: held") && row(s, "tty-held").is_some() && row(s, "tty-demo").is_none()
    });

    tmux.keys(&["q"]);
    tmux.expect_restored();
}

#[test]
fn top_restores_the_terminal_on_sigterm() {
    let broker = Broker::start();
    let Some(tmux) = Tmux::start(&broker.socket) else {
        return;
    };
    tmux.start_top("");
    let pid = tmux.foreground_pid().expect("top's pid");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("SIGTERM");
    tmux.expect_restored();
}

#[test]
fn top_says_disconnected_and_reconnects_after_a_broker_restart() {
    let first = Broker::start();
    // top follows a symlink, so a second broker can take the first one's place.
    let link_dir = tempfile::tempdir().expect("temp dir");
    let link = link_dir.path().join("gpushare.sock");
    std::os::unix::fs::symlink(&first.socket, &link).expect("symlink");
    let Some(tmux) = Tmux::start(&link) else {
        return;
    };
    let before = first.client_named("before-restart");
    tmux.start_top("-d 0.2");
    tmux.expect("the first broker's client", |s| {
        row(s, "before-restart").is_some()
    });

    drop(before);
    drop(first);
    tmux.expect("disconnected", |s| s.contains("disconnected — retrying"));

    let second = Broker::start();
    std::fs::remove_file(&link).expect("unlink");
    std::os::unix::fs::symlink(&second.socket, &link).expect("symlink");
    let _after = second.client_named("after-restart");
    tmux.expect("the second broker's client only", |s| {
        row(s, "after-restart").is_some()
            && row(s, "before-restart").is_none()
            && !s.contains("disconnected")
    });
    tmux.keys(&["q"]);
    tmux.expect_restored();
}

/// Whether a process whose command line contains `needle` is still alive.
fn process_alive(needle: &str) -> bool {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| {
            std::fs::read(e.path().join("cmdline"))
                .map(|c| {
                    String::from_utf8_lossy(&c)
                        .replace('\0', " ")
                        .contains(needle)
                })
                .unwrap_or(false)
        })
}

#[test]
fn top_exits_when_its_terminal_goes_away() {
    if Command::new("tmux")
        .arg("-V")
        .output()
        .map(|o| !o.status.success())
        .unwrap_or(true)
    {
        skip("tmux is not installed (scripts/setup.sh installs it)");
        return;
    }
    let broker = Broker::start();
    // A non-interactive shell runs top and then lingers: when the session is killed the
    // shell dies and top loses its terminal (this once left top spinning on end-of-file).
    let socket = broker.socket.to_string_lossy().to_string();
    let server = format!("gpushare-hangup-{}", std::process::id());
    let script = format!(
        "{} top --socket {} -d 0.3; sleep 100",
        quote(&binary("gpushare").to_string_lossy()),
        quote(&socket)
    );
    let tmux = |args: &[&str]| {
        Command::new("tmux")
            .args(["-f", "/dev/null", "-L", &server])
            .args(args)
            .env_remove("TMUX")
            .stdin(Stdio::null())
            .output()
            .expect("tmux")
    };
    let out = tmux(&[
        "new-session",
        "-d",
        "-x",
        "120",
        "-y",
        "30",
        "bash",
        "-c",
        &script,
    ]);
    assert!(out.status.success(), "{out:?}");
    let needle = format!("top --socket {socket}");
    assert!(
        gpushare_tests::wait_until(std::time::Duration::from_secs(10), || process_alive(
            &needle
        )),
        "top did not start"
    );
    std::thread::sleep(std::time::Duration::from_millis(500));
    tmux(&["kill-server"]);
    assert!(
        gpushare_tests::wait_until(std::time::Duration::from_secs(5), || !process_alive(
            &needle
        )),
        "gpushare top outlived its terminal"
    );
}

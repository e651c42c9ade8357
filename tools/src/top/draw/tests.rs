use std::time::Duration;

use ratatui::Terminal;
use ratatui::backend::TestBackend;

use super::super::collect::tests::{client, process, report, telemetry_with};
use super::super::collect::{Deriver, Extras};
use super::*;

fn screen(state: &State, width: u16, height: u16) -> String {
    let mut terminal = Terminal::new(TestBackend::new(width, height)).expect("test terminal");
    terminal.draw(|f| draw(f, state)).expect("draw");
    let buffer = terminal.backend().buffer();
    let mut out = String::new();
    for y in 0..buffer.area.height {
        for x in 0..buffer.area.width {
            out.push_str(buffer[(x, y)].symbol());
        }
        out.push('\n');
    }
    out
}

fn state(extras: &Extras) -> State {
    let mut a = client(1, 4242, "trainer");
    a.gpu_time_ns = 600_000_000;
    a.kernels = 1_500;
    let mut b = client(2, 4343, "notebook");
    b.gpu_time_ns = 100_000_000;
    b.memory_quota = None;
    b.class = gpushare::PriorityClass::BestEffort;
    let mut d = Deriver::default();
    let mut s = State::new("/run/gpushare/gpushare.sock".into(), Duration::from_secs(1));
    s.apply(
        Ok(d.derive(&report(65_000, vec![a, b]), extras)),
        Instant::now(),
    );
    s
}

#[test]
fn shows_header_rows_and_the_selected_rows_history() {
    let s = state(&Extras::default());
    let text = screen(&s, 160, 40);
    assert!(text.contains("gpushare top"), "{text}");
    assert!(
        text.contains("gpushared 0.1.0 · backend sim · policy fifo · up 1m05s · 2 clients"),
        "{text}"
    );
    assert!(text.contains("GPU 0 sim-gpu-0"), "{text}");
    assert!(
        text.contains("gpushared: CPU "),
        "the broker's own cost: {text}"
    );
    assert!(text.contains("util  70.0%"), "{text}");
    assert!(text.contains("mem 512.0 MiB / 16.0 GiB"), "{text}");
    let header = text.lines().find(|l| l.contains("COMMAND")).unwrap_or("");
    for title in [
        "PID", "USER", "KIND", "CLASS", "GPU%▼", "QUEUE", "P99", "IOCTL/s",
    ] {
        assert!(header.contains(title), "{title} in {header}");
    }
    let trainer = text.lines().find(|l| l.contains("trainer")).unwrap_or("");
    assert!(trainer.contains("4242"), "{trainer}");
    assert!(trainer.contains("library"), "{trainer}");
    assert!(trainer.contains("60.0"), "{trainer}");
    assert!(trainer.contains("1.0 GiB"), "{trainer}");
    let last: Vec<&str> = trainer.split_whitespace().rev().take(2).collect();
    assert_eq!(
        last,
        ["0.0", "-"],
        "never held (THROT%), no ioctl figure: {trainer}"
    );
    let notebook = text.lines().find(|l| l.contains("notebook")).unwrap_or("");
    assert!(
        notebook.contains("best-effort") && notebook.contains("none"),
        "{notebook}"
    );
    // Sorted by share: trainer above notebook, and selected.
    assert!(text.find("trainer") < text.find("notebook"));
    assert!(
        text.contains("GPU share — trainer (pid 4242): 60.0% now · chart 0–60.0%"),
        "{text}"
    );
    assert!(text.contains("sort: GPU%▼"), "{text}");
    assert!(!text.contains("KIND  library: runs"), "no help yet");
}

#[test]
fn help_popup_and_filter_line() {
    let mut s = state(&Extras::default());
    s.show_help = true;
    let text = screen(&s, 160, 40);
    assert!(text.contains("help — ? or Esc closes"), "{text}");
    assert!(text.contains("observed: uses the GPU directly"), "{text}");
    s.show_help = false;
    s.editing_filter = true;
    s.filter = "note".into();
    let text = screen(&s, 160, 40);
    assert!(text.contains("/note▏"), "{text}");
    assert!(!text.contains("4242"), "trainer filtered out: {text}");
    assert!(text.contains("4343"), "{text}");
}

#[test]
fn disconnected_keeps_the_last_rows_and_says_so() {
    let mut s = state(&Extras::default());
    s.apply(
        Err("the connection to gpushared was lost".into()),
        Instant::now(),
    );
    let text = screen(&s, 160, 40);
    assert!(text.contains("disconnected — retrying"), "{text}");
    assert!(
        text.contains("the connection to gpushared was lost"),
        "{text}"
    );
    assert!(text.contains("trainer"), "{text}");
    let mut fresh = State::new("/tmp/x.sock".into(), Duration::from_secs(1));
    let text = screen(&fresh, 100, 20);
    assert!(text.contains("connecting to /tmp/x.sock"), "{text}");
    fresh.apply(Err("cannot connect".into()), Instant::now());
    assert!(screen(&fresh, 100, 20).contains("disconnected — retrying"));
}

#[test]
fn telemetry_shows_observed_processes_and_ioctl_rates() {
    let extras = telemetry_with(vec![
        process(4242, "trainer", 300),
        process(777, "python3", 9_000),
    ]);
    let text = screen(&state(&extras), 160, 40);
    assert!(text.contains("telemetry: eBPF on (ioctls)"), "{text}");
    let py = text.lines().find(|l| l.contains("python3")).unwrap_or("");
    assert!(py.contains("observed") && py.contains("777"), "{py}");
    assert!(py.contains("4500"), "ioctls/s: {py}");
    let trainer = text.lines().find(|l| l.contains("trainer")).unwrap_or("");
    assert!(
        trainer.contains("both") && trainer.contains("300"),
        "{trainer}"
    );
}

#[test]
fn a_governed_program_shows_its_kind_memory_launches_and_throttling() {
    let mut g = client(3, 5151, "train.py");
    g.governed = true;
    g.class = gpushare::PriorityClass::BestEffort;
    g.memory_used = 434 << 20;
    g.kernels = 4_000;
    g.throttled_ns = 100_000_000;
    let mut d = Deriver::default();
    let mut s = State::new("/run/gpushare/gpushare.sock".into(), Duration::from_secs(1));
    d.derive(&report(10_000, vec![g.clone()]), &Extras::default());
    // One second later: 900 more launches, held 250 ms of it.
    g.kernels += 900;
    g.throttled_ns += 250_000_000;
    g.connected_ms += 1_000;
    s.apply(
        Ok(d.derive(&report(11_000, vec![g]), &Extras::default())),
        Instant::now(),
    );
    let text = screen(&s, 200, 40);
    let header = text.lines().find(|l| l.contains("COMMAND")).unwrap_or("");
    assert!(header.contains("THROT%"), "{header}");
    let row = text.lines().find(|l| l.contains("train.py")).unwrap_or("");
    assert!(row.contains("5151") && row.contains("governed"), "{row}");
    assert!(
        row.contains("best-effort") && row.contains("434.0 MiB"),
        "{row}"
    );
    assert!(row.contains("900"), "launches/s: {row}");
    assert!(row.contains("25.0"), "throttled 250 ms of 1 s: {row}");
}

#[test]
fn a_consolidated_program_shows_its_kind_memory_kernels_and_gpu_share() {
    let mut c = client(4, 6161, "infer.py");
    c.consolidated = true;
    c.memory_used = 300 << 20;
    c.kernels = 1_000;
    c.latency_p99_ns = Some(2_500_000);
    let mut d = Deriver::default();
    let mut s = State::new("/run/gpushare/gpushare.sock".into(), Duration::from_secs(1));
    d.derive(&report(10_000, vec![c.clone()]), &Extras::default());
    // One second later: 700 more kernels and 400 ms of measured GPU time.
    c.kernels += 700;
    c.gpu_time_ns += 400_000_000;
    c.connected_ms += 1_000;
    let extras = Extras::of(&report(11_000, vec![c.clone()]));
    s.apply(
        Ok(d.derive(&report(11_000, vec![c]), &extras)),
        Instant::now(),
    );
    let text = screen(&s, 200, 40);
    let row = text.lines().find(|l| l.contains("infer.py")).unwrap_or("");
    assert!(
        row.contains("6161") && row.contains("consolidated"),
        "{row}"
    );
    assert!(row.contains("300.0 MiB"), "{row}");
    assert!(row.contains("700"), "kernels/s: {row}");
    assert!(row.contains("40.0"), "GPU share 400 ms of 1 s: {row}");
    assert!(row.contains("2.5ms"), "p99 latency: {row}");
}

#[test]
fn narrow_screens_drop_minor_columns_and_keep_the_command() {
    assert_eq!(columns_for(200, 2).len(), TOP_COLUMNS.len());
    assert!(
        !columns_for(200, 1).contains(&crate::format::GPU_COLUMN),
        "one GPU: no GPU column"
    );
    let s = state(&Extras::default());
    let text = screen(&s, 100, 30);
    let header = text.lines().find(|l| l.contains("COMMAND")).unwrap_or("");
    for title in ["PID", "COMMAND", "GPU%", "MEMORY", "KERN/s"] {
        assert!(header.contains(title), "{title} in {header}");
    }
    assert!(!header.contains("P50"), "{header}");
    assert!(
        text.contains("trainer") && text.contains("notebook"),
        "{text}"
    );
    for width in [0, 20, 60] {
        assert!(columns_for(width, 2).contains(&NAME_COLUMN));
    }
}

#[test]
fn small_terminals_do_not_panic() {
    let mut s = state(&Extras::default());
    s.show_help = true;
    for (w, h) in [(1, 1), (10, 5), (40, 10), (80, 24)] {
        screen(&s, w, h);
    }
    let mut odd = state(&Extras::default());
    if let Some(fr) = odd.frame.as_mut() {
        fr.devices[0].utilisation = f64::NAN;
        fr.devices[0].memory_total = 0;
    }
    screen(&odd, 120, 30);
}

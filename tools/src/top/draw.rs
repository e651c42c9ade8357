//! Draws the screen from [`State`]; reads it and nothing else.

use std::time::Instant;

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style, Stylize};
use ratatui::text::{Line, Span};
use ratatui::widgets::{
    Block, Cell, Clear, LineGauge, Paragraph, Row as TableRow, Sparkline, Table, TableState, Wrap,
};

use super::collect::{DeviceLoad, Kind};
use super::state::{Connection, State};
use crate::format::{self, NAME_COLUMN, TOP_COLUMNS};

/// Height of the share-history panel, borders included.
const HISTORY_HEIGHT: u16 = 6;

pub fn draw(f: &mut Frame, state: &State) {
    let frame = state.frame.as_ref();
    let devices = frame.map_or(0, |fr| fr.devices.len()) as u16;
    let telemetry = frame.and_then(format::telemetry_line);
    // Borders, the summary, the devices, gpushared's own cost, telemetry.
    let header_height = 2 + 1 + devices + 1 + u16::from(telemetry.is_some());
    let [header, table, history, footer] = Layout::vertical([
        Constraint::Length(header_height),
        Constraint::Min(3),
        Constraint::Length(HISTORY_HEIGHT),
        Constraint::Length(1),
    ])
    .areas(f.area());

    draw_header(f, header, state, telemetry);
    draw_table(f, table, state);
    draw_history(f, history, state);
    draw_footer(f, footer, state);
    if state.show_help {
        draw_help(f, f.area());
    }
}

fn draw_header(f: &mut Frame, area: Rect, state: &State, telemetry: Option<String>) {
    let block = Block::bordered()
        .title(Line::from(" gpushare top ").bold())
        .title(Line::from(format!(" every {} ", format::interval(state.interval))).right_aligned());
    let inner = block.inner(area);
    f.render_widget(block, area);
    let mut lines = Layout::vertical(vec![Constraint::Length(1); inner.height as usize])
        .split(inner)
        .to_vec()
        .into_iter();

    if let Some(line) = lines.next() {
        let text = match (&state.connection, &state.frame) {
            (Connection::Down { error, since }, _) => Line::from(vec![
                Span::styled(
                    "disconnected — retrying",
                    Style::new().fg(Color::Red).add_modifier(Modifier::BOLD),
                ),
                Span::raw(format!(
                    " ({} so far): {error}",
                    format::duration(Instant::now().saturating_duration_since(*since))
                )),
            ]),
            (_, Some(fr)) => Line::from(format::top_summary(fr)),
            (_, None) => Line::from(format!("connecting to {} …", state.socket)),
        };
        f.render_widget(Paragraph::new(text), line);
    }
    if let Some(fr) = &state.frame {
        for d in &fr.devices {
            if let Some(line) = lines.next() {
                draw_device(f, line, d, fr.devices.len() > 1);
            }
        }
    }
    if let (Some(fr), Some(line)) = (&state.frame, lines.next()) {
        f.render_widget(Paragraph::new(format::broker_line(fr)).dim(), line);
    }
    if let (Some(t), Some(line)) = (telemetry, lines.next()) {
        f.render_widget(Paragraph::new(t).dim(), line);
    }
}

fn draw_device(f: &mut Frame, area: Rect, d: &DeviceLoad, several: bool) {
    // The name gives way first on a narrow screen; the gauges' labels carry the numbers.
    // With several GPUs, each user's memory on this one follows the gauges.
    let name_width = (area.width / 4).min(32);
    let users = several.then(|| format::device_users(d)).flatten();
    let [label, util, mem, held] = Layout::horizontal([
        Constraint::Length(name_width),
        Constraint::Fill(1),
        Constraint::Fill(1),
        Constraint::Fill(u16::from(several)),
    ])
    .spacing(2)
    .areas(area);
    if let Some(users) = users {
        f.render_widget(
            Paragraph::new(format::truncate(&users, held.width as usize)).dim(),
            held,
        );
    }
    let name = format!("GPU {} {}", d.index, d.name);
    f.render_widget(
        Paragraph::new(format::truncate(&name, name_width as usize)).bold(),
        label,
    );
    f.render_widget(
        LineGauge::default()
            .ratio(unit(d.utilisation))
            .label(format!("util {:>5.1}%", d.utilisation * 100.0))
            .filled_style(Style::new().fg(Color::Green))
            .unfilled_style(Style::new().fg(Color::DarkGray)),
        util,
    );
    let used = if d.memory_total == 0 {
        0.0
    } else {
        d.memory_used as f64 / d.memory_total as f64
    };
    f.render_widget(
        LineGauge::default()
            .ratio(unit(used))
            .label(format!(
                "mem {} / {}",
                bytesize::ByteSize(d.memory_used),
                bytesize::ByteSize(d.memory_total)
            ))
            .filled_style(Style::new().fg(Color::Cyan))
            .unfilled_style(Style::new().fg(Color::DarkGray)),
        mem,
    );
}

/// A ratio the gauges accept: finite, within 0..=1.
fn unit(v: f64) -> f64 {
    if v.is_finite() {
        v.clamp(0.0, 1.0)
    } else {
        0.0
    }
}

/// Columns a narrow screen gives up first, so that COMMAND always keeps some room.
const DROP_ORDER: [usize; 11] = [15, 12, 13, 11, 14, 8, 3, 10, 5, 4, 1];
/// Width COMMAND keeps before other columns go.
const MIN_NAME_WIDTH: u16 = 12;

/// The columns that fit in `width`, in display order, for a broker of `devices` GPUs.
fn columns_for(width: u16, devices: usize) -> Vec<usize> {
    let mut shown = format::top_columns(devices);
    let needed = |shown: &[usize]| -> u16 {
        shown
            .iter()
            .map(|&i| {
                if i == NAME_COLUMN {
                    MIN_NAME_WIDTH
                } else {
                    TOP_COLUMNS[i].width
                }
            })
            .sum::<u16>()
            + shown.len().saturating_sub(1) as u16
    };
    for drop in DROP_ORDER {
        if needed(&shown) <= width {
            break;
        }
        shown.retain(|&i| i != drop);
    }
    shown
}

fn draw_table(f: &mut Frame, area: Rect, state: &State) {
    let rows = state.visible_rows();
    let devices = state.frame.as_ref().map_or(0, |fr| fr.devices.len());
    let shown = columns_for(area.width, devices);
    let arrow = if state.reversed { "▲" } else { "▼" };
    let header = TableRow::new(shown.iter().map(|&i| {
        let c = &TOP_COLUMNS[i];
        let title = if c.title == state.sort.label() {
            format!("{}{arrow}", c.title)
        } else {
            c.title.to_string()
        };
        align(title, c.right)
    }))
    .style(Style::new().add_modifier(Modifier::BOLD | Modifier::REVERSED));
    let body = rows.iter().map(|r| {
        let mut cells = format::top_cells(r).map(Some);
        let style = match r.kind {
            Kind::Observed => Style::new().fg(Color::Yellow),
            Kind::Both => Style::new().fg(Color::Magenta),
            Kind::Governed => Style::new().fg(Color::Cyan),
            Kind::Consolidated => Style::new().fg(Color::Green),
            Kind::Library => Style::new(),
        };
        TableRow::new(
            shown
                .iter()
                .map(|&i| align(cells[i].take().unwrap_or_default(), TOP_COLUMNS[i].right)),
        )
        .style(style)
    });
    let widths = shown.iter().map(|&i| {
        if i == NAME_COLUMN {
            Constraint::Fill(1)
        } else {
            Constraint::Length(TOP_COLUMNS[i].width)
        }
    });
    let stale = !matches!(state.connection, Connection::Up);
    let empty = if state.frame.is_some() && rows.is_empty() {
        if state.filter.is_empty() {
            " no clients "
        } else {
            " no rows match the filter "
        }
    } else {
        ""
    };
    let table = Table::new(body, widths)
        .header(header)
        .column_spacing(1)
        .row_highlight_style(Style::new().add_modifier(Modifier::REVERSED))
        .block(Block::new().title_bottom(Line::from(empty).centered()))
        .style(if stale {
            Style::new().add_modifier(Modifier::DIM)
        } else {
            Style::new()
        });
    let mut table_state = TableState::default().with_selected(state.selected_index());
    f.render_stateful_widget(table, area, &mut table_state);
}

fn align(text: String, right: bool) -> Cell<'static> {
    let line = Line::from(text);
    Cell::from(if right { line.right_aligned() } else { line })
}

fn draw_history(f: &mut Frame, area: Rect, state: &State) {
    let Some(row) = state.selected_row() else {
        f.render_widget(Block::bordered().title(" GPU share history "), area);
        return;
    };
    let history = state.history.get(&row.key);
    // Scaled to the peak (at least 1%), so a light user's pattern still shows.
    let top = history
        .and_then(|h| h.iter().max())
        .copied()
        .unwrap_or(0)
        .max(10);
    let title = match row.gpu_share {
        Some(s) => format!(
            " GPU share — {} (pid {}): {:.1}% now · chart 0–{:.1}% ",
            row.name,
            row.pid,
            s * 100.0,
            top as f64 / 10.0
        ),
        None => format!(
            " GPU share — {} (pid {}): not brokered, the broker does not time its work ",
            row.name, row.pid
        ),
    };
    let block = Block::bordered().title(title);
    let inner = block.inner(area);
    let data: Vec<u64> = history
        .map(|h| {
            let skip = h.len().saturating_sub(inner.width as usize);
            h.iter().skip(skip).copied().collect()
        })
        .unwrap_or_default();
    f.render_widget(
        Sparkline::default()
            .block(block)
            .data(&data)
            .max(top)
            .style(Style::new().fg(Color::Green)),
        area,
    );
}

fn draw_footer(f: &mut Frame, area: Rect, state: &State) {
    let key = |k: &'static str| Span::styled(k, Style::new().add_modifier(Modifier::REVERSED));
    let mut spans = if state.editing_filter {
        vec![
            key("/"),
            Span::raw(format!("{}▏", state.filter)),
            Span::raw("   "),
            key("Enter"),
            Span::raw(" keep  "),
            key("Esc"),
            Span::raw(" clear"),
        ]
    } else {
        vec![
            key("q"),
            Span::raw(" quit  "),
            key("↑↓"),
            Span::raw(" select  "),
            key("s"),
            Span::raw(format!(
                " sort: {}{}  ",
                state.sort.label(),
                if state.reversed { "▲" } else { "▼" }
            )),
            key("S"),
            Span::raw(" reverse  "),
            key("/"),
            Span::raw(" filter  "),
            key("?"),
            Span::raw(" help  "),
            key("+-"),
            Span::raw(format!(" interval {}", format::interval(state.interval))),
        ]
    };
    if !state.editing_filter && !state.filter.is_empty() {
        spans.push(Span::styled(
            format!("  filter: {}", state.filter),
            Style::new().fg(Color::Yellow),
        ));
    }
    f.render_widget(Paragraph::new(Line::from(spans)), area);
}

const HELP: &[(&str, &str)] = &[
    ("q, Esc, Ctrl-C", "quit"),
    (
        "↑ ↓ (k j), PgUp PgDn",
        "select a row; its GPU-share history shows below",
    ),
    ("s / S", "next sort column / reverse the order"),
    (
        "/",
        "filter rows by command, user, pid, kind, class or `gpu N`",
    ),
    ("+ / -", "refresh less / more often"),
    ("?", "show or hide this help"),
    ("", ""),
    (
        "KIND",
        "library: runs its work through gpushared (client library)",
    ),
    (
        "",
        "consolidated: `gpushare run`, its work in gpushared's context",
    ),
    (
        "",
        "governed: `gpushare run --mode governed` (its own context)",
    ),
    ("", "observed: uses the GPU directly (seen by eBPF)"),
    ("", "both: a broker client that also uses the GPU directly"),
    ("GPU%", "share of the device's time over the last interval"),
    (
        "MEMORY/QUOTA",
        "device memory held / allowed (none: no quota)",
    ),
    (
        "KERN/s, COPY MB/s",
        "kernels launched and bytes copied per second",
    ),
    (
        "QUEUE, P50, P99",
        "commands waiting; command latency percentiles",
    ),
    ("IOCTL/s", "NVIDIA driver calls per second (eBPF telemetry)"),
    (
        "THROT%",
        "share of the interval a governed program waited to launch",
    ),
    ("-", "not known: the broker does not report it (yet)"),
];

fn draw_help(f: &mut Frame, area: Rect) {
    let width = 80.min(area.width);
    let height = (HELP.len() as u16 + 2).min(area.height);
    let popup = area.centered(Constraint::Length(width), Constraint::Length(height));
    let lines: Vec<Line> = HELP
        .iter()
        .map(|(k, v)| {
            Line::from(vec![
                Span::styled(
                    format!("{k:>20}  "),
                    Style::new().add_modifier(Modifier::BOLD),
                ),
                Span::raw(*v),
            ])
        })
        .collect();
    f.render_widget(Clear, popup);
    f.render_widget(
        Paragraph::new(lines)
            .wrap(Wrap { trim: false })
            .block(Block::bordered().title(" help — ? or Esc closes ")),
        popup,
    );
}

#[cfg(test)]
mod tests;

//! Tables as GitHub renders them: a header, a separator of as many columns and rows of as
//! many cells, with a blank line before and after.

use std::path::Path;

use crate::markdown::prose;

/// The cells of a table line, split at the `|`s that are not escaped (inside code spans too,
/// as GitHub does).
fn cells(line: &str) -> usize {
    let t = line.trim();
    let t = t.strip_prefix('|').unwrap_or(t);
    let t = t
        .strip_suffix('|')
        .filter(|s| !s.ends_with('\\'))
        .unwrap_or(t);
    let mut n = 1;
    let mut escaped = false;
    for c in t.chars() {
        if c == '|' && !escaped {
            n += 1;
        }
        escaped = c == '\\' && !escaped;
    }
    n
}

fn is_separator(line: &str) -> bool {
    let t = line.trim().trim_matches('|');
    !t.is_empty()
        && t.split('|').all(|c| {
            let c = c.trim().trim_start_matches(':').trim_end_matches(':');
            c.len() >= 3 && c.chars().all(|ch| ch == '-')
        })
}

/// What is wrong with each table of `file`, one line each.
pub(crate) fn broken_tables(root: &Path, file: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(root.join(file))
        .unwrap_or_else(|e| panic!("read {}: {e}", file.display()));
    // Fenced blocks are blanked (their pipes are not tables), but code spans are kept, since a
    // `|` inside one still splits a table's cell: `prose` blanked both, so the original line
    // is put back wherever `prose` kept any text.
    let p = prose(&text);
    let blanked: Vec<&str> = p
        .lines()
        .zip(text.lines())
        .map(|(p, t)| if p.trim().is_empty() { p } else { t })
        .collect();
    let mut problems = Vec::new();
    let is_row = |l: &str| l.trim_start().starts_with('|');
    let mut i = 0;
    while i < blanked.len() {
        if !is_row(blanked[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < blanked.len() && is_row(blanked[i]) {
            i += 1;
        }
        let block = &blanked[start..i];
        let at = format!("{}:{}", file.display(), start + 1);
        if start > 0 && !blanked[start - 1].trim().is_empty() {
            problems.push(format!("{at}: no blank line before the table"));
        }
        if i < blanked.len() && !blanked[i].trim().is_empty() {
            problems.push(format!(
                "{}:{}: a line right after a table (it would be read as a row)",
                file.display(),
                i + 1
            ));
        }
        if block.len() < 2 || !is_separator(block[1]) {
            problems.push(format!(
                "{at}: a table row with no header and separator above it (a blank line \
                 inside a table?)"
            ));
            continue;
        }
        let width = cells(block[0]);
        if cells(block[1]) != width {
            problems.push(format!(
                "{at}: the separator has {} columns, the header {width}",
                cells(block[1])
            ));
        }
        if block.len() == 2 {
            problems.push(format!("{at}: a table without rows"));
        }
        for (k, row) in block.iter().enumerate().skip(2) {
            let n = cells(row);
            if n != width {
                problems.push(format!(
                    "{}:{}: a row of {n} cells in a table of {width} columns (an unescaped `|`?)",
                    file.display(),
                    start + k + 1
                ));
            }
        }
    }
    problems
}

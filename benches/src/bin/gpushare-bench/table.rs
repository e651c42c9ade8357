//! A markdown table that renders as one: the report's only way to write a table.

use std::fmt::Write;

/// A markdown table. Rendered as the header row, the separator and the rows, with no blank
/// line between them (a blank line ends a table, so rows after one render as a paragraph of
/// pipes) and every `|` inside a cell escaped (it would otherwise start a new column).
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(header: &[&str]) -> Self {
        Table {
            header: header.iter().map(|h| h.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row; a short row is padded with empty cells to the header's width.
    pub fn row(&mut self, cells: impl IntoIterator<Item = String>) {
        let mut cells: Vec<String> = cells.into_iter().collect();
        assert!(
            cells.len() <= self.header.len(),
            "a row of {} cells in a table of {} columns",
            cells.len(),
            self.header.len()
        );
        cells.resize(self.header.len(), String::new());
        self.rows.push(cells);
    }

    /// Appends the table to `out`, after a blank line so that it starts a block of its own.
    /// What follows must start with a blank line too: a line of text right under a table
    /// would be read as one more row.
    pub fn render(&self, out: &mut String) {
        if !out.is_empty() && !out.ends_with("\n\n") {
            out.push_str(if out.ends_with('\n') { "\n" } else { "\n\n" });
        }
        let line = |out: &mut String, cells: &[String]| {
            out.push('|');
            for c in cells {
                let c = escape_cell(c);
                if c.is_empty() {
                    out.push_str(" |");
                } else {
                    let _ = write!(out, " {c} |");
                }
            }
            out.push('\n');
        };
        line(out, &self.header);
        out.push('|');
        for _ in &self.header {
            out.push_str("---|");
        }
        out.push('\n');
        for r in &self.rows {
            line(out, r);
        }
    }
}

/// A cell's text made safe for a table: `|` escaped, line breaks (which would end the row)
/// turned into spaces.
fn escape_cell(s: &str) -> String {
    s.replace('|', "\\|").replace(['\r', '\n'], " ")
}

/// The cells of a table line, split at the `|`s that are not escaped.
#[cfg(test)]
fn cells(line: &str) -> Vec<String> {
    let inner = line
        .trim()
        .strip_prefix('|')
        .and_then(|l| l.strip_suffix('|'));
    let inner = inner.unwrap_or_else(|| panic!("not a table line: {line:?}"));
    let mut out = vec![String::new()];
    let mut escaped = false;
    for ch in inner.chars() {
        match ch {
            '|' if !escaped => out.push(String::new()),
            _ => out.last_mut().expect("one cell at least").push(ch),
        }
        escaped = ch == '\\' && !escaped;
    }
    out.iter().map(|c| c.trim().to_string()).collect()
}

/// Every table in `md`, as (header, rows), after checking that each is one block of
/// lines: a blank line (or the start) before it, a header, a separator of as many columns,
/// and rows of as many cells, with no blank line in between.
#[cfg(test)]
pub fn tables(md: &str) -> Vec<(Vec<String>, Vec<Vec<String>>)> {
    let lines: Vec<&str> = md.lines().collect();
    let mut found = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if !lines[i].starts_with('|') {
            i += 1;
            continue;
        }
        let start = i;
        while i < lines.len() && lines[i].starts_with('|') {
            i += 1;
        }
        let block = &lines[start..i];
        let at = format!("table at line {}:\n{}", start + 1, block.join("\n"));
        assert!(
            start == 0 || lines[start - 1].trim().is_empty(),
            "no blank line before the {at}"
        );
        assert!(
            i == lines.len() || lines[i].trim().is_empty(),
            "no blank line after the {at}"
        );
        assert!(block.len() >= 2, "a header without separator: {at}");
        let header = cells(block[0]);
        let separator = cells(block[1]);
        assert!(
            separator
                .iter()
                .all(|c| c.len() >= 3 && c.trim_matches(':').chars().all(|ch| ch == '-')),
            "the second line is not a separator: {at}"
        );
        assert_eq!(separator.len(), header.len(), "separator width: {at}");
        let rows: Vec<Vec<String>> = block[2..].iter().map(|l| cells(l)).collect();
        assert!(!rows.is_empty(), "a table without rows: {at}");
        for r in &rows {
            assert_eq!(r.len(), header.len(), "row width: {at}");
        }
        found.push((header, rows));
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_is_header_separator_rows_with_pipes_escaped() {
        let mut t = Table::new(&["", "a", "b | c"]);
        t.row(["one".to_string(), "1".into(), "x|y".into()]);
        t.row(["two".to_string()]);
        let mut out = "Some text:\n".to_string();
        t.render(&mut out);
        out.push_str("\nAfter.\n");
        assert_eq!(
            out,
            "Some text:\n\
             \n\
             | | a | b \\| c |\n\
             |---|---|---|\n\
             | one | 1 | x\\|y |\n\
             | two | | |\n\
             \n\
             After.\n"
        );
        let found = tables(&out);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].0, ["", "a", "b \\| c"]);
        assert_eq!(found[0].1, [vec!["one", "1", "x\\|y"], vec!["two", "", ""]]);
    }

    #[test]
    #[should_panic(expected = "a row of 3 cells in a table of 2 columns")]
    fn a_row_wider_than_the_header_is_refused() {
        let mut t = Table::new(&["a", "b"]);
        t.row(["1".to_string(), "2".into(), "3".into()]);
    }
}

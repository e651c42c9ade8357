//! Markdown as the docs check reads it: prose with fenced blocks and code spans blanked at
//! their line numbers, and the code spans themselves.

/// The file's text with fenced code blocks blanked and inline code spans turned into spaces,
/// line breaks kept, so that what is left is prose, links and headings at their own line
/// numbers.
pub(crate) fn prose(text: &str) -> String {
    blank_code_spans(&without_fences(text))
}

/// The file's text with the lines of fenced code blocks (fences included) emptied.
pub(crate) fn without_fences(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut fence: Option<(char, usize)> = None;
    for line in text.split_inclusive('\n') {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        let marker = trimmed.chars().next().filter(|c| *c == '`' || *c == '~');
        let run = marker.map_or(0, |m| trimmed.chars().take_while(|c| *c == m).count());
        match (fence, marker) {
            (None, Some(m)) if run >= 3 && indent <= 3 => fence = Some((m, run)),
            (Some((m, n)), Some(c))
                if c == m && run >= n && trimmed[run * c.len_utf8()..].trim().is_empty() =>
            {
                fence = None
            }
            (None, _) => {
                out.push_str(line);
                continue;
            }
            _ => {}
        }
        if line.ends_with('\n') {
            out.push('\n');
        }
    }
    out
}

/// Replaces each inline code span (a run of N backticks up to the next run of exactly N in
/// the same paragraph or list item) with spaces, keeping line breaks. A run without its
/// closing run is left as it is (and renders as literal backticks).
fn blank_code_spans(text: &str) -> String {
    code_spans_and_rest(text).1
}

/// The inline code spans of `text` (outside fences), each with its line number.
pub(crate) fn code_spans(text: &str) -> Vec<(usize, String)> {
    code_spans_and_rest(&without_fences(text)).0
}

/// The line numbers of the runs of backticks in `text` (outside fences) that no run of the
/// same length closes within their paragraph or list item: they render as literal backticks.
pub(crate) fn unclosed_code_spans(text: &str) -> Vec<usize> {
    code_spans_and_rest(&without_fences(text)).2
}

/// Whether a new block (a blank line, a heading, a list item, a table row, a quote) starts at
/// `chars[k..]`, the start of a line: a code span cannot run into it.
fn block_starts(chars: &[char], k: usize) -> bool {
    let rest = &chars[k.min(chars.len())..];
    let indent = rest.iter().take_while(|c| **c == ' ').count();
    let rest = &rest[indent..];
    match rest {
        [] | ['\n', ..] | ['#' | '|' | '>', ..] => true,
        ['-' | '*' | '+', ' ', ..] => true,
        _ => {
            let digits = rest.iter().take_while(|c| c.is_ascii_digit()).count();
            digits > 0 && matches!(rest[digits..], ['.' | ')', ' ', ..])
        }
    }
}

/// The code spans of `text` with their line numbers, `text` with them blanked, and the line
/// numbers of the runs of backticks that open no span.
fn code_spans_and_rest(text: &str) -> (Vec<(usize, String)>, String, Vec<usize>) {
    let chars: Vec<char> = text.chars().collect();
    let mut spans = Vec::new();
    let mut unclosed = Vec::new();
    let mut line = 1;
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        if chars[i] != '`' {
            if chars[i] == '\n' {
                line += 1;
            }
            out.push(chars[i]);
            i += 1;
            continue;
        }
        let n = chars[i..].iter().take_while(|c| **c == '`').count();
        let mut j = i + n;
        let mut close = None;
        while j < chars.len() {
            if chars[j] == '`' {
                let m = chars[j..].iter().take_while(|c| **c == '`').count();
                if m == n {
                    close = Some(j);
                    break;
                }
                j += m;
            } else if chars[j] == '\n' && block_starts(&chars, j + 1) {
                break;
            } else {
                j += 1;
            }
        }
        match close {
            Some(j) => {
                let inside: String = chars[i + n..j].iter().collect();
                spans.push((line, inside.replace('\n', " ").trim().to_string()));
                for c in &chars[i..j + n] {
                    out.push(if *c == '\n' { '\n' } else { ' ' });
                }
                line += inside.matches('\n').count();
                i = j + n;
            }
            None => {
                unclosed.push(line);
                out.extend(&chars[i..i + n]);
                i += n;
            }
        }
    }
    (spans, out, unclosed)
}

//! Strings a client or another user controls (client names, process names, symbol names), made
//! safe to show: in a terminal, a log line or a label, a control character or a bidirectional
//! override shows as an escape (`\x1b`, `\n`, `\u{202e}`) instead of acting, so a name cannot
//! retitle or clear somebody's terminal, forge a log line or reorder what is shown after it.

use std::borrow::Cow;
use std::fmt;

/// Whether `c` is shown escaped: control characters (C0, DEL, C1) and the invisible format
/// characters that reorder or hide text. Not the backslash: escaping is idempotent, so a name
/// the broker escaped is shown as it is by `gpushare status` and `top`, which escape again
/// whatever a broker sends them.
fn escaped(c: char) -> bool {
    c.is_control()
        || matches!(c,
            '\u{061c}' | '\u{200b}'..='\u{200f}' | '\u{2028}'..='\u{202e}'
            | '\u{2060}'..='\u{2069}' | '\u{feff}')
}

/// `s` as it can be shown anywhere (borrowed when nothing needs escaping).
pub fn printable(s: &str) -> Cow<'_, str> {
    if !s.chars().any(escaped) {
        return Cow::Borrowed(s);
    }
    Cow::Owned(Printable(s).to_string())
}

/// Shows a string with [`printable`]'s escapes, without allocating: for `format!` and log
/// fields (`name = %Printable(&name)`).
#[derive(Debug, Clone, Copy)]
pub struct Printable<'a>(pub &'a str);

impl fmt::Display for Printable<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut rest = self.0;
        while let Some(at) = rest.find(escaped) {
            f.write_str(&rest[..at])?;
            let c = rest[at..].chars().next().unwrap_or_default();
            match c {
                '\n' => f.write_str("\\n")?,
                '\r' => f.write_str("\\r")?,
                '\t' => f.write_str("\\t")?,
                c if (c as u32) < 0x100 => write!(f, "\\x{:02x}", c as u32)?,
                c => write!(f, "\\u{{{:x}}}", c as u32)?,
            }
            rest = &rest[at + c.len_utf8()..];
        }
        f.write_str(rest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_and_overrides_show_as_escapes() {
        assert_eq!(printable("trainer-1"), Cow::Borrowed("trainer-1"));
        assert_eq!(printable("héllo wörld ✓"), "héllo wörld ✓");
        assert_eq!(
            printable("\x1b]0;pwned\x07\x1b[2J"),
            "\\x1b]0;pwned\\x07\\x1b[2J"
        );
        assert_eq!(printable("a\nINFO forged"), "a\\nINFO forged");
        assert_eq!(printable("tab\there\r"), "tab\\there\\r");
        assert_eq!(printable("\u{9b}31m"), "\\x9b31m", "C1 CSI");
        assert_eq!(printable("abc\u{202e}fed"), "abc\\u{202e}fed");
        assert_eq!(printable("del\x7f"), "del\\x7f");
        let once = printable("\x1b[2Ja\nb\u{202e}").into_owned();
        assert_eq!(printable(&once), once, "escaping twice changes nothing");
    }

    #[test]
    fn nothing_escaped_survives_and_plain_text_is_untouched() {
        let hostile: String = (0u32..0x3000).filter_map(char::from_u32).collect();
        let shown = printable(&hostile);
        assert!(!shown.chars().any(escaped), "{shown}");
        let plain = "GPU-0 trainer (uid 1000) — 42 %";
        assert_eq!(Printable(plain).to_string(), plain);
    }
}

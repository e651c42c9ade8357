//! The text exposition format (version 0.0.4): families with their HELP and TYPE, samples
//! with labels, and the format's escaping and number spelling.

use std::fmt::Write;

/// The content type of the text exposition format.
pub const CONTENT_TYPE_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

pub(super) fn borrow<'a, const N: usize>(
    labels: &'a [(&'a str, String); N],
) -> Vec<(&'a str, &'a str)> {
    labels.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

/// Text being built, with the format's escaping rules.
#[derive(Default)]
pub(super) struct Exposition {
    pub(super) text: String,
}

impl Exposition {
    pub(super) fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.text, "# HELP {name} {}", escape(help, false));
        let _ = writeln!(self.text, "# TYPE {name} {kind}");
    }

    pub(super) fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.text.push_str(name);
        if !labels.is_empty() {
            self.text.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.text.push(',');
                }
                let _ = write!(self.text, "{k}=\"{}\"", escape(v, true));
            }
            self.text.push('}');
        }
        let _ = writeln!(self.text, " {}", number(value));
    }
}

/// Escapes per the format: `\` and newline everywhere, `"` in label values.
fn escape(s: &str, quotes: bool) -> std::borrow::Cow<'_, str> {
    if !s.contains(['\\', '\n', '"']) {
        return s.into();
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '"' if quotes => out.push_str("\\\""),
            c => out.push(c),
        }
    }
    out.into()
}

/// A sample value as the format spells it (Go's float syntax for the specials).
fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        format!("{v}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_and_spells_numbers_as_the_format_does() {
        assert_eq!(escape("a\\b\nc\"d", false), "a\\\\b\\nc\"d");
        assert_eq!(escape("a\\b\nc\"d", true), "a\\\\b\\nc\\\"d");
        assert_eq!(number(f64::NAN), "NaN");
        assert_eq!(number(f64::INFINITY), "+Inf");
        assert_eq!(number(f64::NEG_INFINITY), "-Inf");
        assert_eq!(number(3.0), "3");
        assert_eq!(number(0.25), "0.25");
    }
}

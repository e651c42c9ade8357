//! The driver's lines on stderr, each starting `gpushare: `: one line, or one line once. A
//! leaf: every part of the driver may say something, so this imports none of them.

use std::collections::HashSet;
use std::sync::Mutex;

/// One line on stderr.
pub fn say(line: &str) {
    let _ = std::io::Write::write_all(
        &mut std::io::stderr(),
        format!("gpushare: {line}\n").as_bytes(),
    );
}

/// One line on stderr, once per distinct line.
pub fn say_once(line: &str) {
    static SAID: Mutex<Option<HashSet<String>>> = Mutex::new(None);
    let mut said = SAID.lock().unwrap_or_else(|p| p.into_inner());
    if said
        .get_or_insert_with(HashSet::new)
        .insert(line.to_string())
    {
        say(line);
    }
}

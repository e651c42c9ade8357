//! Slurm's host lists, as `scontrol` prints them (`vm`, `gpu[01-04,7]`, `a[1-2]-b[3-4],c`):
//! whether one names a node. Matched, never expanded: `n[1-100000]` costs nothing.

/// Whether `list` names `host`. A list Slurm would not print (an unclosed bracket, a range
/// that is not numbers) names nothing.
pub fn contains(list: &str, host: &str) -> bool {
    split_top(list)
        .into_iter()
        .any(|pattern| matches(pattern, host))
}

/// `list`'s comma-separated patterns, commas inside brackets left alone.
fn split_top(list: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in list.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&list[start..]);
    parts.into_iter().filter(|p| !p.is_empty()).collect()
}

/// Whether one pattern (`pre[ranges]rest`, any number of bracket groups) names `host`.
fn matches(pattern: &str, host: &str) -> bool {
    let Some(open) = pattern.find('[') else {
        return pattern == host;
    };
    let Some(close) = pattern[open..].find(']').map(|c| open + c) else {
        return false;
    };
    let (prefix, ranges, rest) = (
        &pattern[..open],
        &pattern[open + 1..close],
        &pattern[close + 1..],
    );
    let Some(tail) = host.strip_prefix(prefix) else {
        return false;
    };
    let digits = tail.bytes().take_while(u8::is_ascii_digit).count();
    // The number is some of those digits; the rest of the host must match the rest.
    (1..=digits)
        .any(|n| in_ranges(ranges, &tail[..n]).unwrap_or(false) && matches(rest, &tail[n..]))
}

/// Whether `number` (decimal digits, as written in the host name) is in `ranges`
/// (`1-3,5`, `01-10`: a zero-padded bound pads every number of its range to its width).
fn in_ranges(ranges: &str, number: &str) -> Option<bool> {
    let value: u64 = number.parse().ok()?;
    for range in ranges.split(',') {
        let (lo, hi) = range.split_once('-').unwrap_or((range, range));
        let (low, high): (u64, u64) = (lo.parse().ok()?, hi.parse().ok()?);
        let width = if lo.len() > 1 && lo.starts_with('0') {
            lo.len()
        } else {
            0
        };
        if (low..=high).contains(&value) && format!("{value:0width$}") == number {
            return Some(true);
        }
    }
    Some(false)
}

#[cfg(test)]
mod tests {
    use super::contains;

    #[test]
    fn plain_names_and_lists() {
        assert!(contains("vm", "vm"));
        assert!(!contains("vm", "vm1"));
        assert!(!contains("vm1", "vm"));
        assert!(contains("a,vm,b", "vm"));
        assert!(!contains("", "vm"));
    }

    #[test]
    fn ranges_and_padding() {
        assert!(contains("vm[1-3,5]", "vm2"));
        assert!(contains("vm[1-3,5]", "vm5"));
        assert!(!contains("vm[1-3,5]", "vm4"));
        assert!(!contains("vm[1-3,5]", "vm"));
        assert!(contains("gpu[01-10]", "gpu07"));
        assert!(contains("gpu[01-10]", "gpu10"));
        assert!(!contains("gpu[01-10]", "gpu7"));
        assert!(contains("n[8-10]", "n9"));
        assert!(contains("n[8-10]", "n10"));
        assert!(!contains("n[8-10]", "n010"));
        assert!(contains("n[098-100]", "n099"));
        assert!(contains("n[1-100000]", "n99999"));
    }

    #[test]
    fn several_groups_suffixes_and_lists_of_them() {
        assert!(contains("rack[1-2]-n[1-4]", "rack2-n3"));
        assert!(!contains("rack[1-2]-n[1-4]", "rack3-n3"));
        assert!(contains("gpu-a[01-04],gpu-b7", "gpu-b7"));
        assert!(contains("gpu-a[01-04],gpu-b7", "gpu-a03"));
        assert!(contains("n[1-2]x", "n2x"));
        assert!(!contains("n[1-2]x", "n2"));
        // A suffix that starts with digits: the number is the digits the range allows.
        assert!(contains("n[1-2]0", "n20"));
    }

    #[test]
    fn what_slurm_would_not_print_names_nothing() {
        assert!(!contains("vm[1-3", "vm1"));
        assert!(!contains("vm[a-c]", "vmb"));
    }
}

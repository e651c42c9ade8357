//! The loader's search lists in the environment (`LD_LIBRARY_PATH`, `LD_AUDIT`,
//! `LD_PRELOAD`): gpushare's entries added where they take effect, the user's kept as they
//! were, and entries a gpushare-run parent left taken out.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;

/// `LD_LIBRARY_PATH` and `LD_AUDIT` separate entries with colons.
pub const COLON: &[u8] = b":";
/// `LD_PRELOAD` takes spaces too.
pub const COLON_OR_SPACE: &[u8] = b": ";

/// A list with `dir` first, ahead of `rest`. An empty `rest` adds nothing: a trailing empty
/// entry would put the working directory on the path.
pub fn prepend(dir: &Path, rest: Option<OsString>) -> OsString {
    let mut list = dir.as_os_str().to_os_string();
    if let Some(rest) = rest.filter(|r| !r.is_empty()) {
        list.push(":");
        list.push(rest);
    }
    list
}

/// A list with `entry` last, after `rest` (for `LD_AUDIT`, whose last module has the last
/// word on each search).
pub fn append(rest: Option<OsString>, entry: &Path) -> OsString {
    match rest.filter(|r| !r.is_empty()) {
        Some(mut list) => {
            list.push(":");
            list.push(entry);
            list
        }
        None => entry.as_os_str().to_os_string(),
    }
}

/// `list` without the entries `drop` picks, the others in order and as written (empty
/// entries included: in `LD_LIBRARY_PATH` they mean the working directory); `None` when
/// nothing is left.
pub fn without(
    list: Option<OsString>,
    separators: &[u8],
    drop: impl Fn(&Path) -> bool,
) -> Option<OsString> {
    let list = list?;
    let kept: Vec<&[u8]> = list
        .as_bytes()
        .split(|b| separators.contains(b))
        .filter(|e| !drop(Path::new(OsStr::from_bytes(e))) || e.is_empty())
        .collect();
    let joined = kept.join(&b':');
    if kept.iter().all(|e| e.is_empty()) {
        None
    } else {
        Some(OsString::from_vec(joined))
    }
}

/// Whether `entry` names a file called `name`.
pub fn named(entry: &Path, name: &str) -> bool {
    entry.file_name().is_some_and(|n| n == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(s: &str) -> Option<OsString> {
        Some(s.into())
    }

    #[test]
    fn prepending_keeps_the_users_path_after_ours_and_adds_no_working_directory() {
        let shadow = Path::new("/usr/lib/gpushare/cuda");
        assert_eq!(
            prepend(shadow, os("/opt/lib::/usr/local/lib")),
            "/usr/lib/gpushare/cuda:/opt/lib::/usr/local/lib"
        );
        assert_eq!(prepend(shadow, None), "/usr/lib/gpushare/cuda");
        assert_eq!(prepend(shadow, os("")), "/usr/lib/gpushare/cuda");
    }

    #[test]
    fn appending_puts_ours_last() {
        let audit = Path::new("/usr/lib/gpushare/libgpushare_audit.so");
        assert_eq!(
            append(os("/home/a/my_audit.so"), audit),
            "/home/a/my_audit.so:/usr/lib/gpushare/libgpushare_audit.so"
        );
        assert_eq!(append(os(""), audit), audit.as_os_str());
        assert_eq!(append(None, audit), audit.as_os_str());
    }

    #[test]
    fn removing_takes_out_only_the_entries_asked_for() {
        let audit = |p: &Path| named(p, "libgpushare_audit.so");
        assert_eq!(
            without(
                os("/a/my.so:/usr/lib/gpushare/libgpushare_audit.so"),
                COLON,
                audit
            ),
            os("/a/my.so")
        );
        assert_eq!(
            without(os("/usr/lib/gpushare/libgpushare_audit.so"), COLON, audit),
            None
        );
        assert_eq!(without(os("/a/my.so"), COLON, audit), os("/a/my.so"));
        assert_eq!(without(os(""), COLON, audit), None);
        assert_eq!(without(None, COLON, audit), None);
        // An empty entry (the working directory) stays.
        let shadow = |p: &Path| p == Path::new("/x/cuda");
        assert_eq!(
            without(os("/x/cuda:/opt/lib::/y"), COLON, shadow),
            os("/opt/lib::/y")
        );
        // LD_PRELOAD's spaces separate too.
        let interposer = |p: &Path| named(p, "libgpushare_interpose.so");
        assert_eq!(
            without(
                os("/a/one.so /lib/libgpushare_interpose.so:/b/two.so"),
                COLON_OR_SPACE,
                interposer
            ),
            os("/a/one.so:/b/two.so")
        );
    }
}

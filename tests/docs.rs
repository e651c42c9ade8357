//! The project's markdown renders and its cross-references resolve. In README.md, docs/*.md,
//! packaging/README.md and benches/*/README.md:
//! - every relative link names a file or directory that exists, and every `#anchor` (in the
//!   same file or `file.md#anchor`) names a heading of that file; external links (http,
//!   https, mailto) are not fetched;
//! - every section named in prose, `see "Heading"`, is a heading of the same file (or text of
//!   the file named after it: `see "X" in `path``);
//! - every path of the repository named in inline code (`broker/src/dispatch.rs`) exists;
//! - every table is a header, a separator of as many columns and rows of as many cells, with
//!   a blank line before and after it.
//!
//! Each failure names the file and line. Run alone: `cargo test -p gpushare-tests --test docs`.
//!
//! Anchors follow GitHub's rule: the heading's text, lowercased, with everything but letters,
//! digits, spaces, `-` and `_` dropped and spaces turned into `-`; a repeated heading gets
//! `-1`, `-2`, … appended.

use std::collections::{BTreeMap, HashSet};
use std::path::{Component, Path, PathBuf};

#[path = "docs/markdown.rs"]
mod markdown;
#[path = "docs/tables.rs"]
mod tables;

use markdown::{code_spans, prose, unclosed_code_spans, without_fences};
use tables::broken_tables;

/// The workspace root (this crate lives in `tests/`).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// The markdown files that are checked, relative to the root.
fn checked_files(root: &Path) -> Vec<PathBuf> {
    let mut files = vec![PathBuf::from("README.md")];
    let mut sorted_dir = |dir: &str, keep: &dyn Fn(&Path) -> Option<PathBuf>| {
        let mut found: Vec<PathBuf> = std::fs::read_dir(root.join(dir))
            .unwrap_or_else(|e| panic!("read {dir}: {e}"))
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter_map(|p| keep(&p))
            .collect();
        found.sort();
        files.extend(found.into_iter().map(|p| Path::new(dir).join(p)));
    };
    sorted_dir("docs", &|p| {
        (p.extension().is_some_and(|e| e == "md") && p.is_file())
            .then(|| PathBuf::from(p.file_name().unwrap_or_default()))
    });
    sorted_dir("benches", &|p| {
        let readme = p.join("README.md");
        readme
            .is_file()
            .then(|| Path::new(p.file_name().unwrap_or_default()).join("README.md"))
    });
    if root.join("packaging/README.md").is_file() {
        files.push(PathBuf::from("packaging/README.md"));
    }
    files
}

/// The top-level directories a code span's path must start with to be checked as a reference
/// to a file of the repository.
const REPO_DIRS: &[&str] = &[
    "benches/",
    "bpf/",
    "broker/",
    "client-lib/",
    "docs/",
    "packaging/",
    "scripts/",
    "tests/",
    "tools/",
];

/// What is wrong with each path of the repository that `file` names in a code span
/// (`broker/src/dispatch.rs`, `scripts/test.sh:12`): it must exist. Patterns (`*`, `{…}`) and
/// anything with spaces or other arguments are not paths and are left alone.
fn missing_paths(root: &Path, file: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(root.join(file))
        .unwrap_or_else(|e| panic!("read {}: {e}", file.display()));
    let mut problems = Vec::new();
    for (line, span) in code_spans(&text) {
        let path = span.split(':').next().unwrap_or("");
        let path = path.trim_end_matches(['.', ',']);
        let is_path = REPO_DIRS.iter().any(|d| path.starts_with(d))
            && path
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "/._-".contains(c));
        if is_path && !root.join(path).exists() {
            problems.push(format!(
                "{}:{line}: `{span}`: no such file or directory in the repository",
                file.display()
            ));
        }
    }
    problems
}

/// GitHub's anchor for a heading's text.
fn slug(heading: &str) -> String {
    // Links in a heading count by their text only.
    let text = replace_links_by_text(heading);
    text.trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            '-' | '_' => Some(c),
            c if c.is_alphanumeric() => Some(c),
            _ => None,
        })
        .collect()
}

/// `[text](target)` → `text`.
fn replace_links_by_text(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(open) = rest.find('[') {
        let Some(close) = rest[open..].find("](").map(|c| open + c) else {
            break;
        };
        let Some(end) = rest[close..].find(')').map(|e| close + e) else {
            break;
        };
        out.push_str(&rest[..open]);
        out.push_str(&rest[open + 1..close]);
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    out
}

/// The anchors of a file's headings (ATX headings, `#` to `######`, outside code blocks; and
/// `<a name="…">`/`id="…"` in HTML), with GitHub's numbering of repeated ones.
fn anchors(text: &str) -> HashSet<String> {
    let prose = prose(text);
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = HashSet::new();
    for line in prose.lines() {
        let t = line.trim_start();
        if line.len() - t.len() > 3 {
            continue;
        }
        let level = t.chars().take_while(|c| *c == '#').count();
        if (1..=6).contains(&level) && t[level..].starts_with([' ', '\t']) {
            // The code spans were blanked out of `prose`: take the heading from the original
            // line, whose code text counts for the anchor.
            let original = text.lines().nth(line_index(&prose, line)).unwrap_or(line);
            let heading = original.trim_start()[level..]
                .trim()
                .trim_end_matches('#')
                .trim_end();
            let base = slug(heading);
            let n = seen.entry(base.clone()).or_insert(0);
            out.insert(if *n == 0 { base } else { format!("{base}-{n}") });
            *n += 1;
        }
        for key in ["name=\"", "id=\""] {
            let mut rest = line;
            while let Some(at) = rest.find(key) {
                rest = &rest[at + key.len()..];
                if let Some(end) = rest.find('"') {
                    out.insert(rest[..end].to_string());
                }
            }
        }
    }
    out
}

/// The index of `line` (a slice of `text` yielded by `text.lines()`) among the lines of `text`.
fn line_index(text: &str, line: &str) -> usize {
    let offset = line.as_ptr() as usize - text.as_ptr() as usize;
    text[..offset].matches('\n').count()
}

/// One link in a file: its line number and its target as written.
struct Link {
    line: usize,
    target: String,
}

/// The inline links and images (`[text](target)`, `![alt](target)`) and the reference
/// definitions (`[label]: target`) of a file, outside code.
fn links(text: &str) -> Vec<Link> {
    let prose = prose(text);
    let mut out = Vec::new();
    let bytes = prose.as_bytes();
    let mut i = 0;
    while let Some(at) = prose[i..].find("](").map(|a| i + a) {
        let start = at + 2;
        let mut depth = 0usize;
        let mut end = None;
        let angle = bytes.get(start) == Some(&b'<');
        for (k, &b) in bytes.iter().enumerate().skip(start) {
            match b {
                b'\n' => break,
                b'>' if angle => {
                    end = Some(k + 1);
                    break;
                }
                b'(' if !angle => depth += 1,
                b')' if !angle && depth == 0 => {
                    end = Some(k);
                    break;
                }
                b')' if !angle => depth -= 1,
                _ => {}
            }
        }
        i = start;
        let Some(end) = end else { continue };
        let inside = prose[start..end].trim();
        let target = if angle {
            inside.trim_start_matches('<').trim_end_matches('>')
        } else {
            // A title may follow the destination after a space.
            inside.split_whitespace().next().unwrap_or("")
        };
        out.push(Link {
            line: prose[..at].matches('\n').count() + 1,
            target: target.to_string(),
        });
    }
    for (n, line) in prose.lines().enumerate() {
        let t = line.trim_start();
        if line.len() - t.len() > 3 || !t.starts_with('[') {
            continue;
        }
        if let Some(close) = t.find("]:") {
            let target = t[close + 2..].split_whitespace().next().unwrap_or("");
            let target = target.trim_start_matches('<').trim_end_matches('>');
            if !target.is_empty() {
                out.push(Link {
                    line: n + 1,
                    target: target.to_string(),
                });
            }
        }
    }
    out
}

/// `a/./b/../c` → `a/c`, without touching the file system; `None` for a path that climbs
/// above where it starts.
fn normalize(p: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            other => out.push(other),
        }
    }
    Some(out)
}

/// `%20` and the like in a link's path.
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(hex) = s.get(i + 1..i + 3)
            && let Ok(b) = u8::from_str_radix(hex, 16)
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// What is wrong with each link of `file` (relative to `root`), one line each.
fn broken_links(
    root: &Path,
    file: &Path,
    cache: &mut BTreeMap<PathBuf, HashSet<String>>,
) -> Vec<String> {
    let text = std::fs::read_to_string(root.join(file))
        .unwrap_or_else(|e| panic!("read {}: {e}", file.display()));
    let mut problems = Vec::new();
    let mut anchors_of = |path: &Path| -> HashSet<String> {
        cache
            .entry(path.to_path_buf())
            .or_insert_with(|| {
                anchors(&std::fs::read_to_string(root.join(path)).unwrap_or_default())
            })
            .clone()
    };
    problems.extend(broken_section_references(root, file));
    for link in links(&text) {
        let target = link.target.as_str();
        let lower = target.to_ascii_lowercase();
        if ["http://", "https://", "mailto:", "ftp://"]
            .iter()
            .any(|s| lower.starts_with(s))
        {
            continue;
        }
        let at = format!("{}:{}: `{target}`", file.display(), link.line);
        let (path, anchor) = match target.split_once('#') {
            Some((p, a)) => (p, Some(a)),
            None => (target, None),
        };
        let path = path.split('?').next().unwrap_or("");
        let resolved = if path.is_empty() {
            Some(file.to_path_buf())
        } else if let Some(abs) = path.strip_prefix('/') {
            // GitHub reads a leading `/` as the repository's root.
            normalize(Path::new(&percent_decode(abs)))
        } else {
            let dir = file.parent().unwrap_or(Path::new(""));
            normalize(&dir.join(percent_decode(path)))
        };
        let Some(resolved) = resolved else {
            problems.push(format!("{at}: points outside the repository"));
            continue;
        };
        if !root.join(&resolved).exists() {
            problems.push(format!("{at}: no file {}", resolved.display()));
            continue;
        }
        let Some(anchor) = anchor else { continue };
        // Anchors are checked in markdown files only (`code.rs#L10` is a line, not a heading).
        if resolved.extension().is_none_or(|e| e != "md") {
            continue;
        }
        let anchor = percent_decode(anchor).to_lowercase();
        if !anchors_of(&resolved).contains(&anchor) {
            problems.push(format!(
                "{at}: no heading in {} has the anchor #{anchor}",
                resolved.display()
            ));
        }
    }
    problems
}

/// What is wrong with each section named in prose, `see "Heading"`, in `file`: the quoted
/// text must be a heading of the file, or, where it goes on `in `path``, text of that file of
/// the repository. (A reference that is a link is checked as one.)
fn broken_section_references(root: &Path, file: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(root.join(file))
        .unwrap_or_else(|e| panic!("read {}: {e}", file.display()));
    let own = anchors(&text);
    let body = without_fences(&text);
    let lower = body.to_ascii_lowercase();
    let mut problems = Vec::new();
    let mut from = 0;
    while let Some(at) = lower[from..].find("see \"").map(|a| from + a) {
        let start = at + "see \"".len();
        from = start;
        let Some(len) = body[start..].find('"') else {
            break;
        };
        let name = body[start..start + len]
            .split_whitespace()
            .collect::<Vec<_>>();
        let name = name.join(" ");
        let line = body[..at].matches('\n').count() + 1;
        let after = &body[start + len + 1..];
        let in_file = after
            .strip_prefix(" in `")
            .and_then(|rest| rest.split('`').next());
        let problem = match in_file {
            Some(path) => {
                let holds = std::fs::read_to_string(root.join(path))
                    .is_ok_and(|t| t.contains(name.as_str()));
                (!holds).then(|| format!("`{path}` has no \"{name}\""))
            }
            None => (!own.contains(&slug(&name)))
                .then(|| "no heading of this file has that name".to_string()),
        };
        if let Some(problem) = problem {
            problems.push(format!(
                "{}:{line}: see \"{name}\": {problem}",
                file.display()
            ));
        }
    }
    problems
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let root = root();
    let mut cache = BTreeMap::new();
    let files = checked_files(&root);
    assert!(files.len() > 3, "found only {files:?}");
    let problems: Vec<String> = files
        .iter()
        .flat_map(|f| broken_links(&root, f, &mut cache))
        .collect();
    assert!(
        problems.is_empty(),
        "{} broken links:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn every_repository_path_named_in_code_exists() {
    let root = root();
    let problems: Vec<String> = checked_files(&root)
        .iter()
        .flat_map(|f| missing_paths(&root, f))
        .collect();
    assert!(
        problems.is_empty(),
        "{} paths that do not exist:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn every_code_span_closes() {
    let root = root();
    let mut problems = Vec::new();
    for f in checked_files(&root) {
        let text = std::fs::read_to_string(root.join(&f)).expect("read");
        for line in unclosed_code_spans(&text) {
            problems.push(format!(
                "{}:{line}: a run of backticks that nothing closes in its paragraph or list \
                 item (it shows as literal backticks)",
                f.display()
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "{} broken code spans:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn every_table_renders() {
    let root = root();
    let problems: Vec<String> = checked_files(&root)
        .iter()
        .flat_map(|f| broken_tables(&root, f))
        .collect();
    assert!(
        problems.is_empty(),
        "{} broken tables:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn the_checker_finds_what_it_should() {
    // Anchors, GitHub's way.
    assert_eq!(slug("Limits, stated plainly"), "limits-stated-plainly");
    assert_eq!(
        slug("Seeing who uses the GPU: `gpushare top`, `status`, metrics"),
        "seeing-who-uses-the-gpu-gpushare-top-status-metrics"
    );
    assert_eq!(
        slug("The idle round trip (112 µs)"),
        "the-idle-round-trip-112-µs"
    );
    assert_eq!(
        slug("Run A: all scenarios (commit b38f20c, 5 rounds)"),
        "run-a-all-scenarios-commit-b38f20c-5-rounds"
    );
    let a = anchors("# Top\n\n## Same\n\n```\n# not a heading\n```\n\n## Same\n");
    let mut a: Vec<_> = a.into_iter().collect();
    a.sort();
    assert_eq!(a, ["same", "same-1", "top"]);

    // Links, outside code only.
    let text = "See [a](b.md#c), `[x](not-a-link)`, ![img](pic.png \"title\").\n\
                ```\n[y](in-code)\n```\n[ref]: other.md\n[multi\nline](z.md)\n";
    let found: Vec<(usize, String)> = links(text)
        .into_iter()
        .map(|l| (l.line, l.target))
        .collect();
    assert_eq!(
        found,
        [
            (1, "b.md#c".to_string()),
            (1, "pic.png".to_string()),
            (7, "z.md".to_string()),
            (5, "other.md".to_string())
        ]
    );

    // Code spans, and the paths in them.
    let spans = code_spans("a `x`\n```\n`no`\n```\nb ``y `z` y``\nc `d\ne` f\n");
    assert_eq!(
        spans,
        [
            (1, "x".to_string()),
            (5, "y `z` y".to_string()),
            (6, "d e".to_string())
        ]
    );
    // A span does not run into the next list item or paragraph; the old tracefs line of
    // docs/telemetry.md (runs of one, two and three backticks) closes nothing.
    let text = "- `a ``b```\n- `c`\n\n`d\n\ne`\n";
    assert_eq!(code_spans(text), [(2, "c".to_string())]);
    assert_eq!(unclosed_code_spans(text), [1, 1, 1, 4, 6]);

    // Tables: the report writer's old output (a blank line under the separator) is caught.
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(
        dir.path().join("t.md"),
        "Text.\n\n| a | b |\n|---|---|\n\n| 1 | 2 |\n\n| a | b |\n|---|---|\n| 1 | 2 | 3 |\n",
    )
    .expect("write");
    let problems = broken_tables(dir.path(), Path::new("t.md"));
    assert!(
        problems
            .iter()
            .any(|p| p.contains("t.md:3: a table without rows")),
        "{problems:?}"
    );
    assert!(
        problems
            .iter()
            .any(|p| p.contains("t.md:6: a table row with no header")),
        "{problems:?}"
    );
    assert!(
        problems
            .iter()
            .any(|p| p.contains("t.md:10: a row of 3 cells")),
        "{problems:?}"
    );

    // A path of the repository in code must exist; patterns and commands are left alone.
    std::fs::create_dir_all(dir.path().join("docs")).expect("mkdir");
    std::fs::write(
        dir.path().join("p.md"),
        "`docs/` `docs/gone.md` `scripts/*.sh` `tests/{a,b}.rs` `docs/x.md --flag`\n",
    )
    .expect("write");
    let problems = missing_paths(dir.path(), Path::new("p.md"));
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].starts_with("p.md:1: `docs/gone.md`"),
        "{problems:?}"
    );

    // Broken links and section references are named with their file and line.
    std::fs::write(
        dir.path().join("l.md"),
        "# Here\n\n[ok](#here) [bad](#there) [gone](missing.md) [x](t.md#nope) [web](https://x.invalid/)\n\
         (see \"Here\"; see \"There\"; see \"a b\" in `t.md`; see \"Text.\" in `t.md`)\n",
    )
    .expect("write");
    let problems = broken_links(dir.path(), Path::new("l.md"), &mut BTreeMap::new());
    assert_eq!(problems.len(), 5, "{problems:?}");
    assert!(
        problems[0].starts_with("l.md:4: see \"There\": no heading"),
        "{problems:?}"
    );
    assert!(
        problems[1].starts_with("l.md:4: see \"a b\": `t.md` has no \"a b\""),
        "{problems:?}"
    );
    assert!(
        problems[2].starts_with("l.md:3: `#there`: no heading"),
        "{problems:?}"
    );
    assert!(
        problems[3].starts_with("l.md:3: `missing.md`: no file"),
        "{problems:?}"
    );
    assert!(
        problems[4].starts_with("l.md:3: `t.md#nope`: no heading in t.md"),
        "{problems:?}"
    );
}

//! The docs' commands and examples do what they say, run as written:
//! - every shell command in README.md (```` ```sh ```` blocks, `$ ` lines of ```` ```console ````
//!   blocks) is run here or listed in [`NOT_RUN`] with the reason (root, a GPU, a release build),
//!   which the README's prose says too;
//! - the README's C program builds with the README's own command line and runs against a sim
//!   broker; its policy example is what the broker reads and grants, and the broker starts with
//!   each of its other policy examples;
//! - the README's `gpushared` synopsis names every flag `gpushared --help` has, and no other;
//! - the outputs docs/cli.md and docs/install.md show have the columns and lines the binaries
//!   print now.

use std::path::{Path, PathBuf};
use std::process::Command;

use gpushare_tests::{Broker, BrokerOptions, binary, library_dir};

/// README commands no test runs, and why. Each must still be in the README.
const NOT_RUN: &[(&str, &str)] = &[
    (
        "./scripts/demo.sh",
        "a release build first; tests/demo.rs runs the tour it ends with",
    ),
    ("./scripts/test.sh", "it runs this test"),
    (
        "scripts/package.sh",
        "a release build and cargo-deb; scripts/package-check.sh (as root) checks the package",
    ),
    (
        "apt install",
        "root: installs the package, which starts a system service",
    ),
    ("adduser", "root: changes the system's groups"),
    (
        "gpushare run",
        "a CUDA program (python3 train.py); tests/run.rs and tests/consolidated.rs run C ones",
    ),
    (
        "./scripts/gpu-bundle.sh",
        "a release build for a GPU machine",
    ),
    ("scp", "a GPU machine"),
    ("ssh", "a GPU machine"),
];

/// README commands the C test below runs.
const C_COMMANDS: [&str; 2] = ["cc -I client-lib/include app.c", "./app"];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_path_buf()
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("read {path}: {e}"))
}

/// A fenced code block: its info string's first word, its first line's number, its text.
struct Block {
    lang: String,
    line: usize,
    text: String,
}

fn blocks(markdown: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut open: Option<Block> = None;
    for (i, line) in markdown.lines().enumerate() {
        let fence = line.trim_start().starts_with("```");
        match (&mut open, fence) {
            (None, true) => {
                let info = line.trim_start().trim_start_matches('`').trim();
                open = Some(Block {
                    lang: info.split_whitespace().next().unwrap_or("").to_string(),
                    line: i + 2,
                    text: String::new(),
                });
            }
            (Some(_), true) => out.extend(open.take()),
            (Some(b), false) => {
                b.text.push_str(line);
                b.text.push('\n');
            }
            (None, false) => {}
        }
    }
    out
}

/// The shell commands of a block: `sh` lines without their comments, continued lines
/// joined; the `$ ` lines of a `console` block.
fn commands(block: &Block) -> Vec<String> {
    match block.lang.as_str() {
        "sh" => {
            let mut out = Vec::new();
            let mut pending = String::new();
            for line in block.text.lines() {
                let code = line.split(" #").next().unwrap_or("").trim();
                if let Some(head) = code.strip_suffix('\\') {
                    pending.push_str(head);
                    continue;
                }
                pending.push_str(code);
                if !pending.trim().is_empty() {
                    out.push(pending.trim().to_string());
                }
                pending.clear();
            }
            out
        }
        "console" => block
            .text
            .lines()
            .filter_map(|l| l.strip_prefix("$ "))
            .map(|c| c.trim().to_string())
            .collect(),
        _ => Vec::new(),
    }
}

fn the_block(markdown: &str, lang: &str, starts_with: &str) -> Block {
    blocks(markdown)
        .into_iter()
        .find(|b| b.lang == lang && b.text.starts_with(starts_with))
        .unwrap_or_else(|| panic!("no ```{lang} block starting {starts_with:?}"))
}

#[test]
fn every_readme_shell_command_runs_here_or_says_why_not() {
    let readme = read("README.md");
    let mut unexplained = Vec::new();
    let mut used = vec![false; NOT_RUN.len()];
    for block in blocks(&readme) {
        for command in commands(&block) {
            if C_COMMANDS.iter().any(|c| command.starts_with(c)) {
                continue;
            }
            match NOT_RUN.iter().position(|(p, _)| command.starts_with(p)) {
                Some(i) => used[i] = true,
                None => unexplained.push(format!("README.md:{}: {command}", block.line)),
            }
        }
    }
    assert!(
        unexplained.is_empty(),
        "README commands that no test runs and NOT_RUN does not explain:\n{}",
        unexplained.join("\n")
    );
    let stale: Vec<_> = NOT_RUN
        .iter()
        .zip(&used)
        .filter(|(_, used)| !**used)
        .map(|((p, _), _)| *p)
        .collect();
    assert!(
        stale.is_empty(),
        "NOT_RUN names commands the README no longer has: {stale:?}"
    );
}

#[test]
fn the_readme_c_program_builds_with_its_own_line_and_runs() {
    let readme = read("README.md");
    let program = the_block(&readme, "c", "#include <gpushare.h>");
    let build = blocks(&readme)
        .iter()
        .flat_map(commands)
        .find(|c| c.starts_with(C_COMMANDS[0]))
        .expect("the README's build line");
    // The README's paths, relative to the repository, in a scratch directory: the headers,
    // and as target/release the build directory of this test's libgpushare.so, where its
    // soname link is (cargo's deps/ holds the library without it).
    let built = library_dir();
    let target = [built.as_path(), built.parent().unwrap_or(&built)]
        .into_iter()
        .find(|d| d.join("libgpushare.so.0").exists())
        .expect("a directory with libgpushare.so.0 (client-lib/build.rs makes the link)")
        .to_path_buf();
    let dir = tempfile::tempdir().expect("temp dir");
    std::os::unix::fs::symlink(root().join("client-lib"), dir.path().join("client-lib"))
        .expect("link client-lib");
    std::fs::create_dir(dir.path().join("target")).expect("target");
    std::os::unix::fs::symlink(&target, dir.path().join("target/release"))
        .expect("link target/release");
    std::fs::write(dir.path().join("app.c"), &program.text).expect("write app.c");
    // As from a shell in that directory: `$PWD` (in the rpath) names it.
    let cc = Command::new("sh")
        .args(["-c", &build])
        .current_dir(dir.path())
        .env("PWD", dir.path())
        .output()
        .expect("run sh");
    assert!(
        cc.status.success(),
        "{build}\n{}",
        String::from_utf8_lossy(&cc.stderr)
    );

    let broker = Broker::start();
    let run = Command::new(dir.path().join("app"))
        .env("GPUSHARE_SOCKET", &broker.socket)
        .env_remove("LD_LIBRARY_PATH")
        .output()
        .expect("run ./app");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "./app: {stdout}{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert_eq!(stdout, "my-app: 4096 sums checked\n");
}

#[test]
fn the_readme_policy_example_is_what_the_broker_reads() {
    let readme = read("README.md");
    let policy = the_block(&readme, "toml", "admin_group");
    let broker = Broker::start_with(BrokerOptions {
        policy: Some(policy.text),
        ..Default::default()
    });
    // This user is neither alice nor a student: the example's [defaults] apply.
    let session = broker.client_named("policy-example").session();
    assert_eq!(session.class, gpushare::PriorityClass::Normal);
    assert_eq!(session.weight, 1);
    assert_eq!(session.memory_quota, Some(8 << 30));
    assert_eq!(broker.status().policy, "fifo");
}

/// The README's other policy examples (priority beside fair shares, fair shares by user): the
/// broker starts with each and runs the scheduler it names.
#[test]
fn every_readme_policy_example_starts_the_broker() {
    let readme = read("README.md");
    let examples: Vec<Block> = blocks(&readme)
        .into_iter()
        .filter(|b| b.lang == "toml" && !b.text.starts_with("admin_group"))
        .collect();
    assert!(!examples.is_empty(), "the README has no policy example");
    for example in examples {
        let scheduler = example
            .text
            .lines()
            .find_map(|l| l.strip_prefix("scheduler = \""))
            .and_then(|rest| rest.split('"').next())
            .unwrap_or_else(|| panic!("README.md:{}: no scheduler line", example.line))
            .to_string();
        let broker = Broker::start_with(BrokerOptions {
            policy: Some(example.text),
            ..Default::default()
        });
        assert_eq!(
            broker.status().policy,
            scheduler,
            "README.md:{}: the policy running",
            example.line
        );
    }
}

/// The `--flags` named in `text`.
fn flags(text: &str) -> std::collections::BTreeSet<String> {
    text.split(|c: char| c.is_whitespace() || c == '[' || c == ']' || c == ',')
        .filter(|w| w.starts_with("--") && w.len() > 2)
        .map(|w| {
            w.trim_end_matches(|c: char| !c.is_ascii_alphanumeric())
                .to_string()
        })
        .collect()
}

#[test]
fn the_readme_synopsis_names_every_gpushared_flag() {
    let readme = read("README.md");
    let synopsis = the_block(&readme, "text", "gpushared [");
    let help = Command::new(binary("gpushared"))
        .arg("--help")
        .output()
        .expect("gpushared --help");
    let help = String::from_utf8_lossy(&help.stdout);
    let mut offered = flags(&help);
    offered.remove("--help");
    offered.remove("--version");
    assert_eq!(
        flags(&synopsis.text),
        offered,
        "README synopsis vs gpushared --help"
    );
}

/// The header row (the line with `PID`) of a table, as words.
fn header(text: &str) -> Vec<String> {
    text.lines()
        .find(|l| l.split_whitespace().any(|w| w == "PID"))
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .unwrap_or_default()
}

fn gpushare(broker: &Broker, args: &[&str]) -> String {
    let out = broker
        .command("gpushare")
        .args(args)
        .output()
        .expect("run gpushare");
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_cli_docs_show_what_the_binaries_print() {
    let cli = read("docs/cli.md");
    let install = read("docs/install.md");
    let broker = Broker::start();

    // `gpushare status` with no clients: the same lines, up to each one's first `,` or `:`.
    let shape = |text: &str| -> Vec<String> {
        text.lines()
            .map(|l| l.split([',', ':']).next().unwrap_or("").to_string())
            .collect()
    };
    let documented = the_block(&install, "console", "$ gpushare status");
    let documented: String = documented
        .text
        .lines()
        .skip(1)
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(
        shape(&documented),
        shape(&gpushare(&broker, &["status"])),
        "docs/install.md's gpushare status"
    );

    // The top frame in docs/cli.md is of a broker of two GPUs (its GPU column shows then).
    let two = gpushare_tests::Broker::start_with(gpushare_tests::BrokerOptions {
        extra_args: vec!["--sim-gpus".into(), "2".into()],
        ..Default::default()
    });
    let _client = broker.client_named("columns");
    let _on_two = two.client_named("columns");
    for (doc, args, broker) in [
        (
            "$ gpushare top -b -n 1",
            &["top", "-b", "-n", "1"][..],
            &two,
        ),
        ("$ gpushare clients", &["clients"][..], &broker),
    ] {
        let block = blocks(&cli)
            .into_iter()
            .find(|b| b.text.starts_with(doc))
            .unwrap_or_else(|| panic!("docs/cli.md has no block starting {doc:?}"));
        let printed = gpushare(broker, args);
        assert!(!header(&printed).is_empty(), "{printed}");
        assert_eq!(
            header(&block.text),
            header(&printed),
            "docs/cli.md:{}: the columns of `{doc}`",
            block.line
        );
    }
}

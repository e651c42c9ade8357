use super::*;
use std::path::PathBuf;

use super::commands::command_variant;
use super::messages::{broker_variant, client_variant};
use super::seeds::encoded;

fn corpus_dir(target: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target)
}

/// Every checked-in corpus file goes through its target's body, as the fuzzer would.
#[test]
fn checked_in_corpus_replays() {
    for (target, body) in TARGETS {
        let dir = corpus_dir(target);
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|entry| entry.expect("corpus entry").path())
            .collect();
        files.sort();
        assert!(!files.is_empty(), "{}: empty corpus", dir.display());
        let failed: Vec<String> = files
            .iter()
            .filter(|path| {
                let bytes = std::fs::read(path).expect("read corpus file");
                std::panic::catch_unwind(|| body(&bytes)).is_err()
            })
            .map(|path| path.display().to_string())
            .collect();
        assert!(failed.is_empty(), "{target}: failing inputs {failed:#?}");
    }
}

/// The checked-in corpus holds every seed [`seeds`] makes, byte for byte.
#[test]
fn seed_corpus_is_checked_in() {
    let mut stale = Vec::new();
    for (target, name, bytes) in seeds() {
        let path = corpus_dir(target).join(&name);
        if std::fs::read(&path).ok().as_deref() != Some(&bytes[..]) {
            stale.push(path.display().to_string());
        }
    }
    assert!(
        stale.is_empty(),
        "seed corpus out of date; regenerate with `cargo test -p gpushare-protocol --lib \
         fuzzing::tests::write_seed_corpus -- --ignored`: {stale:#?}"
    );
}

/// Every seed is a valid message or command where it should be, so the fuzzer starts from
/// deep inside the decoders.
#[test]
fn seeds_cover_every_variant() {
    for m in client_messages() {
        let bytes = encoded(&m);
        assert_eq!(
            control::decode::<ClientMessage>(&bytes).expect("decodes"),
            m
        );
    }
    for m in broker_messages() {
        let bytes = encoded(&m);
        assert_eq!(
            control::decode::<BrokerMessage>(&bytes).expect("decodes"),
            m
        );
    }
    let mut names: Vec<&str> = commands().iter().map(command_variant).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), 64, "one seed per command and kernel");
    for c in commands() {
        assert_eq!(Command::decode(&c.encode(1)), Ok(c));
    }
    let mut names: Vec<&str> = client_messages().iter().map(client_variant).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), 24, "every client message");
    let mut names: Vec<&str> = broker_messages().iter().map(broker_variant).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), 24, "every broker message");
    let total = seeds().len();
    assert!(total < 200, "{total} seeds: keep the corpus small");
}

/// Writes [`seeds`] into `fuzz/corpus/` (run by hand after changing them).
#[test]
#[ignore = "writes the seed corpus; run by hand"]
fn write_seed_corpus() {
    for (target, name, bytes) in seeds() {
        let dir = corpus_dir(target);
        std::fs::create_dir_all(&dir).expect("create corpus dir");
        std::fs::write(dir.join(name), bytes).expect("write seed");
    }
}

//! The C ABI: a C program built against `include/gpushare.h` and `libgpushare.so` runs
//! against a real broker; the header agrees with the library (codes, names, functions,
//! struct layout) and works from C++.
//!
//! Needs `cc` (the project's setup installs it) and the workspace built
//! (`cargo build --workspace`) for `gpushared` and `libgpushare.so`.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{CStr, CString, OsStr};
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use gpushare::ErrorCode;
use gpushare::ffi;
use gpushare_tests::{Broker, library_dir};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

fn include_dir() -> PathBuf {
    repo_root().join("client-lib/include")
}

fn header_text() -> String {
    let path = include_dir().join("gpushare.h");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// Whether `tool` can be run at all.
fn have(tool: &OsStr) -> bool {
    match Command::new(tool).arg("--version").output() {
        Ok(_) => true,
        Err(e) if e.kind() == ErrorKind::NotFound => false,
        Err(e) => panic!("cannot run {}: {e}", tool.to_string_lossy()),
    }
}

fn c_compiler() -> std::ffi::OsString {
    let cc = std::env::var_os("CC").unwrap_or_else(|| "cc".into());
    assert!(
        have(&cc),
        "the C compiler `{}` is missing: the C ABI test needs one (install gcc or clang, or set CC)",
        cc.to_string_lossy()
    );
    cc
}

/// Compiles and links `source` against `libgpushare.so` into `out`, panicking with the
/// compiler's output on failure.
fn compile(compiler: &OsStr, flags: &[&str], source: &Path, out: &Path) {
    let lib = library_dir();
    let mut cmd = Command::new(compiler);
    cmd.args(flags)
        .arg("-I")
        .arg(include_dir())
        .arg(source)
        .arg("-L")
        .arg(&lib)
        .arg("-lgpushare")
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-lm")
        .arg("-o")
        .arg(out);
    let output = cmd.output().unwrap_or_else(|e| panic!("run {cmd:?}: {e}"));
    assert!(
        output.status.success(),
        "{cmd:?} failed:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Runs `cmd` to completion, killing it after `timeout`.
fn run_with_timeout(mut cmd: Command, timeout: Duration) -> Output {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(timeout) {
        Ok(output) => output.unwrap_or_else(|e| panic!("wait for {cmd:?}: {e}")),
        Err(_) => {
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
            let output = rx.recv().ok().and_then(Result::ok);
            panic!(
                "{cmd:?} did not finish in {timeout:?}; output so far:\n{}",
                output
                    .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                    .unwrap_or_default()
            );
        }
    }
}

#[test]
fn c_program_passes_its_checks_against_the_broker() {
    let cc = c_compiler();
    let dir = tempfile::tempdir().expect("temp dir");
    let exe = dir.path().join("basic");
    compile(
        &cc,
        &[
            "-std=c11",
            "-Wall",
            "-Wextra",
            "-Wpedantic",
            "-Wstrict-prototypes",
            "-Werror",
        ],
        &repo_root().join("tests/c/basic.c"),
        &exe,
    );

    let broker = Broker::start();
    let mut cmd = Command::new(&exe);
    cmd.env("GPUSHARE_SOCKET", &broker.socket);
    let output = run_with_timeout(cmd, Duration::from_secs(120));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.contains("c client: all checks passed"),
        "the C client failed ({}):\n--- stdout\n{stdout}--- stderr\n{stderr}--- broker log\n{}",
        output.status,
        broker.log_text()
    );

    // The struct the C compiler laid out is the one the library writes.
    let layout = format!(
        "layout session_info size={} backend_offset={}",
        std::mem::size_of::<ffi::gpushare_session_info_t>(),
        std::mem::offset_of!(ffi::gpushare_session_info_t, backend)
    );
    assert!(
        stdout.contains(&layout),
        "C and Rust disagree on gpushare_session_info_t: Rust has `{layout}`, C printed:\n{stdout}"
    );
}

#[test]
fn header_compiles_and_links_as_cpp() {
    let cxx = std::env::var_os("CXX").unwrap_or_else(|| "c++".into());
    if !have(&cxx) {
        eprintln!(
            "NOTE: skipping the C++ header check: `{}` is not installed",
            cxx.to_string_lossy()
        );
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let source = dir.path().join("check.cpp");
    // Linking proves the extern "C" guard: without it the names would be C++-mangled and
    // not found in libgpushare.so.
    std::fs::write(
        &source,
        r#"#include "gpushare.h"
#include <cstring>
int main() {
    gpushare_client *client = nullptr;
    int rc = gpushare_connect("/nonexistent/gpushare.sock", "cpp", &client);
    if (rc != GPUSHARE_E_CONNECT || client != nullptr) return 1;
    if (std::strcmp(gpushare_error_name(rc), "GPUSHARE_E_CONNECT") != 0) return 2;
    if (std::strstr(gpushare_last_error_message(), "/nonexistent/gpushare.sock") == nullptr) return 3;
    gpushare_disconnect(client);
    return 0;
}
"#,
    )
    .expect("write check.cpp");
    let exe = dir.path().join("check");
    compile(
        &cxx,
        &[
            "-x",
            "c++",
            "-std=c++11",
            "-Wall",
            "-Wextra",
            "-Wpedantic",
            "-Werror",
        ],
        &source,
        &exe,
    );
    let output = run_with_timeout(Command::new(&exe), Duration::from_secs(30));
    assert!(
        output.status.success(),
        "the C++ check failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
}

/// `#define NAME INTEGER` lines of the header.
fn header_defines(header: &str) -> BTreeMap<String, String> {
    header
        .lines()
        .filter_map(|line| {
            let mut words = line.strip_prefix("#define ")?.split_whitespace();
            let name = words.next()?;
            let value = words.next()?;
            Some((name.to_string(), value.to_string()))
        })
        .collect()
}

fn error_name(code: i32) -> String {
    let name = ffi::gpushare_error_name(code);
    assert!(!name.is_null(), "gpushare_error_name({code}) is NULL");
    // SAFETY: gpushare_error_name returns a pointer to a static NUL-terminated string.
    unsafe { CStr::from_ptr(name) }
        .to_str()
        .expect("ASCII name")
        .to_string()
}

#[test]
fn header_codes_and_names_match_the_library() {
    let defines = header_defines(&header_text());
    let codes: BTreeMap<i32, String> = defines
        .iter()
        .filter(|(name, _)| name.starts_with("GPUSHARE_E_") || *name == "GPUSHARE_OK")
        .map(|(name, value)| {
            let value = value
                .parse()
                .unwrap_or_else(|_| panic!("{name} has a non-integer value `{value}`"));
            (value, name.clone())
        })
        .collect();
    let code_defines = defines
        .keys()
        .filter(|n| n.starts_with("GPUSHARE_E_") || *n == "GPUSHARE_OK")
        .count();
    assert_eq!(codes.len(), code_defines, "two status codes share a value");

    // Every code the library names is in the header under that name, and back.
    for code in -10..1000 {
        let name = error_name(code);
        match codes.get(&code) {
            Some(header_name) => assert_eq!(&name, header_name, "code {code}"),
            None => assert_eq!(
                name, "GPUSHARE_E_UNKNOWN",
                "code {code} is not in the header"
            ),
        }
    }
    // Every broker error code has its define.
    for code in ErrorCode::ALL {
        assert!(
            codes.contains_key(&(code.as_u32() as i32)),
            "ErrorCode::{code:?} ({}) has no GPUSHARE_E_ define",
            code.as_u32()
        );
    }
    for (name, value) in [
        (
            "GPUSHARE_E_INVALID_ARGUMENT",
            ffi::GPUSHARE_E_INVALID_ARGUMENT,
        ),
        ("GPUSHARE_E_SHUTTING_DOWN", ffi::GPUSHARE_E_SHUTTING_DOWN),
        ("GPUSHARE_E_INTERNAL", ffi::GPUSHARE_E_INTERNAL),
        ("GPUSHARE_E_NULL", ffi::GPUSHARE_E_NULL),
        ("GPUSHARE_MODULE_PTX", ffi::GPUSHARE_MODULE_PTX),
        ("GPUSHARE_MODULE_CUBIN", ffi::GPUSHARE_MODULE_CUBIN),
        ("GPUSHARE_MODULE_FATBIN", ffi::GPUSHARE_MODULE_FATBIN),
        ("GPUSHARE_CLASS_HIGH", ffi::GPUSHARE_CLASS_HIGH as i32),
        ("GPUSHARE_CLASS_NORMAL", ffi::GPUSHARE_CLASS_NORMAL as i32),
        (
            "GPUSHARE_CLASS_BEST_EFFORT",
            ffi::GPUSHARE_CLASS_BEST_EFFORT as i32,
        ),
        (
            "GPUSHARE_BACKEND_NAME_LEN",
            ffi::GPUSHARE_BACKEND_NAME_LEN as i32,
        ),
    ] {
        assert_eq!(
            defines.get(name).map(String::as_str),
            Some(value.to_string().as_str()),
            "{name}"
        );
    }
    assert_eq!(
        defines.get("GPUSHARE_DEFAULT_STREAM").map(String::as_str),
        Some("0u")
    );
    assert_eq!(ffi::GPUSHARE_DEFAULT_STREAM, 0);
    assert_eq!(
        defines.get("GPUSHARE_QUOTA_UNLIMITED").map(String::as_str),
        Some("UINT64_MAX")
    );
    assert_eq!(ffi::GPUSHARE_QUOTA_UNLIMITED, u64::MAX);
}

#[test]
fn header_declares_exactly_the_exported_functions() {
    let dir = repo_root().join("client-lib/src/ffi");
    let mut source = String::new();
    for entry in std::fs::read_dir(&dir).expect("read client-lib/src/ffi") {
        let path = entry.expect("list client-lib/src/ffi").path();
        if path.extension().is_some_and(|e| e == "rs") {
            source += &std::fs::read_to_string(&path).expect("read an ffi source file");
        }
    }
    let exported: BTreeSet<&str> = source
        .split("#[unsafe(no_mangle)]")
        .skip(1)
        .filter_map(|rest| {
            let after = rest.split("extern \"C\" fn ").nth(1)?;
            after.split('(').next()
        })
        .collect();
    assert!(
        exported.len() > 30,
        "found only {exported:?} in client-lib/src/ffi"
    );
    let header = header_text();
    // Every `gpushare_name(` in the header: the declarations (and comments that cite one).
    let declared: BTreeSet<&str> = header
        .match_indices("gpushare_")
        .filter_map(|(at, _)| {
            let rest = &header[at..];
            let len = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            rest[len..].starts_with('(').then(|| &rest[..len])
        })
        .collect();
    assert_eq!(
        exported, declared,
        "client-lib/src/ffi exports and gpushare.h declares different functions"
    );
}

#[test]
fn null_pointers_and_unreachable_brokers_are_reported_not_crashed() {
    // SAFETY: NULL and valid C strings only; `client` is a valid out-pointer.
    unsafe {
        assert_eq!(
            ffi::gpushare_connect(std::ptr::null(), std::ptr::null(), std::ptr::null_mut()),
            ffi::GPUSHARE_E_NULL
        );
        let path = CString::new("/nonexistent/gpushare.sock").expect("no NUL");
        let mut client = std::ptr::NonNull::dangling().as_ptr();
        assert_eq!(
            ffi::gpushare_connect(path.as_ptr(), std::ptr::null(), &mut client),
            ffi::GPUSHARE_E_CONNECT
        );
        assert!(client.is_null(), "the out-pointer is cleared on failure");
        let message = CStr::from_ptr(ffi::gpushare_last_error_message());
        let message = message.to_string_lossy();
        assert!(
            message.contains("gpushare_connect") && message.contains("/nonexistent/gpushare.sock"),
            "{message}"
        );

        let mut ptr = 0u64;
        assert_eq!(
            ffi::gpushare_alloc(std::ptr::null(), 16, &mut ptr),
            ffi::GPUSHARE_E_NULL
        );
        let message = CStr::from_ptr(ffi::gpushare_last_error_message());
        assert!(
            message
                .to_string_lossy()
                .contains("`client` must not be NULL"),
            "{message:?}"
        );
        assert_eq!(
            ffi::gpushare_fill_f32(std::ptr::null(), 0, 0, 1, 0.0),
            ffi::GPUSHARE_E_NULL
        );
        ffi::gpushare_disconnect(std::ptr::null_mut());
    }
}

#[test]
fn a_client_is_usable_from_several_threads() {
    let broker = Broker::start();
    let path = CString::new(broker.socket.as_os_str().as_encoded_bytes()).expect("no NUL");
    let mut client = std::ptr::null_mut();
    // SAFETY: valid C strings and out-pointer.
    let rc = unsafe { ffi::gpushare_connect(path.as_ptr(), c"threads".as_ptr(), &mut client) };
    assert_eq!(rc, ffi::GPUSHARE_OK);
    struct Shared(*mut ffi::gpushare_client);
    // SAFETY: the library documents a client as usable from several threads at once.
    unsafe impl Sync for Shared {}
    let shared = Shared(client);
    std::thread::scope(|s| {
        for t in 0..4u8 {
            let shared = &shared;
            s.spawn(move || {
                for _ in 0..20 {
                    let mut ptr = 0u64;
                    // SAFETY: a live client; valid out-pointer.
                    let rc = unsafe { ffi::gpushare_alloc(shared.0, 256, &mut ptr) };
                    assert_eq!(rc, ffi::GPUSHARE_OK);
                    let data = [t; 256];
                    let mut back = [0u8; 256];
                    // SAFETY: a live client; `data` and `back` hold 256 bytes each.
                    unsafe {
                        assert_eq!(
                            ffi::gpushare_copy_htod(shared.0, 0, ptr, data.as_ptr().cast(), 256),
                            ffi::GPUSHARE_OK
                        );
                        assert_eq!(
                            ffi::gpushare_copy_dtoh(
                                shared.0,
                                0,
                                back.as_mut_ptr().cast(),
                                ptr,
                                256
                            ),
                            ffi::GPUSHARE_OK
                        );
                        assert_eq!(ffi::gpushare_free(shared.0, ptr), ffi::GPUSHARE_OK);
                    }
                    assert_eq!(back, data);
                }
            });
        }
    });
    // SAFETY: the threads are done; the handle is not used again.
    unsafe { ffi::gpushare_disconnect(client) };
}

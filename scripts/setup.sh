#!/usr/bin/env bash
# Installs what building and testing gpushare needs on a Debian machine. Idempotent: it
# installs only what is missing, so running it again is cheap.
set -euo pipefail

log() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }

need_apt=()
command -v cc >/dev/null 2>&1 || need_apt+=(gcc libc6-dev)
command -v c++ >/dev/null 2>&1 || need_apt+=(g++)
command -v pkg-config >/dev/null 2>&1 || need_apt+=(pkg-config)
command -v tmux >/dev/null 2>&1 || need_apt+=(tmux) # tests/top_tty.rs drives `gpushare top` in it

if ((${#need_apt[@]})); then
    if [[ $(id -u) -ne 0 ]]; then
        echo "setup: missing packages ${need_apt[*]}; run this script as root (or install them) first" >&2
        exit 1
    fi
    log "installing ${need_apt[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null 2>&1; then
    if [[ -x "$HOME/.cargo/bin/cargo" ]]; then
        export PATH="$HOME/.cargo/bin:$PATH"
    else
        echo "setup: no Rust toolchain found; install rustup (https://rustup.rs) first" >&2
        exit 1
    fi
fi
rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy rustfmt >/dev/null 2>&1 || true
log "toolchain: $(cargo --version)"

# The eBPF toolchain (docs/telemetry.md): the telemetry programs in bpf/ are built by
# broker/build.rs with nightly Rust, core's source (build-std) and bpf-linker. Without them
# the broker still builds, with telemetry off. bpf-linker must be built against the same
# LLVM major version as nightly rustc (22 on this image's Debian).
LLVM_MAJOR=22
LLVM_DIR=/usr/lib/llvm-$LLVM_MAJOR
need_bpf_apt=()
for pkg in "llvm-$LLVM_MAJOR-dev" "libpolly-$LLVM_MAJOR-dev" libzstd-dev; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || need_bpf_apt+=("$pkg")
done
if ((${#need_bpf_apt[@]})); then
    if [[ $(id -u) -ne 0 ]]; then
        log "eBPF toolchain: missing ${need_bpf_apt[*]}; run this script as root to build the telemetry programs (the broker builds without them, telemetry off)"
    else
        log "installing ${need_bpf_apt[*]} (eBPF toolchain)"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends "${need_bpf_apt[@]}" >/dev/null
    fi
fi
if rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
    rustup component list --installed --toolchain nightly 2>/dev/null | grep -q '^rust-src' || {
        log "adding rust-src to the nightly toolchain (eBPF build-std)"
        rustup component add rust-src --toolchain nightly >/dev/null
    }
else
    log "eBPF toolchain: no nightly Rust toolchain; install it with 'rustup toolchain install nightly --component rust-src' to build the telemetry programs"
fi
if ! command -v bpf-linker >/dev/null 2>&1; then
    if [[ -x $LLVM_DIR/bin/llvm-config ]]; then
        log "installing bpf-linker (LLVM $LLVM_MAJOR; about a minute and a half)"
        # Without the prefix variables llvm-sys fails with `unable to find library -lLLVM`.
        env LLVM_PREFIX="$LLVM_DIR" "LLVM_SYS_${LLVM_MAJOR}1_PREFIX=$LLVM_DIR" PATH="$LLVM_DIR/bin:$PATH" \
            cargo install --quiet --locked bpf-linker --no-default-features --features "llvm-$LLVM_MAJOR"
    else
        log "eBPF toolchain: no LLVM $LLVM_MAJOR development files, so bpf-linker is not installed"
    fi
fi

# Slurm and munge, for tests/slurm.rs: it starts a Slurm cluster of this one machine
# (slurmctld and slurmd on ports of their own) and runs jobs through gpushare's hooks. It
# needs root, as installing them does; CI runs as root.
need_slurm_apt=()
for pkg in slurmctld slurmd slurm-client munge; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || need_slurm_apt+=("$pkg")
done
if ((${#need_slurm_apt[@]})); then
    if [[ $(id -u) -ne 0 ]]; then
        log "Slurm test: missing ${need_slurm_apt[*]}; run this script as root to install them (tests/slurm.rs says SKIPPED without them)"
    else
        log "installing ${need_slurm_apt[*]} (the Slurm test; about 20 s)"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends "${need_slurm_apt[@]}" >/dev/null
    fi
fi

# cargo fuzz, for scripts/fuzz.sh (the wire decoders' fuzz targets in client-lib/protocol/fuzz,
# run by test.sh). It builds with the nightly toolchain above when there is one, else with
# stable and RUSTC_BOOTSTRAP=1.
CARGO_FUZZ_VERSION=0.13.2
if ! cargo fuzz --version 2>/dev/null | grep -qx "cargo-fuzz $CARGO_FUZZ_VERSION"; then
    log "installing cargo-fuzz $CARGO_FUZZ_VERSION (about half a minute)"
    cargo install --quiet --locked cargo-fuzz --version "=$CARGO_FUZZ_VERSION"
fi

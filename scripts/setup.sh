#!/usr/bin/env bash
# Installs what building and testing gpushare needs on a Debian machine. Idempotent: it
# installs only what is missing, so running it again is cheap.
set -euo pipefail

log() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }

need_apt=()
command -v cc >/dev/null 2>&1 || need_apt+=(gcc libc6-dev)
command -v c++ >/dev/null 2>&1 || need_apt+=(g++)
command -v pkg-config >/dev/null 2>&1 || need_apt+=(pkg-config)

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

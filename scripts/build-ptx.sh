#!/usr/bin/env bash
# Regenerates the pre-built PTX of the broker's built-in CUDA kernels:
#   broker/kernels/builtin.cu -> broker/kernels/builtin.ptx
# The broker compiles builtin.cu with NVRTC at start when it can, and loads this PTX otherwise.
# compute_90 PTX is JIT-compiled by the driver for sm_90 (H100) and every newer GPU.
#
# Usage: scripts/build-ptx.sh [OUTPUT.ptx]     (run from anywhere; needs nvcc)
# nvcc is taken from $NVCC, else PATH, else /usr/local/cuda/bin/nvcc.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

if (($# > 1)); then
    echo "usage: $0 [OUTPUT.ptx]" >&2
    exit 2
fi

# A relative output path is taken relative to the caller's directory, not the repo root.
out="${1:-$repo_root/broker/kernels/builtin.ptx}"
case "$out" in
    /*) ;;
    *) out="$PWD/$out" ;;
esac
src="$repo_root/broker/kernels/builtin.cu"

nvcc=""
if [[ -n "${NVCC:-}" ]]; then
    if [[ ! -x "$NVCC" ]] && ! command -v "$NVCC" >/dev/null 2>&1; then
        echo "build-ptx: \$NVCC is set to '$NVCC', which is not an executable" >&2
        exit 1
    fi
    nvcc="$NVCC"
elif command -v nvcc >/dev/null 2>&1; then
    nvcc="$(command -v nvcc)"
elif [[ -x /usr/local/cuda/bin/nvcc ]]; then
    nvcc=/usr/local/cuda/bin/nvcc
else
    echo "build-ptx: nvcc not found (looked at \$NVCC, PATH and /usr/local/cuda/bin/nvcc)." >&2
    echo "build-ptx: install the CUDA toolkit or set NVCC=/path/to/nvcc, then run again." >&2
    exit 1
fi

mkdir -p "$(dirname "$out")"
cd "$repo_root"
# No --use_fast_math / -ftz=true: the kernels must round like the CPU sim (see builtin.cu).
"$nvcc" -ptx -arch=compute_90 -O3 -o "$out" "$src"
echo "build-ptx: wrote $out ($("$nvcc" --version | tail -n 1); $(wc -c <"$out") bytes)"

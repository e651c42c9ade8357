#!/usr/bin/env bash
# Builds the gpushare Debian package and prints its path (the last line of stdout).
#
#   scripts/package.sh              # target/debian/gpushare_<version>-1_<arch>.deb
#
# What goes in it is `[package.metadata.deb]` in broker/Cargo.toml and packaging/ (see
# packaging/README.md). Steps: a locked release build of the binaries, the library and
# packaging/gen; gpushare-gen writes the man pages and completions; the pkg-config file is
# filled in; cargo-deb (installed at a pinned version if missing) assembles the package.
#
# Reproducible: the toolchain is pinned by the image, dependencies by Cargo.lock, and every
# timestamp (file mtimes in the package, the man pages' date) comes from SOURCE_DATE_EPOCH,
# which defaults to the last commit's time. Building twice from one tree gives one .deb,
# byte for byte (scripts/package-check.sh checks that for the packaging step).
set -euo pipefail
cd "$(dirname "$0")/.."

CARGO_DEB_VERSION=3.8.0

log() { printf '\033[1m[package]\033[0m %s\n' "$*" >&2; }
die() {
    printf '\033[1;31m[package] error:\033[0m %s\n' "$*" >&2
    exit 1
}

if ! command -v cargo >/dev/null 2>&1 && [[ -x $HOME/.cargo/bin/cargo ]]; then
    export PATH="$HOME/.cargo/bin:$PATH"
fi
command -v cargo >/dev/null 2>&1 || die "no cargo; run scripts/setup.sh first"
command -v dpkg-deb >/dev/null 2>&1 || die "no dpkg-deb: this builds a Debian package, on Debian"

# cargo-deb, at the version this packaging was written and checked against.
if [[ $(cargo deb --version 2>/dev/null) != *" $CARGO_DEB_VERSION"* ]]; then
    log "installing cargo-deb $CARGO_DEB_VERSION (about two minutes)"
    cargo install --quiet --locked cargo-deb --version "$CARGO_DEB_VERSION" >&2
fi

metadata=$(cargo metadata --format-version 1 --no-deps --locked)
field() { sed -n "s/.*\"$1\":\"\\([^\"]*\\)\".*/\\1/p" <<<"$metadata" | head -n 1; }
target_dir=$(field target_directory)
[[ -n $target_dir ]] || die "cannot find the cargo target directory in \`cargo metadata\`"
grep -q '"name":"gpushare-gen"' <<<"$metadata" ||
    die "packaging/gen is not a workspace member yet: it generates the man pages and needs the clap definitions exposed (packaging/README.md, \"The clap definitions\")"
version=$(cargo pkgid --quiet -p gpushare-broker 2>/dev/null | sed 's/.*[@#]//')
[[ -n $version ]] || die "cannot read gpushare-broker's version"

if [[ -z ${SOURCE_DATE_EPOCH:-} ]]; then
    SOURCE_DATE_EPOCH=$(git log -1 --format=%ct 2>/dev/null || true)
    SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-0}
fi
export SOURCE_DATE_EPOCH
date=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%d)

multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch 2>/dev/null || true)
[[ -n $multiarch ]] || die "cannot tell the Debian multiarch triplet (install dpkg-dev)"
grep -q "usr/lib/$multiarch/libgpushare.so" broker/Cargo.toml ||
    die "the library paths in broker/Cargo.toml [package.metadata.deb] are not this machine's ($multiarch): change them there"

log "release build (gpushared, gpushare, gpushare-demo, libgpushare.so, libgpushare_interpose.so, libgpushare_audit.so, libcuda.so, libgpushare_nvml.so, gpushare-gen)"
cargo build --release --locked -p gpushare-broker -p gpushare-tools -p gpushare -p gpushare-interpose \
    -p gpushare-audit -p gpushare-cuda -p gpushare-nvml -p gpushare-gen -p gpushare-k8s >&2

stage="$target_dir/release/gpushare-deb"
log "man pages, completions, gpushare.pc and the stripped libraries in $stage"
rm -rf "$stage"
mkdir -p "$stage"
"$target_dir/release/gpushare-gen" --out "$stage" --date "$date"
# -n: no name or timestamp in the gzip header, so the same page compresses the same.
gzip -9n "$stage"/man/man*/*.[18]
sed -e "s|@LIBDIR@|/usr/lib/$multiarch|" -e "s|@VERSION@|$version|" \
    packaging/gpushare.pc.in >"$stage/gpushare.pc"
# cargo-deb strips the executables (their debug info goes to the -dbgsym package) but not a
# library another crate built (the client library; the interposer, the audit library and the
# CUDA driver and NVML of `gpushare run`, under their sonames).
strip --strip-unneeded -o "$stage/libgpushare.so" "$target_dir/release/libgpushare.so"
strip --strip-unneeded -o "$stage/libgpushare_interpose.so" "$target_dir/release/libgpushare_interpose.so"
strip --strip-unneeded -o "$stage/libgpushare_audit.so" "$target_dir/release/libgpushare_audit.so"
strip --strip-unneeded -o "$stage/libcuda.so.1" "$target_dir/release/libcuda.so"
strip --strip-unneeded -o "$stage/libnvidia-ml.so.1" "$target_dir/release/libgpushare_nvml.so"

log "cargo deb (SOURCE_DATE_EPOCH=$SOURCE_DATE_EPOCH)"
out=$(cargo deb -p gpushare-broker --no-build --locked --output "$target_dir/debian/")
deb=$(tail -n 1 <<<"$out")
[[ -f $deb ]] || die "cargo deb did not report a package (said: $out)"
log "built $deb"
echo "$deb"

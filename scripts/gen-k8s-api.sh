#!/bin/sh
# Makes k8s/src/api/v1beta1.rs and v1.rs again from k8s/proto/ (the kubelet's protos as
# published in k8s.io/kubelet): tonic-build 0.12.3 with protox, so no protoc is needed. Run
# when the protos change; the output is checked in.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/src" "$work/proto"
cp "$root/k8s/proto/deviceplugin_v1beta1.proto" "$work/proto/deviceplugin.proto"
cp "$root/k8s/proto/podresources_v1.proto" "$work/proto/podresources.proto"
cat > "$work/Cargo.toml" <<'TOML'
[package]
name = "k8sgen"
version = "0.1.0"
edition = "2021"
[dependencies]
tonic-build = { version = "=0.12.3", default-features = false, features = ["prost"] }
prost-build = "=0.13.5"
protox = "0.7"
[workspace]
TOML
cat > "$work/src/main.rs" <<'RS'
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let fds = protox::compile(["deviceplugin.proto", "podresources.proto"], ["proto"])?;
    tonic_build::configure()
        .build_transport(false)
        .out_dir(std::env::args().nth(1).ok_or("output directory")?)
        .compile_fds(fds)?;
    Ok(())
}
RS
(cd "$work" && cargo run -q -- "$root/k8s/src/api")

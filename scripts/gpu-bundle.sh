#!/usr/bin/env bash
# Builds what a GPU machine runs for scripts/gpu-check.sh, on any x86-64 machine (no GPU, no system
# CUDA): kiln (the default build, which starts without a driver) and kiln-gpu (the CUDA build, CUDA
# assembled from NVIDIA's wheels by deploy/cuda/cuda-root.sh), both stripped, in one tarball:
#
#   scripts/gpu-bundle.sh            # -> target/gpu-check/bundle.tar.gz (prints its size)
#
# The two are built by separate cargo commands on purpose: one command would unify candle's `cuda`
# feature into kiln, which then could not start where the driver is missing.
# A GPU machine that takes at most 64 MiB of files per run (tree and bundle together) is the
# budget: the script fails when the tarball is over KILN_BUNDLE_MAX_MIB (default 48).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
out=target/gpu-check
max_mib=${KILN_BUNDLE_MAX_MIB:-48}
say() { echo "gpu-bundle: $*" >&2; }

started=$(date +%s)
cargo build --release --locked -p kiln --bin kiln
eval "$(deploy/cuda/cuda-root.sh)"
cargo build --release --locked -p kiln-gpu --features cuda,nccl
rm -rf "$out" && mkdir -p "$out/bundle"
strip -o "$out/bundle/kiln" target/release/kiln
strip -o "$out/bundle/kiln-gpu" target/release/kiln-gpu
git rev-parse HEAD > "$out/bundle/COMMIT" 2>/dev/null || echo unknown > "$out/bundle/COMMIT"
tar -C "$out/bundle" -czf "$out/bundle.tar.gz" kiln kiln-gpu COMMIT
rm -rf "$out/bundle"
bytes=$(stat -c %s "$out/bundle.tar.gz")
say "$out/bundle.tar.gz: $((bytes / 1048576)) MiB ($bytes bytes) in $(( $(date +%s) - started )) s"
if [ "$bytes" -gt $((max_mib * 1048576)) ]; then
    say "over the $max_mib MiB budget (KILN_BUNDLE_MAX_MIB)"
    exit 1
fi
echo "$out/bundle.tar.gz"

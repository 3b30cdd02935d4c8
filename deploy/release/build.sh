#!/bin/bash
# The binary a technician copies to a bare box: kiln for x86-64 Linux that runs on any
# distribution with glibc 2.31 or newer (Debian 11, Ubuntu 20.04, RHEL 9 and later), whatever
# glibc the build machine has. It links against glibc 2.31's symbol versions through zig's C
# toolchain and cargo-zigbuild (no container, no root, no system toolkit): both are fetched into
# target/release-tools on first use (python3's pip and cargo install, pinned versions). Why not a
# static musl binary: kiln dlopens NVML (libnvidia-ml.so.1), which a static musl binary cannot.
#
# Output, per target: dist/kiln-<version>-<target>/ (the stripped binary, README, ARCHITECTURE,
# images, specs, deploy) and its .tar.gz. The script checks what it built: the newest glibc
# symbol version the binary needs is at most 2.31, and (x86-64) it runs `kiln --version` and
# `kiln inventory`. aarch64 is built too where its Rust standard library is installed
# (`rustup target add aarch64-unknown-linux-gnu`); otherwise the script says it was skipped.
# The Debian package takes the binary: deploy/deb/build-deb.sh --binary dist/…/kiln.
#
# usage: deploy/release/build.sh [--out DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."

ZIG_VERSION=0.13.0
ZIGBUILD_VERSION=0.24.1
GLIBC=2.31
out=dist
while [ $# -gt 0 ]; do
    case "$1" in
        --out) out=$2; shift 2 ;;
        *) echo "build.sh: unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
    esac
done

tools=$PWD/target/release-tools
mkdir -p "$tools"
if [ ! -x "$tools/zig/ziglang/zig" ]; then
    echo "release: fetching zig $ZIG_VERSION (the ziglang wheel) into $tools" >&2
    python3 -m pip download --quiet --no-deps --only-binary=:all: "ziglang==$ZIG_VERSION" -d "$tools/wheels"
    rm -rf "$tools/zig"
    python3 -m zipfile -e "$tools"/wheels/ziglang-"$ZIG_VERSION"-*.whl "$tools/zig"
    chmod +x "$tools/zig/ziglang/zig"
fi
if [ ! -x "$tools/bin/cargo-zigbuild" ]; then
    echo "release: installing cargo-zigbuild $ZIGBUILD_VERSION into $tools" >&2
    cargo install --quiet --locked --version "$ZIGBUILD_VERSION" --root "$tools" cargo-zigbuild
fi
export PATH="$tools/zig/ziglang:$tools/bin:$PATH"

version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)
targets=(x86_64-unknown-linux-gnu)
if rustup target list --installed 2>/dev/null | grep -qx aarch64-unknown-linux-gnu; then
    targets+=(aarch64-unknown-linux-gnu)
else
    echo "release: aarch64 skipped (its standard library is not installed: rustup target add aarch64-unknown-linux-gnu)" >&2
fi

# The newest GLIBC_x.y symbol version a binary asks for (read from its bytes: no binutils needed).
newest_glibc() {
    python3 - "$1" <<'PY'
import re, sys
data = open(sys.argv[1], "rb").read()
versions = {tuple(int(p) for p in m.group(1).split(b".")) for m in re.finditer(rb"GLIBC_([0-9]+\.[0-9]+(?:\.[0-9]+)?)\x00", data)}
print(".".join(map(str, max(versions))) if versions else "none")
PY
}

for target in "${targets[@]}"; do
    echo "release: building kiln $version for $target (glibc >= $GLIBC)" >&2
    CARGO_PROFILE_RELEASE_DEBUG=0 CARGO_PROFILE_RELEASE_STRIP=symbols \
        cargo zigbuild --release --locked -p kiln --target "$target.$GLIBC" --target-dir target/release-build
    binary=target/release-build/$target/release/kiln
    needs=$(newest_glibc "$binary")
    if [ "$needs" = none ] || [ "$(printf '%s\n%s\n' "$needs" "$GLIBC" | sort -V | tail -1)" != "$GLIBC" ]; then
        echo "release: $binary needs glibc $needs, newer than $GLIBC" >&2
        exit 1
    fi
    if [ "$target" = "$(uname -m)-unknown-linux-gnu" ]; then
        "$binary" --version >/dev/null
        "$binary" inventory --json >/dev/null
    fi
    dir=$out/kiln-$version-$target
    rm -rf "$dir"
    mkdir -p "$dir"
    cp "$binary" "$dir/kiln"
    cp -r README.md ARCHITECTURE.md images specs deploy "$dir/"
    tar -C "$out" -czf "$out/kiln-$version-$target.tar.gz" "kiln-$version-$target"
    echo "release: $out/kiln-$version-$target.tar.gz ($(du -h "$dir/kiln" | cut -f1) binary, needs glibc $needs)" >&2
done

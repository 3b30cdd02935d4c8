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
#
# With --gpu it also builds kiln-gpu, the GPU benchmarks (x86-64 only: candle's and cudarc's CUDA
# 13.0, assembled from NVIDIA's wheels by deploy/cuda/cuda-root.sh, sm_90a by default; about 7 more
# minutes on 2 cores, mostly nvcc), to the same glibc floor, and puts it beside kiln in the x86-64
# tarball, where kiln looks for it. kiln-gpu needs NVIDIA's driver 580 or newer and CUDA 13.0's
# runtime libraries at run time (images/nvidia-cuda13.0-*.toml install both); kiln itself needs
# neither. The script checks the libraries kiln-gpu links (CUDA 13.0's and NCCL's sonames).
#
# Where dpkg-deb is installed, the build machine's own target is packaged too
# (deploy/deb/build-deb.sh): dist/kiln_<version>_<arch>.deb, and kiln-gpu_<version>_<arch>.deb
# with --gpu.
#
# usage: deploy/release/build.sh [--out DIR] [--gpu]
set -euo pipefail
cd "$(dirname "$0")/../.."

ZIG_VERSION=0.13.0
ZIGBUILD_VERSION=0.24.1
GLIBC=2.31
out=dist
gpu=0
while [ $# -gt 0 ]; do
    case "$1" in
        --out) out=$2; shift 2 ;;
        --gpu) gpu=1; shift ;;
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

# Stops the script unless BINARY asks for glibc $GLIBC at most; prints what it asks for.
within_glibc_floor() {
    local needs
    needs=$(newest_glibc "$1")
    if [ "$needs" = none ] || [ "$(printf '%s\n%s\n' "$needs" "$GLIBC" | sort -V | tail -1)" != "$GLIBC" ]; then
        echo "release: $1 needs glibc $needs, newer than $GLIBC" >&2
        exit 1
    fi
    echo "$needs"
}

# The sonames a binary links (its ELF NEEDED entries; read from its bytes: no binutils needed).
needed() {
    python3 - "$1" <<'PY'
import struct, sys
data = open(sys.argv[1], "rb").read()
assert data[:4] == b"\x7fELF" and data[4] == 2, "a 64-bit ELF file"
end = "<" if data[5] == 1 else ">"
shoff, = struct.unpack_from(end + "Q", data, 0x28)
shentsize, shnum = struct.unpack_from(end + "HH", data, 0x3A)
sections = [struct.unpack_from(end + "IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
for s in sections:
    if s[1] != 6:  # SHT_DYNAMIC
        continue
    strtab = sections[s[6]]
    names = lambda off: data[strtab[4] + off:data.index(b"\0", strtab[4] + off)].decode()
    for i in range(s[5] // 16):
        tag, val = struct.unpack_from(end + "qQ", data, s[4] + i * 16)
        if tag == 1:  # DT_NEEDED
            print(names(val))
PY
}

# kiln-gpu first, so that the x86-64 tarball holds it.
gpu_binary=
if [ "$gpu" = 1 ]; then
    eval "$(deploy/cuda/cuda-root.sh)"
    target=x86_64-unknown-linux-gnu
    echo "release: building kiln-gpu $version for $target (glibc >= $GLIBC, CUDA 13.0, sm_$CUDA_COMPUTE_CAP)" >&2
    CARGO_PROFILE_RELEASE_DEBUG=0 CARGO_PROFILE_RELEASE_STRIP=symbols KILN_GPU_ZIG_SHIM=1 \
        cargo zigbuild --release --locked -p kiln-gpu --features cuda,nccl --target "$target.$GLIBC" \
        --target-dir target/release-build
    gpu_binary=target/release-build/$target/release/kiln-gpu
    within_glibc_floor "$gpu_binary" >/dev/null
    # The libraries it links: CUDA 13.0's runtime and NCCL, which the box must hold; a library of
    # another CUDA major would not load beside a 580 driver's CUDA 13.
    linked=$(needed "$gpu_binary")
    for lib in libcuda.so.1 libcublas.so.13 libnccl.so.2; do
        grep -qx "$lib" <<<"$linked" || { echo "release: $gpu_binary does not link $lib (links: $linked)" >&2; exit 1; }
    done
    if grep -E '\.so\.12$' <<<"$linked"; then
        echo "release: $gpu_binary links a CUDA 12 library" >&2
        exit 1
    fi
    echo "release: kiln-gpu links $(paste -sd' ' <<<"$linked")" >&2
    # It starts: every library it links found (CUDA 13.0's, from the wheels) and every symbol
    # bound, with a stand-in driver that reports CUDA 12.8 (570's) — which it must refuse, first.
    # Twice: with the whole toolkit, and with only the runtime libraries that scripts/gpu-check.sh
    # fetches on a box that has none (`cuda-root.sh --runtime`, here from the wheels already fetched).
    drivers=$(mktemp -d)
    sed 's/^int cuDriverGetVersion(void) .*/int cuDriverGetVersion(int *v) { *v = 12080; return 0; }/' \
        "$CUDA_ROOT/lib/stubs/cuda-stub.c" > "$drivers/old.c"
    cc -shared -fPIC -O0 -Wl,-soname,libcuda.so.1 -o "$drivers/libcuda.so.1" "$drivers/old.c"
    runtime=$(KILN_CUDA_WHEELS="$CUDA_ROOT.wheels" deploy/cuda/cuda-root.sh --runtime "$CUDA_ROOT-runtime")
    for libs in "$CUDA_ROOT/lib" "$runtime"; do
        said=$(LD_LIBRARY_PATH="$drivers:$libs" "$gpu_binary" devices 2>&1 || true)
        if ! grep -q 'the NVIDIA driver supports CUDA 12.8 at most' <<<"$said"; then
            echo "release: $gpu_binary with the libraries of $libs under a CUDA 12.8 driver said: $said" >&2
            exit 1
        fi
    done
    rm -rf "$drivers"
    echo "release: kiln-gpu starts with CUDA 13.0's libraries (the toolkit's, and the runtime's alone) and refuses a CUDA 12.8 driver" >&2
fi

for target in "${targets[@]}"; do
    echo "release: building kiln $version for $target (glibc >= $GLIBC)" >&2
    CARGO_PROFILE_RELEASE_DEBUG=0 CARGO_PROFILE_RELEASE_STRIP=symbols \
        cargo zigbuild --release --locked -p kiln --target "$target.$GLIBC" --target-dir target/release-build
    binary=target/release-build/$target/release/kiln
    needs=$(within_glibc_floor "$binary")
    if [ "$target" = "$(uname -m)-unknown-linux-gnu" ]; then
        "$binary" --version >/dev/null
        "$binary" inventory --json >/dev/null
    fi
    dir=$out/kiln-$version-$target
    rm -rf "$dir"
    mkdir -p "$dir"
    cp "$binary" "$dir/kiln"
    if [ -n "$gpu_binary" ] && [ "$target" = x86_64-unknown-linux-gnu ]; then
        cp "$gpu_binary" "$dir/kiln-gpu"
    fi
    cp -r README.md ARCHITECTURE.md images specs deploy "$dir/"
    tar -C "$out" -czf "$out/kiln-$version-$target.tar.gz" "kiln-$version-$target"
    echo "release: $out/kiln-$version-$target.tar.gz ($(du -h "$dir/kiln" | cut -f1) binary, needs glibc $needs$(
        [ -f "$dir/kiln-gpu" ] && echo "; kiln-gpu $(du -h "$dir/kiln-gpu" | cut -f1)"))" >&2
    if [ "$target" = "$(uname -m)-unknown-linux-gnu" ] && command -v dpkg-deb >/dev/null; then
        deb_args=(--binary "$dir/kiln" --out "$out")
        [ -f "$dir/kiln-gpu" ] && deb_args+=(--gpu-binary "$dir/kiln-gpu")
        deploy/deb/build-deb.sh "${deb_args[@]}" | while read -r deb; do
            echo "release: $deb ($(du -h "$deb" | cut -f1))" >&2
        done
    fi
done

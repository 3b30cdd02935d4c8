#!/bin/bash
# Builds the Debian package kiln_<version>_<arch>.deb with dpkg-deb alone (cargo-deb users get the
# same layout from [package.metadata.deb] in Cargo.toml):
#   /usr/bin/kiln                      the binary (stripped)
#   /lib/systemd/system/kiln-*         kiln-serve.service, kiln-nightly.service and .timer (not enabled)
#   /usr/share/kiln/images, specs      the image specs `kiln provision` finds; the example SKU specs
#   /usr/share/doc/kiln/               README, agent.toml.example
#   /var/lib/kiln                      the results database's directory
# No maintainer scripts: the service users are systemd's DynamicUser, and nothing is enabled or
# started on install (`systemctl enable --now kiln-nightly.timer` is the site's decision).
#
# With --gpu-binary PATH (kiln-gpu, the CUDA build: deploy/release/build.sh --gpu), a second
# package, kiln-gpu_<version>_<arch>.deb, holds /usr/bin/kiln-gpu, where kiln finds it (beside
# itself). It depends on kiln at the same version and on the packages of NVIDIA's CUDA repository
# that hold the libraries the binary links (read from its ELF NEEDED entries: CUDA 13.0's cudart,
# cuBLAS, cuRAND, NVRTC, and NCCL), so that apt names what is missing; the driver's libcuda.so.1 is
# not a dependency (the image installs the driver, and kiln says so when it is missing). The
# images that provide all of it: images/nvidia-cuda13.0-*.toml.
#
# usage: deploy/deb/build-deb.sh [--binary PATH] [--gpu-binary PATH] [--out DIR] [--compress xz|gzip|none]
# Prints the path of each package built, one per line.
set -euo pipefail
# Paths given are taken from where the script is run; the defaults, from the checkout.
start=$PWD
abs() { case "$1" in /*) echo "$1" ;; *) echo "$start/$1" ;; esac; }
cd "$(dirname "$0")/../.."

binary=target/release/kiln
gpu_binary=
out=target/deb
compress=xz
while [ $# -gt 0 ]; do
    case "$1" in
        --binary) binary=$(abs "$2"); shift 2 ;;
        --gpu-binary) gpu_binary=$(abs "$2"); shift 2 ;;
        --out) out=$(abs "$2"); shift 2 ;;
        --compress) compress=$2; shift 2 ;;
        *) echo "build-deb.sh: unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
    esac
done
[ -x "$binary" ] || { echo "build-deb.sh: $binary is not an executable: run cargo build --release first" >&2; exit 2; }
if [ -n "$gpu_binary" ]; then
    [ -x "$gpu_binary" ] || { echo "build-deb.sh: $gpu_binary is not an executable: build kiln-gpu first (deploy/release/build.sh --gpu)" >&2; exit 2; }
    command -v readelf >/dev/null || { echo "build-deb.sh: --gpu-binary needs readelf (binutils) to read the libraries kiln-gpu links" >&2; exit 2; }
fi

version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)
arch=$(dpkg --print-architecture)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT

install -D -m0755 "$binary" "$stage/usr/bin/kiln"
if command -v strip >/dev/null; then strip --strip-debug "$stage/usr/bin/kiln"; fi
for unit in deploy/systemd/*; do install -D -m0644 "$unit" "$stage/lib/systemd/system/$(basename "$unit")"; done
for dir in images specs; do
    mkdir -p "$stage/usr/share/kiln/$dir"
    cp -r "$dir/." "$stage/usr/share/kiln/$dir/"
done
install -D -m0644 README.md "$stage/usr/share/doc/kiln/README.md"
install -D -m0644 deploy/agent.toml.example "$stage/usr/share/doc/kiln/agent.toml.example"
install -d -m0755 "$stage/var/lib/kiln"

size=$(du -sk "$stage" | cut -f1)
mkdir -p "$stage/DEBIAN"
cat > "$stage/DEBIAN/control" <<CONTROL
Package: kiln
Version: $version
Architecture: $arch
Maintainer: kiln developers <kiln@localhost>
Installed-Size: $size
Depends: libc6 (>= 2.31), ca-certificates
Recommends: libopenblas0-pthread
Suggests: libdnnl2, libblis4-pthread
Section: admin
Priority: optional
Description: inventory, provision, benchmark and compare AI training servers
 kiln takes a server's hardware inventory, provisions drivers from image specs,
 benchmarks the box, stores every result, judges it against its SKU's spec and
 uploads results to a fleet service (kiln serve).
CONTROL

mkdir -p "$out"
deb="$out/kiln_${version}_${arch}.deb"
dpkg-deb --root-owner-group -Z"$compress" --build "$stage" "$deb" >/dev/null
echo "$deb"

[ -n "$gpu_binary" ] || exit 0

# The package of NVIDIA's CUDA repository (or Debian's, for glibc) that holds each library
# kiln-gpu links; a library not in this table stops the build rather than go unstated.
depends_of() {
    case "$1" in
        libc.so.6|libm.so.6|libdl.so.2|libpthread.so.0|librt.so.1|ld-linux-*) echo "libc6 (>= 2.31)" ;;
        libgcc_s.so.1) echo "libgcc-s1" ;;
        libstdc++.so.6) echo "libstdc++6" ;;
        libcuda.so.1) ;;  # the driver's: installed by the image, reported by kiln when missing
        libcudart.so.13) echo "cuda-cudart-13-0" ;;
        libcublas.so.13|libcublasLt.so.13) echo "libcublas-13-0" ;;
        libcurand.so.10) echo "libcurand-13-0" ;;
        libnvrtc.so.13) echo "cuda-nvrtc-13-0" ;;
        libnccl.so.2) echo "libnccl2 (>= 2.27.7)" ;;
        *) return 1 ;;
    esac
}
gpu_stage=$(mktemp -d)
trap 'rm -rf "$stage" "$gpu_stage"' EXIT
install -D -m0755 "$gpu_binary" "$gpu_stage/usr/bin/kiln-gpu"
if command -v strip >/dev/null; then strip --strip-debug "$gpu_stage/usr/bin/kiln-gpu"; fi
deps=("kiln (= $version)")
while read -r lib; do
    dep=$(depends_of "$lib") || { echo "build-deb.sh: $gpu_binary links $lib, which no package is known to hold (add it to depends_of in $0)" >&2; exit 1; }
    [ -n "$dep" ] && deps+=("$dep")
done < <(readelf -d "$gpu_binary" 2>/dev/null | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
depends=$(printf '%s\n' "${deps[@]}" | awk '!seen[$0]++' | paste -sd, - | sed 's/,/, /g')
install -D -m0644 README.md "$gpu_stage/usr/share/doc/kiln-gpu/README.md"
size=$(du -sk "$gpu_stage" | cut -f1)
mkdir -p "$gpu_stage/DEBIAN"
cat > "$gpu_stage/DEBIAN/control" <<CONTROL
Package: kiln-gpu
Version: $version
Architecture: $arch
Maintainer: kiln developers <kiln@localhost>
Installed-Size: $size
Depends: $depends
Section: admin
Priority: optional
Description: kiln's GPU benchmarks (CUDA 13.0 build)
 kiln-gpu measures GEMM, HBM, host-device and peer bandwidth, NCCL collectives
 and training on NVIDIA GPUs; kiln runs it when NVML finds GPUs. It needs the
 NVIDIA driver 580 or newer and CUDA 13.0's runtime libraries (the images
 nvidia-cuda13.0-* provide both).
CONTROL
gpu_deb="$out/kiln-gpu_${version}_${arch}.deb"
dpkg-deb --root-owner-group -Z"$compress" --build "$gpu_stage" "$gpu_deb" >/dev/null
echo "$gpu_deb"

#!/usr/bin/env bash
# Assembles a CUDA 13.0 toolkit from NVIDIA's PyPI wheels into a folder of the checkout (no system
# toolkit, no root, no GPU needed), so that kiln's GPU half builds on any x86-64 machine:
#
#   eval "$(deploy/cuda/cuda-root.sh)"
#   cargo build --release -p kiln-gpu --features cuda,nccl
#
# It prints the environment candle's and cudarc's build scripts read (CUDA_ROOT, CUDA_COMPUTE_CAP,
# PATH with nvcc). The wheels are pinned to CUDA 13.0 (cudarc 0.19.10 refuses 13.5); they hold
# only versioned libraries, so the script makes the link names, and a driver stub
# (lib/stubs/libcuda.so: every cu* entry point cudarc declares, each returning
# CUDA_ERROR_STUB_LIBRARY) so that the link succeeds; the stub is never loaded at run time, where
# the real driver's libcuda.so.1 is.
#
# Environment: KILN_CUDA_ROOT (default target/cuda-13.0), CUDA_COMPUTE_CAP (default 90: H100/H200;
# 100 for B200). Downloads about 900 MB once (kept in KILN_CUDA_ROOT.wheels); running it again
# only prints the environment.
#
#   deploy/cuda/cuda-root.sh --runtime DIR
#
# only the libraries kiln-gpu loads at run time (the CUDA runtime, NVRTC, cuBLAS, cuRAND, NCCL) of
# the same pins, into DIR/lib, and prints DIR/lib: what scripts/gpu-check.sh fetches on a box with
# the driver and no CUDA libraries. KILN_CUDA_WHEELS=FOLDER takes the wheels from that folder
# instead of the package index (a box with no network); a second run only prints the folder.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
root=${KILN_CUDA_ROOT:-$repo/target/cuda-13.0}
wheels=$root.wheels
cap=${CUDA_COMPUTE_CAP:-90}
say() { echo "cuda-root: $*" >&2; }

# CUDA 13.0 Update 2, as NVIDIA's wheels number its parts; NCCL 2.30 for cudarc's NCCL API.
pins=(
    nvidia-cuda-nvcc==13.0.88
    nvidia-nvvm==13.0.88
    nvidia-cuda-crt==13.0.88
    nvidia-cuda-runtime==13.0.96
    nvidia-cuda-cccl==13.0.85
    nvidia-cuda-nvrtc==13.0.88
    nvidia-cublas==13.1.0.3
    nvidia-curand==10.4.0.35
    nvidia-nccl-cu13==2.30.7
)

# unpack WHEELS DEST PIN...: each pinned wheel of WHEELS unzipped into DEST.
unpack() {
    local wheels=$1 dest=$2 pin name version whl
    shift 2
    for pin in "$@"; do
        name=${pin%%==*}; version=${pin##*==}
        whl=$(ls "$wheels"/"${name//-/_}"-"$version"-*.whl 2>/dev/null | head -n 1)
        [ -n "$whl" ] || { say "$pin: no wheel in $wheels"; exit 2; }
        python3 -m zipfile -e "$whl" "$dest" >&2
    done
}

if [ "${1:-}" = --runtime ]; then
    dir=${2:?usage: cuda-root.sh --runtime DIR}
    if [ ! -f "$dir/.complete" ]; then
        command -v python3 >/dev/null || { say "needs python3 with pip"; exit 2; }
        wanted=()
        for pin in "${pins[@]}"; do
            case ${pin%%==*} in
                nvidia-cuda-runtime | nvidia-cuda-nvrtc | nvidia-cublas | nvidia-curand | nvidia-nccl-cu13) wanted+=("$pin") ;;
            esac
        done
        from=()
        [ -z "${KILN_CUDA_WHEELS:-}" ] || from=(--no-index --find-links "$KILN_CUDA_WHEELS")
        mkdir -p "$dir.wheels"
        say "fetching ${#wanted[@]} runtime wheels into $dir.wheels${KILN_CUDA_WHEELS:+ from $KILN_CUDA_WHEELS}"
        python3 -m pip download --quiet --no-deps --only-binary=:all: "${from[@]}" --dest "$dir.wheels" "${wanted[@]}" >&2 ||
            { say "could not fetch ${wanted[*]} (no network? KILN_CUDA_WHEELS=FOLDER names a folder holding them)"; exit 2; }
        rm -rf "$dir.tmp" && mkdir -p "$dir.tmp/lib"
        unpack "$dir.wheels" "$dir.tmp/unpacked" "${wanted[@]}"
        cp -a "$dir.tmp/unpacked/nvidia/cu13/lib/." "$dir.tmp/unpacked/nvidia/nccl/lib/." "$dir.tmp/lib/"
        mkdir -p "$dir" && rm -rf "$dir/lib" && mv "$dir.tmp/lib" "$dir/lib" && rm -rf "$dir.tmp"
        touch "$dir/.complete"
    fi
    echo "$dir/lib"
    exit 0
fi

if [ ! -f "$root/.complete" ]; then
    case "$(uname -m)" in
        x86_64) ;;
        *) say "only x86-64 is assembled here (the wheels' aarch64 builds differ); stopping"; exit 2 ;;
    esac
    command -v python3 >/dev/null || { say "needs python3 with pip"; exit 2; }
    mkdir -p "$wheels"
    say "fetching ${#pins[@]} wheels into $wheels"
    python3 -m pip download --quiet --no-deps --only-binary=:all: --dest "$wheels" "${pins[@]}" >&2
    rm -rf "$root.tmp" && mkdir -p "$root.tmp"
    unpack "$wheels" "$root.tmp/unpacked" "${pins[@]}"
    # Everything lives under nvidia/cu13 (bin, include, lib, nvvm); NCCL under nvidia/nccl.
    mv "$root.tmp/unpacked/nvidia/cu13" "$root.tmp/root"
    cp -a "$root.tmp/unpacked/nvidia/nccl/include/." "$root.tmp/root/include/"
    cp -a "$root.tmp/unpacked/nvidia/nccl/lib/." "$root.tmp/root/lib/"
    chmod +x "$root.tmp/root/bin/"* "$root.tmp/root/nvvm/bin/"* 2>/dev/null || true
    # Link names for the versioned libraries (libcublas.so -> libcublas.so.13), and lib64 as
    # build scripts expect it.
    (
        cd "$root.tmp/root/lib"
        for lib in lib*.so.*; do
            base=${lib%%.so.*}.so
            [ -e "$base" ] || ln -s "$lib" "$base"
        done
    )
    ln -s lib "$root.tmp/root/lib64"
    # The driver stub: cudarc's declared cu* functions, from its sources in cargo's registry.
    cargo fetch --manifest-path "$repo/Cargo.toml" >&2
    sys=$(find "${CARGO_HOME:-$HOME/.cargo}"/registry/src -maxdepth 5 -path '*/cudarc-0.19.*/src/driver/sys' \
        2>/dev/null | sort | tail -n 1)
    [ -n "$sys" ] || { say "cudarc's sources are not in cargo's registry (cargo fetch failed?)"; exit 2; }
    mkdir -p "$root.tmp/root/lib/stubs"
    {
        echo "/* Generated by deploy/cuda/cuda-root.sh from $(basename "$(dirname "$(dirname "$sys")")"). */"
        echo "/* Links kiln-gpu where no driver exists; never loaded (the real libcuda.so.1 is). */"
        grep -ohE '\bfn cu[A-Za-z0-9_]+\(' -r "$sys" | sed -E 's/fn (cu[A-Za-z0-9_]+)\(/\1/' | sort -u |
            while read -r f; do echo "int $f(void) { return 34; /* CUDA_ERROR_STUB_LIBRARY */ }"; done
    } > "$root.tmp/root/lib/stubs/cuda-stub.c"
    cc -shared -fPIC -O0 -Wl,-soname,libcuda.so.1 -o "$root.tmp/root/lib/stubs/libcuda.so" \
        "$root.tmp/root/lib/stubs/cuda-stub.c"
    say "$(grep -c '^int ' "$root.tmp/root/lib/stubs/cuda-stub.c") driver entry points stubbed"
    "$root.tmp/root/bin/nvcc" --version | tail -n 2 >&2
    rm -rf "$root" && mv "$root.tmp/root" "$root" && rm -rf "$root.tmp"
    touch "$root/.complete"
    say "CUDA root ready: $root"
fi

echo "export CUDA_ROOT='$root'"
echo "export CUDA_PATH='$root'"
echo "export CUDA_COMPUTE_CAP='$cap'"
echo "export PATH='$root/bin':\"\$PATH\""

//! With the `cuda` feature, compiles kiln-gpu's own kernels (`kernels/*.cu`) to PTX with nvcc
//! (deploy/cuda/cuda-root.sh puts one on PATH and sets CUDA_ROOT), for `compute_75` so that the
//! driver compiles them for whatever GPU it finds (Turing and newer). Without the feature it does
//! nothing and needs no CUDA.
//!
//! The CUDA build also records the compute capability candle's kernels are compiled for
//! (`CUDA_COMPUTE_CAP`, as `KILN_GPU_COMPUTE_CAP`), and where NVIDIA's packages put CUDA 13.0's libraries
//! (`/usr/local/cuda-13.0/targets/<arch>-linux/lib`) as the executable's RUNPATH: a box with the
//! toolkit installed there runs kiln-gpu even when that folder is not on the loader's path.
//! `LD_LIBRARY_PATH` still comes first (scripts/gpu-check.sh points it at PyTorch's wheels).

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=kernels/triad.cu");
    println!("cargo:rerun-if-env-changed=CUDA_ROOT");
    println!("cargo:rerun-if-env-changed=CUDA_COMPUTE_CAP");
    // The architecture candle-kernels compiles for (cudaforge reads the same variable), which
    // kiln-gpu checks each GPU against before any work (`capability_in_build`).
    let cap = match std::env::var_os("CARGO_FEATURE_CUDA") {
        Some(_) => std::env::var("CUDA_COMPUTE_CAP").unwrap_or_default(),
        None => String::new(),
    };
    println!("cargo:rustc-env=KILN_GPU_COMPUTE_CAP={cap}");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let arch = if arch == "aarch64" { "sbsa" } else { arch.as_str() };
    println!("cargo:rustc-link-arg-bins=-Wl,-rpath,/usr/local/cuda-13.0/targets/{arch}-linux/lib");
    zig_moe_shim();
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR")).join("triad.ptx");
    let nvcc = std::env::var_os("CUDA_ROOT")
        .map(|root| PathBuf::from(root).join("bin/nvcc"))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("nvcc"));
    let status = Command::new(&nvcc)
        .args(["--ptx", "-arch=compute_75", "-O3", "-o"])
        .arg(&out)
        .arg("kernels/triad.cu")
        .status()
        .unwrap_or_else(|e| {
            panic!("{}: {e} (the cuda feature needs nvcc: eval \"$(deploy/cuda/cuda-root.sh)\")", nvcc.display())
        });
    assert!(status.success(), "{} could not compile kernels/triad.cu", nvcc.display());
}

/// For the release build with zig (deploy/release/build.sh sets KILN_GPU_ZIG_SHIM): candle-kernels
/// links its static `libmoe.a` as `-lmoe` with no kind, which GNU ld resolves to the archive but
/// zig's linker driver will only take as a shared library. A linker script named `libmoe.so`
/// that asks for `libmoe.a` by file name (`-l:`, searched in the same folders) lets zig find a
/// "shared library" and lld link the archive.
fn zig_moe_shim() {
    println!("cargo:rerun-if-env-changed=KILN_GPU_ZIG_SHIM");
    if std::env::var_os("KILN_GPU_ZIG_SHIM").is_none() {
        return;
    }
    let dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR")).join("zig-shim");
    std::fs::create_dir_all(&dir).expect("OUT_DIR is writable");
    std::fs::write(dir.join("libmoe.so"), "/* deploy/release/build.sh: see gpu/build.rs */\nINPUT(-l:libmoe.a)\n")
        .expect("OUT_DIR is writable");
    println!("cargo:rustc-link-search=native={}", dir.display());
}

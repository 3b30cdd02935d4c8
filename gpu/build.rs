//! With the `cuda` feature, compiles kiln-gpu's own kernels (`kernels/*.cu`) to PTX with nvcc
//! (deploy/cuda/cuda-root.sh puts one on PATH and sets CUDA_ROOT), for `compute_75` so that the
//! driver compiles them for whatever GPU it finds (Turing and newer). Without the feature it does
//! nothing and needs no CUDA.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=kernels/triad.cu");
    println!("cargo:rerun-if-env-changed=CUDA_ROOT");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
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

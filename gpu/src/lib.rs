//! `kiln-gpu`: kiln's GPU benchmarks, in an executable of their own (this library is its
//! measurements and their documents, which kiln reads back typed). A binary built with candle's
//! CUDA backend links `libcuda.so.1` and cannot even start where no NVIDIA driver is installed,
//! and commissioning installs that driver: so `kiln` itself never links CUDA, and is to run this
//! program, shipped beside it, when NVML finds GPUs (that side, `kiln bench gpu`, is not built
//! yet). It answers one JSON document on stdout per command, `{"error": …}` with exit status 2
//! when it cannot measure.
//!
//! Built without the `cuda` feature (the default, so that the workspace builds anywhere) it says
//! what to build. `deploy/cuda/cuda-root.sh` assembles the CUDA toolkit the `cuda` build needs.

pub mod gemm;

use serde::{Deserialize, Serialize};

/// The version of every document `kiln-gpu` prints.
pub const SCHEMA_VERSION: u32 = 1;

/// A CUDA device as the driver describes it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeviceInfo {
    pub ordinal: usize,
    pub name: String,
    /// "9.0" for H100/H200, "10.0" for B200.
    pub compute_capability: String,
    pub memory_bytes: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Devices {
    pub devices: Vec<DeviceInfo>,
}

#[cfg(feature = "cuda")]
pub mod backend {
    use crate::{gemm, DeviceInfo, Devices};
    use anyhow::Context;
    use candle_core::cuda_backend::cudarc::driver::{sys::CUdevice_attribute, CudaContext};

    /// Every CUDA device the driver sees.
    pub fn devices() -> anyhow::Result<Devices> {
        let count = CudaContext::device_count().context("the CUDA driver cannot count its devices")?;
        let mut devices = Vec::new();
        for ordinal in 0..count as usize {
            let ctx = CudaContext::new(ordinal).with_context(|| format!("opening CUDA device {ordinal}"))?;
            let major = ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
            let minor = ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
            devices.push(DeviceInfo {
                ordinal,
                name: ctx.name()?,
                compute_capability: format!("{major}.{minor}"),
                memory_bytes: ctx.total_mem()? as u64,
            });
        }
        Ok(Devices { devices })
    }

    pub fn gemm(options: &gemm::Options) -> anyhow::Result<gemm::Report> {
        let device = candle_core::Device::new_cuda(options.device)
            .with_context(|| format!("opening CUDA device {} (is the NVIDIA driver loaded?)", options.device))?;
        let info = devices()?.devices.into_iter().find(|d| d.ordinal == options.device);
        gemm::measure(&device, options, info.map(|d| d.name))
    }
}

#[cfg(not(feature = "cuda"))]
pub mod backend {
    use crate::{gemm, Devices};

    const NOT_BUILT: &str = "kiln-gpu was built without CUDA: run `eval \"$(deploy/cuda/cuda-root.sh)\"` \
         and `cargo build --release -p kiln-gpu --features cuda,nccl` (no GPU needed to build)";

    pub fn devices() -> anyhow::Result<Devices> {
        anyhow::bail!(NOT_BUILT)
    }

    pub fn gemm(_: &gemm::Options) -> anyhow::Result<gemm::Report> {
        anyhow::bail!(NOT_BUILT)
    }
}

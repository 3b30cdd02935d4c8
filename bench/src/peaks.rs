//! Peak dense FLOP/s of accelerators by model and data type, from the vendors' datasheets
//! (dense figures: the datasheets' "with sparsity" numbers are twice these). MFU is reported
//! against them; CPUs are measured instead (`ceilings::fma_peak`).

/// A datasheet row: how NVML names the part, and TFLOP/s for bf16 (and fp16) tensor, tf32, fp32,
/// and fp8 tensor with f32 accumulation (none before compute capability 8.9).
struct Row {
    /// Matched against the NVML name, first match wins (so longer names come first).
    name: &'static str,
    bf16: f64,
    tf32: Option<f64>,
    fp32: Option<f64>,
    fp8: Option<f64>,
}

const TABLE: &[Row] = &[
    // NVIDIA H100 Tensor Core GPU datasheet (2023): SXM5 BF16 1,979 TFLOPS with sparsity, TF32 989, FP32 67,
    // FP8 3,958 with sparsity (NVL 3,341, PCIe 3,026; H200 as SXM5).
    Row { name: "H100 80GB HBM3", bf16: 989.4, tf32: Some(494.7), fp32: Some(66.9), fp8: Some(1978.9) },
    Row { name: "H100 SXM", bf16: 989.4, tf32: Some(494.7), fp32: Some(66.9), fp8: Some(1978.9) },
    // Same datasheet: H100 NVL BF16 1,671 with sparsity, FP32 60; H100 PCIe BF16 1,513, FP32 51.
    Row { name: "H100 NVL", bf16: 835.5, tf32: Some(417.5), fp32: Some(60.0), fp8: Some(1670.5) },
    Row { name: "H100 PCIe", bf16: 756.5, tf32: Some(378.0), fp32: Some(51.2), fp8: Some(1513.0) },
    // NVIDIA H200 Tensor Core GPU datasheet (2024): same compute as H100 SXM (BF16 1,979 sparse).
    Row { name: "H200", bf16: 989.4, tf32: Some(494.7), fp32: Some(66.9), fp8: Some(1978.9) },
    // NVIDIA DGX B200 / HGX B200 datasheets (2024): 72 PFLOPS FP8 sparse per 8 GPUs -> 4.5 PF FP8 and
    // 2.25 PF BF16 dense per GPU.
    Row { name: "B200", bf16: 2250.0, tf32: Some(1100.0), fp32: None, fp8: Some(4500.0) },
    // NVIDIA A100 Tensor Core GPU datasheet (2021): BF16 312, TF32 156, FP32 19.5 (SXM and PCIe alike).
    Row { name: "A100", bf16: 312.0, tf32: Some(156.0), fp32: Some(19.5), fp8: None },
    // NVIDIA L40S datasheet (2023): BF16 733 with sparsity, TF32 183, FP32 91.6, FP8 1,466 with sparsity.
    Row { name: "L40S", bf16: 366.5, tf32: Some(183.0), fp32: Some(91.6), fp8: Some(733.0) },
    // NVIDIA L4 datasheet (2023): BF16 242 with sparsity, TF32 60, FP32 30.3, FP8 485 with sparsity.
    Row { name: "L4", bf16: 121.0, tf32: Some(60.0), fp32: Some(30.3), fp8: Some(242.5) },
    // NVIDIA Ada Lovelace architecture whitepaper (2022), RTX 4090: FP16/BF16 tensor with FP32
    // accumulate 165.2 dense, FP32 82.6, FP8 with FP32 accumulate 330.3 dense.
    Row { name: "RTX 4090", bf16: 165.2, tf32: Some(82.6), fp32: Some(82.6), fp8: Some(330.3) },
];

/// Datasheet memory bandwidth of GPUs, GB/s (decimal), matched like `TABLE` (longer names first).
const MEMORY: &[(&str, f64)] = &[
    // NVIDIA H100 Tensor Core GPU datasheet (2023): SXM 3.35 TB/s, NVL 3.9 TB/s, PCIe 2 TB/s.
    ("H100 80GB HBM3", 3350.0),
    ("H100 SXM", 3350.0),
    ("H100 NVL", 3900.0),
    ("H100 PCIe", 2000.0),
    // NVIDIA H200 Tensor Core GPU datasheet (2024): 4.8 TB/s (SXM and NVL).
    ("H200", 4800.0),
    // NVIDIA HGX B200 datasheet (2024): 8 TB/s per GPU.
    ("B200", 8000.0),
    // NVIDIA A100 datasheet (2021): 80 GB SXM 2,039 GB/s, 80 GB PCIe 1,935 GB/s, 40 GB 1,555 GB/s.
    ("A100-SXM4-80GB", 2039.0),
    ("A100 80GB PCIe", 1935.0),
    ("A100", 1555.0),
    // NVIDIA L40S datasheet (2023): 864 GB/s; L4: 300 GB/s; RTX 4090 (Ada whitepaper): 1,008 GB/s.
    ("L40S", 864.0),
    ("L4", 300.0),
    ("RTX 4090", 1008.0),
];

/// A GPU's datasheet memory bandwidth in GB/s (by its NVML name).
pub fn gpu_memory_gbps(name: &str) -> Option<f64> {
    MEMORY.iter().find(|(n, _)| name.contains(n)).map(|(_, gbps)| *gbps)
}

/// One direction of a PCIe link, GB/s: the generation's rate per lane after line coding, times
/// the lanes (gen 1–2 8b/10b, gen 3–5 128b/130b; gen 6's FLIT overhead taken as 242/256).
pub fn pcie_gbps(generation: u32, width: u32) -> Option<f64> {
    let per_lane = match generation {
        1 => 2.5 * 0.8 / 8.0,
        2 => 5.0 * 0.8 / 8.0,
        3 => 8.0 * 128.0 / 130.0 / 8.0,
        4 => 16.0 * 128.0 / 130.0 / 8.0,
        5 => 32.0 * 128.0 / 130.0 / 8.0,
        6 => 64.0 * 242.0 / 256.0 / 8.0,
        _ => return None,
    };
    Some(per_lane * f64::from(width))
}

/// One direction of one NVLink, GB/s, by NVLink version: NVLink 1 (P100) 20, NVLink 2–4 (V100,
/// A100, H100/H200) 25, NVLink 5 (B200) 50 — each datasheet's total bidirectional bandwidth over
/// its links and two directions (H100 SXM: 900 GB/s over 18 links).
pub fn nvlink_gbps(version: u32) -> Option<f64> {
    match version {
        1 => Some(20.0),
        2..=4 => Some(25.0),
        5 => Some(50.0),
        _ => None,
    }
}

/// Peak dense TFLOP/s of a GPU (by its NVML name) for "bf16"/"fp16", "tf32", "fp32" or "fp8".
pub fn gpu_peak_tflops(name: &str, dtype: &str) -> Option<f64> {
    let row = TABLE.iter().find(|r| name.contains(r.name))?;
    match dtype {
        "bf16" | "fp16" | "f16" => Some(row.bf16),
        "tf32" => row.tf32,
        "fp32" | "f32" => row.fp32,
        "fp8" => row.fp8,
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datasheet_figures_by_nvml_name() {
        assert_eq!(gpu_peak_tflops("NVIDIA H100 80GB HBM3", "bf16"), Some(989.4));
        assert_eq!(gpu_peak_tflops("NVIDIA H200", "bf16"), Some(989.4));
        assert_eq!(gpu_memory_gbps("NVIDIA H200"), Some(4800.0));
        assert_eq!(gpu_memory_gbps("NVIDIA A100-SXM4-80GB"), Some(2039.0));
        assert_eq!(gpu_memory_gbps("NVIDIA A100-SXM4-40GB"), Some(1555.0));
        assert_eq!(gpu_memory_gbps("NVIDIA H100 80GB HBM3"), Some(3350.0));
        assert!((pcie_gbps(5, 16).unwrap() - 63.015).abs() < 0.01);
        assert_eq!(pcie_gbps(7, 16), None);
        assert_eq!(gpu_peak_tflops("NVIDIA B200", "bf16"), Some(2250.0));
        assert_eq!(gpu_peak_tflops("NVIDIA A100-SXM4-80GB", "bf16"), Some(312.0));
        assert_eq!(gpu_peak_tflops("NVIDIA H100 NVL", "fp32"), Some(60.0));
        assert_eq!(gpu_peak_tflops("NVIDIA L40S", "bf16"), Some(366.5));
        assert_eq!(gpu_peak_tflops("NVIDIA L4", "bf16"), Some(121.0));
        assert_eq!(gpu_peak_tflops("NVIDIA GeForce RTX 4090", "fp32"), Some(82.6));
        assert_eq!(gpu_peak_tflops("NVIDIA B200", "fp32"), None);
        assert_eq!(gpu_peak_tflops("Tesla T4", "bf16"), None);
        assert_eq!(gpu_peak_tflops("NVIDIA H100 80GB HBM3", "int4"), None);
        assert_eq!(gpu_peak_tflops("NVIDIA H200", "fp8"), Some(1978.9));
        assert_eq!(gpu_peak_tflops("NVIDIA A100-SXM4-80GB", "fp8"), None, "Ampere has no fp8 tensor cores");
        // H100 SXM: 18 NVLink 4 links, 900 GB/s both ways together; B200: 1.8 TB/s.
        assert_eq!(nvlink_gbps(4).map(|g| 18.0 * g * 2.0), Some(900.0));
        assert_eq!(nvlink_gbps(5).map(|g| 18.0 * g * 2.0), Some(1800.0));
        assert_eq!(nvlink_gbps(0), None);
    }
}

/// FP32 FLOPs per cycle per core from the microarchitecture: FMA units × vector lanes × 2.
/// Returns the figure and the reason. `None` where the table cannot say.
pub fn cpu_fp32_flops_per_cycle(
    vendor: &str,
    family: Option<u32>,
    model: Option<u32>,
    part: Option<&str>,
    features: &[String],
) -> Option<(u32, &'static str)> {
    let has = |f: &str| features.iter().any(|x| x == f);
    match vendor {
        // AMD Software Optimization Guides: Zen 1 has two 128-bit FMA pipes; Zen 2-4 two 256-bit
        // (Zen 4 runs AVX-512 as two halves); Zen 5 server parts two 512-bit.
        "AuthenticAMD" | "HygonGenuine" => match (family?, model?) {
            (0x17, m) if m < 0x30 => Some((16, "Zen/Zen+: 2 x 128-bit FMA")),
            (0x17, _) => Some((32, "Zen 2: 2 x 256-bit FMA")),
            (0x19, m) if (0x10..0x20).contains(&m) || (0x60..0x80).contains(&m) || (0xa0..0xb0).contains(&m) => {
                Some((32, "Zen 4: 2 x 256-bit FMA (AVX-512 in two halves)"))
            }
            (0x19, _) => Some((32, "Zen 3: 2 x 256-bit FMA")),
            (0x1a, _) => Some((64, "Zen 5: 2 x 512-bit FMA")),
            _ => None,
        },
        // Intel: server cores with AVX-512 have two 512-bit FMA units on most SKUs (one on some
        // Silver/Bronze parts: the measured peak tells); AVX2 cores two 256-bit units.
        "GenuineIntel" => {
            if has("avx512f") {
                Some((64, "AVX-512: 2 x 512-bit FMA (1 on some SKUs)"))
            } else if has("avx2") && has("fma") {
                Some((32, "AVX2: 2 x 256-bit FMA"))
            } else if has("avx") {
                Some((16, "AVX: 256-bit add + multiply"))
            } else {
                Some((8, "SSE: 128-bit add + multiply"))
            }
        }
        // Arm Neoverse technical reference manuals: V1/V2 four 128-bit FMA pipes, N1/N2 two.
        _ => match part? {
            "0xd40" | "0xd4f" | "0xd84" => Some((32, "Neoverse V: 4 x 128-bit FMA")),
            "0xd0c" | "0xd49" | "0xd8e" => Some((16, "Neoverse N: 2 x 128-bit FMA")),
            "0x001" => Some((64, "A64FX: 2 x 512-bit SVE FMA")),
            _ => None,
        },
    }
}

#[cfg(test)]
mod cpu_tests {
    use super::*;

    #[test]
    fn fp32_flops_per_cycle() {
        let f = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(cpu_fp32_flops_per_cycle("AuthenticAMD", Some(0x17), Some(0x31), None, &[]).unwrap().0, 32);
        assert_eq!(cpu_fp32_flops_per_cycle("AuthenticAMD", Some(0x19), Some(0x11), None, &[]).unwrap().0, 32);
        assert_eq!(cpu_fp32_flops_per_cycle("AuthenticAMD", Some(0x1a), Some(0x02), None, &[]).unwrap().0, 64);
        assert_eq!(
            cpu_fp32_flops_per_cycle("GenuineIntel", Some(6), Some(143), None, &f(&["avx2", "fma", "avx512f"]))
                .unwrap()
                .0,
            64
        );
        assert_eq!(
            cpu_fp32_flops_per_cycle("GenuineIntel", Some(6), Some(85), None, &f(&["avx2", "fma"])).unwrap().0,
            32
        );
        assert_eq!(cpu_fp32_flops_per_cycle("ARM", None, None, Some("0xd4f"), &[]).unwrap().0, 32);
        assert_eq!(cpu_fp32_flops_per_cycle("ARM", None, None, Some("0xfff"), &[]), None);
    }
}

//! The reference training run (`kiln_bench::train`, the model `kiln bench train` trains on the
//! CPU) on one GPU: the same seeded model, corpus and learning check, composed kernels through
//! candle's CUDA backend, f32 parameters with the products in bf16 (mixed precision: operands
//! rounded to bf16, results widened back), TF32 or plain f32, its model FLOP utilisation against
//! the GPU's datasheet peak for that precision. Device-agnostic: its test trains on the CPU
//! through the same path.

use anyhow::Context;
use candle_core::Device;
use serde::{Deserialize, Serialize};

use crate::gemm::Precision;

/// What `kiln-gpu train` runs.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    pub device: usize,
    /// A `kiln_bench::train::Config` preset: `gpt2`, `350m`, `1b` (and the CPU's smaller ones).
    pub size: String,
    pub steps: Option<usize>,
    pub batch: Option<usize>,
    pub precision: Precision,
    /// Set: one rank of data-parallel training, its gradients all-reduced through NCCL.
    pub as_rank: Option<crate::collectives::AsRank>,
}

impl Options {
    /// The run's configuration: the preset with `--steps` and `--batch`.
    pub fn config(&self) -> anyhow::Result<kiln_bench::train::Config> {
        anyhow::ensure!(
            !matches!(self.precision, Precision::F16 | Precision::Fp8),
            "--dtype {}: training runs f32 parameters with bf16, tf32 or f32 products (f16 would need loss scaling, \
             fp8 per-tensor scales)",
            self.precision.name()
        );
        let mut c = kiln_bench::train::Config::preset(&self.size)
            .with_context(|| format!("--size {:?}: tiny, anchor, small, gpt2, 350m or 1b", self.size))?;
        c.steps = self.steps.unwrap_or(c.steps);
        c.batch = self.batch.unwrap_or(c.batch);
        c.warmup_steps = (c.steps / 10).max(2).min(c.steps);
        if self.precision == Precision::Bf16 {
            c.products = kiln_bench::train::Products::Bf16;
        }
        c.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
        anyhow::ensure!(
            c.steps >= kiln_bench::train::MIN_STEPS_FOR_VERDICT,
            "--steps {}: at least {} for the learning check",
            c.steps,
            kiln_bench::train::MIN_STEPS_FOR_VERDICT
        );
        Ok(c)
    }
}

/// `kiln-gpu train`'s document.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    pub device: usize,
    pub name: Option<String>,
    /// `bf16`, `tf32` or `f32`: how the products ran.
    pub precision: String,
    /// The datasheet's dense peak for that precision, TFLOP/s (the MFU's denominator).
    pub peak_tflops: Option<f64>,
    pub run: kiln_bench::train::Report,
    /// What this GPU's GEMM reaches at the model's own dense products, measured after the run.
    #[serde(default)]
    pub ceiling: Option<Ceiling>,
}

/// The measured ceiling a run's model FLOPs are held to besides the datasheet: each of the
/// model's dense products of one step (attention's projection in, its projection out, the MLP's
/// two, the head: `tokens × in → out`) timed alone in the run's precision and checked, the fastest
/// right one the ceiling. A run at 40 % of the datasheet whose products reach only 50 % of it is
/// using its GPU well; one whose products reach 90 % is not.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Ceiling {
    pub products: Vec<crate::gemm::Report>,
    /// The best median TFLOP/s among the products that passed their check.
    pub tflops: Option<f64>,
    /// The run's model FLOP/s over that ceiling.
    pub mfu: Option<f64>,
}

/// The model's dense products of one step (per rank): `m` the tokens of a step, each `k → n`.
pub fn dense_products(c: &kiln_bench::train::Config) -> Vec<crate::gemm::Shape> {
    let tokens = c.batch * c.seq;
    let d = c.d_model;
    let mut shapes: Vec<crate::gemm::Shape> = [(d, 3 * d), (d, d), (d, 4 * d), (4 * d, d), (d, c.vocab)]
        .into_iter()
        .map(|(k, n)| crate::gemm::Shape { m: tokens, n, k })
        .collect();
    shapes.dedup();
    shapes
}

/// Times each of the model's dense products on `device` (`reps` each) and derives the ceiling.
///
/// # Errors
/// The device fails an operation (out of memory, a lost device).
pub fn ceiling(
    device: &Device,
    options: &Options,
    config: &kiln_bench::train::Config,
    achieved_flops: f64,
    reps: usize,
) -> anyhow::Result<Ceiling> {
    let mut products = Vec::new();
    for shape in dense_products(config) {
        let o = crate::gemm::Options {
            device: options.device,
            dtype: options.precision,
            shape,
            reps,
            samples: 8.min(shape.m).min(shape.n),
        };
        products.push(crate::gemm::measure(device, &o, None)?);
    }
    let tflops = products.iter().filter(|p| p.check.ok).map(|p| p.tflops_median).reduce(f64::max);
    let mfu = tflops.filter(|t| *t > 0.0).map(|t| achieved_flops / (t * 1e12));
    Ok(Ceiling { products, tflops, mfu })
}

/// The datasheet column a run's MFU is against.
fn peak_key(p: Precision) -> &'static str {
    match p {
        Precision::F32 => "fp32",
        Precision::Tf32 => "tf32",
        Precision::Bf16 | Precision::F16 => "bf16",
        Precision::Fp8 => "fp8",
    }
}

/// Timed repetitions of each product for the ceiling (after three untimed ones).
const CEILING_REPS: usize = 10;

/// Trains on `device` (a CUDA device, or the CPU in tests); `name` is the GPU's, for its peak.
///
/// # Errors
/// A configuration that does not fit, or a candle error (out of memory, a kernel that fails).
pub fn measure(
    device: &Device,
    options: &Options,
    name: Option<String>,
    progress: impl FnMut(usize, usize, f64),
    dp: Option<&mut dyn kiln_bench::train::DataParallel>,
) -> anyhow::Result<Report> {
    let config = options.config()?;
    options.precision.select();
    let peak_tflops = name.as_deref().and_then(|n| kiln_bench::peaks::gpu_peak_tflops(n, peak_key(options.precision)));
    let run = kiln_bench::train::run_on(device, &config, peak_tflops.map(|t| t * 1e12), progress, dp)
        .map_err(|e| anyhow::anyhow!("training {} on {}: {e}", config.size, kiln_bench::train::device_label(device)))?;
    let ceiling = ceiling(device, options, &config, run.achieved_flops, CEILING_REPS)
        .with_context(|| format!("the model's products on {}", kiln_bench::train::device_label(device)))?;
    Ok(Report {
        device: options.device,
        name,
        precision: options.precision.name().to_string(),
        peak_tflops,
        run,
        ceiling: Some(ceiling),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_checked() {
        let args = |s: &str| s.split_whitespace().map(String::from).collect::<Vec<_>>();
        let o = crate::request::checked::<crate::request::TrainArgs>(&args(
            "--device 1 --size 350m --steps 30 --dtype f32",
        ))
        .unwrap();
        assert_eq!((o.device, o.size.as_str(), o.steps, o.precision), (1, "350m", Some(30), Precision::F32));
        assert_eq!(o.config().unwrap().d_model, 1024);
        assert_eq!(
            crate::request::checked::<crate::request::TrainArgs>(&[]).unwrap().config().unwrap().products,
            kiln_bench::train::Products::Bf16
        );
        assert_eq!([Precision::Bf16, Precision::Tf32, Precision::F32].map(peak_key), ["bf16", "tf32", "fp32"]);
        let hex = "0a".repeat(128);
        let o = crate::request::checked::<crate::request::TrainArgs>(&args(&format!(
            "--device 2 --nccl-id {hex} --rank 1 --ranks 4 --nccl-root 127.0.0.1:41000"
        )))
        .unwrap();
        assert_eq!(o.as_rank.map(|r| (r.rank, r.ranks, r.device)), Some((1, 4, 2)));
        for bad in ["--size 7b", "--steps 3", "--dtype f16", "--dtype fp8", "--batch 0", "--what 1", "--rank 1"] {
            assert!(crate::request::checked::<crate::request::TrainArgs>(&args(bad)).is_err(), "{bad}");
        }
    }

    /// The GPU path, run on the CPU: composed kernels, the learning check, the peak by name.
    #[test]
    fn the_reference_model_trains_through_the_device_path() {
        let o = Options {
            device: 0,
            size: "tiny".into(),
            steps: Some(40),
            batch: None,
            precision: Precision::Tf32,
            as_rank: None,
        };
        let mut seen = 0;
        let r = measure(&Device::Cpu, &o, Some("NVIDIA H100 80GB HBM3".into()), |_, _, _| seen += 1, None).unwrap();
        assert_eq!(seen, 40);
        assert_eq!(r.run.device, "cpu");
        assert_eq!(r.run.config.kernels, kiln_bench::train::Kernels::Fused, "the CPU keeps its fused kernels");
        assert!(r.run.learned, "loss {} -> {}", r.run.loss_start, r.run.loss_end);
        assert_eq!(r.peak_tflops, kiln_bench::peaks::gpu_peak_tflops("NVIDIA H100 80GB HBM3", "tf32"));
        assert!(r.run.mfu.is_some_and(|m| m > 0.0 && m < 1e-3), "a CPU against an H100's peak");
        // The measured ceiling: the model's five dense products, each checked; against it the
        // same run's utilisation is far above its share of a datasheet it never had.
        let c = r.ceiling.as_ref().expect("a ceiling");
        let k = &r.run.config;
        let tokens = k.batch * k.seq;
        let shapes: Vec<(usize, usize, usize)> = c.products.iter().map(|p| (p.shape.m, p.shape.k, p.shape.n)).collect();
        assert_eq!(
            shapes,
            [
                (k.d_model, 3 * k.d_model),
                (k.d_model, k.d_model),
                (k.d_model, 4 * k.d_model),
                (4 * k.d_model, k.d_model),
                (k.d_model, k.vocab)
            ]
            .map(|(kk, n)| (tokens, kk, n))
        );
        assert!(c.products.iter().all(|p| p.check.ok && p.seconds.len() == CEILING_REPS));
        let best = c.products.iter().map(|p| p.tflops_median).fold(0.0, f64::max);
        assert_eq!(c.tflops, Some(best));
        assert!((c.mfu.unwrap() - r.run.achieved_flops / (best * 1e12)).abs() < 1e-12);
        assert!(c.mfu.unwrap() > 100.0 * r.run.mfu.unwrap(), "{:?} against {:?}", c.mfu, r.run.mfu);
    }
}

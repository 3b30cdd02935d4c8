//! `kiln bench gpu gemm`: C = A·B on each GPU alone and on every GPU at once, each product checked
//! by kiln-gpu against an f64 reference and here against the other GPUs' sampled sums.

use std::sync::atomic::AtomicBool;
use std::time::Duration;

use kiln_db::{Direction, Metric};
use kiln_gpu::gemm::Report as GemmRun;
use kiln_gpu::request::{GemmArgs, Request, SweepArgs};
use serde::{Deserialize, Serialize};

use super::{
    close, interpret, read_document, render_verdict, run_all, wrong_by, ChildError, Closing, GpuReport, Prepared,
    Shown, PEAK_MARGIN, TELEMETRY_INTERVAL,
};
use crate::runs::{sampler, samples_of, unsettled, Outcome, Report};
use kiln_inventory::telemetry;
use kiln_inventory::Inventory;
use kiln_text::timefmt::now_rfc3339;
use kiln_text::Progress;

/// What `kiln bench gpu gemm` measures.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GemmConfig {
    pub dtypes: Vec<String>,
    pub n: usize,
    pub reps: usize,
    pub samples: usize,
    /// The GPUs measured (NVML indices, which are CUDA's with `CUDA_DEVICE_ORDER=PCI_BUS_ID`).
    pub gpus: Vec<usize>,
    pub timeout_s: u64,
    /// The shapes of the sweep run on each GPU alone after the products above (`--sweep`):
    /// comma-separated, N or MxNxK; `None`: no sweep.
    #[serde(default)]
    pub sweep: Option<String>,
}

/// One GPU's sweep of shapes in one type: the best right product is the GPU's ceiling.
#[derive(Debug, Clone, Serialize)]
pub struct SweepResult {
    pub gpu: usize,
    pub dtype: String,
    pub sweep: Option<kiln_gpu::gemm::Sweep>,
    pub error: Option<String>,
    /// The best shape and its median rate.
    pub best_shape: Option<String>,
    pub best_tflops: Option<f64>,
}

/// One GPU's product in one type, alone or beside every other GPU.
#[derive(Debug, Clone, Serialize)]
pub struct GemmResult {
    pub gpu: usize,
    pub dtype: String,
    /// Measured while every GPU of the run multiplied at once.
    pub together: bool,
    pub run: Option<GemmRun>,
    pub error: Option<String>,
    /// Of the repetitions' times.
    pub cv: Option<f64>,
    /// The datasheet's dense peak for this GPU and type, TFLOP/s.
    pub peak_tflops: Option<f64>,
    /// Median over the peak.
    pub fraction_of_peak: Option<f64>,
    /// Median over the best shape of this GPU's sweep in this type (alone only, with `--sweep`).
    pub fraction_of_best: Option<f64>,
}

/// Whether the GPUs computed the same product: each sampled sum against their median.
#[derive(Debug, Clone, Serialize)]
pub struct Agreement {
    pub dtype: String,
    pub median_sum: f64,
    /// (GPU, together, sampled sum, deviation over what two passing GPUs may differ by).
    pub sums: Vec<(usize, bool, f64, f64)>,
    pub ok: bool,
}

/// `kiln bench gpu gemm`'s document.
pub type GpuGemmReport = GpuReport<GemmConfig, GemmBody>;

/// What `GpuGemmReport` holds besides the envelope every GPU benchmark shares.
#[derive(Debug, Clone, Serialize)]
pub struct GemmBody {
    pub results: Vec<GemmResult>,
    pub agreement: Vec<Agreement>,
    /// The shape sweeps (`--sweep`), per GPU and type.
    pub sweeps: Vec<SweepResult>,
    /// A type a GPU was not asked for because it cannot multiply in it (fp8 before compute
    /// capability 8.9), in words: no failure, and no figure.
    #[serde(default)]
    pub skipped: Vec<String>,
}

/// The argument list of one `kiln-gpu gemm`.
fn gemm_args(c: &GemmConfig, device: usize, dtype: &str) -> Vec<String> {
    let shape = c.n.to_string();
    Request::Gemm(GemmArgs { device, dtype: dtype.to_string(), shape, reps: c.reps, samples: c.samples }).to_args()
}

/// The GPUs of `gpus` that multiply in `dtype`, and a line for each that cannot: fp8 needs the
/// tensor cores of compute capability 8.9 (Ada) or newer, which CUDA reports per device.
pub(crate) fn able(prepared: &Prepared, gpus: &[usize], dtype: &str) -> (Vec<usize>, Vec<String>) {
    let (mut able, mut skipped) = (Vec::new(), Vec::new());
    for &gpu in gpus {
        let device = prepared.devices.iter().find(|d| d.ordinal == gpu);
        match device {
            Some(d) if dtype == "fp8" && !kiln_gpu::fp8::has_fp8(&d.compute_capability) => skipped.push(format!(
                "fp8 on GPU {gpu} ({}, compute capability {}): no fp8 tensor cores before 8.9",
                d.name, d.compute_capability
            )),
            _ => able.push(gpu),
        }
    }
    (able, skipped)
}

/// Runs the GEMM on each GPU alone, then on all of them at once, in each type.
pub fn gemm(inv: &Inventory, prepared: &Prepared, config: GemmConfig, interrupted: &AtomicBool) -> Outcome {
    let started_at = now_rfc3339();
    let sampler = sampler(inv, TELEMETRY_INTERVAL);
    let progress = Progress::new();
    let timeout = Duration::from_secs(config.timeout_s);
    let mut results = Vec::new();
    let mut skipped = Vec::new();
    for dtype in &config.dtypes {
        let (gpus, cannot) = able(prepared, &config.gpus, dtype);
        skipped.extend(cannot);
        let mut rounds: Vec<(bool, Vec<usize>)> = gpus.iter().map(|&g| (false, vec![g])).collect();
        if gpus.len() > 1 {
            rounds.push((true, gpus.clone()));
        }
        for (together, gpus) in rounds {
            let what = if together { "all GPUs at once".to_string() } else { format!("GPU {}", gpus[0]) };
            progress.update(&format!("gpu gemm {dtype} n={}: {what}", config.n));
            let args: Vec<Vec<String>> = gpus.iter().map(|&g| gemm_args(&config, g, dtype)).collect();
            for (gpu, ended) in gpus.iter().zip(run_all(&prepared.program, &args, timeout, interrupted)) {
                results.push(result_of(inv, *gpu, dtype, together, interpret(&ended, timeout)));
            }
        }
    }
    let mut sweeps = Vec::new();
    if let Some(shapes) = &config.sweep {
        // Each GPU alone: a sweep measures the GPU's ceiling, not the box's power budget.
        let count = shapes.split(',').count() as u64;
        let limit = Duration::from_secs(config.timeout_s.saturating_mul(count));
        for dtype in &config.dtypes {
            for gpu in able(prepared, &config.gpus, dtype).0 {
                progress.update(&format!("gpu gemm {dtype}: GPU {gpu}, sweep of {count} shapes"));
                let args = Request::Sweep(SweepArgs {
                    device: gpu,
                    dtype: dtype.clone(),
                    shapes: shapes.clone(),
                    reps: config.reps,
                    samples: config.samples,
                })
                .to_args();
                let ended = run_all(&prepared.program, &[args], limit, interrupted).remove(0);
                sweeps.push(sweep_of(gpu, dtype, interpret(&ended, limit)));
            }
        }
    }
    progress.finish();
    let telemetry = sampler.stop();
    for r in results.iter_mut().filter(|r| !r.together) {
        let best = sweeps.iter().find(|s| s.gpu == r.gpu && s.dtype == r.dtype).and_then(|s| s.best_tflops);
        r.fraction_of_best = r.run.as_ref().zip(best).map(|(g, b)| g.tflops_median / b);
    }
    judge(prepared, config, Measured { results, sweeps, skipped }, telemetry, started_at)
}

/// What the runs gave, for [`judge`].
struct Measured {
    results: Vec<GemmResult>,
    sweeps: Vec<SweepResult>,
    skipped: Vec<String>,
}

/// A sweep's document read, with its best shape.
fn sweep_of(gpu: usize, dtype: &str, doc: Result<serde_json::Value, ChildError>) -> SweepResult {
    let (sweep, error) = read_document::<kiln_gpu::gemm::Sweep>(doc, "a sweep");
    let best = sweep.as_ref().and_then(|s| s.results.get(s.best?));
    SweepResult {
        gpu,
        dtype: dtype.to_string(),
        best_shape: best.map(|b| b.shape.to_string()),
        best_tflops: best.map(|b| b.tflops_median),
        sweep,
        error,
    }
}

/// One run's document read as a GEMM result, with its peak.
fn result_of(
    inv: &Inventory,
    gpu: usize,
    dtype: &str,
    together: bool,
    doc: Result<serde_json::Value, ChildError>,
) -> GemmResult {
    let name = inv.gpus.devices.iter().find(|d| d.index as usize == gpu).and_then(|d| d.name.clone());
    let peak_tflops = name.as_deref().and_then(|n| kiln_bench::peaks::gpu_peak_tflops(n, dtype));
    let (run, error) = read_document::<GemmRun>(doc, "a GEMM");
    let cv = run.as_ref().and_then(|r| kiln_bench::stats::summarize(&r.seconds)).map(|s| s.cv);
    let fraction_of_peak = run.as_ref().zip(peak_tflops).map(|(r, p)| r.tflops_median / p);
    GemmResult {
        gpu,
        dtype: dtype.to_string(),
        together,
        run,
        error,
        cv,
        peak_tflops,
        fraction_of_peak,
        fraction_of_best: None,
    }
}

/// Each type's sampled sums against their median. Two GPUs that both pass the check may differ by
/// twice the larger of their summed allowed errors.
pub fn agreement(results: &[GemmResult]) -> Vec<Agreement> {
    let mut dtypes: Vec<&str> = results.iter().map(|r| r.dtype.as_str()).collect();
    dtypes.dedup();
    dtypes
        .into_iter()
        .filter_map(|dtype| {
            let runs: Vec<(&GemmResult, &GemmRun)> =
                results.iter().filter(|r| r.dtype == dtype).filter_map(|r| Some((r, r.run.as_ref()?))).collect();
            if runs.len() < 2 {
                return None;
            }
            let mut sums: Vec<f64> = runs.iter().map(|(_, g)| g.check.sampled_sum).collect();
            sums.sort_by(f64::total_cmp);
            let median_sum = sums[sums.len() / 2];
            let most_allowed = runs.iter().map(|(_, g)| g.check.allowed_sum).fold(0.0, f64::max);
            let sums: Vec<(usize, bool, f64, f64)> = runs
                .iter()
                .map(|(r, g)| {
                    let s = g.check.sampled_sum;
                    let deviation = if s.is_finite() {
                        (s - median_sum).abs() / (2.0 * most_allowed + f64::MIN_POSITIVE)
                    } else {
                        f64::INFINITY
                    };
                    (r.gpu, r.together, s, deviation)
                })
                .collect();
            let ok = sums.iter().all(|s| s.3 <= 1.0);
            Some(Agreement { dtype: dtype.to_string(), median_sum, sums, ok })
        })
        .collect()
}

fn label(gpu: usize, dtype: &str, together: bool) -> String {
    format!("GPU {gpu} ({dtype}{})", if together { ", all GPUs at once" } else { "" })
}

/// The failures, the ceiling and the status, the metrics and the text.
fn judge(
    prepared: &Prepared,
    config: GemmConfig,
    measured: Measured,
    telemetry: Vec<telemetry::Sample>,
    started_at: String,
) -> Outcome {
    let Measured { results, sweeps, skipped } = measured;
    let agreement = agreement(&results);
    let mut failures = Vec::new();
    let mut above = Vec::new();
    let mut unstable = false;
    for r in &results {
        let at = label(r.gpu, &r.dtype, r.together);
        if let Some(e) = &r.error {
            failures.push(format!("{at}: {e}"));
        }
        let Some(g) = &r.run else { continue };
        if !g.check.ok {
            failures.push(format!("{at} computed wrong: {}", wrong_by(&g.check)));
        }
        if let Some(p) = r.peak_tflops.filter(|p| g.tflops_best > p * (1.0 + PEAK_MARGIN)) {
            above.push(format!(
                "{at}: {:.1} TFLOP/s, above the datasheet's {p:.1} (+{:.0} %)",
                g.tflops_best,
                PEAK_MARGIN * 100.0
            ));
        }
        unstable |=
            r.run.as_ref().and_then(|g| kiln_bench::stats::summarize(&g.seconds)).is_some_and(|s| unsettled(&s));
    }
    for sw in &sweeps {
        let at = format!("GPU {} ({} sweep)", sw.gpu, sw.dtype);
        if let Some(e) = &sw.error {
            failures.push(format!("{at}: {e}"));
        }
        let peak = prepared_peak(&results, sw.gpu, &sw.dtype);
        for g in sw.sweep.iter().flat_map(|s| &s.results) {
            if !g.check.ok {
                failures.push(format!("{at} computed wrong at {}: {}", g.shape, wrong_by(&g.check)));
            }
            if let Some(p) = peak.filter(|p| g.tflops_best > p * (1.0 + PEAK_MARGIN)) {
                above.push(format!(
                    "{at} at {}: {:.1} TFLOP/s, above the datasheet's {p:.1} (+{:.0} %)",
                    g.shape,
                    g.tflops_best,
                    PEAK_MARGIN * 100.0
                ));
            }
        }
    }
    for a in agreement.iter().filter(|a| !a.ok) {
        for (gpu, together, sum, deviation) in a.sums.iter().filter(|s| s.3 > 1.0) {
            failures.push(format!(
                "{} disagrees with the other GPUs: sampled sum {sum:.6e} against their median {:.6e}, {deviation:.1} \
                 times what two right products may differ by",
                label(*gpu, &a.dtype, *together),
                a.median_sum
            ));
        }
    }
    let (mut metrics, samples) = metrics_of(&config, &results);
    for sw in &sweeps {
        if let Some(best) = sw.best_tflops {
            metrics.push(Metric {
                name: format!("gpu{}.gemm.{}.best_tflops", sw.gpu, sw.dtype),
                value: best,
                unit: "TFLOP/s".into(),
                direction: Direction::Higher,
            });
        }
    }
    let body = GemmBody { results, agreement, sweeps, skipped };
    let closing = Closing { started_at, telemetry, above, failures, unstable, metrics, samples };
    close(prepared, config, body, closing, &SHOWN)
}

/// How `GpuGemmReport` shows itself.
const SHOWN: Shown<GemmConfig, GemmBody> = Shown { headline, render, report: Report::GpuGemm };

/// The datasheet peak a GPU's results in `dtype` were held to.
fn prepared_peak(results: &[GemmResult], gpu: usize, dtype: &str) -> Option<f64> {
    results.iter().find(|r| r.gpu == gpu && r.dtype == dtype).and_then(|r| r.peak_tflops)
}

/// `gpu{i}.gemm.{dtype}.{n}.tflops` (alone) and `….all_tflops` (all GPUs at once), medians, with
/// every repetition's rate as samples; `gpus.gemm.{dtype}.{n}.tflops`, the GPUs' sum at once.
fn metrics_of(c: &GemmConfig, results: &[GemmResult]) -> (Vec<Metric>, Vec<(String, i64, f64)>) {
    let mut metrics = Vec::new();
    let mut samples = Vec::new();
    let metric = |name: String, value| Metric { name, value, unit: "TFLOP/s".into(), direction: Direction::Higher };
    for dtype in &c.dtypes {
        let mut total = None;
        for r in results.iter().filter(|r| &r.dtype == dtype) {
            let Some(g) = &r.run else { continue };
            let name =
                format!("gpu{}.gemm.{dtype}.{}.{}", r.gpu, c.n, if r.together { "all_tflops" } else { "tflops" });
            let rates: Vec<f64> = g.seconds.iter().map(|s| g.flops_per_rep / s / 1e12).collect();
            samples.extend(samples_of(&name, &rates));
            metrics.push(metric(name, g.tflops_median));
            if r.together {
                *total.get_or_insert(0.0) += g.tflops_median;
            }
        }
        if let Some(t) = total {
            metrics.push(metric(format!("gpus.gemm.{dtype}.{}.tflops", c.n), t));
        }
    }
    (metrics, samples)
}

fn headline(r: &GpuGemmReport) -> String {
    let alone: Vec<&GemmResult> = r.results.iter().filter(|x| !x.together && x.run.is_some()).collect();
    let Some(first) = r.config.dtypes.first() else { return "gpu gemm: nothing measured".into() };
    let of_type: Vec<f64> =
        alone.iter().filter(|x| &x.dtype == first).filter_map(|x| Some(x.run.as_ref()?.tflops_median)).collect();
    let median = kiln_bench::stats::summarize(&of_type).map(|s| s.median);
    match median {
        Some(m) => format!(
            "gpu gemm {first} n={}: {} GPU(s), median {m:.1} TFLOP/s per GPU, slowest {:.1}{}",
            r.config.n,
            of_type.len(),
            of_type.iter().copied().fold(f64::INFINITY, f64::min),
            if r.failures.is_empty() { String::new() } else { format!("; {} failure(s)", r.failures.len()) }
        ),
        None => format!("gpu gemm {first}: no GPU finished; {}", r.failures.first().map_or("", String::as_str)),
    }
}

pub fn render(r: &GpuGemmReport) -> String {
    let names: Vec<&str> = r.devices.iter().map(|d| d.name.as_str()).collect();
    let mut out = format!(
        "gpu gemm: {} GPU(s) ({}), n={}, {} repetitions each, sampled check {}x{}; {}\n",
        r.config.gpus.len(),
        names.first().copied().unwrap_or("?"),
        r.config.n,
        r.config.reps,
        r.config.samples,
        r.config.samples,
        r.program
    );
    out.push_str(&format!(
        "{:<6} {:>4} {:<9} {:>10} {:>10} {:>6} {:>8}  {}\n",
        "dtype", "gpu", "when", "TFLOP/s", "best", "CV %", "of peak", "check"
    ));
    for x in &r.results {
        let when = if x.together { "together" } else { "alone" };
        match &x.run {
            Some(g) => out.push_str(&format!(
                "{:<6} {:>4} {:<9} {:>10.1} {:>10.1} {:>6.2} {:>8}  {}\n",
                x.dtype,
                x.gpu,
                when,
                g.tflops_median,
                g.tflops_best,
                x.cv.unwrap_or(0.0) * 100.0,
                x.fraction_of_peak.map_or_else(|| "-".to_string(), |f| format!("{:.1} %", f * 100.0)),
                if g.check.ok {
                    format!("ok ({} values, worst {:.2} of allowed)", g.check.values, g.check.worst_ratio)
                } else {
                    "WRONG".to_string()
                }
            )),
            None => out.push_str(&format!("{:<6} {:>4} {:<9} failed\n", x.dtype, x.gpu, when)),
        }
    }
    for dtype in &r.config.dtypes {
        let together: Vec<f64> = r
            .results
            .iter()
            .filter(|x| x.together && &x.dtype == dtype)
            .filter_map(|x| Some(x.run.as_ref()?.tflops_median))
            .collect();
        if !together.is_empty() {
            out.push_str(&format!(
                "{dtype}: {} GPUs at once {:.1} TFLOP/s in all\n",
                together.len(),
                together.iter().sum::<f64>()
            ));
        }
    }
    for sw in r.sweeps.iter().filter(|s| s.best_shape.is_some()) {
        let asked = r.results.iter().find(|x| !x.together && x.gpu == sw.gpu && x.dtype == sw.dtype);
        out.push_str(&format!(
            "GPU {} {} sweep of {} shapes: best {} at {:.1} TFLOP/s{}\n",
            sw.gpu,
            sw.dtype,
            sw.sweep.as_ref().map_or(0, |s| s.results.len()),
            sw.best_shape.as_deref().unwrap_or("-"),
            sw.best_tflops.unwrap_or(0.0),
            asked.and_then(|x| x.fraction_of_best).map_or_else(String::new, |f| format!(
                "; n={} reaches {:.1} % of it",
                r.config.n,
                f * 100.0
            ))
        ));
    }
    for line in &r.skipped {
        out.push_str(&format!("skipped: {line}\n"));
    }
    render_verdict(&mut out, &r.failures, r.invalid.as_deref(), r.status, &r.telemetry);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_db::RunStatus;
    use kiln_gpu::DeviceInfo;

    fn run(gpu: usize, sum: f64, ok: bool, best: f64) -> GemmResult {
        let check = kiln_gpu::gemm::Check {
            values: 4,
            worst_ratio: if ok { 0.1 } else { 40.0 },
            worst_at: (1, 2),
            ok,
            sampled_sum: sum,
            allowed_sum: 0.5,
        };
        let g = GemmRun {
            device: gpu,
            name: Some("NVIDIA H200".into()),
            dtype: "bf16".into(),
            n: 8192,
            shape: kiln_gpu::gemm::Shape::square(8192),
            flops_per_rep: 2.0 * 8192f64.powi(3),
            seconds: vec![0.0015, 0.0015, 0.00152],
            tflops_median: best * 0.98,
            tflops_best: best,
            check,
        };
        GemmResult {
            gpu,
            dtype: "bf16".into(),
            together: false,
            run: Some(g),
            error: None,
            cv: Some(0.01),
            peak_tflops: Some(989.4),
            fraction_of_peak: Some(0.7),
            fraction_of_best: None,
        }
    }

    fn judged(results: Vec<GemmResult>) -> Outcome {
        let prepared = Prepared { program: "/opt/kiln-gpu".into(), devices: Vec::new() };
        let config = GemmConfig {
            dtypes: vec!["bf16".into()],
            n: 8192,
            reps: 3,
            samples: 2,
            gpus: results.iter().map(|r| r.gpu).collect(),
            timeout_s: 60,
            sweep: None,
        };
        let measured = Measured { results, sweeps: Vec::new(), skipped: Vec::new() };
        judge(&prepared, config, measured, Vec::new(), "2026-12-05T00:00:00Z".into())
    }

    #[test]
    fn gpus_that_agree_pass_and_one_that_disagrees_is_named() {
        let o = judged(vec![run(0, 100.0, true, 700.0), run(1, 100.4, true, 700.0), run(2, 99.8, true, 700.0)]);
        assert_eq!(o.status, RunStatus::Ok, "{}", o.text);
        assert!(o.metrics.iter().any(|m| m.name == "gpu1.gemm.bf16.8192.tflops" && m.unit == "TFLOP/s"));
        // GPU 2 is 3 off the median: more than the 2 x 0.5 two right products may differ by.
        let o = judged(vec![run(0, 100.0, true, 700.0), run(1, 100.0, true, 700.0), run(2, 103.0, true, 700.0)]);
        assert_eq!(o.status, RunStatus::Failed);
        let Report::GpuGemm(r) = &o.report else { panic!() };
        assert_eq!(r.failures.len(), 1, "{:?}", r.failures);
        assert!(r.failures[0].starts_with("GPU 2 (bf16) disagrees"), "{}", r.failures[0]);
    }

    #[test]
    fn a_wrong_product_fails_and_a_figure_above_the_datasheet_is_invalid() {
        let o = judged(vec![run(0, 100.0, true, 700.0), run(1, 100.0, false, 700.0)]);
        assert_eq!(o.status, RunStatus::Failed);
        assert!(o.text.contains("FAIL GPU 1 (bf16) computed wrong: C[1][2]"), "{}", o.text);
        let o = judged(vec![run(0, 100.0, true, 1100.0)]);
        assert_eq!(o.status, RunStatus::Invalid);
        assert!(o.report.invalid_reason().unwrap().contains("above the datasheet's 989.4"));
        let mut failed = run(3, 0.0, true, 1.0);
        (failed.run, failed.error) = (None, Some("did not finish within 60 s".into()));
        let o = judged(vec![run(0, 100.0, true, 700.0), failed]);
        assert_eq!(o.status, RunStatus::Failed);
        assert!(o.text.contains("FAIL GPU 3 (bf16): did not finish within 60 s"), "{}", o.text);
    }

    #[test]
    fn a_sweep_sets_each_gpus_ceiling_and_a_wrong_shape_fails() {
        let shaped = |shape: &str, rate: f64, ok: bool| {
            let mut g = run(0, 1.0, ok, rate).run.unwrap();
            g.shape = kiln_gpu::gemm::Shape::parse(shape).unwrap();
            g.tflops_median = rate;
            g
        };
        let sweep = |results: Vec<GemmRun>, best| kiln_gpu::gemm::Sweep {
            device: 0,
            name: None,
            dtype: "bf16".into(),
            results,
            best,
        };
        let doc = serde_json::to_value(sweep(
            vec![shaped("4096", 600.0, true), shaped("8192x8192x16384", 760.0, true)],
            Some(1),
        ))
        .unwrap();
        let sw = sweep_of(0, "bf16", Ok(doc));
        assert_eq!((sw.best_shape.as_deref(), sw.best_tflops), (Some("8192x8192x16384"), Some(760.0)));
        let mut alone = run(0, 100.0, true, 700.0);
        alone.fraction_of_best = Some(alone.run.as_ref().unwrap().tflops_median / 760.0);
        let prepared = Prepared { program: "/opt/kiln-gpu".into(), devices: Vec::new() };
        let config = GemmConfig {
            dtypes: vec!["bf16".into()],
            n: 8192,
            reps: 3,
            samples: 2,
            gpus: vec![0],
            timeout_s: 60,
            sweep: Some("4096,8192x8192x16384".into()),
        };
        let measured = |results, sweeps| Measured { results, sweeps, skipped: Vec::new() };
        let o = judge(&prepared, config.clone(), measured(vec![alone.clone()], vec![sw]), Vec::new(), "t".into());
        assert_eq!(o.status, RunStatus::Ok, "{}", o.text);
        assert!(
            o.text.contains(
                "GPU 0 bf16 sweep of 2 shapes: best 8192x8192x16384 at 760.0 TFLOP/s; n=8192 reaches 90.3 % of it"
            ),
            "{}",
            o.text
        );
        assert!(o.metrics.iter().any(|m| m.name == "gpu0.gemm.bf16.best_tflops" && m.value == 760.0));
        // A shape computed wrong fails the run; one above the datasheet makes it invalid.
        let doc = serde_json::to_value(sweep(vec![shaped("2048", 500.0, false)], None)).unwrap();
        let o = judge(
            &prepared,
            config.clone(),
            measured(vec![alone.clone()], vec![sweep_of(0, "bf16", Ok(doc))]),
            Vec::new(),
            "t".into(),
        );
        assert_eq!(o.status, RunStatus::Failed);
        assert!(o.text.contains("FAIL GPU 0 (bf16 sweep) computed wrong at 2048x2048x2048"), "{}", o.text);
        let doc = serde_json::to_value(sweep(vec![shaped("2048", 1100.0, true)], Some(0))).unwrap();
        let o =
            judge(&prepared, config, measured(vec![alone], vec![sweep_of(0, "bf16", Ok(doc))]), Vec::new(), "t".into());
        assert_eq!(o.status, RunStatus::Invalid);
    }

    /// fp8 only where the tensor cores have it: an A100 beside an H100 is skipped, and says why.
    #[test]
    fn fp8_is_asked_only_of_gpus_that_have_it() {
        let device = |ordinal: usize, name: &str, cc: &str| DeviceInfo {
            ordinal,
            name: name.into(),
            compute_capability: cc.into(),
            memory_bytes: 80 << 30,
        };
        let prepared = Prepared {
            program: "/opt/kiln-gpu".into(),
            devices: vec![device(0, "NVIDIA H100 80GB HBM3", "9.0"), device(1, "NVIDIA A100-SXM4-80GB", "8.0")],
        };
        assert_eq!(able(&prepared, &[0, 1], "bf16"), (vec![0, 1], vec![]));
        let (gpus, skipped) = able(&prepared, &[0, 1], "fp8");
        assert_eq!(gpus, vec![0]);
        assert_eq!(
            skipped,
            ["fp8 on GPU 1 (NVIDIA A100-SXM4-80GB, compute capability 8.0): no fp8 tensor cores before 8.9"]
        );
        let config = GemmConfig {
            dtypes: vec!["fp8".into()],
            n: 8192,
            reps: 3,
            samples: 2,
            gpus: vec![0, 1],
            timeout_s: 60,
            sweep: None,
        };
        let mut fp8 = run(0, 100.0, true, 1500.0);
        fp8.dtype = "fp8".into();
        fp8.peak_tflops = Some(1978.9);
        let measured = Measured { results: vec![fp8], sweeps: Vec::new(), skipped };
        let o = judge(&prepared, config, measured, Vec::new(), "t".into());
        assert_eq!(o.status, RunStatus::Ok, "a GPU without fp8 is no failure: {}", o.text);
        assert!(o.text.contains("skipped: fp8 on GPU 1 (NVIDIA A100-SXM4-80GB"), "{}", o.text);
    }
}

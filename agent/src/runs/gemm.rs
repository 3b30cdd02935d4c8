//! The GEMM adapter: dense matrix multiplies per dtype and size against the measured FMA peak,
//! with the datasheet view beside it.

use std::time::Duration;

use kiln_bench::gemm::{GemmResult, PeakResult};
use kiln_db::{Direction, Metric};
use serde::{Deserialize, Serialize};

use super::{allowed_cpus, contention_limit, sampler, samples_of, status_of, Outcome, Report, MAX_CV};
use crate::inventory::Inventory;
use crate::render::Progress;
use crate::timefmt::now_rfc3339;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GemmReport {
    pub peak: PeakResult,
    pub theoretical_peak: Option<TheoreticalPeak>,
    pub results: Vec<GemmResult>,
    pub skipped: Vec<String>,
}

/// The datasheet view: CPUs × clock × FLOPs per cycle of the microarchitecture.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TheoreticalPeak {
    pub gflops: f64,
    pub flops_per_cycle: u32,
    pub basis: String,
    pub clock_mhz: u32,
    pub cpus: usize,
    /// The clock the measured peak implies: measured / (CPUs × FLOPs per cycle).
    pub implied_clock_mhz: f64,
}

/// On a VM the reported clock is often the base clock while the host boosts, so the measured peak
/// is what % of peak uses; the implied clock shows whether the box sustains its boost.
fn theoretical_peak(inv: &Inventory, cpus: usize, measured_gflops: f64) -> Option<TheoreticalPeak> {
    let cpu = &inv.cpu;
    let (flops_per_cycle, basis) = kiln_bench::peaks::cpu_fp32_flops_per_cycle(
        cpu.vendor.as_deref().unwrap_or(""),
        cpu.family,
        cpu.model,
        cpu.part.as_deref(),
        &cpu.ml_features,
    )?;
    let clock_mhz = cpu.frequency.max_mhz.or(cpu.frequency.current_mhz)?;
    let per_mhz = cpus as f64 * f64::from(flops_per_cycle);
    Some(TheoreticalPeak {
        gflops: per_mhz * f64::from(clock_mhz) / 1000.0,
        flops_per_cycle,
        basis: basis.to_string(),
        clock_mhz,
        cpus,
        implied_clock_mhz: measured_gflops * 1000.0 / per_mhz,
    })
}

pub fn render_gemm(report: &GemmReport, cpus: usize) -> String {
    let peak = &report.peak;
    let mut text = format!(
        "measured FMA peak (f32, {}, {} threads): {:.1} GFLOP/s{}\n{:<6} {:>6} {:>12} {:>8} {:>7}\n",
        peak.isa,
        cpus,
        peak.summary.median,
        report.theoretical_peak.as_ref().map_or(String::new(), |t| format!(
            "; datasheet {:.1} GFLOP/s at {} MHz x {} FLOP/cycle ({}), implied sustained clock {:.0} MHz",
            t.gflops, t.clock_mhz, t.flops_per_cycle, t.basis, t.implied_clock_mhz
        )),
        "dtype",
        "n",
        "GFLOP/s",
        "of peak",
        "CV"
    );
    for r in &report.results {
        text.push_str(&format!(
            "{:<6} {:>6} {:>12.1} {:>7.1}% {:>6.1}%\n",
            r.dtype,
            r.n,
            r.summary.median,
            r.percent_of_peak.unwrap_or(0.0),
            r.summary.cv * 100.0
        ));
    }
    for s in &report.skipped {
        text.push_str(&format!("skipped {s}\n"));
    }
    text
}

pub fn gemm(inv: &Inventory, sizes: &[usize], dtypes: &[candle_core::DType], repetitions: usize) -> Outcome {
    let progress = Progress::new();
    progress.update("measuring the FMA peak");
    let cpus = allowed_cpus(inv);
    // Sampling (and the contention figures) covers the peak probe too: % of peak divides by it.
    let sampler = sampler(inv, Duration::from_millis(500));
    let peak = kiln_bench::gemm::fma_peak(&cpus, 3, 20_000_000);
    let started_at = now_rfc3339();
    let mut results = Vec::new();
    let mut skipped = Vec::new();
    for &dtype in dtypes {
        for &n in sizes {
            progress.update(&format!("gemm {dtype:?} {n}x{n}x{n}"));
            match kiln_bench::gemm::measure(dtype, n, repetitions, Some(peak.summary.median)) {
                Ok(r) => results.push(r),
                Err(e) => skipped.push(format!("{dtype:?} {n}: {e}")),
            }
        }
    }
    progress.finish();
    let telemetry = sampler.stop();
    let gflops = |name: String, value| Metric { name, value, unit: "GFLOP/s".into(), direction: Direction::Higher };
    let mut metrics = vec![gflops("cpu.fma_peak_gflops".into(), peak.summary.median)];
    let mut samples: Vec<(String, i64, f64)> = samples_of("cpu.fma_peak_gflops", &peak.gflops).collect();
    for r in &results {
        let name = format!("gemm.{}.{}.gflops", r.dtype, r.n);
        samples.extend(samples_of(&name, &r.gflops));
        metrics.push(gflops(name, r.summary.median));
    }
    let best = results.iter().filter(|r| r.dtype == "f32").max_by(|a, b| a.n.cmp(&b.n));
    let headline = best.map_or(String::new(), |b| {
        format!(
            "GEMM f32 {}³ {:.1} GFLOP/s, {:.0} % of the {:.1} GFLOP/s FMA peak",
            b.n,
            b.summary.median,
            b.percent_of_peak.unwrap_or(0.0),
            peak.summary.median
        )
    });
    let status = status_of(results.iter().any(|r| r.summary.cv > MAX_CV));
    let report =
        GemmReport { theoretical_peak: theoretical_peak(inv, cpus.len(), peak.summary.median), peak, results, skipped };
    let dtype_names: Vec<String> = dtypes.iter().map(|d| format!("{d:?}").to_lowercase()).collect();
    Outcome {
        status,
        status_reason: None,
        started_at,
        config: serde_json::json!({ "sizes": sizes, "dtypes": dtype_names, "repetitions": repetitions }),
        headline,
        text: render_gemm(&report, cpus.len()),
        report: Report::Gemm(report),
        metrics,
        samples,
        telemetry,
    }
    .judge_contention(contention_limit())
}

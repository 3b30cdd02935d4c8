//! `kiln bench gpu gemm --burn DURATION`: every GPU multiplying at once, back to back, for the
//! duration (full power, as a box trains), each GPU's product checked against its f64 reference
//! about every second: a GPU that miscomputes when hot, or slows down as it heats, shows when.

use std::sync::atomic::AtomicBool;
use std::time::Duration;

use kiln_db::{Direction, Metric};
use kiln_gpu::gemm::Burn;
use kiln_gpu::request::{BurnArgs, Request};
use serde::{Deserialize, Serialize};

use super::{
    close, interpret, read_document, render_verdict, run_all, Closing, GpuReport, Prepared, Shown, PEAK_MARGIN,
    TELEMETRY_INTERVAL,
};
use crate::runs::{sampler, samples_of, Outcome, Report};
use kiln_inventory::telemetry;
use kiln_inventory::Inventory;
use kiln_text::timefmt::now_rfc3339;
use kiln_text::Progress;

/// What a burn does.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BurnConfig {
    pub dtype: String,
    pub n: usize,
    pub seconds: f64,
    pub samples: usize,
    pub gpus: Vec<usize>,
}

/// One GPU's burn.
#[derive(Debug, Clone, Serialize)]
pub struct BurnResult {
    pub gpu: usize,
    pub burn: Option<Burn>,
    pub error: Option<String>,
    pub peak_tflops: Option<f64>,
    /// Over the intervals' rates.
    pub median_tflops: Option<f64>,
    pub min_tflops: Option<f64>,
    /// The slowest interval's shortfall from the median, as a share (0.1: 10 % slower).
    pub slowdown: Option<f64>,
}

/// `kiln bench gpu gemm --burn`'s document.
pub type GpuBurnReport = GpuReport<BurnConfig, Burned>;

/// What `GpuBurnReport` holds besides the envelope every GPU benchmark shares.
#[derive(Debug, Clone, Serialize)]
pub struct Burned {
    pub results: Vec<BurnResult>,
}

/// Burns every GPU of `config` at once.
pub fn burn(inv: &Inventory, prepared: &Prepared, config: BurnConfig, interrupted: &AtomicBool) -> Outcome {
    let started_at = now_rfc3339();
    let sampler = sampler(inv, TELEMETRY_INTERVAL);
    let progress = Progress::new();
    progress.update(&format!("gpu burn: {} GPU(s), {:.0} s", config.gpus.len(), config.seconds));
    let args: Vec<Vec<String>> = config
        .gpus
        .iter()
        .map(|&device| {
            Request::Burn(BurnArgs {
                device,
                dtype: config.dtype.clone(),
                shape: config.n.to_string(),
                seconds: config.seconds,
                samples: config.samples,
            })
            .to_args()
        })
        .collect();
    // The products' own time, and room for starting, the inputs and the last check.
    let limit = Duration::from_secs_f64(config.seconds + 120.0);
    let ended = run_all(&prepared.program, &args, limit, interrupted);
    progress.finish();
    let telemetry = sampler.stop();
    let results = config
        .gpus
        .iter()
        .zip(ended)
        .map(|(&gpu, ended)| {
            let name = inv.gpus.devices.iter().find(|d| d.index as usize == gpu).and_then(|d| d.name.clone());
            let peak_tflops = name.as_deref().and_then(|n| kiln_bench::peaks::gpu_peak_tflops(n, &config.dtype));
            let (burn, error) = read_document::<Burn>(interpret(&ended, limit), "a burn");
            let rates: Vec<f64> = burn.iter().flat_map(|b| b.intervals.iter().map(|i| i.tflops)).collect();
            let median_tflops = kiln_bench::stats::summarize(&rates).map(|s| s.median);
            let min_tflops = rates.iter().copied().reduce(f64::min);
            let slowdown = median_tflops.zip(min_tflops).map(|(m, lo)| 1.0 - lo / m);
            BurnResult { gpu, burn, error, peak_tflops, median_tflops, min_tflops, slowdown }
        })
        .collect();
    judge(prepared, config, results, telemetry, started_at)
}

fn judge(
    prepared: &Prepared,
    config: BurnConfig,
    results: Vec<BurnResult>,
    telemetry: Vec<telemetry::Sample>,
    started_at: String,
) -> Outcome {
    let mut failures = Vec::new();
    let mut above = Vec::new();
    let mut metrics = Vec::new();
    let mut samples = Vec::new();
    for r in &results {
        if let Some(e) = &r.error {
            failures.push(format!("GPU {}: {e}", r.gpu));
        }
        let Some(b) = &r.burn else { continue };
        if b.failed_checks > 0 {
            failures.push(format!(
                "GPU {} computed wrong in {} of {} checks, first after {:.0} s (worst value off by {:.3e} times \
                 its allowed error)",
                r.gpu,
                b.failed_checks,
                b.intervals.len(),
                b.first_failure_s.unwrap_or(0.0),
                b.worst.worst_ratio
            ));
        }
        let fastest = b.intervals.iter().map(|i| i.tflops).fold(0.0, f64::max);
        if let Some(p) = r.peak_tflops.filter(|p| fastest > p * (1.0 + PEAK_MARGIN)) {
            above.push(format!(
                "GPU {}: {fastest:.1} TFLOP/s in a second of the burn, above the datasheet's {p:.1}",
                r.gpu
            ));
        }
        let name = format!("gpu{}.burn.{}.tflops", r.gpu, config.dtype);
        let rates: Vec<f64> = b.intervals.iter().map(|i| i.tflops).collect();
        samples.extend(samples_of(&name, &rates));
        let metric = |name: String, value| Metric { name, value, unit: "TFLOP/s".into(), direction: Direction::Higher };
        if let (Some(median), Some(min)) = (r.median_tflops, r.min_tflops) {
            metrics.push(metric(name, median));
            metrics.push(metric(format!("gpu{}.burn.{}.min_tflops", r.gpu, config.dtype), min));
        }
    }
    let body = Burned { results };
    let closing = Closing { started_at, telemetry, above, failures, unstable: false, metrics, samples };
    close(prepared, config, body, closing, &SHOWN)
}

/// How `GpuBurnReport` shows itself.
const SHOWN: Shown<BurnConfig, Burned> = Shown { headline, render, report: Report::GpuBurn };

fn headline(r: &GpuBurnReport) -> String {
    let medians: Vec<f64> = r.results.iter().filter_map(|x| x.median_tflops).collect();
    format!(
        "gpu burn {} n={} for {:.0} s: {} GPU(s), {:.1} TFLOP/s median per GPU{}",
        r.config.dtype,
        r.config.n,
        r.config.seconds,
        medians.len(),
        kiln_bench::stats::summarize(&medians).map_or(0.0, |s| s.median),
        if r.failures.is_empty() { String::new() } else { format!("; {} failure(s)", r.failures.len()) }
    )
}

pub fn render(r: &GpuBurnReport) -> String {
    let mut out = format!(
        "gpu burn: {} GPU(s) at once, {} n={}, {:.0} s, each product checked about every second; {}\n",
        r.config.gpus.len(),
        r.config.dtype,
        r.config.n,
        r.config.seconds,
        r.program
    );
    out.push_str(&format!(
        "{:>4} {:>10} {:>14} {:>14} {:>9} {:>8}  {}\n",
        "gpu", "products", "median TFLOP/s", "slowest second", "slowdown", "checks", "check"
    ));
    for x in &r.results {
        match &x.burn {
            Some(b) => out.push_str(&format!(
                "{:>4} {:>10} {:>14.1} {:>14.1} {:>8.1}% {:>8}  {}\n",
                x.gpu,
                b.products,
                x.median_tflops.unwrap_or(0.0),
                x.min_tflops.unwrap_or(0.0),
                x.slowdown.unwrap_or(0.0) * 100.0,
                b.intervals.len(),
                if b.failed_checks == 0 { "ok".to_string() } else { format!("{} WRONG", b.failed_checks) }
            )),
            None => out.push_str(&format!("{:>4} failed\n", x.gpu)),
        }
    }
    render_verdict(&mut out, &r.failures, r.invalid.as_deref(), r.status, &r.telemetry);
    out
}

/// "90", "90s", "10m", "1h" as seconds.
pub fn parse_duration(text: &str) -> anyhow::Result<f64> {
    let t = text.trim();
    let (number, unit) = match t.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => (&t[..i], &t[i..]),
        None => (t, "s"),
    };
    let n: f64 = number.trim().parse().map_err(|_| anyhow::anyhow!("{text:?}: a duration like 90s, 10m or 1h"))?;
    let scale = match unit {
        "s" => 1.0,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        _ => anyhow::bail!("{text:?}: a duration like 90s, 10m or 1h"),
    };
    anyhow::ensure!(n > 0.0 && n * scale <= 7.0 * 86_400.0, "{text:?}: above 0, at most a week");
    Ok(n * scale)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_db::RunStatus;
    use kiln_gpu::gemm::{Check, Interval, Shape};

    fn burned(gpu: usize, rates: &[f64], failed: u64) -> BurnResult {
        let check = Check {
            values: 4,
            worst_ratio: if failed > 0 { 9.0 } else { 0.2 },
            worst_at: (3, 4),
            ok: failed == 0,
            sampled_sum: 1.0,
            allowed_sum: 0.1,
        };
        let intervals: Vec<Interval> = rates
            .iter()
            .enumerate()
            .map(|(i, &tflops)| Interval { at_s: i as f64 + 1.0, products: 600, tflops, ok: i as u64 >= failed })
            .collect();
        let burn = Burn {
            device: gpu,
            name: None,
            dtype: "bf16".into(),
            shape: Shape::square(8192),
            seconds: rates.len() as f64,
            products: 600 * rates.len() as u64,
            intervals,
            failed_checks: failed,
            first_failure_s: (failed > 0).then_some(1.0),
            worst: check,
        };
        let median = kiln_bench::stats::summarize(rates).map(|s| s.median);
        let min = rates.iter().copied().reduce(f64::min);
        BurnResult {
            gpu,
            burn: Some(burn),
            error: None,
            peak_tflops: Some(989.4),
            median_tflops: median,
            min_tflops: min,
            slowdown: median.zip(min).map(|(m, lo)| 1.0 - lo / m),
        }
    }

    fn judged(results: Vec<BurnResult>) -> Outcome {
        let prepared = Prepared { program: "/opt/kiln-gpu".into(), devices: Vec::new() };
        let config = BurnConfig {
            dtype: "bf16".into(),
            n: 8192,
            seconds: 3.0,
            samples: 32,
            gpus: results.iter().map(|r| r.gpu).collect(),
        };
        judge(&prepared, config, results, Vec::new(), "t".into())
    }

    #[test]
    fn a_gpu_that_miscomputes_when_hot_fails_and_its_slowdown_is_shown() {
        let o = judged(vec![burned(0, &[700.0, 690.0, 630.0], 0), burned(1, &[700.0, 700.0, 700.0], 2)]);
        assert_eq!(o.status, RunStatus::Failed);
        assert!(o.text.contains("FAIL GPU 1 computed wrong in 2 of 3 checks, first after 1 s"), "{}", o.text);
        assert!(!o.text.contains("FAIL GPU 0"), "{}", o.text);
        assert!(o.text.contains("8.7%"), "GPU 0's slowest second is 8.7 % under its median: {}", o.text);
        let min = o.metrics.iter().find(|m| m.name == "gpu0.burn.bf16.min_tflops").unwrap();
        assert_eq!(min.value, 630.0);
        assert_eq!(o.samples.iter().filter(|s| s.0 == "gpu0.burn.bf16.tflops").count(), 3);
        let o = judged(vec![burned(0, &[700.0, 1200.0], 0)]);
        assert_eq!(o.status, RunStatus::Invalid);
        let o = judged(vec![burned(0, &[700.0, 700.0], 0)]);
        assert_eq!(o.status, RunStatus::Ok, "{}", o.text);
    }

    #[test]
    fn durations_read_as_people_write_them() {
        assert_eq!(parse_duration("90").unwrap(), 90.0);
        assert_eq!(parse_duration("90s").unwrap(), 90.0);
        assert_eq!(parse_duration("10m").unwrap(), 600.0);
        assert_eq!(parse_duration("1.5h").unwrap(), 5400.0);
        for bad in ["", "0", "-3m", "10d", "m", "9000h"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}

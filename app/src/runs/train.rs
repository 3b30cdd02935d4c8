//! The training adapter: the reference model on this host, its MFU against the measured FMA peak.

use std::time::Duration;

use kiln_bench::ceilings::PeakResult;
use kiln_db::{Direction, Metric, RunStatus};
use serde::{Deserialize, Serialize};

use super::{allowed_cpus, contention_limit, sampler, samples_of, status_of, unsettled, Outcome, Report};
use kiln_inventory::Inventory;
use kiln_text::timefmt::now_rfc3339;
use kiln_text::Progress;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainReport {
    pub peak: PeakResult,
    pub train: kiln_bench::train::Report,
}

/// The stored metrics of a training run, with the step times as raw samples.
pub fn train_metrics(r: &kiln_bench::train::Report) -> (Vec<Metric>, Vec<(String, i64, f64)>) {
    let size = &r.config.size;
    let m = |name: &str, value: f64, unit: &str, direction| Metric {
        name: format!("train.{size}.{name}"),
        value,
        unit: unit.into(),
        direction,
    };
    let mut metrics = vec![
        m("tokens_per_s", r.tokens_per_s, "tokens/s", Direction::Higher),
        m("step_p50_s", r.step_s.median, "s", Direction::Lower),
        m("step_p95_s", r.step_p95_s, "s", Direction::Lower),
        m("achieved_gflops", r.achieved_flops / 1e9, "GFLOP/s", Direction::Higher),
        m("loss_start", r.loss_start, "nats", Direction::None),
        m("loss_end", r.loss_end, "nats", Direction::Lower),
    ];
    if let Some(input) = &r.input {
        metrics.push(m("input_wait_share", input.wait_share, "ratio", Direction::Lower));
    }
    if let Some(mfu) = r.mfu {
        metrics.push(m("mfu", mfu, "ratio", Direction::Higher));
    }
    let mut samples: Vec<(String, i64, f64)> = samples_of(&format!("train.{size}.loss"), &r.loss_curve).collect();
    samples.extend(samples_of(&format!("train.{size}.step_s"), &r.step_times_s));
    (metrics, samples)
}

pub fn render_train(r: &kiln_bench::train::Report, peak: &kiln_bench::ceilings::PeakResult) -> String {
    let c = &r.config;
    format!(
        "train {}: {} layers, d_model {}, {} heads, seq {}, batch {}, {} steps, seed {} ({} parameters, {} without embeddings; {} kernels, dense layers through {})\n\
         tokens/s {:.0}  samples/s {:.1}  step p50 {:.1} ms  p95 {:.1} ms  max {:.1} ms  (CV {:.1} %, first {} steps excluded)\n\
         achieved {:.2} GFLOP/s ({}), {:.1} % of the measured {} peak {:.1} GFLOP/s\n\
         loss {:.3} -> {:.3} (chance {:.3}, corpus entropy {:.3}){}\n\
         peak memory {}\n{}",
        c.size, c.layers, c.d_model, c.heads, c.seq, c.batch, c.steps, c.seed, r.parameters, r.non_embedding_parameters, format!("{:?}", c.kernels).to_lowercase(), format!("{:?}", c.gemm).to_lowercase(),
        r.tokens_per_s, r.samples_per_s, r.step_s.median * 1e3, r.step_p95_s * 1e3, r.step_max_s * 1e3, r.step_s.cv * 100.0, r.warmup_steps_excluded,
        r.achieved_flops / 1e9, r.flops_formula, r.mfu.unwrap_or(0.0) * 100.0, peak.isa, peak.rate(),
        r.loss_start, r.loss_end, r.loss_chance, r.loss_floor, if r.learned { "" } else { "  DID NOT LEARN" },
        r.peak_rss_bytes.map_or("unknown".to_string(), kiln_inventory::fingerprint::human_bytes),
        gemm_trial(r),
    ) + &input_line(r)
}

/// Where the batches came from, when from disk (`--data`), and how long the steps waited on them.
fn input_line(r: &kiln_bench::train::Report) -> String {
    r.input.as_ref().map_or(String::new(), |i| {
        format!(
            "input from {} ({}, {} bytes a step): waited {:.2} ms a step (median), {:.1} % of the steps' time\n",
            i.dir,
            if i.direct { "O_DIRECT" } else { "buffered: the page cache may serve it" },
            i.bytes_per_step,
            i.wait_s * 1e3,
            100.0 * i.wait_share
        )
    })
}

/// `--gemm auto`'s trial, when there was one: what each candidate took, and the choice.
fn gemm_trial(r: &kiln_bench::train::Report) -> String {
    if r.gemm_trials.is_empty() {
        return String::new();
    }
    let times: Vec<String> = r
        .gemm_trials
        .iter()
        .map(|t| format!("{} {:.1} ms", format!("{:?}", t.gemm).to_lowercase(), t.seconds * 1e3))
        .collect();
    format!(
        "gemm auto chose {} (one block's and the head's products, forward and backward: {})\n",
        format!("{:?}", r.config.gemm).to_lowercase(),
        times.join(", ")
    )
}

/// Trains; the MFU is against this machine's measured f32 FMA peak.
///
/// # Errors
/// A candle error.
pub fn train(inv: &Inventory, config: &kiln_bench::train::Config) -> anyhow::Result<Outcome> {
    let progress = Progress::new();
    progress.update("measuring the FMA peak");
    // Sampling (and the contention figures) covers the peak probe too: MFU divides by it.
    let sampler = sampler(inv, Duration::from_millis(500));
    let peak = kiln_bench::ceilings::fma_peak(&allowed_cpus(inv), 3, 20_000_000);
    let started_at = now_rfc3339();
    let size = config.size.clone();
    let result = kiln_bench::train::run(config, Some(peak.rate() * 1e9), |step, total, loss| {
        progress.update(&format!("train {size}: step {step}/{total}, loss {loss:.3}"));
    });
    progress.finish();
    let telemetry = sampler.stop();
    let report = result?;
    let status = if report.learned { status_of(unsettled(&report.step_s)) } else { RunStatus::Failed };
    let (metrics, samples) = train_metrics(&report);
    Ok(Outcome {
        started_at,
        config: serde_json::json!({ "config": report.config, "peak_gflops": peak.rate() }),
        headline: format!(
            "train {}: {:.0} tokens/s, MFU {:.1} %, loss {:.2} -> {:.2}{}",
            report.config.size,
            report.tokens_per_s,
            report.mfu.unwrap_or(0.0) * 100.0,
            report.loss_start,
            report.loss_end,
            if report.learned { "" } else { " DID NOT LEARN" }
        ),
        text: format!("{}status {status}\n", render_train(&report, &peak)),
        report: Report::Train(TrainReport { peak, train: report }),
        status,
        status_reason: None,
        metrics,
        samples,
        telemetry,
    }
    .judge_contention(contention_limit()))
}

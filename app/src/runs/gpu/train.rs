//! `kiln bench gpu train`: the reference training run (the model `kiln bench train` trains on the
//! CPU) on every chosen GPU at once, each GPU its own replica through `kiln-gpu train` — the box
//! at full power as training holds it, one figure per GPU so that a slow one stands out. Each
//! GPU's run must learn (the CPU's learning check: a GPU whose loss does not fall computes
//! wrong), and its model FLOP utilisation is against the datasheet's dense peak for the
//! precision; above that peak (+5 %) the run is `invalid`. `--data-parallel`: the GPUs train one
//! model instead, each on its slice of every step's global batch, the gradients all-reduced through
//! NCCL (one `kiln-gpu train` per GPU as a rank of the job, joined by the id of `kiln-gpu nccl-id`).

use std::sync::atomic::AtomicBool;
use std::time::Duration;

use kiln_db::{Direction, Metric};
use kiln_gpu::request::{NcclIdArgs, NcclJob, RankArgs, Request, TrainArgs};
use kiln_gpu::train::Report as Trained;
use serde::{Deserialize, Serialize};

use super::{
    close, interpret, read_document, render_verdict, run_all, wrong_by, Closing, GpuReport, Prepared, Shown,
    PEAK_MARGIN, TELEMETRY_INTERVAL,
};
use crate::runs::{sampler, samples_of, unsettled, Outcome, Report};
use kiln_inventory::telemetry;
use kiln_inventory::Inventory;
use kiln_text::timefmt::now_rfc3339;
use kiln_text::Progress;

/// What `kiln bench gpu train` runs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TrainConfig {
    pub size: String,
    pub steps: Option<usize>,
    pub batch: Option<usize>,
    pub dtype: String,
    pub gpus: Vec<usize>,
    pub timeout_s: u64,
    /// One model over the GPUs (NCCL) instead of a replica each.
    #[serde(default)]
    pub data_parallel: bool,
}

impl TrainConfig {
    /// `train` (replicas) or `train_dp` (data-parallel): what the metrics are named under.
    fn kind(&self) -> &'static str {
        if self.data_parallel {
            "train_dp"
        } else {
            "train"
        }
    }
}

/// One GPU's run.
#[derive(Debug, Clone, Serialize)]
pub struct TrainResult {
    pub gpu: usize,
    pub run: Option<Trained>,
    pub error: Option<String>,
}

/// `kiln bench gpu train`'s document.
pub type GpuTrainReport = GpuReport<TrainConfig, TrainBody>;

/// What `GpuTrainReport` holds besides the envelope every GPU benchmark shares.
#[derive(Debug, Clone, Serialize)]
pub struct TrainBody {
    pub results: Vec<TrainResult>,
}

/// Trains on every GPU of `config` at once.
pub fn train(inv: &Inventory, prepared: &Prepared, config: TrainConfig, interrupted: &AtomicBool) -> Outcome {
    let started_at = now_rfc3339();
    let sampler = sampler(inv, TELEMETRY_INTERVAL);
    let progress = Progress::new();
    progress.update(&format!("gpu train {}: {} GPU(s) at once", config.size, config.gpus.len()));
    let timeout = Duration::from_secs(config.timeout_s);
    // Data-parallel: the ranks' NCCL id first, from one run of its own, naming a loopback port
    // where rank 0's process will host NCCL's bootstrap (the id outlives the run that made it).
    let id = match config.data_parallel {
        false => Ok(None),
        true => {
            let localhost = std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);
            match kiln_gpu::child::nccl_root(localhost, "127.0.0.1") {
                Err(e) => Err(format!("no free loopback port for NCCL's bootstrap: {e}")),
                Ok(root) => {
                    let asked = Request::NcclId(NcclIdArgs { root: root.clone() }).to_args();
                    let ended = run_all(&prepared.program, &[asked], timeout, interrupted).remove(0);
                    match read_document::<kiln_gpu::collectives::NcclId>(interpret(&ended, timeout), "nccl-id") {
                        (Some(id), _) => Ok(Some(NcclJob { id: id.nccl_id, root })),
                        (None, e) => Err(format!("kiln-gpu nccl-id: {}", e.unwrap_or_default())),
                    }
                }
            }
        }
    };
    let id = match id {
        Ok(id) => id,
        Err(e) => {
            progress.finish();
            let results =
                config.gpus.iter().map(|&gpu| TrainResult { gpu, run: None, error: Some(e.clone()) }).collect();
            return judge(prepared, config, results, sampler.stop(), started_at);
        }
    };
    let args: Vec<Vec<String>> = config
        .gpus
        .iter()
        .enumerate()
        .map(|(rank, &device)| {
            let ranks = config.gpus.len();
            Request::Train(TrainArgs {
                device,
                size: config.size.clone(),
                steps: config.steps,
                batch: config.batch,
                dtype: config.dtype.clone(),
                job: id.as_ref().map(|job| RankArgs::of(job, rank, ranks)).unwrap_or_default(),
            })
            .to_args()
        })
        .collect();
    let mut results = Vec::new();
    for (gpu, ended) in config.gpus.iter().zip(run_all(&prepared.program, &args, timeout, interrupted)) {
        let (run, error) = read_document::<Trained>(interpret(&ended, timeout), "train");
        results.push(TrainResult { gpu: *gpu, run, error });
    }
    progress.finish();
    let telemetry = sampler.stop();
    judge(prepared, config, results, telemetry, started_at)
}

fn judge(
    prepared: &Prepared,
    config: TrainConfig,
    results: Vec<TrainResult>,
    telemetry: Vec<telemetry::Sample>,
    started_at: String,
) -> Outcome {
    let mut failures = Vec::new();
    let mut above = Vec::new();
    let mut unstable = false;
    for r in &results {
        let at = format!("GPU {}", r.gpu);
        if let Some(e) = &r.error {
            failures.push(format!("{at}: {e}"));
        }
        let Some(t) = &r.run else { continue };
        let run = &t.run;
        if !run.learned {
            failures.push(format!(
                "{at}: the model did not learn: loss {:.3} -> {:.3}, above the bar of {:.3} for {} steps (a GPU \
                 that computes wrong, or a broken stack)",
                run.loss_start, run.loss_end, run.loss_bar, run.config.steps
            ));
        }
        if let Some(mfu) = run.mfu.filter(|m| *m > 1.0 + PEAK_MARGIN) {
            above.push(format!(
                "{at}: {:.1} TFLOP/s of model FLOPs, {:.0} % of the datasheet's {} peak of {:.1} TFLOP/s (+{:.0} %)",
                run.achieved_flops / 1e12,
                mfu * 100.0,
                t.precision,
                t.peak_tflops.unwrap_or(f64::NAN),
                PEAK_MARGIN * 100.0
            ));
        }
        for p in t.ceiling.iter().flat_map(|c| &c.products).filter(|p| !p.check.ok) {
            failures.push(format!(
                "{at}: the model's product {} in {} computed wrong: {}",
                p.shape,
                p.dtype,
                wrong_by(&p.check)
            ));
        }
        if let (Some(c), Some(peak)) = (t.ceiling.as_ref().and_then(|c| c.tflops), t.peak_tflops) {
            if c > peak * (1.0 + PEAK_MARGIN) {
                above.push(format!(
                    "{at}: the model's products reached {c:.1} TFLOP/s, above the datasheet's {} peak of {peak:.1} \
                     TFLOP/s (+{:.0} %)",
                    t.precision,
                    PEAK_MARGIN * 100.0
                ));
            }
        }
        unstable |= unsettled(&run.step_s);
    }
    let (metrics, samples) = metrics_of(&config, &results);
    let body = TrainBody { results };
    let closing = Closing { started_at, telemetry, above, failures, unstable, metrics, samples };
    close(prepared, config, body, closing, &SHOWN)
}

/// How `GpuTrainReport` shows itself.
const SHOWN: Shown<TrainConfig, TrainBody> = Shown { headline, render, report: Report::GpuTrain };

/// `gpu<i>.train.<size>.tokens_per_s`, `….mfu`, `….step_p50_s`, `….loss_end` per GPU (each step's
/// time and the loss curve as samples), the GEMM ceiling at the model's products and the MFU
/// against it (`….gemm_ceiling_tflops`, `….mfu_of_gemm`), and `gpus.train.<size>.tokens_per_s`, their sum; under
/// `train_dp` for data-parallel runs, with each rank's `….comm_share`.
fn metrics_of(config: &TrainConfig, results: &[TrainResult]) -> (Vec<Metric>, Vec<(String, i64, f64)>) {
    let mut metrics = Vec::new();
    let mut samples = Vec::new();
    let mut total = None;
    for r in results {
        let Some(t) = &r.run else { continue };
        let run = &t.run;
        let prefix = format!("gpu{}.{}.{}", r.gpu, config.kind(), config.size);
        let m = |name: &str, value: f64, unit: &str, direction| Metric {
            name: format!("{prefix}.{name}"),
            value,
            unit: unit.into(),
            direction,
        };
        metrics.push(m("tokens_per_s", run.tokens_per_s, "tokens/s", Direction::Higher));
        metrics.push(m("step_p50_s", run.step_s.median, "s", Direction::Lower));
        metrics.push(m("loss_end", run.loss_end, "nats", Direction::Lower));
        if let Some(mfu) = run.mfu {
            metrics.push(m("mfu", mfu, "ratio", Direction::Higher));
        }
        if let Some(p) = &run.parallel {
            metrics.push(m("comm_share", p.comm_share, "ratio", Direction::Lower));
        }
        if let Some(c) = &t.ceiling {
            if let Some(tflops) = c.tflops {
                metrics.push(m("gemm_ceiling_tflops", tflops, "TFLOP/s", Direction::Higher));
            }
            if let Some(mfu) = c.mfu {
                metrics.push(m("mfu_of_gemm", mfu, "ratio", Direction::Higher));
            }
        }
        samples.extend(samples_of(&format!("{prefix}.step_s"), &run.step_times_s));
        samples.extend(samples_of(&format!("{prefix}.loss"), &run.loss_curve));
        *total.get_or_insert(0.0) += run.tokens_per_s;
    }
    if let Some(total) = total {
        metrics.push(Metric {
            name: format!("gpus.{}.{}.tokens_per_s", config.kind(), config.size),
            value: total,
            unit: "tokens/s".into(),
            direction: Direction::Higher,
        });
    }
    (metrics, samples)
}

fn headline(r: &GpuTrainReport) -> String {
    let runs: Vec<&Trained> = r.results.iter().filter_map(|x| x.run.as_ref()).collect();
    let tokens: f64 = runs.iter().map(|t| t.run.tokens_per_s).sum();
    let mfu = kiln_bench::stats::summarize(&runs.iter().filter_map(|t| t.run.mfu).collect::<Vec<_>>());
    let comm = runs.iter().filter_map(|t| t.run.parallel.as_ref()).map(|p| p.comm_share).reduce(f64::max);
    format!(
        "gpu train {}{}: {} GPU(s), {:.0} tokens/s in all{}{}{}",
        r.config.size,
        if r.config.data_parallel { " data-parallel" } else { "" },
        runs.len(),
        tokens,
        mfu.map(|s| format!(", MFU {:.1} % (median)", s.median * 100.0)).unwrap_or_default(),
        comm.map(|c| format!(", {:.0} % of a step in the all-reduce", c * 100.0)).unwrap_or_default(),
        if r.failures.is_empty() { String::new() } else { format!("; {} failure(s)", r.failures.len()) }
    )
}

pub fn render(r: &GpuTrainReport) -> String {
    let c = &r.config;
    let how = if c.data_parallel {
        "one model data-parallel over the GPUs, gradients all-reduced through NCCL"
    } else {
        "each GPU its own replica, all at once"
    };
    let mut out = format!("gpu train {}: {how}, products in {}; {}\n", c.size, c.dtype, r.program);
    if let Some(t) = r.results.iter().find_map(|x| x.run.as_ref()) {
        let k = &t.run.config;
        out.push_str(&format!(
            "{} layers, d_model {}, {} heads, seq {}, batch {}, {} steps ({} parameters; {})\n",
            k.layers, k.d_model, k.heads, k.seq, k.batch, k.steps, t.run.parameters, t.run.flops_formula
        ));
    }
    out.push_str(&format!(
        "{:>4} {:>12} {:>10} {:>10} {:>8} {:>20} {:>16}  {}\n",
        "gpu", "tokens/s", "step p50", "step CV", "MFU", "of GEMM (TFLOP/s)", "loss", "learned"
    ));
    for x in &r.results {
        match &x.run {
            Some(t) => {
                let run = &t.run;
                let of_gemm = match t.ceiling.as_ref().map(|c| (c.mfu, c.tflops)) {
                    Some((Some(m), Some(c))) => format!("{:.1}% ({c:.1})", m * 100.0),
                    _ => "-".to_string(),
                };
                out.push_str(&format!(
                    "{:>4} {:>12.0} {:>8.1}ms {:>9.1}% {:>8} {:>20} {:>16}  {}\n",
                    x.gpu,
                    run.tokens_per_s,
                    run.step_s.median * 1e3,
                    run.step_s.cv * 100.0,
                    run.mfu.map_or_else(|| "-".to_string(), |m| format!("{:.1}%", m * 100.0)),
                    of_gemm,
                    format!("{:.3} -> {:.3}", run.loss_start, run.loss_end),
                    if run.learned { "yes" } else { "NO" }
                ));
            }
            None => out.push_str(&format!("{:>4} failed\n", x.gpu)),
        }
    }
    render_verdict(&mut out, &r.failures, r.invalid.as_deref(), r.status, &r.telemetry);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_db::RunStatus;

    /// A real run of the reference model on the CPU through kiln-gpu's library, as GPU `gpu`.
    fn trained(gpu: usize) -> Trained {
        let o = kiln_gpu::train::Options {
            device: gpu,
            size: "tiny".into(),
            steps: Some(20),
            batch: None,
            precision: kiln_gpu::gemm::Precision::Tf32,
            as_rank: None,
        };
        kiln_gpu::train::measure(
            &candle_core::Device::Cpu,
            &o,
            Some("NVIDIA H100 80GB HBM3".into()),
            |_, _, _| {},
            None,
        )
        .unwrap()
    }

    fn judged(results: Vec<TrainResult>) -> Outcome {
        let prepared = Prepared { program: "/opt/kiln-gpu".into(), devices: Vec::new() };
        let config = TrainConfig {
            size: "tiny".into(),
            steps: Some(20),
            batch: None,
            dtype: "tf32".into(),
            gpus: results.iter().map(|r| r.gpu).collect(),
            timeout_s: 60,
            data_parallel: false,
        };
        judge(&prepared, config, results, Vec::new(), "2026-12-05T00:00:00Z".into())
    }

    #[test]
    fn every_gpu_is_judged_on_its_own_run() {
        let good = trained(0);
        assert!(good.run.learned);
        let mut stuck = trained(1);
        stuck.run.learned = false;
        let mut impossible = trained(2);
        impossible.run.mfu = Some(1.3);
        let results = vec![
            TrainResult { gpu: 0, run: Some(good.clone()), error: None },
            TrainResult { gpu: 1, run: Some(stuck), error: None },
            TrainResult { gpu: 3, run: None, error: Some("did not finish within 60 s".into()) },
        ];
        let o = judged(results);
        assert_eq!(o.status, RunStatus::Failed, "{}", o.text);
        assert!(o.text.contains("FAIL GPU 1: the model did not learn"), "{}", o.text);
        assert!(o.text.contains("FAIL GPU 3: did not finish within 60 s"), "{}", o.text);
        assert!(!o.text.contains("FAIL GPU 0"), "{}", o.text);
        let value = |name: &str| o.metrics.iter().find(|m| m.name == name).map(|m| m.value);
        assert!((value("gpu0.train.tiny.tokens_per_s").unwrap() - good.run.tokens_per_s).abs() < 1e-9);
        assert!(value("gpus.train.tiny.tokens_per_s").unwrap() > good.run.tokens_per_s);
        assert_eq!(o.samples.iter().filter(|s| s.0 == "gpu0.train.tiny.loss").count(), 20);
        let ceiling = good.ceiling.as_ref().unwrap();
        assert_eq!(value("gpu0.train.tiny.gemm_ceiling_tflops"), ceiling.tflops);
        assert_eq!(value("gpu0.train.tiny.mfu_of_gemm"), ceiling.mfu);
        assert!(
            o.text.contains(&format!("{:.1}% ({:.1})", ceiling.mfu.unwrap() * 100.0, ceiling.tflops.unwrap())),
            "{}",
            o.text
        );

        let mut wrong = trained(5);
        wrong.ceiling.as_mut().unwrap().products[1].check.ok = false;
        let o = judged(vec![TrainResult { gpu: 5, run: Some(wrong), error: None }]);
        assert_eq!(o.status, RunStatus::Failed, "{}", o.text);
        assert!(o.text.contains("FAIL GPU 5: the model's product"), "{}", o.text);

        // Products measured above the datasheet: the run is invalid, the GPU named.
        let mut fast = trained(4);
        fast.ceiling.as_mut().unwrap().tflops = Some(fast.peak_tflops.unwrap() * 1.2);
        let o = judged(vec![TrainResult { gpu: 4, run: Some(fast), error: None }]);
        assert_eq!(o.status, RunStatus::Invalid, "{}", o.text);
        assert!(o.report.invalid_reason().unwrap().contains("GPU 4: the model's products reached"), "{}", o.text);

        let o = judged(vec![TrainResult { gpu: 2, run: Some(impossible), error: None }]);
        assert_eq!(o.status, RunStatus::Invalid);
        assert!(o.report.invalid_reason().unwrap().contains("GPU 2:"), "{}", o.text);
    }
}

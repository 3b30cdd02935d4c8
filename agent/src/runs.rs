//! Running benchmarks on this host and turning their results into a stored run: the scopes to
//! measure (NUMA nodes from the inventory), progress, telemetry, the software stack, metrics.

use std::io::IsTerminal;
use std::time::Duration;

use kiln_bench::membw;
use kiln_db::{Direction, Metric, NewRun};
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::inventory::cpulist::parse_list;
use crate::inventory::Inventory;
use crate::telemetry::{self, Sampler};
use crate::timefmt::now_rfc3339;

/// A result is unstable, not a number, when its coefficient of variation exceeds this.
pub const MAX_CV: f64 = 0.05;

/// The software a result was measured on, so that results are compared like with like.
#[derive(Debug, Clone, Serialize)]
pub struct Software {
    pub kiln: String,
    pub kernel: Option<String>,
    pub distribution: Option<String>,
    pub nvidia_driver: Option<String>,
    pub cuda_driver: Option<String>,
    /// What `kiln provision status` reports: fabric manager, CUDA, NCCL, cuDNN, the Python
    /// frameworks and the images kiln applied (with their content hashes). `None` when the dpkg
    /// database cannot be read.
    pub stack: Option<kiln_provision::software::Software>,
}

impl Software {
    /// The software of this (live) host; runs are only ever measured live. The package stack is
    /// read once per process (a commission stores several runs on the same stack).
    pub fn of(inv: &Inventory) -> Software {
        static STACK: std::sync::OnceLock<Option<kiln_provision::software::Software>> = std::sync::OnceLock::new();
        let stack = STACK
            .get_or_init(|| {
                kiln_provision::software::read(&kiln_provision::plan::Target::new(std::path::Path::new("/")))
                    .map_err(|e| tracing::warn!("software fingerprint without packages: {e}"))
                    .ok()
            })
            .clone();
        Software {
            kiln: env!("CARGO_PKG_VERSION").to_string(),
            kernel: inv.os.kernel_release.clone(),
            distribution: inv.os.distribution.as_ref().and_then(|d| d.pretty_name.clone()),
            nvidia_driver: inv.gpus.driver_version.clone(),
            cuda_driver: inv.gpus.cuda_driver_version.clone(),
            stack,
        }
    }

    /// (fingerprint, JSON document).
    pub fn fingerprinted(&self) -> (String, String) {
        let doc = serde_json::to_string(self).unwrap_or_default();
        let hash: String = Sha256::digest(doc.as_bytes()).iter().take(8).map(|b| format!("{b:02x}")).collect();
        (hash, doc)
    }
}

/// The NVML library to sample GPUs with during a run: the one the inventory used successfully.
pub fn gpu_telemetry_library(inv: &Inventory) -> Option<std::ffi::OsString> {
    let g = &inv.gpus;
    (g.nvml_error.is_none() && !g.devices.is_empty()).then(|| g.nvml_library.clone().map(Into::into)).flatten()
}

/// Starts telemetry for a run on this host: CPU always, GPUs when NVML works.
pub fn sampler(inv: &Inventory, interval: Duration) -> Sampler {
    Sampler::start_with(interval, gpu_telemetry_library(inv))
}

/// Progress on stderr, only when it is a terminal; overwritten in place.
pub struct Progress {
    enabled: bool,
}

impl Progress {
    pub fn new() -> Progress {
        Progress { enabled: std::io::stderr().is_terminal() }
    }
    pub fn update(&self, text: &str) {
        if self.enabled {
            eprint!("\r\x1b[2Kkiln: {text}");
        }
    }
    pub fn finish(&self) {
        if self.enabled {
            eprint!("\r\x1b[2K");
        }
    }
}

impl Default for Progress {
    fn default() -> Self {
        Self::new()
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct MembwReport {
    pub config: membw::Config,
    pub scopes: Vec<membw::ScopeResult>,
    pub status: String,
    pub telemetry: Vec<String>,
}

/// The CPUs this process may use.
pub fn allowed_cpus(inv: &Inventory) -> Vec<u32> {
    inv.cpu
        .allowed_cpus
        .as_deref()
        .and_then(parse_list)
        .unwrap_or_else(|| parse_list(&inv.cpu.online_cpus).unwrap_or_default())
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
    if let Some(mfu) = r.mfu {
        metrics.push(m("mfu", mfu, "ratio", Direction::Higher));
    }
    let mut samples: Vec<(String, i64, f64)> =
        r.loss_curve.iter().enumerate().map(|(i, v)| (format!("train.{size}.loss"), i as i64, *v)).collect();
    let step = format!("train.{size}.step_s");
    samples.extend(r.step_times_s.iter().enumerate().map(|(i, v)| (step.clone(), i as i64, *v)));
    (metrics, samples)
}

pub fn render_train(r: &kiln_bench::train::Report, peak: &kiln_bench::gemm::PeakResult) -> String {
    let c = &r.config;
    format!(
        "train {}: {} layers, d_model {}, {} heads, seq {}, batch {}, {} steps, seed {} ({} parameters, {} without embeddings)\n\
         tokens/s {:.0}  samples/s {:.1}  step p50 {:.1} ms  p95 {:.1} ms  max {:.1} ms  (CV {:.1} %, first {} steps excluded)\n\
         achieved {:.2} GFLOP/s ({}), {:.1} % of the measured {} peak {:.1} GFLOP/s\n\
         loss {:.3} -> {:.3} (chance {:.3}, corpus entropy {:.3}){}\n\
         peak memory {}\n",
        c.size, c.layers, c.d_model, c.heads, c.seq, c.batch, c.steps, c.seed, r.parameters, r.non_embedding_parameters,
        r.tokens_per_s, r.samples_per_s, r.step_s.median * 1e3, r.step_p95_s * 1e3, r.step_max_s * 1e3, r.step_s.cv * 100.0, r.warmup_steps_excluded,
        r.achieved_flops / 1e9, r.flops_formula, r.mfu.unwrap_or(0.0) * 100.0, peak.isa, peak.summary.median,
        r.loss_start, r.loss_end, r.loss_chance, r.loss_floor, if r.learned { "" } else { "  DID NOT LEARN" },
        r.peak_rss_bytes.map_or("unknown".to_string(), crate::inventory::fingerprint::human_bytes),
    )
}

/// The NUMA nodes with CPUs this process may use, each a scope, plus "all" when there are several.
pub fn membw_scopes(inv: &Inventory) -> Vec<membw::Scope> {
    let allowed = allowed_cpus(inv);
    let mut scopes: Vec<membw::Scope> = inv
        .numa
        .nodes
        .iter()
        .map(|n| membw::Scope {
            name: format!("node{}", n.id),
            cpus: parse_list(&n.cpus).unwrap_or_default().into_iter().filter(|c| allowed.contains(c)).collect(),
        })
        .filter(|s| !s.cpus.is_empty())
        .collect();
    if scopes.len() != 1 {
        scopes.push(membw::Scope { name: "all".to_string(), cpus: allowed });
    } else {
        scopes[0].name = "all".to_string();
    }
    scopes
}

/// STREAM's rule: each array at least four times the last-level caches together; and at least
/// 256 MiB, because a VM sees only its slice of a host cache that may be far larger.
pub fn default_membw_elements(inv: &Inventory) -> usize {
    let llc: u64 = inv.cpu.caches.iter().filter(|c| c.level >= 3).map(|c| c.size_bytes * u64::from(c.instances)).sum();
    let bytes = (4 * llc).max(256 << 20);
    (bytes / 8) as usize
}

pub fn render_membw(report: &MembwReport) -> String {
    let mut out = format!(
        "membw: STREAM kernels, {} MiB per array, {} repetitions after {} warm-up\n{:<8} {:>7}  {:<6} {:>10} {:>18} {:>7} {:>10}\n",
        (report.config.elements * 8) >> 20,
        report.config.repetitions,
        report.config.warmup,
        "scope",
        "threads",
        "kernel",
        "median",
        "95% CI",
        "CV",
        "best"
    );
    for s in &report.scopes {
        for k in &s.kernels {
            out.push_str(&format!(
                "{:<8} {:>7}  {:<6} {:>6.1} GB/s {:>7.1}..{:<8.1} {:>6.1}% {:>5.1} GB/s\n",
                s.scope,
                s.threads,
                k.kernel.name(),
                k.summary.median,
                k.summary.median_ci.0,
                k.summary.median_ci.1,
                k.summary.cv * 100.0,
                k.best_gbps
            ));
        }
    }
    if report.status == "unstable" {
        out.push_str(&format!(
            "unstable: a kernel's coefficient of variation is above {:.0} %; treat the medians with care\n",
            MAX_CV * 100.0
        ));
    }
    for line in &report.telemetry {
        out.push_str(&format!("telemetry {line}\n"));
    }
    out
}

/// What one benchmark produced, ready to print, to emit as JSON and to store.
pub struct Outcome {
    pub benchmark: &'static str,
    pub status: String,
    pub started_at: String,
    /// The exact configuration (stored with the run).
    pub config: serde_json::Value,
    /// The full result document (`report` in `--json`).
    pub report: serde_json::Value,
    pub text: String,
    /// One line for summaries (`kiln commission`).
    pub headline: String,
    pub metrics: Vec<Metric>,
    pub samples: Vec<(String, i64, f64)>,
    pub telemetry: Vec<telemetry::Sample>,
    /// A check inside the benchmark failed (training did not learn): exit 1.
    pub failed_check: bool,
}

impl Outcome {
    pub fn to_run(&self, inv: &Inventory, host_id: String, inventory_id: String) -> NewRun {
        new_run(
            inv,
            host_id,
            inventory_id,
            self.benchmark,
            &self.config,
            self.started_at.clone(),
            &self.status,
            self.metrics.clone(),
            self.samples.clone(),
            self.telemetry.clone(),
        )
    }
}

fn status_of(unstable: bool) -> String {
    if unstable { "unstable" } else { "ok" }.to_string()
}

pub fn membw(inv: &Inventory, config: membw::Config) -> Outcome {
    let started_at = now_rfc3339();
    let progress = Progress::new();
    let sampler = sampler(inv, Duration::from_millis(250));
    let mut scopes = Vec::new();
    for scope in membw_scopes(inv) {
        let name = scope.name.clone();
        let threads = scope.cpus.len();
        scopes.push(membw::measure(&scope, &config, |round, rounds| {
            progress.update(&format!("membw {name} ({threads} threads): round {round}/{rounds}"));
        }));
    }
    progress.finish();
    let telemetry = sampler.stop();
    let mut metrics = Vec::new();
    let mut samples = Vec::new();
    let mut unstable = false;
    for s in &scopes {
        for k in &s.kernels {
            let name = format!("membw.{}.{}_gbps", s.scope, k.kernel.name());
            unstable |= k.summary.cv > MAX_CV;
            metrics.push(Metric {
                name: name.clone(),
                value: k.summary.median,
                unit: "GB/s".into(),
                direction: Direction::Higher,
            });
            samples.extend(k.samples_gbps.iter().enumerate().map(|(i, v)| (name.clone(), i as i64, *v)));
        }
    }
    let report =
        MembwReport { config, scopes, status: status_of(unstable), telemetry: telemetry::summarize(&telemetry) };
    let all = report.scopes.iter().find(|s| s.scope == "all");
    let triad = all.and_then(|s| s.kernels.iter().find(|k| k.kernel == membw::Kernel::Triad));
    Outcome {
        benchmark: "membw",
        status: report.status.clone(),
        started_at,
        config: serde_json::to_value(&report.config).unwrap_or_default(),
        headline: triad.map_or(String::new(), |t| {
            format!("STREAM triad {:.1} GB/s (CV {:.1} %)", t.summary.median, t.summary.cv * 100.0)
        }),
        text: render_membw(&report),
        report: serde_json::to_value(&report).unwrap_or_default(),
        metrics,
        samples,
        telemetry,
        failed_check: false,
    }
}

pub fn gemm(inv: &Inventory, sizes: &[usize], dtypes: &[candle_core::DType], repetitions: usize) -> Outcome {
    let progress = Progress::new();
    progress.update("measuring the FMA peak");
    let cpus = allowed_cpus(inv);
    let peak = kiln_bench::gemm::fma_peak(&cpus, 3, 20_000_000);
    let started_at = now_rfc3339();
    let sampler = sampler(inv, Duration::from_millis(500));
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
    let mut metrics = vec![Metric {
        name: "cpu.fma_peak_gflops".into(),
        value: peak.summary.median,
        unit: "GFLOP/s".into(),
        direction: Direction::Higher,
    }];
    let mut samples: Vec<(String, i64, f64)> =
        peak.gflops.iter().enumerate().map(|(i, v)| ("cpu.fma_peak_gflops".to_string(), i as i64, *v)).collect();
    for r in &results {
        let name = format!("gemm.{}.{}.gflops", r.dtype, r.n);
        metrics.push(Metric {
            name: name.clone(),
            value: r.summary.median,
            unit: "GFLOP/s".into(),
            direction: Direction::Higher,
        });
        samples.extend(r.gflops.iter().enumerate().map(|(i, v)| (name.clone(), i as i64, *v)));
    }
    // The datasheet view: cores × clock × FLOPs per cycle. On a VM the reported clock is often the
    // base clock while the host boosts, so the measured peak is what % of peak uses; the implied
    // clock (measured / (CPUs × FLOPs per cycle)) shows whether the box sustains its boost.
    let cpu = &inv.cpu;
    let fpc = kiln_bench::peaks::cpu_fp32_flops_per_cycle(
        cpu.vendor.as_deref().unwrap_or(""),
        cpu.family,
        cpu.model,
        cpu.part.as_deref(),
        &cpu.ml_features,
    );
    let mhz = cpu.frequency.max_mhz.or(cpu.frequency.current_mhz);
    let theoretical = fpc.zip(mhz).map(|((f, why), mhz)| {
        let gflops = cpus.len() as f64 * f64::from(mhz) / 1000.0 * f64::from(f);
        serde_json::json!({ "gflops": gflops, "flops_per_cycle": f, "basis": why, "clock_mhz": mhz, "cpus": cpus.len(),
            "implied_clock_mhz": peak.summary.median * 1000.0 / (cpus.len() as f64 * f64::from(f)) })
    });
    let mut text = format!(
        "measured FMA peak (f32, {}, {} threads): {:.1} GFLOP/s{}\n{:<6} {:>6} {:>12} {:>8} {:>7}\n",
        peak.isa,
        cpus.len(),
        peak.summary.median,
        theoretical.as_ref().map_or(String::new(), |t| format!(
            "; datasheet {:.1} GFLOP/s at {} MHz x {} FLOP/cycle ({}), implied sustained clock {:.0} MHz",
            t["gflops"].as_f64().unwrap_or(0.0),
            t["clock_mhz"],
            t["flops_per_cycle"],
            t["basis"].as_str().unwrap_or(""),
            t["implied_clock_mhz"].as_f64().unwrap_or(0.0)
        )),
        "dtype",
        "n",
        "GFLOP/s",
        "of peak",
        "CV"
    );
    for r in &results {
        text.push_str(&format!(
            "{:<6} {:>6} {:>12.1} {:>7.1}% {:>6.1}%\n",
            r.dtype,
            r.n,
            r.summary.median,
            r.percent_of_peak.unwrap_or(0.0),
            r.summary.cv * 100.0
        ));
    }
    for s in &skipped {
        text.push_str(&format!("skipped {s}\n"));
    }
    let best = results.iter().filter(|r| r.dtype == "f32").max_by(|a, b| a.n.cmp(&b.n));
    Outcome {
        benchmark: "gemm",
        status: status_of(results.iter().any(|r| r.summary.cv > MAX_CV)),
        started_at,
        config: serde_json::json!({ "sizes": sizes, "dtypes": dtypes.iter().map(|d| format!("{d:?}").to_lowercase()).collect::<Vec<_>>(), "repetitions": repetitions }),
        headline: best.map_or(String::new(), |b| {
            format!(
                "GEMM f32 {}³ {:.1} GFLOP/s, {:.0} % of the {:.1} GFLOP/s FMA peak",
                b.n,
                b.summary.median,
                b.percent_of_peak.unwrap_or(0.0),
                peak.summary.median
            )
        }),
        report: serde_json::json!({ "peak": peak, "theoretical_peak": theoretical, "results": results, "skipped": skipped }),
        text,
        metrics,
        samples,
        telemetry,
        failed_check: false,
    }
}

/// Trains; the MFU is against this machine's measured f32 FMA peak.
///
/// # Errors
/// A candle error.
pub fn train(inv: &Inventory, config: &kiln_bench::train::Config) -> anyhow::Result<Outcome> {
    let progress = Progress::new();
    progress.update("measuring the FMA peak");
    let peak = kiln_bench::gemm::fma_peak(&allowed_cpus(inv), 3, 20_000_000);
    let started_at = now_rfc3339();
    let sampler = sampler(inv, Duration::from_millis(500));
    let size = config.size.clone();
    let result = kiln_bench::train::run(config, Some(peak.summary.median * 1e9), |step, total, loss| {
        progress.update(&format!("train {size}: step {step}/{total}, loss {loss:.3}"));
    });
    progress.finish();
    let telemetry = sampler.stop();
    let report = result?;
    let status = if !report.learned { "failed".to_string() } else { status_of(report.step_s.cv > MAX_CV) };
    let (metrics, samples) = train_metrics(&report);
    Ok(Outcome {
        benchmark: "train",
        started_at,
        config: serde_json::json!({ "config": report.config, "peak_gflops": peak.summary.median }),
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
        failed_check: !report.learned,
        report: serde_json::json!({ "peak": peak, "train": report }),
        status,
        metrics,
        samples,
        telemetry,
    })
}

/// Storage benchmark on a directory or device.
///
/// # Errors
/// As `kiln_bench::disk::measure`.
pub fn disk(
    path: &std::path::Path,
    config: kiln_bench::disk::Config,
    destructive: bool,
    stop: &std::sync::atomic::AtomicBool,
) -> anyhow::Result<Outcome> {
    let started_at = now_rfc3339();
    let progress = Progress::new();
    let sampler = Sampler::start(Duration::from_millis(500));
    let result = kiln_bench::disk::measure(path, &config, destructive, stop, |p| progress.update(&format!("disk {p}")));
    progress.finish();
    let telemetry = sampler.stop();
    let report = result.map_err(|e| anyhow::anyhow!("disk benchmark on {}: {e}", path.display()))?;
    let mut metrics = Vec::new();
    for t in &report.tests {
        let base = format!("disk.{}_{}k_qd{}", t.test, t.block_bytes / 1024, t.queue_depth);
        metrics.push(Metric {
            name: format!("{base}.mb_per_s"),
            value: t.mb_per_s,
            unit: "MB/s".into(),
            direction: Direction::Higher,
        });
        metrics.push(Metric {
            name: format!("{base}.iops"),
            value: t.iops,
            unit: "IOPS".into(),
            direction: Direction::Higher,
        });
        metrics.push(Metric {
            name: format!("{base}.p99_us"),
            value: t.latency_us.p99,
            unit: "us".into(),
            direction: Direction::Lower,
        });
    }
    let mut text = format!(
        "disk {} ({}), {} MiB, {} s per test\n{:<11} {:>6} {:>4} {:>10} {:>10} {:>9} {:>9} {:>9}\n",
        report.target,
        if report.direct { "O_DIRECT" } else { "buffered: the filesystem refuses O_DIRECT" },
        config.size_bytes >> 20,
        config.seconds,
        "test",
        "block",
        "QD",
        "MB/s",
        "IOPS",
        "p50 us",
        "p99 us",
        "max us"
    );
    for t in &report.tests {
        text.push_str(&format!(
            "{:<11} {:>5}K {:>4} {:>10.1} {:>10.0} {:>9.1} {:>9.1} {:>9.1}\n",
            t.test,
            t.block_bytes / 1024,
            t.queue_depth,
            t.mb_per_s,
            t.iops,
            t.latency_us.p50,
            t.latency_us.p99,
            t.latency_us.max
        ));
    }
    let seq = report.tests.iter().find(|t| t.test == "seq_read");
    let rand = report.tests.iter().filter(|t| t.test == "rand_read").max_by(|a, b| a.queue_depth.cmp(&b.queue_depth));
    Ok(Outcome {
        benchmark: "disk",
        status: "ok".to_string(),
        started_at,
        config: serde_json::json!({ "target": path, "config": config, "direct": report.direct }),
        headline: format!(
            "disk {}: sequential read {:.0} MB/s, 4K random read {:.0} IOPS at QD{}",
            report.target,
            seq.map_or(0.0, |t| t.mb_per_s),
            rand.map_or(0.0, |t| t.iops),
            rand.map_or(0, |t| t.queue_depth)
        ),
        text,
        report: serde_json::to_value(&report).unwrap_or_default(),
        metrics,
        samples: Vec::new(),
        telemetry,
        failed_check: false,
    })
}

/// TCP throughput and latency against a serving kiln.
///
/// # Errors
/// The server cannot be reached, or a connection breaks.
pub fn net(server: &str, config: kiln_bench::net::Config) -> anyhow::Result<Outcome> {
    let started_at = now_rfc3339();
    let progress = Progress::new();
    let sampler = Sampler::start(Duration::from_millis(500));
    let result = kiln_bench::net::measure(server, &config, |p| progress.update(&format!("net {p}")));
    progress.finish();
    let telemetry = sampler.stop();
    let report = result.map_err(|e| {
        anyhow::anyhow!("network benchmark against {server} (is `kiln bench net --serve` running there?): {e}")
    })?;
    let unstable = report.throughput.cv > MAX_CV;
    let t = &report.throughput;
    let metric =
        |name: &str, value, unit: &str, direction| Metric { name: name.into(), value, unit: unit.into(), direction };
    Ok(Outcome {
        benchmark: "net",
        status: status_of(unstable),
        started_at,
        config: serde_json::json!({ "server": report.server, "config": config }),
        headline: format!("net to {}: {:.2} Gb/s, round trip p50 {:.1} us", report.server, t.median, report.rtt_us.median),
        text: format!(
            "net to {}: {} streams, {} x {} s\nthroughput {:.2} Gb/s (95% CI {:.2}..{:.2}, CV {:.1} %){}\nround trip (64 B) p50 {:.1} us, p99 {:.1} us\n",
            report.server,
            config.streams,
            config.repetitions,
            config.seconds_per_repetition,
            t.median,
            t.median_ci.0,
            t.median_ci.1,
            t.cv * 100.0,
            if unstable { ", unstable" } else { "" },
            report.rtt_us.median,
            report.rtt_p99_us
        ),
        metrics: vec![
            metric("net.tcp_throughput_gbps", t.median, "Gb/s", Direction::Higher),
            metric("net.tcp_rtt_p50_us", report.rtt_us.median, "us", Direction::Lower),
            metric("net.tcp_rtt_p99_us", report.rtt_p99_us, "us", Direction::Lower),
        ],
        samples: report.throughput_gbps.iter().enumerate().map(|(i, v)| ("net.tcp_throughput_gbps".to_string(), i as i64, *v)).collect(),
        report: serde_json::to_value(&report).unwrap_or_default(),
        telemetry,
        failed_check: false,
    })
}

/// Assembles the stored run.
#[allow(clippy::too_many_arguments)]
pub fn new_run(
    inv: &Inventory,
    host_id: String,
    inventory_id: String,
    benchmark: &str,
    config: &impl Serialize,
    started_at: String,
    status: &str,
    metrics: Vec<Metric>,
    samples: Vec<(String, i64, f64)>,
    telemetry: Vec<telemetry::Sample>,
) -> NewRun {
    NewRun {
        host_id,
        inventory_id: Some(inventory_id),
        software: Some(Software::of(inv).fingerprinted()),
        benchmark: benchmark.to_string(),
        config: serde_json::to_string(config).unwrap_or_default(),
        started_at,
        finished_at: now_rfc3339(),
        status: status.to_string(),
        metrics,
        samples,
        telemetry,
    }
}

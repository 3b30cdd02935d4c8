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
}

impl Software {
    pub fn of(inv: &Inventory) -> Software {
        Software {
            kiln: env!("CARGO_PKG_VERSION").to_string(),
            kernel: inv.os.kernel_release.clone(),
            distribution: inv.os.distribution.as_ref().and_then(|d| d.pretty_name.clone()),
            nvidia_driver: inv.gpus.driver_version.clone(),
            cuda_driver: inv.gpus.cuda_driver_version.clone(),
        }
    }

    /// (fingerprint, JSON document).
    pub fn fingerprinted(&self) -> (String, String) {
        let doc = serde_json::to_string(self).unwrap_or_default();
        let hash: String = Sha256::digest(doc.as_bytes()).iter().take(8).map(|b| format!("{b:02x}")).collect();
        (hash, doc)
    }
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
    let m = |name: &str, value: f64, unit: &str, direction| Metric { name: format!("train.{size}.{name}"), value, unit: unit.into(), direction };
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

/// STREAM's rule: each array at least four times the last-level caches together, and 64 MiB.
pub fn default_membw_elements(inv: &Inventory) -> usize {
    let llc: u64 = inv.cpu.caches.iter().filter(|c| c.level >= 3).map(|c| c.size_bytes * u64::from(c.instances)).sum();
    let bytes = (4 * llc).max(64 << 20);
    (bytes / 8) as usize
}

pub fn run_membw(inv: &Inventory, config: membw::Config) -> (MembwReport, Vec<Metric>, Vec<(String, i64, f64)>, Vec<telemetry::Sample>) {
    let progress = Progress::new();
    let sampler = Sampler::start(Duration::from_millis(250));
    let mut scopes = Vec::new();
    for scope in membw_scopes(inv) {
        let name = scope.name.clone();
        let threads = scope.cpus.len();
        scopes.push(membw::measure(&scope, &config, |round, rounds| {
            progress.update(&format!("membw {name} ({threads} threads): round {round}/{rounds}"));
        }));
    }
    progress.finish();
    let samples_telemetry = sampler.stop();
    let mut metrics = Vec::new();
    let mut samples = Vec::new();
    let mut unstable = false;
    for s in &scopes {
        for k in &s.kernels {
            let name = format!("membw.{}.{}_gbps", s.scope, k.kernel.name());
            unstable |= k.summary.cv > MAX_CV;
            metrics.push(Metric { name: name.clone(), value: k.summary.median, unit: "GB/s".into(), direction: Direction::Higher });
            samples.extend(k.samples_gbps.iter().enumerate().map(|(i, v)| (name.clone(), i as i64, *v)));
        }
    }
    let report = MembwReport {
        config,
        scopes,
        status: if unstable { "unstable" } else { "ok" }.to_string(),
        telemetry: telemetry::summarize(&samples_telemetry),
    };
    (report, metrics, samples, samples_telemetry)
}

pub fn render_membw(report: &MembwReport) -> String {
    let mut out = format!(
        "membw: STREAM kernels, {} MiB per array, {} repetitions after {} warm-up\n{:<8} {:>7}  {:<6} {:>10} {:>18} {:>7} {:>10}\n",
        report.config.elements * 8 >> 20,
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
        out.push_str(&format!("unstable: a kernel's coefficient of variation is above {:.0} %; treat the medians with care\n", MAX_CV * 100.0));
    }
    for line in &report.telemetry {
        out.push_str(&format!("telemetry {line}\n"));
    }
    out
}

/// Assembles the stored run.
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

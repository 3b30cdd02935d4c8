//! Running benchmarks on this host and turning their results into a stored run: one adapter per
//! benchmark (`membw`, `gemm`, `train`, `disk`, `net`, and `gpu`, which runs `kiln-gpu`), each returning a typed [`Outcome`] — the
//! report document, its text, the headline, metrics, raw samples and telemetry — that the command
//! line serialises at the edge and the store keeps.

mod counters;
mod data;
mod disk;
mod gemm;
pub mod gpu;
mod harness;
mod membw;
mod net;
mod sdc;
mod train;

use std::time::Duration;

use kiln_db::{Metric, NewRun, RunStatus};
use serde::Serialize;
use sha2::{Digest, Sha256};

pub use counters::{counters_after, CountersReport};
pub use data::data;
pub use disk::disk;
pub use gemm::{gemm, GemmReport, Libraries, TheoreticalPeak};
pub use harness::{harness_fault, HarnessReport};
pub use membw::{default_membw_elements, membw, membw_scopes, render_membw, MembwReport};
pub use net::net;
pub use sdc::{injected_fault, sdc};
pub use train::{render_train, train, train_metrics, TrainReport};

use kiln_inventory::cpulist::parse_list;
use kiln_inventory::telemetry::{self, Sampler};
use kiln_inventory::Inventory;
use kiln_text::timefmt::now_rfc3339;

/// Whether a summary's median is not known well enough to be a result (its 95 % interval reaches
/// further than `kiln_bench::stats::MAX_MEDIAN_UNCERTAINTY` from it): what makes a run `unstable`.
pub fn unsettled(summary: &kiln_bench::stats::Summary) -> bool {
    !summary.settled()
}

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

/// The CPUs this process may use.
pub fn allowed_cpus(inv: &Inventory) -> Vec<u32> {
    inv.cpu
        .allowed_cpus
        .as_deref()
        .and_then(parse_list)
        .unwrap_or_else(|| parse_list(&inv.cpu.online_cpus).unwrap_or_default())
}

/// A benchmark's full result document (`report` in `--json`), one type per benchmark.
// One report per benchmark run, built once and moved a few times: boxing the big variants would
// buy nothing measurable.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum Report {
    Membw(MembwReport),
    Gemm(GemmReport),
    Train(TrainReport),
    Disk(kiln_bench::disk::Report),
    Data(kiln_bench::data::Report),
    Net(kiln_bench::net::Report),
    Sdc(kiln_bench::sdc::Report),
    Counters(CountersReport),
    Harness(HarnessReport),
    Fabric(Box<kiln_cluster::FabricReport>),
    Collectives(Box<kiln_cluster::CollectivesReport>),
    Scaling(Box<kiln_cluster::TrainScalingReport>),
    GpuGemm(Box<gpu::GpuGemmReport>),
    GpuMemory(Box<gpu::GpuMemoryReport>),
    GpuBurn(Box<gpu::GpuBurnReport>),
    GpuP2p(Box<gpu::GpuP2pReport>),
    GpuCollectives(Box<gpu::GpuCollectivesReport>),
    GpuTrain(Box<gpu::GpuTrainReport>),
}

impl Report {
    /// The benchmark's name, as stored with the run.
    /// Why the run is `invalid`, when it is.
    pub fn invalid_reason(&self) -> Option<String> {
        match self {
            Report::Membw(m) => m.invalid.clone(),
            Report::Gemm(g) => g.invalid.clone(),
            Report::GpuGemm(g) => g.invalid.clone(),
            Report::GpuMemory(g) => g.invalid.clone(),
            Report::GpuBurn(g) => g.invalid.clone(),
            Report::GpuP2p(g) => g.invalid.clone(),
            Report::GpuCollectives(g) => g.invalid.clone(),
            Report::GpuTrain(g) => g.invalid.clone(),
            Report::Fabric(f) => {
                let why: Vec<String> = f.rails.iter().filter_map(|r| r.invalid.clone()).collect();
                (!why.is_empty()).then(|| why.join("; "))
            }
            _ => None,
        }
    }

    pub fn benchmark(&self) -> &'static str {
        match self {
            Report::Membw(_) => "membw",
            Report::Gemm(_) => "gemm",
            Report::Train(_) => "train",
            Report::Disk(_) => "disk",
            Report::Data(_) => "data",
            Report::Net(_) => "net",
            Report::Sdc(_) => "sdc",
            Report::Counters(_) => "counters",
            Report::Harness(_) => "harness",
            Report::Fabric(_) => "fabric",
            Report::Collectives(_) => "collectives",
            Report::Scaling(_) => "scaling",
            Report::GpuGemm(_) => "gpu-gemm",
            Report::GpuMemory(_) => "gpu-memory",
            Report::GpuBurn(_) => "gpu-burn",
            Report::GpuP2p(_) => "gpu-p2p",
            Report::GpuCollectives(_) => "gpu-collectives",
            Report::GpuTrain(_) => "gpu-train",
        }
    }
}

/// What one benchmark produced, ready to print, to emit as JSON and to store.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub status: RunStatus,
    /// Why the status is what it is, where the report does not say (a `disturbed` run's shares).
    pub status_reason: Option<String>,
    pub started_at: String,
    /// The exact configuration (stored with the run).
    pub config: serde_json::Value,
    pub report: Report,
    pub text: String,
    /// One line for summaries (`kiln commission`).
    pub headline: String,
    pub metrics: Vec<Metric>,
    pub samples: Vec<(String, i64, f64)>,
    pub telemetry: Vec<telemetry::Sample>,
}

impl Outcome {
    pub fn benchmark(&self) -> &'static str {
        self.report.benchmark()
    }

    /// A check inside the benchmark failed (training did not learn, a figure above its physical
    /// ceiling): exit 1.
    pub fn failed_check(&self) -> bool {
        // A harness fault is kiln's own, not a check of the hardware: the verdict says so.
        matches!(self.status, RunStatus::Failed | RunStatus::Invalid) && !matches!(self.report, Report::Harness(_))
    }

    /// The run the store keeps.
    pub fn to_run(&self, inv: &Inventory, host_id: String, inventory_id: String) -> NewRun {
        // A metric a spec cannot name is a metric no verdict can judge: every stored name is one
        // `kiln_sku::spec::metrics::STORED` knows (checked in debug builds, so in every test).
        for m in &self.metrics {
            debug_assert!(
                kiln_sku::spec::metrics::is_stored(&m.name),
                "{} stores metric {}, which kiln_sku::spec::metrics::STORED does not know",
                self.benchmark(),
                m.name
            );
        }
        NewRun {
            host_id,
            inventory_id: Some(inventory_id),
            software: Some(Software::of(inv).fingerprinted()),
            benchmark: self.benchmark().to_string(),
            config: serde_json::to_string(&self.config).unwrap_or_default(),
            started_at: self.started_at.clone(),
            finished_at: now_rfc3339(),
            status: self.status,
            status_reason: self.report.invalid_reason().or_else(|| self.status_reason.clone()),
            metrics: self.metrics.clone(),
            samples: self.samples.clone(),
            telemetry: self.telemetry.clone(),
        }
    }
}

/// The most of the machine's CPU time, in percent, that other processes (or the hypervisor, as
/// steal time) may take while a CPU benchmark measures before its run is `disturbed`:
/// `KILN_MAX_CONTENTION`, else 10. System daemons take 1–2 % of a quiet machine.
pub fn contention_limit() -> f64 {
    std::env::var("KILN_MAX_CONTENTION").ok().and_then(|v| v.trim().parse::<f64>().ok()).unwrap_or(10.0)
}

impl Outcome {
    /// A result measured while others used the CPUs is `disturbed`, with the figures: kept and
    /// shown, never a result (no peak, comparison or verdict reads it). Runs that are not results
    /// anyway keep their status.
    pub fn judge_contention(mut self, limit: f64) -> Outcome {
        if !self.status.is_result() {
            return self;
        }
        let figure = |name: &str| {
            self.telemetry.iter().rev().find(|(_, source, n, _)| source == "cpu" && n == name).map(|s| s.3)
        };
        let (Some(others), Some(steal)) = (figure(telemetry::OTHERS_PERCENT), figure(telemetry::STEAL_PERCENT)) else {
            return self;
        };
        if others + steal > limit {
            self.status = RunStatus::Disturbed;
            let reason = format!(
                "other processes took {others:.0} % of the machine's CPU time while it measured and the \
                 hypervisor {steal:.0} % (limit {limit:.0} %, KILN_MAX_CONTENTION): not a result; run it \
                 on a quiet machine"
            );
            self.text.push_str(&format!("status disturbed: {reason}\n"));
            self.status_reason = Some(reason);
        }
        self
    }
}

/// `ok`, or `unstable` when a median is not known ([`unsettled`]).
fn status_of(unstable: bool) -> RunStatus {
    if unstable {
        RunStatus::Unstable
    } else {
        RunStatus::Ok
    }
}

/// `(metric, repetition, value)` for each raw sample of one metric.
fn samples_of<'a>(name: &str, values: &'a [f64]) -> impl Iterator<Item = (String, i64, f64)> + 'a {
    let name = name.to_string();
    values.iter().enumerate().map(move |(i, v)| (name.clone(), i as i64, *v))
}

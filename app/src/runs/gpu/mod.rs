//! The GPU benchmarks, measured by `kiln-gpu` (the `gpu/` crate; kiln itself never links CUDA, so
//! that it starts on a box where the NVIDIA driver is not installed yet): finding that program,
//! asking it which devices CUDA sees, running it on each GPU alone and on every GPU at once under a
//! deadline, reading its documents back as `kiln_gpu`'s types; `gemm`, `memory`, `burn`, `p2p`, `collectives` and `train` judge them. A
//! GPU whose run fails or hangs, or whose result is wrong, fails the run; a figure above its
//! physical ceiling makes it `invalid`. NVML telemetry (clocks, power, temperature, throttle
//! reasons) is sampled at 10 Hz meanwhile, so that a slow GPU says why.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use kiln_db::{Metric, RunStatus};
pub use kiln_gpu::child::{interpret, locate, read_document, run_all, ChildError, Ended};
use kiln_gpu::request::Request;
use kiln_gpu::DeviceInfo;
use kiln_inventory::telemetry;
use serde::Serialize;

use crate::runs::{Outcome, Report};

use kiln_inventory::Inventory;

mod burn;
mod collectives;
mod gemm;
mod memory;
mod p2p;
mod train;

pub use burn::{burn, parse_duration, BurnConfig, GpuBurnReport};
pub use collectives::{collectives, CollectivesConfig, GpuCollectivesReport};
pub use gemm::{gemm, GemmConfig, GpuGemmReport};
pub use memory::{memory, GpuMemoryReport, MemoryConfig};
pub use p2p::{p2p, GpuP2pReport, P2pConfig};
pub use train::{train, GpuTrainReport, TrainConfig};

/// How often GPU telemetry is read while a GPU benchmark runs (the issue asks for ≥ 10 Hz).
pub const TELEMETRY_INTERVAL: Duration = Duration::from_millis(100);

/// A figure may exceed its datasheet peak by this share (boost clocks, rounding of the datasheet)
/// before the run is `invalid`.
pub(super) const PEAK_MARGIN: f64 = 0.05;

/// Why a GPU benchmark cannot run on this box; the benchmark is skipped with this reason.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Skip(pub String);

/// A GPU run's status: `invalid` when a figure broke its ceiling, else `failed` when a GPU failed,
/// else `unstable` or `ok`.
fn judged_status(invalid: &Option<String>, failures: &[String], unstable: bool) -> kiln_db::RunStatus {
    if invalid.is_some() {
        kiln_db::RunStatus::Invalid
    } else if !failures.is_empty() {
        kiln_db::RunStatus::Failed
    } else {
        crate::runs::status_of(unstable)
    }
}

/// Where a checked product went wrong, in words: "C[1][2] is off by 4.000e1 times its allowed
/// error" (the GEMM benchmark, its sweep, and the training run's own products say it alike).
pub(super) fn wrong_by(check: &kiln_gpu::gemm::Check) -> String {
    format!("C[{}][{}] is off by {:.3e} times its allowed error", check.worst_at.0, check.worst_at.1, check.worst_ratio)
}

/// The lines every GPU benchmark's text ends with: each failure, the status (with why it is
/// `invalid`), then the telemetry's summary lines.
pub(super) fn render_verdict(
    out: &mut String,
    failures: &[String],
    invalid: Option<&str>,
    status: kiln_db::RunStatus,
    telemetry: &[String],
) {
    for f in failures {
        out.push_str(&format!("FAIL {f}\n"));
    }
    match invalid {
        Some(why) => out.push_str(&format!("status invalid: {why}\n")),
        None => out.push_str(&format!("status {status}\n")),
    }
    for line in telemetry {
        out.push_str(&format!("  {line}\n"));
    }
}

/// Every GPU benchmark's document: the program and the devices that measured, the options, the
/// benchmark's own findings (`body`, whose fields stand at the top level of the JSON beside
/// these), and how the run was judged. Reading a report reaches through to its body
/// (`report.results`).
#[derive(Debug, Clone, Serialize)]
pub struct GpuReport<C, B> {
    pub program: String,
    /// The devices as CUDA names them.
    pub devices: Vec<DeviceInfo>,
    pub config: C,
    #[serde(flatten)]
    pub body: B,
    /// Every GPU that failed, computed wrong or disagreed, in words.
    pub failures: Vec<String>,
    /// Why the run is `invalid` (a figure above its physical ceiling), when it is.
    pub invalid: Option<String>,
    pub status: RunStatus,
    /// The telemetry's summary lines.
    pub telemetry: Vec<String>,
}

impl<C, B> std::ops::Deref for GpuReport<C, B> {
    type Target = B;

    fn deref(&self) -> &B {
        &self.body
    }
}

/// How one GPU benchmark shows its report: its headline and text, and which [`Report`] it is.
pub(super) struct Shown<C, B> {
    pub headline: fn(&GpuReport<C, B>) -> String,
    pub render: fn(&GpuReport<C, B>) -> String,
    pub report: fn(Box<GpuReport<C, B>>) -> Report,
}

/// What a GPU benchmark found, for the closing every one shares: when it began, the telemetry's
/// samples, each figure above its physical ceiling and each failure in words, whether the
/// repetitions spread too far, and the metrics with their samples.
pub(super) struct Closing {
    pub started_at: String,
    pub telemetry: Vec<telemetry::Sample>,
    pub above: Vec<String>,
    pub failures: Vec<String>,
    pub unstable: bool,
    pub metrics: Vec<Metric>,
    pub samples: Vec<(String, i64, f64)>,
}

/// The closing every GPU benchmark shares: the run judged (`invalid` where a figure broke its
/// ceiling, else `failed` where a GPU failed, else `unstable` or `ok`), its findings in the
/// envelope, and the outcome kiln stores (the telemetry's samples, and the summary lines the
/// document keeps).
pub(super) fn close<C: Serialize, B>(
    prepared: &Prepared,
    config: C,
    body: B,
    closing: Closing,
    shown: &Shown<C, B>,
) -> Outcome {
    let Closing { started_at, telemetry, above, failures, unstable, metrics, samples } = closing;
    let invalid = (!above.is_empty()).then(|| above.join("; "));
    let status = judged_status(&invalid, &failures, unstable);
    let report = GpuReport {
        program: prepared.program.display().to_string(),
        devices: prepared.devices.clone(),
        config,
        body,
        failures,
        invalid,
        status,
        telemetry: telemetry::summarize(&telemetry),
    };
    Outcome {
        status,
        status_reason: None,
        started_at,
        config: serde_json::to_value(&report.config).unwrap_or_default(),
        headline: (shown.headline)(&report),
        text: (shown.render)(&report),
        metrics,
        samples,
        report: (shown.report)(Box::new(report)),
        telemetry,
    }
}

/// kiln-gpu found, and the devices CUDA sees through it.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub program: PathBuf,
    pub devices: Vec<DeviceInfo>,
}

/// Finds `kiln-gpu` and asks it for CUDA's devices: skipped (with the reason) where NVML sees no
/// GPU, the program is missing, or CUDA cannot be used (no driver, a build without CUDA).
pub fn prepare(inv: &Inventory, interrupted: &AtomicBool) -> Result<Prepared, Skip> {
    let g = &inv.gpus;
    if g.devices.is_empty() {
        let why = match (&g.nvml_error, g.pci_gpus.len()) {
            (Some(e), n) if n > 0 => format!("NVML cannot be used ({e}) though {n} NVIDIA GPU(s) are on PCI"),
            (Some(e), _) => format!("no NVIDIA GPU: NVML {e}"),
            (None, _) => "no NVIDIA GPU: NVML sees none".to_string(),
        };
        return Err(Skip(why));
    }
    let program = locate().map_err(|e| Skip(e.to_string()))?;
    let timeout = Duration::from_secs(120);
    let ended = run_all(&program, &[Request::Devices.to_args()], timeout, interrupted).remove(0);
    let doc = interpret(&ended, timeout).map_err(|e| Skip(format!("{}: {e}", program.display())))?;
    let devices: kiln_gpu::Devices = serde_json::from_value(doc)
        .map_err(|e| Skip(format!("{}: `devices` printed a document kiln does not read: {e}", program.display())))?;
    if devices.devices.is_empty() {
        return Err(Skip(format!("{}: CUDA sees no device where NVML sees {}", program.display(), g.devices.len())));
    }
    Ok(Prepared { program, devices: devices.devices })
}

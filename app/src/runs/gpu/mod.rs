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
/// The harness's known answers, before any GPU is judged: on every GPU at once, a small f32
/// product checked against the host's (`kiln-gpu gemm`'s own check) and a 16 MiB copy to, within
/// and back from the device compared byte for byte (`kiln-gpu bandwidth`). Wrong or failing on
/// every GPU — one GPU included, with no sibling to tell the stack from the part — is kiln's stack
/// (cuBLAS, the driver, the libraries), and the reason comes back as an error; wrong on some of
/// them is those GPUs', left to the benchmarks, which check every product and copy too.
///
/// # Errors
/// In words, what went wrong on each GPU, when it went wrong on all.
pub fn known_answers(prepared: &Prepared, gpus: &[usize], interrupted: &AtomicBool) -> Result<(), String> {
    use kiln_gpu::request::{BandwidthArgs, GemmArgs};
    if gpus.is_empty() {
        return Ok(());
    }
    let timeout = Duration::from_secs(120);
    let mut args = Vec::new();
    for &device in gpus {
        let gemm = GemmArgs { device, dtype: "f32".into(), shape: "256".into(), reps: 1, samples: 16 };
        args.push(Request::Gemm(gemm).to_args());
        args.push(Request::Bandwidth(BandwidthArgs { device, mib: 16, reps: 1, cpus: None }).to_args());
    }
    let ended = run_all(&prepared.program, &args, timeout, interrupted);
    if interrupted.load(std::sync::atomic::Ordering::Relaxed) {
        return Ok(());
    }
    let mut wrong = Vec::new();
    for (&device, pair) in gpus.iter().zip(ended.chunks(2)) {
        let (gemm, error) = read_document::<kiln_gpu::gemm::Report>(interpret(&pair[0], timeout), "gemm");
        let gemm = match (gemm, error) {
            (Some(r), _) if r.check.ok => None,
            (Some(r), _) => Some(format!("the 256³ f32 product is wrong ({})", wrong_by(&r.check))),
            (None, e) => Some(format!("the 256³ f32 product failed: {}", e.unwrap_or_default())),
        };
        let (copy, error) = read_document::<kiln_gpu::bandwidth::Report>(interpret(&pair[1], timeout), "bandwidth");
        let copy = match (copy, error) {
            (Some(r), _) if [&r.device_copy, &r.host_to_device, &r.device_to_host].iter().all(|c| c.intact) => None,
            (Some(_), _) => Some("a 16 MiB copy came back different".to_string()),
            (None, e) => Some(format!("the 16 MiB copies failed: {}", e.unwrap_or_default())),
        };
        let faults: Vec<String> = gemm.into_iter().chain(copy).collect();
        if faults.is_empty() {
            return Ok(());
        }
        wrong.push(format!("GPU {device}: {}", faults.join("; ")));
    }
    Err(format!(
        "the known answers are wrong on every GPU, which is kiln's stack rather than {} GPU(s) at once: {}",
        gpus.len(),
        wrong.join("; ")
    ))
}

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

#[cfg(test)]
mod tests {
    use super::*;

    /// A real `kiln-gpu gemm` document of a small bf16 product on the CPU; `wrong` spoils C's check.
    fn gemm_doc(device: usize, wrong: bool) -> String {
        let options = kiln_gpu::gemm::Options {
            device,
            dtype: kiln_gpu::gemm::Precision::Bf16,
            shape: kiln_gpu::gemm::Shape::square(32),
            reps: 1,
            samples: 4,
        };
        let mut r = kiln_gpu::gemm::measure(&candle_core::Device::Cpu, &options, None).unwrap();
        if wrong {
            (r.check.ok, r.check.worst_ratio, r.check.worst_at) = (false, 40.0, (1, 2));
        }
        let mut v = serde_json::to_value(r).unwrap();
        v["schema_version"] = 1.into();
        v.to_string()
    }

    fn bandwidth_doc(device: usize) -> String {
        let copies = || kiln_gpu::bandwidth::Copies::new(16.0 * 1048576.0, vec![1e-3], true);
        let r = kiln_gpu::bandwidth::Report {
            device,
            name: None,
            bytes: 16 << 20,
            cpus: None,
            device_copy: copies(),
            triad: None,
            triad_error: None,
            host_to_device: copies(),
            device_to_host: copies(),
        };
        let mut v = serde_json::to_value(r).unwrap();
        v["schema_version"] = 1.into();
        v.to_string()
    }

    /// A stand-in for kiln-gpu that prints `<request>-<device>.json` from its directory.
    fn stand_in(dir: &std::path::Path) -> Prepared {
        let script = dir.join("kiln-gpu");
        std::fs::write(
            &script,
            "#!/bin/sh\ndir=$(dirname \"$0\")\ncommand=$1\ndev=0\n\
             while [ $# -gt 0 ]; do if [ \"$1\" = --device ]; then dev=$2; fi; shift; done\n\
             cat \"$dir/$command-$dev.json\"\n",
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        Prepared { program: script, devices: Vec::new() }
    }

    /// Wrong on every GPU is the stack's fault, named GPU by GPU; wrong on one of two is that
    /// GPU's, for the benchmarks to judge; right everywhere passes.
    #[test]
    fn known_answers_wrong_everywhere_are_the_harness() {
        let dir = tempfile::tempdir().unwrap();
        let prepared = stand_in(dir.path());
        let write = |name: &str, text: String| std::fs::write(dir.path().join(name), text).unwrap();
        let quiet = AtomicBool::new(false);
        for d in 0..2 {
            write(&format!("gemm-{d}.json"), gemm_doc(d, false));
            write(&format!("bandwidth-{d}.json"), bandwidth_doc(d));
        }
        assert_eq!(known_answers(&prepared, &[0, 1], &quiet), Ok(()));
        write("gemm-1.json", gemm_doc(1, true));
        assert_eq!(known_answers(&prepared, &[0, 1], &quiet), Ok(()), "one wrong GPU is the GPU's");
        write("gemm-0.json", gemm_doc(0, true));
        std::fs::remove_file(dir.path().join("bandwidth-1.json")).unwrap();
        let why = known_answers(&prepared, &[0, 1], &quiet).unwrap_err();
        assert!(why.starts_with("the known answers are wrong on every GPU, which is kiln's stack rather than 2 GPU(s) at once: GPU 0: the 256³ f32 product is wrong (C[1][2] is off by 4.000e1 times its allowed error); GPU 1: the 256³ f32 product is wrong"), "{why}");
        assert!(why.contains("GPU 1: the 256³ f32 product is wrong (C[1][2] is off by 4.000e1 times its allowed error); the 16 MiB copies failed"), "{why}");
    }
}

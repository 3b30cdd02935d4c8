//! Faults of kiln's own stack, not of the hardware: where NVML sees GPUs but kiln-gpu cannot
//! measure them (not installed, built without CUDA, its libraries do not load, CUDA sees no
//! device). Stored as a run named `harness` (status `failed`, the reason with it), so that the
//! verdict — now and when re-judged — is INCONCLUSIVE with "harness: …" rather than an ACCEPT
//! without GPU benchmarks, and never a REJECT of healthy hardware for kiln's own fault.

use kiln_db::{Direction, Metric, RunStatus};
use kiln_text::timefmt::now_rfc3339;
use serde::Serialize;

use super::{Outcome, Report};

/// What failed in kiln's own stack.
#[derive(Debug, Clone, Serialize)]
pub struct HarnessReport {
    /// The part of kiln's stack that failed ("kiln-gpu").
    pub component: String,
    pub reason: String,
}

/// The run that records a harness fault of `component`.
pub fn harness_fault(component: &str, reason: &str) -> Outcome {
    let reason = format!("{component}: {reason}");
    Outcome {
        status: RunStatus::Failed,
        status_reason: Some(reason.clone()),
        started_at: now_rfc3339(),
        config: serde_json::json!({ "component": component }),
        text: format!("harness fault (kiln's own stack, not the hardware): {reason}\n"),
        headline: format!("harness: {reason}"),
        metrics: vec![Metric {
            name: "harness.faults".into(),
            value: 1.0,
            unit: "faults".into(),
            direction: Direction::Lower,
        }],
        samples: Vec::new(),
        report: Report::Harness(HarnessReport { component: component.to_string(), reason }),
        telemetry: Vec::new(),
    }
}

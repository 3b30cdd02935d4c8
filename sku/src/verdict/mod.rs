//! The commissioning verdict: a SKU spec and the evidence of one box (its stored inventory, the
//! benchmark runs taken with it, and what the fleet says about its configuration) in, one
//! ACCEPT / REJECT / INCONCLUSIVE out, with every check that led there.
//!
//! `judge` is a pure function of its inputs — no clock, no randomness, no I/O — so the same
//! evidence and spec give the same verdict byte for byte, and a stored inventory can be re-judged
//! against a tightened spec without touching the box (`kiln verdict --inventory ID`).

pub mod counters;
pub mod drift;
pub mod hardware;
pub mod health;
pub mod heat;
pub mod ocp;
pub mod perf;
pub mod remedy;
pub mod siblings;
pub mod storage;

use std::collections::BTreeMap;
use std::fmt::Write as _;

use kiln_db::RunStatus;
use serde::{Deserialize, Serialize};

use crate::spec::LoadedSpec;
use kiln_inventory::Inventory;

/// The status of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Fail,
    Skip,
    Warn,
    Pass,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Fail => "fail",
            Status::Skip => "skip",
            Status::Warn => "warn",
            Status::Pass => "pass",
        }
    }
}

/// How bad a failure of a check is: the order REJECT lists failures in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// The hardware is failing: uncorrectable errors, XIDs, a GPU gone from the bus.
    Critical,
    /// The box is not what was bought: a missing or wrong part, a degraded link.
    Major,
    /// Misconfigured: persistence, power limit, firmware, platform settings.
    Minor,
    /// Slower than it should be.
    Performance,
}

/// One check: what was expected of what, what was measured, and where that came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Check {
    /// Stable across releases: scripts match on it ("gpu.pcie.link", "nvlink.active").
    pub id: String,
    /// What was checked: "GPU 3 0000:1b:00.0", "upstream port 0000:15:01.0", "mlx5_2 port 1".
    pub subject: String,
    pub status: Status,
    pub severity: Severity,
    pub expected: String,
    pub measured: String,
    /// Why it failed, warned or skipped; empty when it passed.
    pub reason: String,
    /// Where the measurement came from: a sysfs file, an NVML call, a benchmark run id.
    pub evidence: String,
    /// What to do about a check that failed or warned, and where that advice comes from
    /// (`remedy::remedy_for`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remedy: Option<remedy::Remedy>,
    /// The published figure the measurement was compared with (`of_reference` floors).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<Referenced>,
}

/// A published reference figure as a check used it: the figure, the measurement's ratio to it,
/// and where it comes from (`spec::references`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Referenced {
    pub value: f64,
    pub unit: String,
    /// measured / reference.
    pub ratio: f64,
    /// The floor as a fraction of the reference.
    pub floor: f64,
    pub kind: String,
    pub conditions: String,
    pub source: String,
}

impl Check {
    /// The columns of a table of checks, and a check as its row.
    pub const COLUMNS: [&'static str; 6] = ["status", "check", "subject", "expected", "measured", "reason"];

    pub fn row(&self) -> Vec<String> {
        vec![
            self.status.as_str().to_uppercase(),
            self.id.clone(),
            self.subject.clone(),
            self.expected.clone(),
            self.measured.clone(),
            self.reason.clone(),
        ]
    }
}

/// The decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Decision {
    Accept,
    Reject,
    Inconclusive,
}

impl Decision {
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Accept => "accept",
            Decision::Reject => "reject",
            Decision::Inconclusive => "inconclusive",
        }
    }
}

/// The spec a verdict was reached with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpecRef {
    pub name: String,
    pub file: String,
    /// SHA-256 of the spec's text.
    pub hash: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    pub pass: usize,
    pub warn: usize,
    pub skip: usize,
    pub fail: usize,
}

/// A verdict with its checks: the `--json` document and what is stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    pub verdict: Decision,
    pub spec: SpecRef,
    pub inventory_id: Option<String>,
    pub hostname: Option<String>,
    /// Whether performance was judged (not with `--no-bench`).
    pub performance_judged: bool,
    /// Skipped checks were allowed (`--allow-skip`).
    pub allow_skip: bool,
    pub counts: Counts,
    /// Faults of kiln's own stack (kiln-gpu not loading, …): the verdict is INCONCLUSIVE for them
    /// unless the hardware failed a check anyway, whatever `allow_skip` says.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub harness: Vec<String>,
    /// Failures first (most severe first), then skips, warnings and passes, each in check order.
    pub checks: Vec<Check>,
}

/// One stored benchmark run, as evidence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunEvidence {
    pub id: String,
    pub benchmark: String,
    pub status: RunStatus,
    /// (name, value, unit).
    pub metrics: Vec<(String, f64, String)>,
    /// PCIe links read while this run loaded their device.
    #[serde(default)]
    pub links: Vec<kiln_inventory::linkwatch::LinkUnderLoad>,
    /// Per GPU (NVML index): (samples, samples held back by heat) during this run.
    #[serde(default)]
    pub thermal: Vec<(u32, u32, u32)>,
    /// Per GPU (NVML index): the hottest its telemetry read during this run, in °C.
    #[serde(default)]
    pub hottest: Vec<(u32, f64)>,
    /// Why the run has its status, where it says (a `harness` run's fault).
    #[serde(default)]
    pub reason: Option<String>,
}

/// Per GPU, the hottest a run's telemetry read (`temperature_c`).
pub fn hottest_of(telemetry: &[kiln_inventory::telemetry::Sample]) -> Vec<(u32, f64)> {
    let mut by: BTreeMap<u32, f64> = BTreeMap::new();
    for (_, source, _, v) in telemetry.iter().filter(|s| s.2 == "temperature_c") {
        let Some(i) = source.strip_prefix("gpu").and_then(|n| n.parse().ok()) else { continue };
        let e = by.entry(i).or_insert(*v);
        *e = e.max(*v);
    }
    by.into_iter().collect()
}

/// Per GPU, how many telemetry samples of a run there were and how many saw thermal throttling.
pub fn thermal_of(telemetry: &[kiln_inventory::telemetry::Sample]) -> Vec<(u32, u32, u32)> {
    let mut by: BTreeMap<u32, (u32, u32)> = BTreeMap::new();
    for (_, source, name, v) in telemetry {
        let Some(i) = source.strip_prefix("gpu").and_then(|n| n.parse().ok()) else { continue };
        if name == "throttled_thermal" {
            let e = by.entry(i).or_default();
            e.0 += 1;
            e.1 += u32::from(*v > 0.5);
        }
    }
    by.into_iter().map(|(i, (n, hot))| (i, n, hot)).collect()
}

/// Everything a verdict is reached from.
pub struct Evidence<'a> {
    pub inventory: &'a Inventory,
    pub inventory_id: Option<&'a str>,
    /// The runs taken with this inventory.
    pub runs: &'a [RunEvidence],
    /// Per metric, the values of accepted boxes of this configuration (for `fleet_p10`).
    pub fleet: &'a BTreeMap<String, Vec<f64>>,
    /// False with `--no-bench`: performance checks are out of scope, not missing.
    pub performance_judged: bool,
    /// The box's own first acceptance, for drift (none for a box never accepted before).
    pub baseline: Option<&'a drift::Baseline>,
}

/// Collects checks.
#[derive(Default)]
pub struct Checks {
    pub list: Vec<Check>,
}

/// What a check measured: a value that passes or not, or nothing (and why).
pub enum Measured {
    Value {
        text: String,
        ok: bool,
    },
    /// Passes, but with a warning.
    Warn {
        text: String,
        why: String,
    },
    Missing {
        why: String,
    },
}

impl Measured {
    pub fn of(text: impl Into<String>, ok: bool) -> Measured {
        Measured::Value { text: text.into(), ok }
    }
    pub fn missing(why: impl Into<String>) -> Measured {
        Measured::Missing { why: why.into() }
    }
}

impl Checks {
    /// Adds a check. `reason` says what a failure means ("trained down"); it is left empty on a
    /// pass.
    // Each argument is a column of the check table: a struct literal at every call would say no more.
    #[allow(clippy::too_many_arguments)]
    pub fn add(
        &mut self,
        id: &str,
        subject: &str,
        severity: Severity,
        expected: impl Into<String>,
        measured: Measured,
        reason: &str,
        evidence: &str,
    ) {
        let (status, measured, reason) = match measured {
            Measured::Value { text, ok: true } => (Status::Pass, text, String::new()),
            Measured::Value { text, ok: false } => (Status::Fail, text, reason.to_string()),
            Measured::Warn { text, why } => (Status::Warn, text, why),
            Measured::Missing { why } => (Status::Skip, String::new(), why),
        };
        self.list.push(Check {
            id: id.to_string(),
            subject: subject.to_string(),
            status,
            severity,
            expected: expected.into(),
            measured,
            reason,
            evidence: evidence.to_string(),
            remedy: None,
            reference: None,
        });
    }
}

/// The GPUs of the box: NVML's count, or the PCI tree's when NVML answered nothing.
pub fn gpu_count(inv: &Inventory) -> u32 {
    if inv.gpus.devices.is_empty() {
        inv.gpus.pci_gpus.len() as u32
    } else {
        inv.gpus.devices.len() as u32
    }
}

/// The GPU model names: NVML's, or the PCI device names.
pub fn gpu_models(inv: &Inventory) -> Vec<String> {
    if inv.gpus.devices.is_empty() {
        inv.gpus
            .pci_gpus
            .iter()
            .map(|a| inv.pci.iter().find(|d| &d.address == a).and_then(|d| d.device_name.clone()).unwrap_or_default())
            .collect()
    } else {
        inv.gpus.devices.iter().map(|g| g.name.clone().unwrap_or_default()).collect()
    }
}

/// Judges `evidence` against `spec`. Pure and deterministic.
pub fn judge(spec: &LoadedSpec, evidence: &Evidence<'_>, allow_skip: bool) -> Verdict {
    let mut checks = Checks::default();
    let harness = harness_faults(evidence, &mut checks);
    hardware::check(&spec.spec, evidence.inventory, &mut checks);
    hardware::links_under_load(&spec.spec, evidence, &mut checks);
    health::thermal(&spec.spec, evidence, &mut checks);
    health::sdc(evidence, &mut checks);
    health::at_rest(evidence.inventory, &mut checks);
    health::check(&spec.spec, evidence.inventory, &mut checks);
    siblings::check(&spec.spec, evidence.inventory, &mut checks);
    counters::check(&spec.spec, evidence, &mut checks);
    heat::check(&spec.spec, evidence, &mut checks);
    if evidence.performance_judged {
        perf::check(&spec.spec, evidence, &mut checks);
        storage::check(&spec.spec, evidence, &mut checks);
    }
    drift::check(evidence.inventory, evidence.baseline, evidence.performance_judged, &mut checks);
    let mut list = checks.list;
    // A harness fault skips what it could not measure, and says what to do about it too.
    for c in list.iter_mut().filter(|c| matches!(c.status, Status::Fail | Status::Warn) || c.id == "harness") {
        c.remedy = remedy::remedy_for(&c.id);
    }
    // A stable sort: failures by severity, then skips, warnings and passes, each in check order.
    list.sort_by_key(|c| (c.status, if c.status == Status::Fail { c.severity } else { Severity::Critical }));
    let mut counts = Counts::default();
    for c in &list {
        match c.status {
            Status::Pass => counts.pass += 1,
            Status::Warn => counts.warn += 1,
            Status::Skip => counts.skip += 1,
            Status::Fail => counts.fail += 1,
        }
    }
    // Under a harness fault, a figure below its floor may be the stack's doing: only a failure of
    // the hardware itself (an error, a missing part, a setting) rejects.
    let rejects =
        list.iter().any(|c| c.status == Status::Fail && (harness.is_empty() || c.severity != Severity::Performance));
    let verdict = if rejects {
        Decision::Reject
    } else if !harness.is_empty() || counts.fail > 0 || counts.skip > 0 && !allow_skip {
        Decision::Inconclusive
    } else {
        Decision::Accept
    };
    Verdict {
        verdict,
        spec: SpecRef { name: spec.spec.name.clone(), file: spec.file.clone(), hash: spec.hash.clone() },
        inventory_id: evidence.inventory_id.map(str::to_string),
        hostname: evidence.inventory.os.hostname.clone(),
        performance_judged: evidence.performance_judged,
        allow_skip,
        counts,
        harness,
        checks: list,
    }
}

/// The faults of kiln's own stack among the runs (failed `harness` runs), each a skipped check
/// `harness` naming it: what cannot be measured is not judged, and not the hardware's fault.
fn harness_faults(evidence: &Evidence<'_>, c: &mut Checks) -> Vec<String> {
    let mut faults = Vec::new();
    for run in evidence.runs.iter().filter(|r| r.benchmark == "harness" && r.status == RunStatus::Failed) {
        let why = run.reason.clone().unwrap_or_else(|| "kiln's own stack failed".into());
        c.add(
            "harness",
            "kiln's own stack",
            Severity::Major,
            "kiln's stack: the software the images pin, kiln-gpu loading and seeing every GPU, the known answers right",
            Measured::missing(format!("harness: {why}")),
            "",
            &format!("run {}", run.id),
        );
        faults.push(why);
    }
    faults
}

impl Verdict {
    /// Measured against the published references: per check, its weakest subject, the ratio,
    /// and the reference with its source.
    pub fn render_references(&self) -> String {
        let mut worst: Vec<(&str, &Check, &Referenced)> = Vec::new();
        for c in &self.checks {
            let Some(r) = &c.reference else { continue };
            match worst.iter_mut().find(|(id, ..)| *id == c.id) {
                Some(w) if r.ratio < w.2.ratio => *w = (&c.id, c, r),
                Some(_) => {}
                None => worst.push((&c.id, c, r)),
            }
        }
        if worst.is_empty() {
            return String::new();
        }
        let mut out = String::from("Against published references (the weakest of each):\n");
        for (id, c, r) in worst {
            let _ = writeln!(
                out,
                "- {id}: {} {} = {:.2} × {} {} ({}; floor {:.2}; {}) [{}]",
                c.subject,
                c.measured.split(" = ").next().unwrap_or(&c.measured),
                r.ratio,
                kiln_text::num(r.value),
                r.unit,
                r.kind,
                r.floor,
                r.conditions,
                r.source
            );
        }
        out
    }

    /// The human summary: failing (and skipped) checks as a table, then one verdict line.
    pub fn render(&self, verbose: bool) -> String {
        let mut out = String::new();
        let shown: Vec<&Check> = self
            .checks
            .iter()
            .filter(|c| verbose || matches!(c.status, Status::Fail | Status::Skip | Status::Warn))
            .collect();
        if !shown.is_empty() {
            let rows: Vec<Vec<String>> = shown.iter().map(|c| c.row()).collect();
            let head: Vec<String> = Check::COLUMNS.iter().map(|h| h.to_uppercase()).collect();
            let head: Vec<&str> = head.iter().map(String::as_str).collect();
            out.push_str(&kiln_text::table(&head, &rows));
        }
        // What to do, once per check id, naming the subjects it applies to.
        let mut remedies: Vec<(&str, Vec<&str>, &remedy::Remedy)> = Vec::new();
        for c in shown.iter().filter(|c| matches!(c.status, Status::Fail | Status::Warn) || c.id == "harness") {
            let Some(r) = &c.remedy else { continue };
            match remedies.iter_mut().find(|(id, ..)| *id == c.id) {
                Some(entry) => entry.1.push(&c.subject),
                None => remedies.push((&c.id, vec![&c.subject], r)),
            }
        }
        out.push_str(&self.render_references());
        if !remedies.is_empty() {
            out.push_str("What to do:\n");
            for (id, subjects, r) in remedies {
                let _ = writeln!(out, "- {id} ({}): {} [{}]", subjects.join("; "), r.action, r.source);
            }
        }
        let c = &self.counts;
        let _ = writeln!(
            out,
            "{}: {} against spec {} ({} checks: {} passed, {} failed, {} skipped, {} warnings{}{})",
            self.verdict.as_str().to_uppercase(),
            self.hostname.as_deref().unwrap_or("this box"),
            self.spec.name,
            self.checks.len(),
            c.pass,
            c.fail,
            c.skip,
            c.warn,
            if self.performance_judged { "" } else { "; performance not judged: --no-bench" },
            if self.allow_skip && c.skip > 0 { "; skips allowed" } else { "" },
        );
        for h in &self.harness {
            let _ = writeln!(
                out,
                "harness: {h} — kiln's own stack, not the hardware: what it could not measure, or measured on a broken stack, is not held against the box."
            );
        }
        if self.verdict == Decision::Inconclusive && self.harness.is_empty() {
            out.push_str("Checks the spec requires could not run (see SKIP above); run as root, or pass --allow-skip to accept without them.\n");
        }
        out
    }
}

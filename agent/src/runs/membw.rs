//! The memory-bandwidth adapter: STREAM per NUMA node and over all CPUs this process may use.

use std::time::Duration;

use kiln_bench::membw;
use kiln_db::{Direction, Metric};
use serde::{Deserialize, Serialize};

use super::{allowed_cpus, sampler, samples_of, status_of, Outcome, Report, MAX_CV};
use crate::inventory::cpulist::parse_list;
use crate::inventory::Inventory;
use crate::render::Progress;
use crate::telemetry;
use crate::timefmt::now_rfc3339;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MembwReport {
    pub config: membw::Config,
    pub scopes: Vec<membw::ScopeResult>,
    pub status: kiln_db::RunStatus,
    pub telemetry: Vec<String>,
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
    if report.status == kiln_db::RunStatus::Unstable {
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
            samples.extend(samples_of(&name, &k.samples_gbps));
            metrics.push(Metric { name, value: k.summary.median, unit: "GB/s".into(), direction: Direction::Higher });
        }
    }
    let report =
        MembwReport { config, scopes, status: status_of(unstable), telemetry: telemetry::summarize(&telemetry) };
    let all = report.scopes.iter().find(|s| s.scope == "all");
    let triad = all.and_then(|s| s.kernels.iter().find(|k| k.kernel == membw::Kernel::Triad));
    Outcome {
        status: report.status,
        started_at,
        config: serde_json::to_value(&report.config).unwrap_or_default(),
        headline: triad.map_or(String::new(), |t| {
            format!("STREAM triad {:.1} GB/s (CV {:.1} %)", t.summary.median, t.summary.cv * 100.0)
        }),
        text: render_membw(&report),
        report: Report::Membw(report),
        metrics,
        samples,
        telemetry,
    }
}

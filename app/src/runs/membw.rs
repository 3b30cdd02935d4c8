//! The memory-bandwidth adapter: STREAM per NUMA node and over all CPUs this process may use.

use std::time::Duration;

use kiln_bench::membw;
use kiln_db::{Direction, Metric};
use serde::{Deserialize, Serialize};

use super::{allowed_cpus, contention_limit, sampler, samples_of, status_of, unsettled, Outcome, Report};
use kiln_inventory::cpulist::parse_list;
use kiln_inventory::telemetry;
use kiln_inventory::Inventory;
use kiln_text::timefmt::now_rfc3339;
use kiln_text::Progress;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MembwReport {
    pub config: membw::Config,
    pub scopes: Vec<membw::ScopeResult>,
    pub status: kiln_db::RunStatus,
    /// The most any scope's threads could move (see [`ceiling`]); a sample above it makes the run
    /// `invalid`.
    #[serde(default)]
    pub ceilings: Vec<Ceiling>,
    /// Why the run is `invalid`.
    #[serde(default)]
    pub invalid: Option<String>,
    pub telemetry: Vec<String>,
}

/// A physical ceiling on a scope's memory bandwidth, and what it rests on.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Ceiling {
    pub scope: String,
    pub gbps: f64,
    pub basis: String,
}

/// Bytes a core's load and store units move per cycle at most: two 64-byte loads and one 64-byte
/// store (AVX-512; wider than any x86 or Arm core ships), so no kernel can stream faster from L1.
const CORE_BYTES_PER_CYCLE: f64 = 192.0;
/// The clock assumed when the inventory has none: above any shipping CPU's boost.
const MAX_CLOCK_MHZ: f64 = 6000.0;

/// The most memory bandwidth `threads` threads of this machine can show: each core's L1 bandwidth
/// at its highest clock, and, where SMBIOS tells the DIMMs, the sum of their peak transfer rates
/// × 8 bytes (every DIMM on a channel of its own: never below the truth). A STREAM figure above it
/// was mis-timed, not measured.
pub fn ceiling(inv: &Inventory, scope: &str, threads: usize) -> Ceiling {
    let mhz = inv.cpu.frequency.max_mhz.map_or(MAX_CLOCK_MHZ, f64::from);
    let l1 = threads as f64 * CORE_BYTES_PER_CYCLE * mhz * 1e6 / 1e9;
    let mut basis = format!("{threads} cores × {CORE_BYTES_PER_CYCLE} B/cycle × {mhz:.0} MHz = {l1:.0} GB/s");
    let mut gbps = l1;
    let dimms: Vec<u32> = inv
        .memory
        .dimms
        .iter()
        .flatten()
        .filter(|d| d.populated)
        .filter_map(|d| d.speed_mts.or(d.configured_speed_mts))
        .collect();
    if !dimms.is_empty() {
        let dram = dimms.iter().map(|&mts| f64::from(mts) * 8.0 / 1000.0).sum::<f64>();
        if dram < gbps && scope == "all" {
            gbps = dram;
            basis = format!("{} DIMMs × 8 B × their MT/s = {dram:.0} GB/s", dimms.len());
        }
    }
    Ceiling { scope: scope.to_string(), gbps, basis }
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
    if let Some(why) = &report.invalid {
        out.push_str(&format!("INVALID, not a result: {why}\n"));
    }
    if report.status == kiln_db::RunStatus::Unstable {
        out.push_str(&format!(
            "unstable: a kernel's median is not known to within {:.1} % (its 95 % interval); treat the medians with care\n",
            kiln_bench::stats::MAX_MEDIAN_UNCERTAINTY * 100.0
        ));
    }
    for line in &report.telemetry {
        out.push_str(&format!("telemetry {line}\n"));
    }
    out
}

/// The first sample of any kernel above its scope's ceiling, said for people.
pub fn above_ceiling(scopes: &[membw::ScopeResult], ceilings: &[Ceiling]) -> Option<String> {
    scopes.iter().zip(ceilings).find_map(|(s, c)| {
        s.kernels.iter().find_map(|k| {
            let top = k.samples_gbps.iter().copied().fold(0.0, f64::max);
            (top > c.gbps).then(|| {
                format!(
                    "{} {} measured {top:.1} GB/s, above the physical ceiling of {:.0} GB/s ({}): the timing missed work",
                    s.scope,
                    k.kernel.name(),
                    c.gbps,
                    c.basis
                )
            })
        })
    })
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
            unstable |= unsettled(&k.summary);
            samples.extend(samples_of(&name, &k.samples_gbps));
            metrics.push(Metric { name, value: k.summary.median, unit: "GB/s".into(), direction: Direction::Higher });
        }
    }
    let ceilings: Vec<Ceiling> = scopes.iter().map(|s| ceiling(inv, &s.scope, s.threads)).collect();
    // No figure above its ceiling is a result: the run is stored `invalid`, with the reason.
    let broken = above_ceiling(&scopes, &ceilings);
    let status = if broken.is_some() { kiln_db::RunStatus::Invalid } else { status_of(unstable) };
    let report =
        MembwReport { config, scopes, status, ceilings, invalid: broken, telemetry: telemetry::summarize(&telemetry) };
    let all = report.scopes.iter().find(|s| s.scope == "all");
    let triad = all.and_then(|s| s.kernels.iter().find(|k| k.kernel == membw::Kernel::Triad));
    Outcome {
        status: report.status,
        status_reason: None,
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
    .judge_contention(contention_limit())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A figure above the ceiling (issue 16's 47,193 GB/s on a 2-core VM) is caught and named.
    #[test]
    fn a_figure_above_the_ceiling_is_named() {
        let kernel = |gbps: Vec<f64>| membw::KernelResult {
            kernel: membw::Kernel::Copy,
            summary: kiln_bench::stats::summarize(&gbps).unwrap(),
            best_gbps: gbps.iter().copied().fold(0.0, f64::max),
            samples_gbps: gbps,
        };
        let scopes = vec![membw::ScopeResult {
            scope: "all".into(),
            threads: 2,
            kernels: vec![kernel(vec![30.0, 31.0, 47_193.0])],
        }];
        let ceilings = vec![Ceiling { scope: "all".into(), gbps: 2304.0, basis: "2 cores".into() }];
        let why = above_ceiling(&scopes, &ceilings).unwrap();
        assert!(why.starts_with("all copy measured 47193.0 GB/s, above the physical ceiling of 2304 GB/s"), "{why}");
        let fine =
            vec![membw::ScopeResult { scope: "all".into(), threads: 2, kernels: vec![kernel(vec![30.0, 31.0])] }];
        assert_eq!(above_ceiling(&fine, &ceilings), None);
    }
}

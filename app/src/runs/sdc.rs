//! The silent-data-corruption screen (`kiln bench sdc`, and a short one in the suite): every
//! allowed CPU runs the same deterministic kernels (`kiln_bench::sdc`), compared bit for bit across
//! CPUs and against the known answers. A CPU that computes wrong fails the run (exit 1) and the
//! verdict (`cpu.sdc`), named with the kernel and the first wrong word.

use std::sync::atomic::AtomicBool;
use std::time::Duration;

use kiln_db::{Direction, Metric, RunStatus};

use super::{allowed_cpus, sampler, Outcome, Report};
use kiln_inventory::Inventory;
use kiln_text::timefmt::now_rfc3339;
use kiln_text::Progress;

/// The fault a test build injects: `KILN_SDC_INJECT=CPU:KERNEL` (ignored where debug assertions are
/// off, so a release binary never reports a fault it made itself).
pub fn injected_fault() -> Option<(u32, String)> {
    if !cfg!(debug_assertions) {
        return None;
    }
    let v = std::env::var("KILN_SDC_INJECT").ok()?;
    let (cpu, kernel) = v.split_once(':')?;
    Some((cpu.trim().parse().ok()?, kernel.trim().to_string()))
}

/// Screens every allowed CPU for `seconds`.
pub fn sdc(inv: &Inventory, seconds: f64, stop: &AtomicBool) -> Outcome {
    let started_at = now_rfc3339();
    let cpus = allowed_cpus(inv);
    let progress = Progress::new();
    let sampler = sampler(inv, Duration::from_millis(500));
    let config = kiln_bench::sdc::Config { seconds, inject: injected_fault() };
    let report = kiln_bench::sdc::screen(&cpus, &config, stop, |done| {
        progress.update(&format!("sdc: {done:.0} of {seconds:.0} s on {} CPUs", cpus.len()));
    });
    progress.finish();
    let telemetry = sampler.stop();
    let bad: std::collections::BTreeMap<u32, usize> = report.wrong.iter().fold(Default::default(), |mut m, w| {
        *m.entry(w.cpu).or_default() += 1;
        m
    });
    let metric = |name: String, value: f64, unit: &str, direction| Metric { name, value, unit: unit.into(), direction };
    let mut metrics = vec![
        metric("sdc.cpus".into(), report.cpus.len() as f64, "CPUs", Direction::None),
        metric("sdc.cpus_wrong".into(), bad.len() as f64, "CPUs", Direction::Lower),
        metric("sdc.rounds_compared".into(), report.compared as f64, "rounds", Direction::None),
    ];
    // Each wrong CPU by number, so that a verdict read from the stored run can name it.
    metrics.extend(
        bad.iter().map(|(cpu, n)| metric(format!("sdc.cpu{cpu}.wrong"), *n as f64, "results", Direction::Lower)),
    );
    let fewest = report.rounds.values().copied().min().unwrap_or(0);
    let headline = if bad.is_empty() {
        format!(
            "sdc: {} CPUs agree: {} kernels x {fewest}+ rounds each, {:.0} s",
            report.cpus.len(),
            report.kernels.len(),
            report.seconds
        )
    } else {
        let named: Vec<String> = bad.keys().map(|c| format!("CPU {c}")).collect();
        format!("sdc: {} computed wrong", named.join(", "))
    };
    Outcome {
        status: if bad.is_empty() { RunStatus::Ok } else { RunStatus::Failed },
        status_reason: report
            .wrong
            .first()
            .map(|w| format!("CPU {} {} round {}: {}", w.cpu, w.kernel, w.round, w.what)),
        started_at,
        config: serde_json::json!({ "seconds": seconds, "cpus": report.cpus.len() }),
        text: render(&report),
        headline,
        metrics,
        samples: Vec::new(),
        report: Report::Sdc(report),
        telemetry,
    }
}

/// The screen's report for people: what ran, how fast, and every wrong result.
pub fn render(r: &kiln_bench::sdc::Report) -> String {
    let mut out = format!(
        "silent data corruption screen: {} CPUs for {:.1} s, {} rounds compared across CPUs or against known answers\n",
        r.cpus.len(),
        r.seconds,
        r.compared
    );
    out.push_str(&format!("{:<10} {:>8} {:>14}\n", "kernel", "rounds", "ms per round"));
    for k in &r.kernels {
        out.push_str(&format!("{:<10} {:>8} {:>14.3}\n", k.kernel, k.rounds, k.seconds_per_round * 1e3));
    }
    if !r.unpinned.is_empty() {
        let cpus: Vec<String> = r.unpinned.iter().map(u32::to_string).collect();
        out.push_str(&format!("not pinned (ran wherever the scheduler put them): CPUs {}\n", cpus.join(", ")));
    }
    if r.wrong.is_empty() {
        out.push_str("every CPU computed every result right\n");
    }
    for w in r.wrong.iter().take(20) {
        out.push_str(&format!("WRONG: CPU {} {} round {}: {}\n", w.cpu, w.kernel, w.round, w.what));
    }
    if r.wrong.len() > 20 {
        out.push_str(&format!("… and {} more wrong results\n", r.wrong.len() - 20));
    }
    out
}

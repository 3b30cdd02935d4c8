//! The error counters across the suite: read with the inventory before the first benchmark and
//! again after the last (`kiln_inventory::counters`), stored as a run named `counters` whose
//! metrics are how much each counter grew, so that the verdict judges the errors the suite's own
//! load caused (`fabric.port.errors`, `fabric.port.flaps`, `gpu.pcie.replays`).

use std::collections::BTreeMap;

use kiln_db::{Direction, Metric, RunStatus};
use kiln_inventory::{counters, Inventory};
use serde::Serialize;

use super::{Outcome, Report};

/// The counters before and after, and their growth.
#[derive(Debug, Clone, Serialize)]
pub struct CountersReport {
    pub before: BTreeMap<String, u64>,
    pub after: BTreeMap<String, u64>,
    pub growth: BTreeMap<String, u64>,
}

/// Reads the counters of this (live) host again and compares them with those of `before`, the
/// inventory taken before the suite; `None` when the box has no counters to read.
pub fn counters_after(before: &Inventory, started_at: String, seconds: f64) -> Option<Outcome> {
    let first = counters::of(before);
    if first.is_empty() {
        return None;
    }
    let options = kiln_inventory::Options {
        nvml_library: before.gpus.nvml_library.clone().map(Into::into),
        ..kiln_inventory::Options::default()
    };
    let after = match kiln_inventory::collect_with(std::path::Path::new(&before.root), &options) {
        Ok(inv) => counters::of(&inv),
        Err(e) => {
            eprintln!("kiln: the error counters could not be read again after the suite: {e}");
            return None;
        }
    };
    Some(outcome(first, after, started_at, seconds))
}

/// The run of counters read as `before` and `after`.
pub fn outcome(
    before: BTreeMap<String, u64>,
    after: BTreeMap<String, u64>,
    started_at: String,
    seconds: f64,
) -> Outcome {
    let growth = counters::growth(&before, &after);
    let mut metrics: Vec<Metric> = growth
        .iter()
        .map(|(name, &v)| Metric {
            name: name.clone(),
            value: v as f64,
            unit: if name.ends_with(".pcie_replays") { "replays" } else { "events" }.into(),
            direction: Direction::Lower,
        })
        .collect();
    metrics.push(Metric {
        name: counters::SUITE_SECONDS.into(),
        value: seconds.round(),
        unit: "s".into(),
        direction: Direction::None,
    });
    let grew: Vec<String> = growth.iter().filter(|(_, &v)| v > 0).map(|(k, v)| format!("{k} +{v}")).collect();
    let headline = if grew.is_empty() {
        format!("counters: none of {} error counters grew during the suite", growth.len())
    } else {
        format!("counters: {} of {} grew during the suite: {}", grew.len(), growth.len(), grew.join(", "))
    };
    let mut text = format!("error counters across the suite ({} read before and after)\n", growth.len());
    for (k, v) in &growth {
        text.push_str(&format!("{k:<56} {:>12} -> {:>12}  +{v}\n", before[k], after[k]));
    }
    Outcome {
        status: RunStatus::Ok,
        status_reason: None,
        started_at,
        config: serde_json::json!({ "counters": growth.len(), "seconds": seconds.round() }),
        text,
        headline,
        metrics,
        samples: Vec::new(),
        report: Report::Counters(CountersReport { before, after, growth }),
        telemetry: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_run_holds_the_growth_of_each_counter() {
        let map = |v: &[(&str, u64)]| v.iter().map(|(k, n)| (k.to_string(), *n)).collect::<BTreeMap<_, _>>();
        let before = map(&[("rdma.mlx5_0.port1.symbol_error", 4), ("gpu0.pcie_replays", 0)]);
        let after = map(&[("rdma.mlx5_0.port1.symbol_error", 16), ("gpu0.pcie_replays", 0)]);
        let o = outcome(before, after, "2026-12-07T00:00:00Z".into(), 95.4);
        assert_eq!(o.benchmark(), "counters");
        let m: Vec<(&str, f64, &str)> = o.metrics.iter().map(|m| (m.name.as_str(), m.value, m.unit.as_str())).collect();
        assert_eq!(
            m,
            [
                ("gpu0.pcie_replays", 0.0, "replays"),
                ("rdma.mlx5_0.port1.symbol_error", 12.0, "events"),
                ("counters.seconds", 95.0, "s")
            ]
        );
        assert!(o.headline.contains("1 of 2 grew") && o.headline.contains("symbol_error +12"), "{}", o.headline);
    }
}

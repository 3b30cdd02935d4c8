//! The error counters a run is judged by: read with the inventory before the suite and again
//! after it, so that a verdict judges what the run itself caused rather than what happened since
//! boot (a cable reseated last week, a switch rebooted). Flat, by metric name:
//! `rdma.<device>.port<N>.<counter>` for the InfiniBand/RoCE port counters and
//! `gpu<index>.pcie_replays` for NVML's PCIe replay counter.

use std::collections::BTreeMap;

use crate::Inventory;

/// The metric of a `counters` run that holds how long the suite took between the two reads, in
/// seconds (a replay rate needs its time base).
pub const SUITE_SECONDS: &str = "counters.seconds";

/// The metric name of an RDMA port's counter.
pub fn port_metric(device: &str, port: u32, counter: &str) -> String {
    format!("rdma.{device}.port{port}.{counter}")
}

/// The metric name of a GPU's PCIe replay counter.
pub fn replay_metric(gpu: u32) -> String {
    format!("gpu{gpu}.pcie_replays")
}

/// Every error counter of `inv`, by metric name.
pub fn of(inv: &Inventory) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for d in &inv.rdma {
        for p in &d.ports {
            for (name, v) in &p.counters {
                out.insert(port_metric(&d.name, p.port, name), *v);
            }
        }
    }
    for g in &inv.gpus.devices {
        if let Some(n) = g.pcie_replays {
            out.insert(replay_metric(g.index), n);
        }
    }
    out
}

/// How much each counter grew from `before` to `after`. A counter that went down was cleared
/// (or its driver reloaded) in between: its growth is what it reads now, a lower bound. A counter
/// missing on either side is left out.
pub fn growth(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    after
        .iter()
        .filter_map(|(k, &a)| {
            let b = *before.get(k)?;
            Some((k.clone(), if a >= b { a - b } else { a }))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn growth_is_after_minus_before_and_a_cleared_counter_counts_from_zero() {
        let before: BTreeMap<String, u64> =
            [("a", 5), ("b", 100), ("gone", 1)].into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        let after: BTreeMap<String, u64> =
            [("a", 12), ("b", 3), ("new", 9)].into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        let g = growth(&before, &after);
        assert_eq!(g.get("a"), Some(&7));
        assert_eq!(g.get("b"), Some(&3), "cleared in between");
        assert_eq!(g.get("gone"), None);
        assert_eq!(g.get("new"), None);
    }
}

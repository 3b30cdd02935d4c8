//! The RDMA ports (state, width, partitions) and the error counters read before and after the
//! suite (`kiln_inventory::counters`): a counter that grew during the suite fails, judged against
//! the spec's threshold for it; without a suite run, the counts since boot only warn, since they
//! hold whatever happened before (a cable reseated last week, a switch rebooted).

use std::collections::BTreeMap;

use kiln_inventory::counters::{port_metric, replay_metric, SUITE_SECONDS};
use kiln_inventory::rdma::{RdmaDevice, RdmaPort};
use kiln_inventory::Inventory;

use super::hardware::{gpu_subject, nic_functions};
use super::{Checks, Evidence, Measured, Severity};
use crate::spec::{pkey_base, FabricSpec, SkuSpec};

/// The counters' growth during the suite: the metrics of the latest `counters` run, with its id.
fn suite_growth<'a>(evidence: &'a Evidence<'_>) -> Option<(&'a str, BTreeMap<&'a str, u64>)> {
    let run = evidence.runs.iter().rev().find(|r| r.benchmark == "counters")?;
    let growth = run.metrics.iter().map(|(name, v, _)| (name.as_str(), *v as u64)).collect();
    Some((run.id.as_str(), growth))
}

pub fn check(spec: &SkuSpec, evidence: &Evidence<'_>, c: &mut Checks) {
    let inv = evidence.inventory;
    let growth = suite_growth(evidence);
    if let Some(f) = &spec.fabric {
        for (d, p) in group_ports(spec, inv) {
            port_link(f, d, p, c);
        }
        for d in &inv.rdma {
            for p in d.ports.iter().filter(|p| p.state.as_deref() == Some("ACTIVE") || !p.counters.is_empty()) {
                port_errors(f, d, p, growth.as_ref(), c);
            }
        }
    }
    if let (Some(rate), Some((id, m))) = (spec.health.as_ref().and_then(|h| h.max_pcie_replays_per_minute), &growth) {
        let seconds = m.get(SUITE_SECONDS).copied().unwrap_or(0);
        // A suite shorter than a minute is allowed a minute's worth.
        let allowed = rate * seconds.max(60) / 60;
        for g in &inv.gpus.devices {
            let Some(&n) = m.get(replay_metric(g.index).as_str()) else { continue };
            c.add(
                "gpu.pcie.replays",
                &gpu_subject(g),
                Severity::Major,
                format!("≤ {rate} PCIe replays a minute: ≤ {allowed} over the suite's {seconds} s"),
                Measured::of(format!("{n} during the suite"), n <= allowed),
                "the GPU's PCIe link resent packets under load: a marginal slot, riser, cable or retimer",
                &format!("NVML nvmlDeviceGetPcieReplayCounter before and after the suite (run {id})"),
            );
        }
    }
}

/// The RDMA ports of the devices of the spec's `[[nic]]` groups (every port, when the spec names
/// no group).
fn group_ports<'a>(spec: &SkuSpec, inv: &'a Inventory) -> Vec<(&'a RdmaDevice, &'a RdmaPort)> {
    let wanted: Vec<&str> =
        spec.nics.iter().flat_map(|s| nic_functions(inv, &s.model)).map(|d| d.address.as_str()).collect();
    inv.rdma
        .iter()
        .filter(|d| spec.nics.is_empty() || d.pci_address.as_deref().is_some_and(|a| wanted.contains(&a)))
        .flat_map(|d| d.ports.iter().map(move |p| (d, p)))
        .collect()
}

fn port_subject(d: &RdmaDevice, p: &RdmaPort) -> String {
    format!("{} port {}", d.name, p.port)
}

fn port_link(f: &FabricSpec, d: &RdmaDevice, p: &RdmaPort, c: &mut Checks) {
    let subject = port_subject(d, p);
    if let Some(want) = &f.physical_state {
        let m = p.physical_state.as_ref().map_or_else(
            || Measured::missing("the port reports no physical state"),
            |s| Measured::of(s, s.eq_ignore_ascii_case(want)),
        );
        c.add(
            "fabric.port.physical_state",
            &subject,
            Severity::Major,
            want.clone(),
            m,
            "the link is not trained (no cable, a bad cable or transceiver, or the switch port is down)",
            "/sys/class/infiniband/*/ports/*/phys_state",
        );
    }
    if let Some(want) = &f.width {
        let m = p.width.as_ref().map_or_else(
            || Measured::missing("the port's rate names no width"),
            |w| Measured::of(w, w.eq_ignore_ascii_case(want)),
        );
        c.add(
            "fabric.port.width",
            &subject,
            Severity::Major,
            want.clone(),
            m,
            "the link trained on fewer lanes than it has (a damaged cable or transceiver)",
            "/sys/class/infiniband/*/ports/*/rate",
        );
    }
    if !f.pkeys.is_empty() {
        let m = p.pkeys.as_ref().map_or_else(
            || Measured::missing("the P_Key table is not readable"),
            |held| {
                let bases: Vec<u16> = held.iter().filter_map(|k| pkey_base(k)).collect();
                let missing: Vec<&str> = f
                    .pkeys
                    .iter()
                    .filter(|k| pkey_base(k).is_none_or(|b| !bases.contains(&b)))
                    .map(String::as_str)
                    .collect();
                let text = if held.is_empty() { "none".to_string() } else { held.join(", ") };
                Measured::of(
                    if missing.is_empty() { text } else { format!("{text} (missing {})", missing.join(", ")) },
                    missing.is_empty(),
                )
            },
        );
        c.add(
            "fabric.port.pkey",
            &subject,
            Severity::Major,
            f.pkeys.join(", "),
            m,
            "the port is not a member of the partition the jobs use: the subnet manager's partition configuration",
            "/sys/class/infiniband/*/ports/*/pkeys/*",
        );
    }
}

fn port_errors(
    f: &FabricSpec,
    d: &RdmaDevice,
    p: &RdmaPort,
    growth: Option<&(&str, BTreeMap<&str, u64>)>,
    c: &mut Checks,
) {
    let subject = port_subject(d, p);
    let during =
        |counter: &str| growth.and_then(|(_, m)| m.get(port_metric(&d.name, p.port, counter).as_str()).copied());
    let judged_during =
        growth.is_some_and(|(_, m)| m.keys().any(|k| k.starts_with(&format!("rdma.{}.port{}.", d.name, p.port))));
    let run = growth.map_or("", |(id, _)| id);
    let over: Vec<String> = f
        .max_errors
        .iter()
        .filter(|(name, _)| name.as_str() != "link_downed")
        .filter_map(|(name, &max)| {
            let n = if judged_during { during(name)? } else { *p.counters.get(name)? };
            (n > max).then(|| format!("{name} {}{n} (max {max})", if judged_during { "+" } else { "" }))
        })
        .collect();
    if let (Some(max), Some(n)) = (f.max_errors.get("link_downed"), during("link_downed").filter(|_| judged_during)) {
        c.add(
            "fabric.port.flaps",
            &subject,
            Severity::Major,
            format!("≤ {max} link downs during the suite"),
            Measured::of(format!("{n} link downs during the suite"), n <= *max),
            "the link went down and came back during the suite (flapping: a loose or failing cable, or the switch port)",
            &format!("/sys/class/infiniband/*/ports/*/counters/link_downed before and after the suite (run {run})"),
        );
    }
    let judged = f.max_errors.keys().filter(|n| n.as_str() != "link_downed").count();
    if judged == 0 || p.counters.is_empty() {
        return;
    }
    let expected = format!("{judged} error counters within [fabric] max_errors during the suite");
    let (measured, evidence) = if judged_during {
        let text =
            if over.is_empty() { "none grew past its limit during the suite".to_string() } else { over.join(", ") };
        (
            Measured::of(text, over.is_empty()),
            format!("/sys/class/infiniband/*/ports/*/counters before and after the suite (run {run})"),
        )
    } else if over.is_empty() {
        (
            Measured::of("within the limits since the driver loaded", true),
            "/sys/class/infiniband/*/ports/*/counters".into(),
        )
    } else {
        (
            Measured::Warn {
                text: format!("{} since the driver loaded", over.join(", ")),
                why: "counts since the driver loaded, not judged across a run: run the suite (or clear the counters \
                      with `perfquery -x`) to see whether they still grow"
                    .into(),
            },
            "/sys/class/infiniband/*/ports/*/counters".into(),
        )
    };
    c.add(
        "fabric.port.errors",
        &subject,
        Severity::Major,
        expected,
        measured,
        "the port counted errors under load: a dirty or damaged cable or transceiver, or a bad switch port",
        &evidence,
    );
}

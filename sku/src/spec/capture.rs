//! `kiln spec capture`: a spec written from a golden box — what it is (counts, models, links,
//! settings) and how fast it measured, with performance floors at a chosen fraction of the measured
//! values (one box, or the medians of the accepted boxes of one configuration). The result loads
//! with [`super::parse`] (tested), so a captured spec is a valid starting point to edit.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::verdict::{gpu_count, gpu_models};
use kiln_inventory::Inventory;

use super::metric_unit;

fn q(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

fn gib_floor(bytes: u64) -> String {
    format!("{} GiB", bytes / (1 << 30))
}

fn fmt_num(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.3}").trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// The spec text. `metrics`: per metric name, the values measured (one box: one value each; a
/// configuration: one per accepted box); the floor is `fraction` of their median.
// Long: one block per spec section, in the order a reader meets them in the file.
pub fn capture(
    name: &str,
    inv: &Inventory,
    metrics: &BTreeMap<String, Vec<f64>>,
    fraction: f64,
    origin: &str,
) -> String {
    let src = q(&format!("captured by kiln {} from {origin}", env!("CARGO_PKG_VERSION")));
    let mut t = String::new();
    let _ = writeln!(t, "# Captured from {origin}. Review every number before using this spec to judge other boxes.");
    let _ = writeln!(t, "name = {}", q(name));
    let _ = writeln!(t, "description = {}\n", q(&inv.fingerprints.config_name));
    let _ = writeln!(t, "[match]");
    if let Some(p) = &inv.system.product.name {
        let _ = writeln!(t, "product_names = [{}]", q(p));
    }
    let gpus = gpu_count(inv);
    let _ = writeln!(t, "gpu_count = {gpus}");
    if let Some(m) = gpu_models(inv).first().filter(|m| !m.is_empty()) {
        let _ = writeln!(t, "gpu_model = {}", q(m));
    }
    let _ = writeln!(t, "\n[cpu]\nsource = {src}");
    if let Some(m) = &inv.cpu.model_name {
        let _ = writeln!(t, "models = [{}]", q(m));
    }
    let _ = writeln!(t, "sockets = {}\nmin_cores = {}", inv.cpu.packages, inv.cpu.cores);
    let _ = writeln!(t, "\n[memory]\nsource = {src}");
    if let Some(total) = inv.memory.total_bytes {
        let _ = writeln!(t, "min_total = {}", q(&gib_floor(total)));
    }
    if let Some(d) = &inv.memory.dimms {
        let populated: Vec<_> = d.iter().filter(|d| d.populated).collect();
        let _ = writeln!(t, "dimms = {}", populated.len());
        if let Some(s) = populated.iter().filter_map(|d| d.configured_speed_mts.or(d.speed_mts)).min() {
            let _ = writeln!(t, "min_dimm_speed = {}", q(&format!("{s} MT/s")));
        }
    }
    let _ = writeln!(t, "\n[numa]\nsource = {src}\nnodes = {}", inv.numa.nodes.len().max(1));
    if let Some(g) = inv.gpus.devices.first() {
        let _ = writeln!(t, "\n[gpu]\nsource = {src}\ncount = {gpus}\nmodel = {}", q(g.name.as_deref().unwrap_or("")));
        if let Some(m) = inv.gpus.devices.iter().filter_map(|g| g.memory_total_bytes).min() {
            let _ = writeln!(t, "min_memory = {}", q(&gib_floor(m)));
        }
        let mut vbios: Vec<&str> = inv.gpus.devices.iter().filter_map(|g| g.vbios.as_deref()).collect();
        vbios.sort_unstable();
        vbios.dedup();
        if !vbios.is_empty() {
            let _ = writeln!(t, "vbios = [{}]", vbios.iter().map(|v| q(v)).collect::<Vec<_>>().join(", "));
        }
        if let Some(e) = &g.ecc {
            let _ = writeln!(t, "ecc = {}", e.enabled);
        }
        if let Some(p) = g.persistence_mode {
            let _ = writeln!(t, "persistence = {p}");
        }
        if let Some(m) = &g.mig {
            let _ = writeln!(t, "mig = {}", m.enabled);
        }
        if let Some(w) = inv.gpus.devices.iter().filter_map(|g| g.power.enforced_watts).min() {
            let _ = writeln!(t, "min_power_limit = {}", q(&format!("{w} W")));
        }
        if let (Some(mg), Some(mw)) = (g.pcie.max_gen, g.pcie.max_width) {
            let _ = writeln!(t, "pcie_gen = {}\npcie_width = {}", q(&format!("Gen{mg}")), q(&format!("x{mw}")));
        }
        let links = inv.gpus.devices.iter().map(|g| g.nvlinks.iter().filter(|l| l.active).count()).min().unwrap_or(0);
        if links > 0 {
            let _ = writeln!(t, "\n[nvlink]\nsource = {src}\nlinks_per_gpu = {links}");
            if let Some(v) = g.nvlinks.iter().filter_map(|l| l.version).min() {
                let _ = writeln!(t, "version = {v}");
            }
        }
    }
    if !inv.nvme.is_empty() {
        let _ = writeln!(t, "\n[nvme]\nsource = {src}\ncount = {}", inv.nvme.len());
        if let Some(min) = inv.nvme.iter().map(|d| d.namespaces.iter().filter_map(|n| n.size_bytes).sum::<u64>()).min()
        {
            let _ = writeln!(t, "min_size = {}", q(&format!("{} GB", min / 1_000_000_000)));
        }
    }
    let _ = writeln!(
        t,
        "\n[health]\nsource = {}",
        q("kiln defaults: no uncorrectable error, no pending remap, no hardware XID (NVIDIA XID catalogue)")
    );
    let _ = writeln!(
        t,
        "max_ecc_uncorrectable = 0\nremapped_rows = true\nxid_fail = [48, 63, 64, 74, 79, 92, 94, 95, 119, 120]"
    );
    for (metric, values) in metrics {
        let Some(unit) = metric_unit(metric) else { continue };
        let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite() && *x > 0.0).collect();
        if v.is_empty() || matches!(unit, "ratio" | "nats") {
            continue;
        }
        v.sort_by(f64::total_cmp);
        let median = v[v.len() / 2];
        let lower_better = matches!(unit, "s" | "us");
        let (key, bound) = if lower_better { ("max", median / fraction) } else { ("min", median * fraction) };
        let _ = writeln!(
            t,
            "\n[[performance]]\nmetric = {}\n{key} = {}\nsource = {}",
            q(metric),
            q(&format!("{} {unit}", fmt_num(bound))),
            q(&format!(
                "{:.0} % of the median {} {unit} of {} measurement(s) from {origin}",
                fraction * 100.0,
                fmt_num(median),
                v.len()
            ))
        );
    }
    t
}

//! Human-readable views of an inventory: a summary a technician can read at a glance.

use std::fmt::Write;

use crate::inventory::cpu::CacheType;
use crate::inventory::fingerprint::human_bytes;
use crate::inventory::Inventory;

fn or_unknown(v: &Option<String>) -> &str {
    v.as_deref().unwrap_or("unknown")
}

/// The multi-line summary `kiln inventory` prints.
pub fn summary(inv: &Inventory) -> String {
    let mut out = String::new();
    let cpu = &inv.cpu;
    let host = inv.os.hostname.as_deref().unwrap_or("(no hostname)");
    let _ = writeln!(out, "host      {host}   config {}   id {}", inv.fingerprints.config, inv.fingerprints.host.as_deref().unwrap_or("none"));
    let _ = writeln!(out, "config    {}", inv.fingerprints.config_name);
    let p = &inv.system.product;
    if p.vendor.is_some() || p.name.is_some() {
        let _ = writeln!(
            out,
            "system    {} {}{}",
            or_unknown(&p.vendor),
            or_unknown(&p.name),
            inv.system.chassis.type_name.as_ref().map(|t| format!(" ({t})")).unwrap_or_default()
        );
        let b = &inv.system.bios;
        let _ = writeln!(out, "bios      {} {} ({})", or_unknown(&b.vendor), or_unknown(&b.version), or_unknown(&b.date));
    }
    let _ = writeln!(
        out,
        "cpu       {} [{}]",
        or_unknown(&cpu.model_name),
        cpu.architecture.as_str()
    );
    let smt = cpu.threads_per_core.map(|t| format!(" × {t} threads")).unwrap_or_default();
    let _ = writeln!(
        out,
        "          {} package(s), {} cores{smt}, {} logical CPUs online{}{}",
        cpu.packages,
        cpu.cores,
        cpu.online,
        if cpu.offline_cpus.is_empty() { String::new() } else { format!(", offline {}", cpu.offline_cpus) },
        cpu.allowed_cpus.as_ref().map(|a| format!(", this process may use {a}")).unwrap_or_default()
    );
    let f = &cpu.frequency;
    if f.base_mhz.is_some() || f.max_mhz.is_some() {
        let mhz = |v: Option<u32>| v.map_or("?".to_string(), |v| format!("{v} MHz"));
        let _ = writeln!(out, "          base {} max {}", mhz(f.base_mhz), mhz(f.max_mhz));
    }
    for kind in &cpu.core_kinds {
        let _ = writeln!(out, "          {} cores: CPUs {} ({})", kind.name, kind.cpus, kind.cpu_count);
    }
    if !cpu.caches.is_empty() {
        let caches: Vec<String> = cpu
            .caches
            .iter()
            .map(|c| {
                let t = match c.cache_type {
                    CacheType::Data => "d",
                    CacheType::Instruction => "i",
                    CacheType::Unified => "",
                };
                format!("L{}{t} {} ×{}", c.level, human_bytes(c.size_bytes), c.instances)
            })
            .collect();
        let _ = writeln!(out, "caches    {}", caches.join(", "));
    }
    if !cpu.ml_features.is_empty() {
        let _ = writeln!(out, "isa       {}", cpu.ml_features.join(" "));
    }
    let m = &inv.memory;
    let _ = write!(out, "memory    {} total", m.total_bytes.map_or("unknown".to_string(), human_bytes));
    if let Some(avail) = m.available_bytes {
        let _ = write!(out, ", {} available", human_bytes(avail));
    }
    match (&m.dimms, m.dimms_populated, m.dimm_slots) {
        (Some(dimms), Some(n), Some(slots)) => {
            let kinds: Vec<String> = {
                let mut k: Vec<String> = dimms
                    .iter()
                    .filter(|d| d.populated)
                    .map(|d| {
                        format!(
                            "{} {}{}",
                            d.size_bytes.map_or("?".into(), human_bytes),
                            d.memory_type.as_deref().unwrap_or("?"),
                            d.speed_mts.map(|s| format!("-{s}")).unwrap_or_default()
                        )
                    })
                    .collect();
                k.sort();
                k.dedup();
                k
            };
            let _ = write!(out, "; {n} of {slots} slots populated ({})", kinds.join(", "));
        }
        _ => {
            let _ = write!(out, "; DIMMs unknown");
        }
    }
    let _ = writeln!(out);
    for pool in m.hugepages.iter().filter(|p| p.total > 0) {
        let _ = writeln!(out, "          hugepages {}: {} ({} free)", human_bytes(pool.size_bytes), pool.total, pool.free);
    }
    if inv.numa.nodes.is_empty() {
        let _ = writeln!(out, "numa      no NUMA information");
    } else {
        let _ = writeln!(out, "numa      {} node(s)", inv.numa.nodes.len());
        for node in &inv.numa.nodes {
            let cpus = if node.cpus.is_empty() { "no CPUs (memory only)".to_string() } else { format!("CPUs {}", node.cpus) };
            let _ = writeln!(
                out,
                "          node{} {cpus}, {}",
                node.id,
                node.memory_total_bytes.map_or("memory unknown".to_string(), human_bytes)
            );
        }
        if inv.numa.nodes.len() > 1 && !inv.numa.distances.is_empty() {
            let rows: Vec<String> =
                inv.numa.distances.iter().map(|r| r.iter().map(u32::to_string).collect::<Vec<_>>().join(" ")).collect();
            let _ = writeln!(out, "          distances {}", rows.join(" | "));
        }
    }
    let os = &inv.os;
    let distro = os.distribution.as_ref().and_then(|d| d.pretty_name.clone()).unwrap_or_else(|| "unknown distribution".into());
    let _ = writeln!(out, "os        {distro}, kernel {}", or_unknown(&os.kernel_release));
    if os.virtualization.is_virtual {
        let _ = writeln!(out, "          virtual machine: {}", os.virtualization.hypervisor.as_deref().unwrap_or("unknown hypervisor"));
    }
    if !inv.problems.is_empty() {
        let _ = writeln!(out, "problems  {} (see --json for all)", inv.problems.len());
        for p in inv.problems.iter().take(5) {
            let _ = writeln!(out, "          {}: {}", p.path, p.message);
        }
    }
    out
}

//! Human-readable views of an inventory: a summary a technician can read at a glance.

use std::fmt::Write;

use crate::cpu::CacheType;
use crate::fingerprint::human_bytes;
use crate::Inventory;

fn or_unknown(v: &Option<String>) -> &str {
    v.as_deref().unwrap_or("unknown")
}

/// The multi-line summary `kiln inventory` prints.
pub fn summary(inv: &Inventory) -> String {
    let mut out = String::new();
    summary_host(&mut out, inv);
    summary_cpu(&mut out, inv);
    summary_memory(&mut out, inv);
    summary_numa(&mut out, inv);
    devices(&mut out, inv);
    summary_os(&mut out, inv);
    out
}

/// Identity, configuration, system and BIOS.
fn summary_host(out: &mut String, inv: &Inventory) {
    let host = inv.os.hostname.as_deref().unwrap_or("(no hostname)");
    let _ = writeln!(
        out,
        "host      {host}   config {}   id {}",
        inv.fingerprints.config,
        inv.fingerprints.host.as_deref().unwrap_or("none")
    );
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
        let _ =
            writeln!(out, "bios      {} {} ({})", or_unknown(&b.vendor), or_unknown(&b.version), or_unknown(&b.date));
    }
}

/// The CPU: model, topology, clocks, core kinds, caches, ML instructions.
fn summary_cpu(out: &mut String, inv: &Inventory) {
    let cpu = &inv.cpu;
    let _ = writeln!(out, "cpu       {} [{}]", or_unknown(&cpu.model_name), cpu.architecture.as_str());
    let smt = cpu.threads_per_core.map(|t| format!(" × {t} threads")).unwrap_or_default();
    let smt = match cpu.compute_units {
        Some(units) => format!("{smt} in {units} compute units"),
        None => smt,
    };
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
}

/// Memory: total, available, DIMMs, hugepages.
fn summary_memory(out: &mut String, inv: &Inventory) {
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
        let _ =
            writeln!(out, "          hugepages {}: {} ({} free)", human_bytes(pool.size_bytes), pool.total, pool.free);
    }
}

/// NUMA nodes and their distances.
fn summary_numa(out: &mut String, inv: &Inventory) {
    if inv.numa.nodes.is_empty() {
        let _ = writeln!(out, "numa      no NUMA information");
    } else {
        let _ = writeln!(out, "numa      {} node(s)", inv.numa.nodes.len());
        for node in &inv.numa.nodes {
            let cpus = match (&node.memory_of, node.cpus.is_empty()) {
                (Some(of), true) => format!("no CPUs (memory of {} {})", of.kind, of.device),
                (None, true) => "no CPUs (memory only)".to_string(),
                (_, false) => format!("CPUs {}", node.cpus),
            };
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
}

/// The OS, virtualisation and the first problems.
fn summary_os(out: &mut String, inv: &Inventory) {
    let os = &inv.os;
    let distro =
        os.distribution.as_ref().and_then(|d| d.pretty_name.clone()).unwrap_or_else(|| "unknown distribution".into());
    let _ = writeln!(out, "os        {distro}, kernel {}", or_unknown(&os.kernel_release));
    if os.virtualization.is_virtual {
        let _ = writeln!(
            out,
            "          virtual machine: {}",
            os.virtualization.hypervisor.as_deref().unwrap_or("unknown hypervisor")
        );
    }
    if !inv.problems.is_empty() {
        let _ = writeln!(out, "problems  {} (see --json for all)", inv.problems.len());
        for p in inv.problems.iter().take(5) {
            let _ = writeln!(out, "          {}: {}", p.path, p.message);
        }
    }
}

fn link_text(l: &crate::pci::PciLink) -> String {
    let speed = |g: Option<u32>, s: Option<f64>| match (g, s) {
        (Some(g), _) => format!("Gen{g}"),
        (None, Some(s)) => format!("{s} GT/s"),
        _ => "?".to_string(),
    };
    let width = |w: Option<u32>| w.map_or("?".to_string(), |w| format!("x{w}"));
    let mut text = format!("{} {}", speed(l.current_gen, l.current_speed_gts), width(l.current_width));
    if l.degraded {
        text.push_str(&format!(" (max {} {})", speed(l.max_gen, l.max_speed_gts), width(l.max_width)));
    }
    text
}

/// GPUs, NVMe drives, NICs and RDMA devices, one line each.
fn devices(out: &mut String, inv: &Inventory) {
    gpus(out, &inv.gpus, &inv.kernel_log.xids);
    let pci_link = |addr: &Option<String>| {
        addr.as_ref()
            .and_then(|a| inv.pci.iter().find(|d| &d.address == a))
            .and_then(|d| d.link.as_ref())
            .map(link_text)
    };
    for n in &inv.nvme {
        let size: u64 = n.namespaces.iter().filter_map(|ns| ns.size_bytes).sum();
        let _ = writeln!(
            out,
            "nvme      {} {} serial {} fw {} {}{}",
            n.name,
            n.model.as_deref().unwrap_or("?"),
            n.serial.as_deref().unwrap_or("?"),
            n.firmware.as_deref().unwrap_or("?"),
            human_bytes(size),
            pci_link(&n.pci_address).map(|l| format!(", PCIe {l}")).unwrap_or_default()
        );
    }
    for n in &inv.nics {
        let _ = writeln!(
            out,
            "nic       {} {} {} {}{}",
            n.name,
            n.driver.as_deref().unwrap_or("?"),
            n.operstate.as_deref().unwrap_or("?"),
            n.speed_mbps.map_or("speed ?".to_string(), |s| format!("{} Gb/s", s as f64 / 1000.0)),
            n.pci_address.as_ref().map(|a| format!(" at {a}")).unwrap_or_default()
        );
    }
    for r in &inv.rdma {
        let ports: Vec<String> = r
            .ports
            .iter()
            .map(|p| {
                let errors: Vec<String> = p
                    .counters
                    .iter()
                    .filter(|(n, &v)| v > 0 && n.as_str() != "link_downed")
                    .map(|(n, v)| format!("{n} {v}"))
                    .collect();
                format!(
                    "port {} {} {}{}",
                    p.port,
                    p.state.as_deref().unwrap_or("?"),
                    p.rate.as_deref().unwrap_or(""),
                    if errors.is_empty() {
                        String::new()
                    } else {
                        format!(" (errors since boot: {})", errors.join(", "))
                    }
                )
            })
            .collect();
        let _ = writeln!(
            out,
            "rdma      {} {} fw {}: {}",
            r.name,
            r.hca_type.as_deref().unwrap_or("?"),
            r.firmware.as_deref().unwrap_or("?"),
            ports.join("; ")
        );
    }
    for chip in &inv.hwmon {
        let faults = sensor_faults(chip);
        if !faults.is_empty() {
            let _ = writeln!(
                out,
                "sensors   {} {}: FAULTS: {}",
                chip.hwmon,
                chip.name.as_deref().unwrap_or("?"),
                faults.join(", ")
            );
        }
    }
    let degraded: Vec<String> = inv
        .pci
        .iter()
        .filter(|d| d.link.as_ref().is_some_and(|l| l.degraded))
        .map(|d| {
            format!(
                "{} {} at {}",
                d.address,
                d.device_name.as_deref().unwrap_or(&d.class),
                link_text(d.link.as_ref().unwrap())
            )
        })
        .collect();
    let _ = writeln!(
        out,
        "pci       {} functions{}",
        inv.pci.len(),
        if degraded.is_empty() { String::new() } else { format!(", {} links below their maximum", degraded.len()) }
    );
    for d in degraded.iter().take(8) {
        let _ = writeln!(out, "          {d}");
    }
}

/// A hwmon chip's sensors in alarm or at their critical limit, and its stopped fans.
pub fn sensor_faults(chip: &crate::hwmon::Chip) -> Vec<String> {
    let temps = chip.temperatures.iter().filter(|t| t.faulted()).map(|t| {
        let name = t.label.clone().unwrap_or_else(|| format!("temp{}", t.index));
        t.celsius.map_or(format!("{name} in alarm"), |c| format!("{name} {c:.0} °C in alarm"))
    });
    let fans = chip.fans.iter().filter(|f| f.faulted()).map(|f| {
        let name = f.label.clone().unwrap_or_else(|| format!("fan{}", f.index));
        format!("{name} at {} RPM (stopped or in alarm)", f.rpm.unwrap_or(0))
    });
    temps.chain(fans).collect()
}

/// The health faults a GPU shows at inventory time, for its summary line: uncorrectable ECC
/// errors, a pending or failed row remap, XIDs in the kernel log, clocks held back at rest, a
/// power limit below the board's default, a recovery action the driver asks for, a drain.
pub fn gpu_faults(gpu: &crate::gpu::Gpu, xids: &[crate::kmsg::XidEvent]) -> Vec<String> {
    let mut faults = Vec::new();
    if let Some(e) = &gpu.ecc {
        let unc = e.volatile_uncorrected.unwrap_or(0).max(e.aggregate_uncorrected.unwrap_or(0));
        if unc > 0 {
            faults.push(format!("{unc} uncorrectable ECC errors"));
        }
    }
    if let Some(r) = &gpu.remapped_rows {
        if r.failure {
            faults.push("row remapping FAILED".into());
        } else if r.pending {
            faults.push("row remap pending (reset the GPU)".into());
        }
    }
    let mut by_xid: std::collections::BTreeMap<u32, usize> = std::collections::BTreeMap::new();
    for x in
        xids.iter().filter(|x| gpu.pci_address.as_deref().is_some_and(|a| a.starts_with(&x.pci.to_ascii_lowercase())))
    {
        *by_xid.entry(x.xid).or_default() += 1;
    }
    faults.extend(by_xid.iter().map(|(xid, n)| format!("XID {xid} ({}) x{n}", crate::kmsg::xid_name(*xid))));
    let at_rest = gpu.held_back_at_rest();
    if !at_rest.is_empty() {
        faults.push(format!("clocks held back at rest ({})", at_rest.join(", ")));
    }
    if let (Some(d), Some(e)) = (gpu.power.default_watts, gpu.power.enforced_watts) {
        if e < d {
            faults.push(format!("power limit {e} W of the default {d} W"));
        }
    }
    if let Some(action) = gpu.recovery_action.as_deref().filter(|a| *a != "none") {
        faults.push(format!("the driver asks for {}", action.replace('_', " ")));
    }
    if gpu.drained == Some(true) {
        faults.push("drained".into());
    }
    faults
}

/// The GPUs NVML sees (identity, memory, PCIe, NVLink, bf16 peak, health faults) and those it
/// does not.
fn gpus(out: &mut String, g: &crate::gpu::Gpus, xids: &[crate::kmsg::XidEvent]) {
    if !g.devices.is_empty() || !g.pci_gpus.is_empty() {
        let _ = writeln!(
            out,
            "gpus      {} via NVML (driver {}, CUDA {}), {} on PCI{}",
            g.devices.len(),
            g.driver_version.as_deref().unwrap_or("?"),
            g.cuda_driver_version.as_deref().unwrap_or("?"),
            g.pci_gpus.len(),
            if g.nvswitches.is_empty() { String::new() } else { format!(", {} NVSwitch(es)", g.nvswitches.len()) }
        );
        for gpu in &g.devices {
            let active = gpu.nvlinks.iter().filter(|l| l.active).count();
            let nvlink = if gpu.nvlinks.is_empty() {
                String::new()
            } else {
                format!(", NVLink {active}/{} up", gpu.nvlinks.len())
            };
            let p = &gpu.pcie;
            let mut pcie = match (p.current_gen, p.current_width) {
                (Some(gen), Some(w)) => format!(", PCIe Gen{gen} x{w}"),
                _ => String::new(),
            };
            if let (Some(mg), Some(mw)) = (p.max_gen, p.max_width) {
                if p.current_gen.is_some_and(|g| g < mg) || p.current_width.is_some_and(|w| w < mw) {
                    pcie.push_str(&format!(" (max Gen{mg} x{mw})"));
                }
            }
            let peak = gpu
                .name
                .as_deref()
                .and_then(|n| kiln_bench::peaks::gpu_peak_tflops(n, "bf16"))
                .map(|t| format!(", {t:.0} TFLOP/s bf16 dense"))
                .unwrap_or_default();
            let faults = gpu_faults(gpu, xids);
            let health = if faults.is_empty() { String::new() } else { format!("; FAULTS: {}", faults.join(", ")) };
            let _ = writeln!(
                out,
                "          GPU{} {} {} {}{pcie}{nvlink}{peak}{health}",
                gpu.index,
                gpu.name.as_deref().unwrap_or("?"),
                gpu.pci_address.as_deref().unwrap_or("?"),
                gpu.memory_total_bytes.map_or("?".to_string(), human_bytes),
            );
        }
        for missing in &g.missing_from_nvml {
            let _ = writeln!(out, "          GPU at {missing} is on PCI but NVML does not see it");
        }
        if let Some(e) = &g.nvml_error {
            let _ = writeln!(out, "          NVML: {e}");
        }
    }
}

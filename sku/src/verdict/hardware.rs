//! Checks of what the box is: CPU, memory, NUMA, GPUs, NVLink, PCIe links along every device's
//! path, NICs, NVMe, platform settings and the software fingerprint.
//!
//! PCIe speed is judged with care: an idle GPU drops its link to Gen1 on purpose, so a GPU link
//! below its generation while idle is a warning, not a failure (under load it is a failure, see
//! `links under load` in ARCHITECTURE.md). A port that cannot reach the generation (its maximum is
//! lower), any width below spec, and a switch uplink below spec fail.

use crate::spec::{matches_any, SkuSpec};
use kiln_inventory::gpu::Gpu;
use kiln_inventory::pci::PciDevice;
use kiln_inventory::Inventory;

use super::{Checks, Measured, Severity};

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

fn gib(bytes: f64) -> String {
    format!("{:.1} GiB", bytes / GIB)
}

fn list(patterns: &[String]) -> String {
    if patterns.len() == 1 {
        patterns[0].clone()
    } else {
        format!("one of {}", patterns.join(", "))
    }
}

pub fn check(spec: &SkuSpec, inv: &Inventory, c: &mut Checks) {
    cpu(spec, inv, c);
    memory(spec, inv, c);
    if let Some(n) = &spec.numa {
        let nodes = inv.numa.nodes.len().max(1) as u32;
        c.add(
            "numa.nodes",
            "system",
            Severity::Major,
            n.nodes.to_string(),
            Measured::of(nodes.to_string(), nodes == n.nodes),
            "NUMA nodes differ (BIOS sub-NUMA clustering or a missing socket)",
            "/sys/devices/system/node",
        );
    }
    gpus(spec, inv, c);
    nvlink(spec, inv, c);
    nics(spec, inv, c);
    nvme(spec, inv, c);
    platform(spec, inv, c);
    software(spec, inv, c);
}

fn cpu(spec: &SkuSpec, inv: &Inventory, c: &mut Checks) {
    let Some(s) = &spec.cpu else { return };
    let ev = "/proc/cpuinfo, /sys/devices/system/cpu";
    if !s.models.is_empty() {
        let model = inv.cpu.model_name.clone().unwrap_or_default();
        let m = if model.is_empty() {
            Measured::missing("the CPU model could not be read")
        } else {
            Measured::of(&model, matches_any(&s.models, &model))
        };
        c.add("cpu.model", "CPU", Severity::Major, list(&s.models), m, "another CPU model", ev);
    }
    if let Some(n) = s.sockets {
        c.add(
            "cpu.sockets",
            "CPU",
            Severity::Major,
            n.to_string(),
            Measured::of(inv.cpu.packages.to_string(), inv.cpu.packages == n),
            "a socket is missing or extra",
            ev,
        );
    }
    if let Some(n) = s.min_cores {
        c.add(
            "cpu.cores",
            "CPU",
            Severity::Major,
            format!("≥ {n}"),
            Measured::of(inv.cpu.cores.to_string(), inv.cpu.cores >= n),
            "cores are disabled or missing",
            ev,
        );
    }
}

fn memory(spec: &SkuSpec, inv: &Inventory, c: &mut Checks) {
    let Some(s) = &spec.memory else { return };
    if let Some(min) = &s.min_total {
        let m = match inv.memory.total_bytes {
            Some(t) => Measured::of(gib(t as f64), t as f64 >= min.value()),
            None => Measured::missing("/proc/meminfo has no MemTotal"),
        };
        c.add(
            "memory.total",
            "memory",
            Severity::Major,
            format!("≥ {min}"),
            m,
            "memory is missing (a DIMM not detected?)",
            "/proc/meminfo MemTotal",
        );
    }
    let dimms: Option<Vec<_>> = inv.memory.dimms.as_ref().map(|d| d.iter().filter(|d| d.populated).collect());
    let no_dimms = || Measured::missing("the DIMM table (SMBIOS type 17) could not be read: needs root");
    if let Some(n) = s.dimms {
        let m = dimms.as_ref().map_or_else(no_dimms, |d| Measured::of(d.len().to_string(), d.len() as u32 == n));
        c.add("memory.dimms", "memory", Severity::Major, n.to_string(), m, "DIMMs missing or extra", "SMBIOS type 17");
    }
    if let Some(min) = &s.min_dimm_speed {
        let m = dimms.as_ref().map_or_else(no_dimms, |d| {
            let speeds: Vec<u32> = d.iter().filter_map(|d| d.configured_speed_mts.or(d.speed_mts)).collect();
            match speeds.iter().min() {
                Some(&slow) => Measured::of(format!("{slow} MT/s"), f64::from(slow) * 1e6 >= min.value()),
                None => Measured::missing("no DIMM reports its speed"),
            }
        });
        c.add(
            "memory.speed",
            "memory",
            Severity::Minor,
            format!("≥ {min}"),
            m,
            "DIMMs run below their rated speed (mixed DIMMs or a BIOS setting)",
            "SMBIOS type 17 configured speed",
        );
    }
}

/// Why a GPU's enforced power limit is below the spec's: another model (whose limit is its own), a
/// board whose default is already below it, or a limit lowered from the default.
fn power_reason(s: &crate::spec::GpuSpec, g: &Gpu) -> String {
    match (&g.name, g.power.default_watts, g.power.enforced_watts) {
        (Some(name), ..) if *name != s.model => {
            format!("this GPU is another model ({name}, not {}): its power limit is that model's", s.model)
        }
        (_, Some(default), Some(enforced)) if enforced < default => {
            format!("the power limit is lowered from the board's default of {default} W (nvidia-smi -pl {default})")
        }
        (_, Some(default), _) => {
            format!("the board's own default limit is {default} W: another board or SKU, or a capped VBIOS")
        }
        _ => "the power limit is below the spec's (nvidia-smi -q -d POWER says why)".to_string(),
    }
}

/// "GPU 3 0000:1b:00.0": how every GPU check names its subject.
pub(super) fn gpu_subject(g: &Gpu) -> String {
    format!("GPU {} {}", g.index, g.pci_address.as_deref().unwrap_or("?"))
}

fn gpus(spec: &SkuSpec, inv: &Inventory, c: &mut Checks) {
    let Some(s) = &spec.gpu else { return };
    let nvml = inv.gpus.devices.len();
    let pci = inv.gpus.pci_gpus.len();
    let nvml_ev = inv.gpus.nvml_library.clone().unwrap_or_else(|| "NVML".into());
    let count = if inv.gpus.nvml_error.is_some() && nvml == 0 {
        Measured::of(format!("{pci} on PCI, NVML unavailable: {}", inv.gpus.nvml_error.as_deref().unwrap_or("")), false)
    } else {
        Measured::of(format!("{nvml} in NVML, {pci} on PCI"), nvml == s.count as usize && pci == s.count as usize)
    };
    c.add(
        "gpu.count",
        "GPUs",
        Severity::Critical,
        s.count.to_string(),
        count,
        "a GPU is missing (or NVML and the PCI bus disagree)",
        "/sys/bus/pci/devices, NVML nvmlDeviceGetCount",
    );
    for addr in &inv.gpus.missing_from_nvml {
        c.add(
            "gpu.visible",
            &format!("PCI {addr}"),
            Severity::Critical,
            "in NVML",
            Measured::of("on PCI only", false),
            "the driver does not see this GPU (fallen off the bus, or failed to initialise)",
            "/sys/bus/pci/devices, NVML",
        );
    }
    for g in &inv.gpus.devices {
        gpu_one(s, g, inv, &nvml_ev, c);
    }
}

/// An on/off setting against the one expected.
fn switch(b: Option<bool>, expected: bool) -> Measured {
    match b {
        Some(on) => Measured::of(on_off(on), on == expected),
        None => Measured::missing("NVML does not report it"),
    }
}

pub(super) fn on_off(b: bool) -> &'static str {
    if b {
        "on"
    } else {
        "off"
    }
}

// Long: one check per line of the spec's [gpu] table, each a few lines; splitting them apart
// would scatter one device's checks.
fn gpu_one(s: &crate::spec::GpuSpec, g: &Gpu, inv: &Inventory, ev: &str, c: &mut Checks) {
    let subject = gpu_subject(g);
    // A name NVML could not read is not another model: the check cannot run.
    let model = g.name.as_ref().map_or_else(
        || Measured::missing("name unknown: NVML could not read it (nvmlDeviceGetName)"),
        |name| Measured::of(name, *name == s.model),
    );
    c.add(
        "gpu.model",
        &subject,
        Severity::Major,
        &s.model,
        model,
        "another GPU model in this slot",
        &format!("{ev} nvmlDeviceGetName"),
    );
    if let Some(min) = &s.min_memory {
        let m = g.memory_total_bytes.map_or_else(
            || Measured::missing("NVML does not report memory"),
            |b| Measured::of(gib(b as f64), b as f64 >= min.value()),
        );
        c.add(
            "gpu.memory",
            &subject,
            Severity::Major,
            format!("≥ {min}"),
            m,
            "less GPU memory than the SKU has",
            &format!("{ev} nvmlDeviceGetMemoryInfo"),
        );
    }
    if !s.vbios.is_empty() {
        let m = g.vbios.as_ref().map_or_else(
            || Measured::missing("NVML does not report the VBIOS"),
            |v| Measured::of(v, matches_any(&s.vbios, v)),
        );
        c.add(
            "gpu.vbios",
            &subject,
            Severity::Minor,
            list(&s.vbios),
            m,
            "a VBIOS version that is not allowed",
            &format!("{ev} nvmlDeviceGetVbiosVersion"),
        );
    }
    if let Some(want_on) = s.ecc {
        let m = switch(g.ecc.as_ref().map(|e| e.enabled), want_on);
        c.add(
            "gpu.ecc.mode",
            &subject,
            Severity::Major,
            on_off(want_on),
            m,
            "ECC mode differs (nvidia-smi -e 1, then a reset)",
            &format!("{ev} nvmlDeviceGetEccMode"),
        );
    }
    if let Some(want_on) = s.persistence {
        let m = switch(g.persistence_mode, want_on);
        c.add(
            "gpu.persistence",
            &subject,
            Severity::Minor,
            on_off(want_on),
            m,
            "persistence mode differs (nvidia-persistenced)",
            &format!("{ev} nvmlDeviceGetPersistenceMode"),
        );
    }
    if let Some(want_on) = s.mig {
        let m = switch(g.mig.as_ref().map(|m| m.enabled), want_on);
        c.add(
            "gpu.mig",
            &subject,
            Severity::Major,
            on_off(want_on),
            m,
            "MIG mode differs (nvidia-smi -mig 0)",
            &format!("{ev} nvmlDeviceGetMigMode"),
        );
    }
    if let Some(min) = &s.min_power_limit {
        let m = g.power.enforced_watts.map_or_else(
            || Measured::missing("NVML does not report the power limit"),
            |w| Measured::of(format!("{w} W"), f64::from(w) >= min.value()),
        );
        c.add(
            "gpu.power_limit",
            &subject,
            Severity::Minor,
            format!("≥ {min}"),
            m,
            &power_reason(s, g),
            &format!("{ev} nvmlDeviceGetEnforcedPowerLimit"),
        );
    }
    if s.pcie_gen.is_some() || s.pcie_width.is_some() {
        let gen = s.pcie_gen.as_ref().map(|g| g.value() as u32);
        let width = s.pcie_width.as_ref().map(|w| w.value() as u32);
        let endpoint = g.pci_address.as_deref().and_then(|a| inv.pci.iter().find(|d| d.address == a));
        match endpoint {
            Some(dev) => pcie_path("gpu", &subject, dev, inv, gen, width, true, c),
            None => {
                // No sysfs (NVML only): NVML's current and maximum link.
                let p = &g.pcie;
                let m = match (p.current_gen, p.current_width, p.max_gen) {
                    (Some(cg), Some(cw), mg) => link_measure(cg, cw, mg, gen, width, true),
                    _ => Measured::missing("neither sysfs nor NVML report the link"),
                };
                c.add(
                    "gpu.pcie.link",
                    &subject,
                    Severity::Major,
                    link_text(gen, width),
                    m,
                    "the link trained below spec",
                    &format!("{ev} nvmlDeviceGetCurrPcieLinkGeneration/Width"),
                );
            }
        }
    }
}

fn link_text(gen: Option<u32>, width: Option<u32>) -> String {
    match (gen, width) {
        (Some(g), Some(w)) => format!("≥ Gen{g} x{w}"),
        (Some(g), None) => format!("≥ Gen{g}"),
        (None, Some(w)) => format!("≥ x{w}"),
        (None, None) => String::new(),
    }
}

/// Judges one link. `may_idle`: a link whose speed drops on purpose when idle (a GPU's own
/// link): a low current speed with a capable maximum is a warning, not a failure.
fn link_measure(
    cur_gen: u32,
    cur_width: u32,
    max_gen: Option<u32>,
    gen: Option<u32>,
    width: Option<u32>,
    may_idle: bool,
) -> Measured {
    let text = format!("Gen{cur_gen} x{cur_width}{}", max_gen.map_or(String::new(), |m| format!(" (max Gen{m})")));
    let width_ok = width.is_none_or(|w| cur_width >= w);
    let gen_ok = gen.is_none_or(|g| cur_gen >= g);
    let capable = gen.is_none_or(|g| max_gen.is_none_or(|m| m >= g));
    if !width_ok || !capable {
        return Measured::of(text, false);
    }
    if !gen_ok {
        if may_idle {
            return Measured::Warn {
                text,
                why: "below spec while idle (GPUs lower their link speed at idle); judged under load".into(),
            };
        }
        return Measured::of(text, false);
    }
    Measured::of(text, true)
}

/// The device's own link and every upstream port on its path, each at least `gen`/`width`.
#[allow(clippy::too_many_arguments)]
pub fn pcie_path(
    kind: &str,
    subject: &str,
    dev: &PciDevice,
    inv: &Inventory,
    gen: Option<u32>,
    width: Option<u32>,
    may_idle: bool,
    c: &mut Checks,
) {
    let expected = link_text(gen, width);
    let sysfs = |a: &str| format!("/sys/bus/pci/devices/{a}/current_link_speed, current_link_width, max_link_speed");
    let m = match &dev.link {
        Some(l) => match (l.current_gen, l.current_width) {
            (Some(cg), Some(cw)) => link_measure(cg, cw, l.max_gen, gen, width, may_idle),
            _ => Measured::missing("the link speed or width could not be read"),
        },
        None => Measured::missing("the device has no PCIe link attributes"),
    };
    c.add(
        &format!("{kind}.pcie.link"),
        subject,
        Severity::Major,
        expected.clone(),
        m,
        "the link trained below spec (reseat, or a bad riser/cable)",
        &sysfs(&dev.address),
    );
    // Bridges from the root port down: the last one's downstream link is the device's own link
    // (seen from the port), which idles with it.
    let n = dev.upstream.len();
    for (i, port) in dev.upstream.iter().enumerate() {
        let Some(p) = inv.pci.iter().find(|d| &d.address == port) else { continue };
        let Some(l) = &p.link else { continue };
        let (Some(cg), Some(cw)) = (l.current_gen, l.current_width) else { continue };
        let m = link_measure(cg, cw, l.max_gen, gen, width, may_idle && i + 1 == n);
        c.add(
            &format!("{kind}.pcie.path"),
            &format!("upstream port {port} ({subject})"),
            Severity::Major,
            expected.clone(),
            m,
            "a port on the path trained below spec (a degraded switch link slows every device below it)",
            &sysfs(port),
        );
    }
}

fn nvlink(spec: &SkuSpec, inv: &Inventory, c: &mut Checks) {
    let Some(s) = &spec.nvlink else { return };
    let ev = "NVML nvmlDeviceGetNvLinkState/Version";
    for g in &inv.gpus.devices {
        let subject = gpu_subject(g);
        let active = g.nvlinks.iter().filter(|l| l.active).count() as u32;
        let down: Vec<String> = g.nvlinks.iter().filter(|l| !l.active).map(|l| l.link.to_string()).collect();
        let m = if g.nvlinks.is_empty() && s.links_per_gpu > 0 {
            Measured::of("no links reported", false)
        } else {
            Measured::of(format!("{active} active"), active >= s.links_per_gpu)
        };
        let reason =
            if down.is_empty() { "links missing".to_string() } else { format!("inactive link(s) {}", down.join(", ")) };
        c.add("nvlink.active", &subject, Severity::Major, format!("{} active", s.links_per_gpu), m, &reason, ev);
        if let Some(v) = s.version {
            let versions: Vec<u32> = g.nvlinks.iter().filter(|l| l.active).filter_map(|l| l.version).collect();
            let m = match versions.iter().min() {
                Some(&low) => Measured::of(format!("NVLink {low}"), low >= v),
                None => Measured::missing("no active link reports its version"),
            };
            c.add("nvlink.version", &subject, Severity::Major, format!("NVLink {v}"), m, "an older NVLink version", ev);
        }
    }
    if let Some(want) = &s.matrix {
        let t = &inv.topology;
        let gpus: Vec<usize> = (0..t.devices.len()).filter(|&i| t.devices[i].label.starts_with("GPU")).collect();
        for &i in &gpus {
            for &j in gpus.iter().filter(|&&j| j > i) {
                let got = &t.matrix[i][j];
                let subject = format!("{} ↔ {}", t.devices[i].label, t.devices[j].label);
                c.add(
                    "nvlink.matrix",
                    &subject,
                    Severity::Major,
                    want.clone(),
                    Measured::of(got.clone(), got == want),
                    "fewer NVLinks between this pair",
                    "kiln topo (NVML NVLink remote bus ids)",
                );
            }
        }
    }
}

/// The physical functions whose PCI name or RDMA HCA type holds `model`.
pub(super) fn nic_functions<'a>(inv: &'a Inventory, model: &str) -> Vec<&'a PciDevice> {
    inv.pci
        .iter()
        .filter(|d| d.physfn.is_none() && d.class.starts_with("02"))
        .filter(|d| {
            d.device_name.as_deref().is_some_and(|n| n.contains(model))
                || inv.rdma.iter().any(|r| {
                    r.pci_address.as_deref() == Some(&d.address)
                        && r.hca_type.as_deref().is_some_and(|h| h.contains(model))
                })
        })
        .collect()
}

fn nics(spec: &SkuSpec, inv: &Inventory, c: &mut Checks) {
    for s in &spec.nics {
        let found = nic_functions(inv, &s.model);
        let subject = format!("{} NICs ({})", s.role, s.model);
        c.add(
            "nic.count",
            &subject,
            Severity::Major,
            s.count.to_string(),
            Measured::of(found.len().to_string(), found.len() as u32 == s.count),
            "NICs missing or extra",
            "/sys/bus/pci/devices class 02",
        );
        for dev in &found {
            nic_one(s, dev, inv, c);
        }
        if !s.gpu_affinity.is_empty() {
            nic_affinity(s, &found, inv, c);
        }
    }
}

fn nic_one(s: &crate::spec::NicSpec, dev: &PciDevice, inv: &Inventory, c: &mut Checks) {
    let rdma = inv.rdma.iter().find(|r| r.pci_address.as_deref() == Some(&dev.address));
    let netdev = inv.nics.iter().find(|n| n.pci_address.as_deref() == Some(&dev.address));
    let name = rdma.map(|r| r.name.clone()).or_else(|| netdev.map(|n| n.name.clone())).unwrap_or_default();
    let subject = format!("{name} {}", dev.address).trim().to_string();
    if !s.firmware.is_empty() {
        let fw = rdma.and_then(|r| r.firmware.clone()).or_else(|| netdev.and_then(|n| n.firmware_version.clone()));
        let m = fw.map_or_else(
            || Measured::missing("no firmware version reported"),
            |f| Measured::of(&f, matches_any(&s.firmware, &f)),
        );
        c.add(
            "nic.firmware",
            &subject,
            Severity::Minor,
            list(&s.firmware),
            m,
            "firmware not allowed",
            "/sys/class/infiniband/*/fw_ver, ethtool -i",
        );
    }
    if s.state.is_some() || s.min_rate.is_some() {
        let ports: Vec<_> = rdma.map(|r| r.ports.iter().collect()).unwrap_or_default();
        for p in &ports {
            let ps = format!("{name} port {}", p.port);
            if let Some(want) = &s.state {
                let st = p.state.clone().unwrap_or_default();
                c.add(
                    "nic.port.state",
                    &ps,
                    Severity::Major,
                    want.clone(),
                    Measured::of(&st, st.eq_ignore_ascii_case(want)),
                    "the port is not up (cable, switch port or subnet manager)",
                    "/sys/class/infiniband/*/ports/*/state",
                );
            }
            if let Some(min) = &s.min_rate {
                let m = p.rate_gbps.map_or_else(
                    || Measured::missing("the port reports no rate"),
                    |r| Measured::of(format!("{r} Gb/s"), r * 1e9 / 8.0 >= min.value()),
                );
                c.add(
                    "nic.port.rate",
                    &ps,
                    Severity::Major,
                    format!("≥ {min}"),
                    m,
                    "the port runs below its rate (cable or switch port)",
                    "/sys/class/infiniband/*/ports/*/rate",
                );
            }
        }
        if ports.is_empty() {
            if let Some(min) = &s.min_rate {
                let m = netdev.and_then(|n| n.speed_mbps).map_or_else(
                    || Measured::missing("no RDMA port and no link speed"),
                    |mb| Measured::of(format!("{mb} Mb/s"), f64::from(mb) * 1e6 / 8.0 >= min.value()),
                );
                c.add(
                    "nic.port.rate",
                    &subject,
                    Severity::Major,
                    format!("≥ {min}"),
                    m,
                    "the link runs below its rate",
                    "/sys/class/net/*/speed",
                );
            }
        }
    }
    let gen = s.pcie_gen.as_ref().map(|g| g.value() as u32);
    let width = s.pcie_width.as_ref().map(|w| w.value() as u32);
    if gen.is_some() || width.is_some() {
        pcie_path("nic", &subject, dev, inv, gen, width, false, c);
    }
}

fn nic_affinity(s: &crate::spec::NicSpec, found: &[&PciDevice], inv: &Inventory, c: &mut Checks) {
    let t = &inv.topology;
    let addrs: Vec<&str> = found.iter().map(|d| d.address.as_str()).collect();
    for (i, d) in t.devices.iter().enumerate().filter(|(_, d)| d.label.starts_with("GPU")) {
        let best = t
            .devices
            .iter()
            .enumerate()
            .filter(|(_, n)| n.label.starts_with("NIC") && n.pci_address.as_deref().is_some_and(|a| addrs.contains(&a)))
            .map(|(j, n)| (t.matrix[i][j].clone(), n.name.clone()))
            .find(|(path, _)| s.gpu_affinity.contains(path));
        let m = match best {
            Some((path, nic)) => Measured::of(format!("{path} to {nic}"), true),
            None => Measured::of("no such NIC", false),
        };
        let subject = format!("{} {}", d.label, d.pci_address.as_deref().unwrap_or("?"));
        c.add(
            "nic.gpu_affinity",
            &subject,
            Severity::Major,
            format!("a {} NIC at {}", s.role, s.gpu_affinity.join("/")),
            m,
            "GPUDirect RDMA traffic would cross the CPU",
            "kiln topo",
        );
    }
}

fn nvme(spec: &SkuSpec, inv: &Inventory, c: &mut Checks) {
    let Some(s) = &spec.nvme else { return };
    let drives: Vec<_> = inv
        .nvme
        .iter()
        .filter(|n| s.models.is_empty() || n.model.as_deref().is_some_and(|m| matches_any(&s.models, m.trim())))
        .collect();
    let expected =
        if s.models.is_empty() { s.count.to_string() } else { format!("{} × {}", s.count, list(&s.models)) };
    c.add(
        "nvme.count",
        "NVMe drives",
        Severity::Major,
        expected,
        Measured::of(drives.len().to_string(), drives.len() as u32 == s.count),
        "drives missing, extra or of another model",
        "/sys/class/nvme",
    );
    for d in &drives {
        let subject = format!("{} {}", d.name, d.pci_address.as_deref().unwrap_or(""));
        if let Some(min) = &s.min_size {
            let size: u64 = d.namespaces.iter().filter_map(|n| n.size_bytes).sum();
            c.add(
                "nvme.size",
                subject.trim(),
                Severity::Major,
                format!("≥ {min}"),
                Measured::of(format!("{:.2} TB", size as f64 / 1e12), size as f64 >= min.value()),
                "a smaller drive",
                "/sys/class/nvme/*/*/size",
            );
        }
        let gen = s.pcie_gen.as_ref().map(|g| g.value() as u32);
        let width = s.pcie_width.as_ref().map(|w| w.value() as u32);
        let dev = d.pci_address.as_deref().and_then(|a| inv.pci.iter().find(|p| p.address == a));
        if let (Some(dev), true) = (dev, gen.is_some() || width.is_some()) {
            pcie_path("nvme", subject.trim(), dev, inv, gen, width, false, c);
        }
    }
}

/// The IOMMU setting on the kernel command line: "pt", "off", "on", or "unset".
pub fn iommu_mode(cmdline: &str) -> String {
    let mut mode = "unset".to_string();
    for word in cmdline.split_whitespace() {
        if let Some(v) = word.strip_prefix("iommu=") {
            mode = v.to_string();
        } else if let Some(v) = word.strip_prefix("intel_iommu=").or_else(|| word.strip_prefix("amd_iommu=")) {
            if mode == "unset" || v == "off" {
                mode = v.to_string();
            }
        }
    }
    mode
}

fn platform(spec: &SkuSpec, inv: &Inventory, c: &mut Checks) {
    let Some(s) = &spec.platform else { return };
    if s.acs_off == Some(true) {
        // Switch ports: bridges below a root port (those with a bridge above them).
        for d in inv.pci.iter().filter(|d| d.class.starts_with("0604") && !d.upstream.is_empty()) {
            let m = match &d.acs {
                Some(a) => Measured::of(format!("ACS control 0x{:04x}", a.control), !a.p2p_redirected),
                None => continue,
            };
            c.add(
                "platform.acs",
                &format!("switch port {}", d.address),
                Severity::Minor,
                "P2P redirect off",
                m,
                "ACS redirects GPU peer-to-peer traffic through the root complex (setpci, or the BIOS)",
                "PCI config space ACS control",
            );
        }
    }
    if !s.iommu.is_empty() {
        let m = inv.os.kernel_cmdline.as_deref().map_or_else(
            || Measured::missing("/proc/cmdline unreadable"),
            |cl| {
                let mode = iommu_mode(cl);
                let ok = s.iommu.contains(&mode);
                Measured::of(mode, ok)
            },
        );
        c.add(
            "platform.iommu",
            "kernel",
            Severity::Minor,
            list(&s.iommu),
            m,
            "IOMMU translation slows GPUDirect RDMA",
            "/proc/cmdline",
        );
    }
    if !s.governors.is_empty() {
        let m = inv.cpu.frequency.governor.as_ref().map_or_else(
            || Measured::missing("no cpufreq governor (a VM, or cpufreq absent)"),
            |g| Measured::of(g, s.governors.contains(g)),
        );
        c.add(
            "platform.governor",
            "CPU",
            Severity::Minor,
            list(&s.governors),
            m,
            "the CPU frequency governor is not as specified",
            "/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor",
        );
    }
    if !s.transparent_hugepages.is_empty() {
        let m = inv.memory.transparent_hugepages.as_ref().map_or_else(
            || Measured::missing("THP setting unreadable"),
            |t| Measured::of(t, s.transparent_hugepages.contains(t)),
        );
        c.add(
            "platform.thp",
            "kernel",
            Severity::Minor,
            list(&s.transparent_hugepages),
            m,
            "transparent huge pages set otherwise",
            "/sys/kernel/mm/transparent_hugepage/enabled",
        );
    }
    if !s.bios.is_empty() {
        let m =
            inv.system.bios.version.as_ref().map_or_else(
                || Measured::missing("BIOS version unreadable"),
                |v| Measured::of(v, matches_any(&s.bios, v)),
            );
        c.add(
            "platform.bios",
            "system",
            Severity::Minor,
            list(&s.bios),
            m,
            "a BIOS version that is not allowed",
            "/sys/class/dmi/id/bios_version",
        );
    }
    if s.bare_metal == Some(true) {
        let v = &inv.os.virtualization;
        let text = if v.is_virtual {
            format!("virtual ({})", v.hypervisor.as_deref().unwrap_or("unknown hypervisor"))
        } else {
            "bare metal".into()
        };
        c.add(
            "platform.bare_metal",
            "system",
            Severity::Major,
            "bare metal",
            Measured::of(text, !v.is_virtual),
            "a virtual machine",
            "CPUID hypervisor flag, DMI",
        );
    }
}

fn software(spec: &SkuSpec, inv: &Inventory, c: &mut Checks) {
    let Some(s) = &spec.software else { return };
    if !s.driver.is_empty() {
        let m = inv.gpus.driver_version.as_ref().map_or_else(
            || Measured::missing("no NVIDIA driver version (NVML unavailable)"),
            |v| Measured::of(v, matches_any(&s.driver, v)),
        );
        c.add(
            "software.driver",
            "NVIDIA driver",
            Severity::Minor,
            list(&s.driver),
            m,
            "a driver version that is not allowed (re-provision the image)",
            "NVML nvmlSystemGetDriverVersion",
        );
    }
    if !s.cuda.is_empty() {
        let m = inv
            .gpus
            .cuda_driver_version
            .as_ref()
            .map_or_else(|| Measured::missing("no CUDA driver version"), |v| Measured::of(v, matches_any(&s.cuda, v)));
        c.add(
            "software.cuda",
            "CUDA driver API",
            Severity::Minor,
            list(&s.cuda),
            m,
            "a CUDA version that is not allowed",
            "NVML nvmlSystemGetCudaDriverVersion",
        );
    }
}

/// The devices the spec sets a link for: (kind, subject, address, generation, width).
fn linked_devices(spec: &SkuSpec, inv: &Inventory) -> Vec<(&'static str, String, String, Option<u32>, Option<u32>)> {
    let q = |g: &Option<crate::spec::units::PcieGen>, w: &Option<crate::spec::units::LinkWidth>| {
        (g.as_ref().map(|g| g.value() as u32), w.as_ref().map(|w| w.value() as u32))
    };
    let mut out = Vec::new();
    if let Some(s) = &spec.gpu {
        let (g, w) = q(&s.pcie_gen, &s.pcie_width);
        for gpu in &inv.gpus.devices {
            if let Some(a) = &gpu.pci_address {
                out.push(("gpu", gpu_subject(gpu), a.clone(), g, w));
            }
        }
    }
    for s in &spec.nics {
        let (g, w) = q(&s.pcie_gen, &s.pcie_width);
        for dev in nic_functions(inv, &s.model) {
            out.push(("nic", format!("NIC {}", dev.address), dev.address.clone(), g, w));
        }
    }
    if let Some(s) = &spec.nvme {
        let (g, w) = q(&s.pcie_gen, &s.pcie_width);
        for d in &inv.nvme {
            if let Some(a) = &d.pci_address {
                out.push(("nvme", format!("{} {a}", d.name), a.clone(), g, w));
            }
        }
    }
    out.retain(|d| d.3.is_some() || d.4.is_some());
    out
}

/// Links read while a benchmark loaded their device: below spec anywhere on the path fails, naming
/// the first degraded port from the root down; more speed or width changes than the spec allows
/// under steady load is a flap and fails.
pub fn links_under_load(spec: &SkuSpec, e: &super::Evidence<'_>, c: &mut Checks) {
    let inv = e.inventory;
    let flaps = spec.health.as_ref().and_then(|h| h.max_link_transitions);
    for (kind, subject, address, gen, width) in linked_devices(spec, inv) {
        let Some(dev) = inv.pci.iter().find(|d| d.address == address) else { continue };
        let path: Vec<&String> = dev.upstream.iter().chain(std::iter::once(&dev.address)).collect();
        let seen = |a: &str| -> Vec<&kiln_inventory::linkwatch::LinkUnderLoad> {
            e.runs.iter().flat_map(|r| r.links.iter()).filter(|l| l.address == a).collect()
        };
        if seen(&address).is_empty() {
            continue;
        }
        let runs: Vec<&str> = {
            let mut v: Vec<&str> = seen(&address).iter().map(|l| l.run.as_str()).collect();
            v.dedup();
            v
        };
        let evidence = format!(
            "sysfs current_link_speed/width at {} Hz during run(s) {}",
            1000 / kiln_inventory::linkwatch::INTERVAL.as_millis(),
            runs.iter().map(|r| kiln_text::short(r)).collect::<Vec<_>>().join(", ")
        );
        // The lowest reading of each link on the path, root first.
        let lows: Vec<(&String, u32, u32, u32, u32)> = path
            .iter()
            .filter_map(|a| {
                let ls = seen(a);
                (!ls.is_empty()).then(|| {
                    let g = ls.iter().map(|l| l.min_gen).min().unwrap_or(0);
                    let w = ls.iter().map(|l| l.min_width).min().unwrap_or(0);
                    let t = ls.iter().map(|l| l.transitions).max().unwrap_or(0);
                    let n = ls.iter().map(|l| l.readings).sum();
                    (*a, g, w, t, n)
                })
            })
            .collect();
        let below = |g: u32, w: u32| gen.is_some_and(|want| g < want) || width.is_some_and(|want| w < want);
        let first_bad = lows.iter().find(|l| below(l.1, l.2));
        let own = lows.iter().find(|l| *l.0 == address).copied();
        let measured = match own {
            Some((_, g, w, _, n)) => format!("lowest Gen{g} x{w} over {n} readings"),
            None => "not read".into(),
        };
        let reason = match first_bad {
            Some((a, g, w, _, _)) if **a == address => format!("the link trained down to Gen{g} x{w} under load"),
            Some((a, g, w, _, _)) => format!("first degraded under load: upstream port {a} at Gen{g} x{w}"),
            None => String::new(),
        };
        let m = Measured::of(measured, first_bad.is_none());
        c.add(
            &format!("{kind}.pcie.under_load"),
            &subject,
            Severity::Major,
            link_text(gen, width),
            m,
            &reason,
            &evidence,
        );
        if let Some(max) = flaps {
            let worst = lows.iter().max_by_key(|l| l.3).copied();
            if let Some((a, _, _, t, _)) = worst {
                let m = Measured::of(format!("{t} change(s) at {a}"), t <= max);
                c.add(
                    &format!("{kind}.pcie.flaps"),
                    &subject,
                    Severity::Major,
                    format!("≤ {max} speed or width changes under load"),
                    m,
                    "the link changes speed under steady load (flapping: a marginal slot, riser or retimer)",
                    &evidence,
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A power limit below the spec's is explained by what it is: another model, a limit lowered
    /// from the board's default, or a board whose default is already lower.
    #[test]
    fn a_low_power_limit_says_why() {
        let spec: crate::spec::GpuSpec = toml::from_str(
            "source = \"s\"\ncount = 8\nmodel = \"NVIDIA H100 80GB HBM3\"\nmin_power_limit = \"700 W\"\n",
        )
        .unwrap();
        let gpu = |name: &str, default: u32, enforced: u32| -> Gpu {
            serde_json::from_value(serde_json::json!({
                "index": 0, "name": name, "pcie": {}, "nvlinks": [],
                "power": {"default_watts": default, "enforced_watts": enforced},
            }))
            .unwrap()
        };
        let other = power_reason(&spec, &gpu("NVIDIA H100 PCIe", 350, 350));
        assert!(other.contains("another model (NVIDIA H100 PCIe") && !other.contains("lowered"), "{other}");
        let lowered = power_reason(&spec, &gpu("NVIDIA H100 80GB HBM3", 700, 500));
        assert!(lowered.contains("lowered from the board's default of 700 W"), "{lowered}");
        let capped = power_reason(&spec, &gpu("NVIDIA H100 80GB HBM3", 650, 650));
        assert!(capped.contains("default limit is 650 W") && !capped.contains("lowered"), "{capped}");
    }
}

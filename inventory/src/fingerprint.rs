//! The two fingerprints: the configuration (what was bought; equal across hosts of one build)
//! and the host identity (this physical box, across reinstalls where the firmware allows).

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::cpu::Cpu;
use super::gpu::Gpus;
use super::memory::Memory;
use super::net::Nic;
use super::nvme::NvmeController;
use super::os::Os;
use super::pci::PciDevice;
use super::smbios::is_placeholder;
use super::system::System;

/// Bumped when the configuration key changes shape, so that old and new fingerprints never collide.
const CONFIG_KEY_VERSION: u32 = 2;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fingerprints {
    /// 16 hex digits of SHA-256 over `config_key`.
    pub config: String,
    /// The configuration for people: "2× AMD EPYC 9654 96-Core Processor · 1.5 TiB".
    pub config_name: String,
    /// What the configuration fingerprint covers, in clear.
    pub config_key: String,
    /// 16 hex digits of SHA-256 over the identity fields; `None` when nothing identifies the box.
    pub host: Option<String>,
    /// Which fields the host identity rests on.
    pub host_basis: Vec<String>,
}

fn short_hash(text: &str) -> String {
    let digest = Sha256::digest(text.as_bytes());
    digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// A processor name without trademarks, clock suffixes or runs of spaces.
pub fn clean_cpu_name(name: &str) -> String {
    let name = name.replace("(R)", "").replace("(r)", "").replace("(TM)", "").replace("(tm)", "");
    let name = match name.find(" @ ") {
        Some(at) => &name[..at],
        None => &name,
    };
    let words: Vec<&str> = name.split_whitespace().filter(|w| *w != "CPU" && *w != "Processor").collect();
    words.join(" ")
}

/// Rounds a kernel's MemTotal up to the size class that was installed: the next 2^k or 1.5·2^k GiB.
pub fn memory_class_bytes(bytes: u64) -> u64 {
    const GIB: u64 = 1 << 30;
    let mut class = GIB / 2;
    loop {
        if class >= bytes {
            return class;
        }
        let mid = class + class / 2;
        if mid >= bytes {
            return mid;
        }
        class *= 2;
    }
}

pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 || value.fract() == 0.0 {
        format!("{value:.0} {}", UNITS[unit])
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// "8× NVIDIA H100 80GB HBM3" style counts of equal names, sorted for a stable key.
fn counted<'a>(names: impl Iterator<Item = &'a str>) -> Vec<(String, usize)> {
    let mut counts: std::collections::BTreeMap<String, usize> = std::collections::BTreeMap::new();
    for name in names {
        *counts.entry(name.to_string()).or_default() += 1;
    }
    counts.into_iter().collect()
}

// One argument per inventory part it reads: the inventory is still being assembled when it runs.
#[allow(clippy::too_many_arguments)]
pub fn compute(
    cpu: &Cpu,
    memory: &Memory,
    system: &System,
    os: &Os,
    gpus: &Gpus,
    pci: &[PciDevice],
    nvme: &[NvmeController],
    nics: &[Nic],
) -> Fingerprints {
    let cpu_name = cpu.model_name.as_deref().map(clean_cpu_name).unwrap_or_else(|| "unknown CPU".to_string());
    let memory_class = match (memory.installed_bytes, memory.total_bytes) {
        (Some(installed), _) if installed > 0 => Some(installed),
        (_, Some(total)) => Some(memory_class_bytes(total)),
        _ => None,
    };
    let memory_text = memory_class.map_or("unknown memory".to_string(), human_bytes);
    // GPUs by NVML name, else (no driver) by PCI address count; drives by model; NICs by driver
    // and speed: what was bought, not how it is configured today.
    let gpu_names = counted(gpus.devices.iter().map(|g| g.name.as_deref().unwrap_or("unknown GPU")));
    // Without a driver, the PCI database names the GPUs.
    let gpu_names = if gpu_names.is_empty() {
        counted(pci.iter().filter(|d| d.is_nvidia_gpu()).map(|d| d.device_name.as_deref().unwrap_or("NVIDIA GPU")))
    } else {
        gpu_names
    };
    let nvme_models = counted(nvme.iter().map(|n| n.model.as_deref().unwrap_or("unknown NVMe")));
    let nic_models =
        counted(nics.iter().filter(|n| !n.virtual_device).map(|n| n.driver.as_deref().unwrap_or("unknown")));
    let list = |items: &[(String, usize)]| items.iter().map(|(n, c)| format!("{c}x{n}")).collect::<Vec<_>>().join(",");
    let config_key = format!(
        "v{CONFIG_KEY_VERSION};arch={};cpu={cpu_name};packages={};cores={};memory_class={};gpus={};nvme={};nics={}",
        cpu.architecture.as_str(),
        cpu.packages,
        cpu.cores,
        memory_class.unwrap_or(0),
        list(&gpu_names),
        list(&nvme_models),
        list(&nic_models),
    );
    let mut config_name = format!("{}× {cpu_name}", cpu.packages);
    for (name, count) in &gpu_names {
        config_name.push_str(&format!(" · {count}× {}", name.trim_start_matches("NVIDIA ")));
    }
    config_name.push_str(&format!(" · {memory_text}"));

    let mut basis = Vec::new();
    let mut parts = Vec::new();
    let dmi = [
        ("dmi.product_uuid", &system.product.uuid),
        ("dmi.product_serial", &system.product.serial),
        ("dmi.board_serial", &system.board.serial),
    ];
    for (name, value) in dmi {
        if let Some(v) = value.as_deref().filter(|v| !is_placeholder(v)) {
            basis.push(name.to_string());
            parts.push(format!("{name}={}", v.to_ascii_lowercase()));
        }
    }
    // GPU serials follow the box too (they are readable without root, unlike DMI serials).
    let mut gpu_serials: Vec<&str> =
        gpus.devices.iter().filter_map(|g| g.serial.as_deref()).filter(|s| !is_placeholder(s)).collect();
    gpu_serials.sort_unstable();
    if !gpu_serials.is_empty() {
        basis.push("gpu_serials".to_string());
        parts.push(format!("gpu_serials={}", gpu_serials.join(",")));
    }
    // Without firmware or GPU serials (VMs, or without root), the OS installation is the next best identity.
    if parts.is_empty() {
        if let Some(id) = os.machine_id.as_deref().filter(|v| !is_placeholder(v)) {
            basis.push("machine_id".to_string());
            parts.push(format!("machine_id={id}"));
        } else if let Some(host) = os.hostname.as_deref().filter(|v| !v.is_empty()) {
            basis.push("hostname".to_string());
            parts.push(format!("hostname={host}"));
        }
    }
    Fingerprints {
        config: short_hash(&config_key),
        config_name,
        config_key,
        host: (!parts.is_empty()).then(|| short_hash(&parts.join(";"))),
        host_basis: basis,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_names() {
        assert_eq!(clean_cpu_name("Intel(R) Xeon(R) CPU E5-2650 0 @ 2.00GHz"), "Intel Xeon E5-2650 0");
        assert_eq!(clean_cpu_name("AMD EPYC 9654 96-Core Processor"), "AMD EPYC 9654 96-Core");
    }

    #[test]
    fn memory_classes() {
        const GIB: u64 = 1 << 30;
        for (total_gib, class_gib) in [(23.4, 24.0), (31.3, 32.0), (2015.0, 2048.0), (755.0, 768.0), (1.9, 2.0)] {
            let total = (total_gib * GIB as f64) as u64;
            assert_eq!(memory_class_bytes(total), (class_gib * GIB as f64) as u64, "{total_gib} GiB");
        }
    }

    #[test]
    fn human() {
        assert_eq!(human_bytes(1536 << 30), "1.5 TiB");
        assert_eq!(human_bytes(24 << 30), "24 GiB");
        assert_eq!(human_bytes(512), "512 B");
    }
}

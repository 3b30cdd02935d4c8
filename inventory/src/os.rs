//! The operating system: kernel, distribution, host name, machine id, boot time, virtualisation,
//! and whether kiln runs with root's rights.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::cpu::Cpu;
use super::source::{ProblemKind, Source};
use super::system::System;
use kiln_text::timefmt::rfc3339;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Distribution {
    pub id: Option<String>,
    pub version_id: Option<String>,
    pub pretty_name: Option<String>,
    pub id_like: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Virtualization {
    pub is_virtual: bool,
    /// The hypervisor's name where something says it ("KVM", "VMware", "Amazon EC2").
    pub hypervisor: Option<String>,
    /// What the conclusion rests on, one entry per clue.
    pub evidence: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Os {
    pub kernel_release: Option<String>,
    pub kernel_version: Option<String>,
    pub kernel_cmdline: Option<String>,
    pub distribution: Option<Distribution>,
    pub hostname: Option<String>,
    pub machine_id: Option<String>,
    pub boot_time: Option<String>,
    pub virtualization: Virtualization,
    /// Whether this kiln process has root's rights (some facts need them).
    pub kiln_is_root: bool,
    /// The loaded kernel modules (`/proc/modules`), by name; `None` where it cannot be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_modules: Option<Vec<String>>,
}

/// Parses `os-release`: `KEY=value` lines, values optionally quoted.
pub fn parse_os_release(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|line| {
            let line = line.trim();
            if line.starts_with('#') {
                return None;
            }
            let (key, value) = line.split_once('=')?;
            let value = value.trim();
            let value = value
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .or_else(|| value.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')))
                .unwrap_or(value);
            Some((key.trim().to_string(), value.replace("\\\"", "\"")))
        })
        .collect()
}

/// Names a hypervisor from DMI strings, as systemd-detect-virt does.
pub fn hypervisor_from_dmi(vendor: &str, product: &str) -> Option<&'static str> {
    let table: [(&str, &str); 11] = [
        ("QEMU", "QEMU"),
        ("KVM", "KVM"),
        ("VMware", "VMware"),
        ("VirtualBox", "VirtualBox"),
        ("innotek GmbH", "VirtualBox"),
        ("Xen", "Xen"),
        ("Microsoft Corporation Virtual Machine", "Hyper-V"),
        ("Amazon EC2", "Amazon EC2"),
        ("Google Compute Engine", "Google Compute Engine"),
        ("OpenStack", "OpenStack"),
        ("Parallels", "Parallels"),
    ];
    let joined = format!("{vendor} {product}");
    table.iter().find(|(needle, _)| joined.contains(needle)).map(|(_, name)| *name)
}

/// The hypervisor vendor from CPUID leaf 0x40000000 on the live machine.
#[cfg(target_arch = "x86_64")]
fn cpuid_hypervisor() -> Option<String> {
    // CPUID exists on every x86_64 processor; leaf 1 ECX bit 31 is the hypervisor bit.
    let leaf1 = std::arch::x86_64::__cpuid(1);
    if leaf1.ecx & (1 << 31) == 0 {
        return None;
    }
    // Leaf 0x40000000 is reserved for hypervisors and harmless to read.
    let leaf = std::arch::x86_64::__cpuid(0x4000_0000);
    let bytes: Vec<u8> = [leaf.ebx, leaf.ecx, leaf.edx].iter().flat_map(|r| r.to_le_bytes()).collect();
    let id = String::from_utf8_lossy(&bytes).trim_matches(char::from(0)).trim().to_string();
    let name = match id.as_str() {
        "KVMKVMKVM" => "KVM",
        "Microsoft Hv" => "Hyper-V",
        "VMwareVMware" => "VMware",
        "XenVMMXenVMM" => "Xen",
        "TCGTCGTCGTCG" => "QEMU (TCG)",
        "ACRNACRNACRN" => "ACRN",
        "bhyve bhyve" => "bhyve",
        "" => return None,
        other => return Some(other.to_string()),
    };
    Some(name.to_string())
}

#[cfg(not(target_arch = "x86_64"))]
fn cpuid_hypervisor() -> Option<String> {
    None
}

fn detect_virtualization(src: &Source, cpu: &Cpu, system: &System) -> Virtualization {
    let mut v = Virtualization::default();
    if cpu.hypervisor_flag {
        v.evidence.push("cpu flag 'hypervisor'".to_string());
    }
    if src.is_live() {
        if let Some(name) = cpuid_hypervisor() {
            v.evidence.push(format!("cpuid hypervisor vendor '{name}'"));
            v.hypervisor = Some(name);
        }
    }
    if let Some(kind) = src.attr("sys/hypervisor/type") {
        v.evidence.push(format!("/sys/hypervisor/type '{kind}'"));
        v.hypervisor.get_or_insert_with(|| if kind == "xen" { "Xen".to_string() } else { kind.clone() });
    }
    let vendor = system.product.vendor.as_deref().unwrap_or("");
    let product = system.product.name.as_deref().unwrap_or("");
    if let Some(name) = hypervisor_from_dmi(vendor, product) {
        v.evidence.push(format!("DMI '{vendor} {product}'"));
        // A cloud's DMI name is more useful than the bare hypervisor (Amazon EC2 rather than KVM).
        v.hypervisor = Some(name.to_string());
    }
    v.is_virtual = !v.evidence.is_empty();
    v
}

pub fn collect(src: &Source, cpu: &Cpu, system: &System) -> Os {
    let release = src
        .read_optional("etc/os-release")
        .or_else(|| src.read_optional("usr/lib/os-release"))
        .map(|t| parse_os_release(&t));
    let distribution = release.map(|r| Distribution {
        id: r.get("ID").cloned(),
        version_id: r.get("VERSION_ID").cloned(),
        pretty_name: r.get("PRETTY_NAME").cloned(),
        id_like: r.get("ID_LIKE").cloned(),
    });
    let boot_time = src.read_optional("proc/stat").and_then(|stat| {
        let line = stat.lines().find_map(|l| l.strip_prefix("btime "))?;
        match line.trim().parse::<i64>() {
            Ok(secs) => Some(rfc3339(secs)),
            Err(_) => {
                src.problem("proc/stat", ProblemKind::Malformed, format!("btime {line:?} is not a number"));
                None
            }
        }
    });
    Os {
        kernel_release: src.attr("proc/sys/kernel/osrelease"),
        kernel_version: src.attr("proc/sys/kernel/version"),
        kernel_cmdline: src.attr("proc/cmdline"),
        distribution,
        hostname: src.attr("proc/sys/kernel/hostname").or_else(|| src.attr("etc/hostname")),
        machine_id: src.attr("etc/machine-id").or_else(|| src.attr("var/lib/dbus/machine-id")),
        boot_time,
        virtualization: detect_virtualization(src, cpu, system),
        // SAFETY: geteuid has no preconditions and cannot fail.
        kiln_is_root: unsafe { libc::geteuid() } == 0,
        kernel_modules: src
            .read_optional("proc/modules")
            .map(|t| t.lines().filter_map(|l| l.split_whitespace().next().map(str::to_string)).collect()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn os_release() {
        let r =
            parse_os_release("# c\nID=debian\nVERSION_ID=\"12\"\nPRETTY_NAME='Debian GNU/Linux 12 (bookworm)'\nbad\n");
        assert_eq!(r["ID"], "debian");
        assert_eq!(r["VERSION_ID"], "12");
        assert_eq!(r["PRETTY_NAME"], "Debian GNU/Linux 12 (bookworm)");
        assert_eq!(r.len(), 3);
    }

    #[test]
    fn dmi_hypervisors() {
        assert_eq!(hypervisor_from_dmi("QEMU", "Standard PC (Q35 + ICH9, 2009)"), Some("QEMU"));
        assert_eq!(hypervisor_from_dmi("Amazon EC2", "m7i.large"), Some("Amazon EC2"));
        assert_eq!(hypervisor_from_dmi("Supermicro", "SYS-821GE-TNHR"), None);
    }
}

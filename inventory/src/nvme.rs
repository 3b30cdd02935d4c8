//! NVMe controllers (`/sys/class/nvme`) and their namespaces, keyed by serial because `nvmeN`
//! numbering is not stable across boots; with root on a live machine, the SMART / health log
//! through the NVMe admin ioctl.

use serde::{Deserialize, Serialize};

use super::pci::{last_pci_address, numa_node_of, parse_numa_node};
use super::source::{ProblemKind, Source};

const NVME_DIR: &str = "sys/class/nvme";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Namespace {
    pub name: String,
    pub size_bytes: Option<u64>,
    pub logical_block_bytes: Option<u32>,
}

/// The SMART / health information log page (log id 0x02).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Smart {
    pub critical_warning: u8,
    pub temperature_celsius: i32,
    pub available_spare_percent: u8,
    pub percentage_used: u8,
    pub media_errors: u64,
    pub unsafe_shutdowns: u64,
    pub power_on_hours: u64,
    pub data_units_written: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvmeController {
    pub name: String,
    pub model: Option<String>,
    pub serial: Option<String>,
    pub firmware: Option<String>,
    pub transport: Option<String>,
    pub state: Option<String>,
    /// The PCI function of a PCIe controller; its link is in the PCI list.
    pub pci_address: Option<String>,
    pub numa_node: Option<u32>,
    pub namespaces: Vec<Namespace>,
    pub smart: Option<Smart>,
}

/// Decodes a 512-byte SMART log page.
pub fn parse_smart(page: &[u8]) -> Option<Smart> {
    if page.len() < 192 {
        return None;
    }
    let le64 = |off: usize| u64::from_le_bytes(page[off..off + 8].try_into().unwrap());
    Some(Smart {
        critical_warning: page[0],
        temperature_celsius: i32::from(u16::from_le_bytes([page[1], page[2]])) - 273,
        available_spare_percent: page[3],
        percentage_used: page[5],
        // The counters are 128-bit; the low 64 bits hold any real value.
        data_units_written: le64(48),
        power_on_hours: le64(128),
        unsafe_shutdowns: le64(144),
        media_errors: le64(160),
    })
}

pub fn collect(src: &Source) -> Vec<NvmeController> {
    let mut out = Vec::new();
    for name in src.list_dir(NVME_DIR) {
        let base = format!("{NVME_DIR}/{name}");
        let attr = |f: &str| src.attr(&format!("{base}/{f}"));
        let pci_address = src.link_target(&format!("{base}/device")).as_deref().and_then(last_pci_address);
        let numa_node = attr("numa_node")
            .as_deref()
            .and_then(parse_numa_node)
            .or_else(|| pci_address.as_deref().and_then(|a| numa_node_of(src, a)));
        let mut namespaces: Vec<Namespace> = src
            .list_dir(&base)
            .into_iter()
            .filter(|n| n.starts_with("nvme") && n.contains('n') && n[4..].contains('n'))
            .map(|ns| {
                let nbase = format!("{base}/{ns}");
                // `size` counts 512-byte sectors whatever the block size.
                let sectors: Option<u64> = src.attr_parse(&format!("{nbase}/size"));
                Namespace {
                    size_bytes: sectors.map(|s| s * 512),
                    logical_block_bytes: src.attr_parse(&format!("{nbase}/queue/logical_block_size")),
                    name: ns,
                }
            })
            .collect();
        namespaces.sort_by(|a, b| a.name.cmp(&b.name));
        let smart = if src.is_live() { read_smart(src, &name) } else { None };
        out.push(NvmeController {
            model: attr("model"),
            serial: attr("serial"),
            firmware: attr("firmware_rev"),
            transport: attr("transport"),
            state: attr("state"),
            pci_address,
            numa_node,
            namespaces,
            smart,
            name,
        });
    }
    if out.is_empty() {
        out = from_block_devices(src);
    }
    // nvmeN numbering is not stable across boots: order (and key) drives by serial.
    out.sort_by(|a, b| a.serial.cmp(&b.serial).then_with(|| a.name.cmp(&b.name)));
    out
}

/// Kernels before /sys/class/nvme (3.x) show only the block devices: each `nvmeXnY` is a
/// namespace of controller `nvmeX`, found on PCI through its sysfs link.
fn from_block_devices(src: &Source) -> Vec<NvmeController> {
    let mut out: Vec<NvmeController> = Vec::new();
    for ns in src.list_dir("sys/class/block") {
        let Some(rest) = ns.strip_prefix("nvme") else { continue };
        let Some((ctrl, nsid)) = rest.split_once('n') else { continue };
        if ctrl.parse::<u32>().is_err() || nsid.parse::<u32>().is_err() {
            continue; // a partition (nvme0n1p1)
        }
        let rel = format!("sys/class/block/{ns}");
        let pci_address = src.link_target(&rel).as_deref().and_then(last_pci_address);
        let namespace = Namespace {
            size_bytes: src.attr_parse::<u64>(&format!("{rel}/size")).map(|s| s * 512),
            logical_block_bytes: src.attr_parse(&format!("{rel}/queue/logical_block_size")),
            name: ns.clone(),
        };
        let name = format!("nvme{ctrl}");
        match out.iter_mut().find(|c| c.name == name) {
            Some(c) => c.namespaces.push(namespace),
            None => out.push(NvmeController {
                numa_node: pci_address.as_deref().and_then(|a| numa_node_of(src, a)),
                model: None,
                serial: None,
                firmware: None,
                transport: Some("pcie".to_string()).filter(|_| pci_address.is_some()),
                state: None,
                pci_address,
                namespaces: vec![namespace],
                smart: None,
                name,
            }),
        }
    }
    out
}

#[cfg(target_os = "linux")]
fn read_smart(src: &Source, name: &str) -> Option<Smart> {
    use std::os::fd::AsRawFd;

    #[repr(C)]
    #[derive(Default)]
    struct PassthruCmd {
        opcode: u8,
        flags: u8,
        rsvd1: u16,
        nsid: u32,
        cdw2: u32,
        cdw3: u32,
        metadata: u64,
        addr: u64,
        metadata_len: u32,
        data_len: u32,
        cdw10: u32,
        cdw11: u32,
        cdw12: u32,
        cdw13: u32,
        cdw14: u32,
        cdw15: u32,
        timeout_ms: u32,
        result: u32,
    }
    // _IOWR('N', 0x41, struct nvme_admin_cmd), 72 bytes.
    const NVME_IOCTL_ADMIN_CMD: libc::c_ulong = 0xC048_4E41;
    let dev = format!("/dev/{name}");
    let file = match std::fs::File::open(&dev) {
        Ok(f) => f,
        Err(e) => {
            let (kind, why) = if e.kind() == std::io::ErrorKind::PermissionDenied {
                (ProblemKind::PermissionDenied, "the SMART log needs root".to_string())
            } else {
                (ProblemKind::Unreadable, format!("cannot open for the SMART log: {e}"))
            };
            src.problem(&format!("dev/{name}"), kind, why);
            return None;
        }
    };
    let mut page = [0u8; 512];
    let mut cmd = PassthruCmd {
        opcode: 0x02, // Get Log Page
        nsid: 0xffff_ffff,
        addr: page.as_mut_ptr() as u64,
        data_len: page.len() as u32,
        cdw10: (((page.len() / 4 - 1) as u32) << 16) | 0x02, // dwords - 1, log id 2 (SMART)
        timeout_ms: 2000,
        ..Default::default()
    };
    // SAFETY: cmd is the kernel's nvme_passthru_cmd layout; addr points at a live 512-byte buffer.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), NVME_IOCTL_ADMIN_CMD as _, &mut cmd) };
    if rc != 0 {
        src.problem(
            &format!("dev/{name}"),
            ProblemKind::Unreadable,
            format!("SMART log: {}", std::io::Error::last_os_error()),
        );
        return None;
    }
    parse_smart(&page)
}

#[cfg(not(target_os = "linux"))]
fn read_smart(_: &Source, _: &str) -> Option<Smart> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smart_page() {
        let mut page = [0u8; 512];
        page[0] = 0x04;
        page[1..3].copy_from_slice(&313u16.to_le_bytes()); // 40 °C
        page[3] = 100;
        page[5] = 7;
        page[128..136].copy_from_slice(&12_345u64.to_le_bytes());
        page[144..152].copy_from_slice(&9u64.to_le_bytes());
        page[160..168].copy_from_slice(&2u64.to_le_bytes());
        let s = parse_smart(&page).unwrap();
        assert_eq!((s.critical_warning, s.temperature_celsius, s.percentage_used), (4, 40, 7));
        assert_eq!((s.power_on_hours, s.unsafe_shutdowns, s.media_errors), (12_345, 9, 2));
        assert_eq!(parse_smart(&page[..100]), None);
    }
}

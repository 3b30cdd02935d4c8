//! Every PCI function under `/sys/bus/pci/devices`: identity and names, driver, NUMA placement,
//! IOMMU group, link speed and width (current and maximum) with the chain of upstream bridges,
//! SR-IOV, and where readable the AER counters and the ACS capability.

use serde::{Deserialize, Serialize};

use super::pciids::PciIds;
use super::source::Source;

const PCI_DIR: &str = "sys/bus/pci/devices";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PciLink {
    pub current_speed_gts: Option<f64>,
    pub current_width: Option<u32>,
    pub max_speed_gts: Option<f64>,
    pub max_width: Option<u32>,
    /// PCIe generation of each speed (2.5 GT/s = 1 … 64 GT/s = 6).
    pub current_gen: Option<u32>,
    pub max_gen: Option<u32>,
    /// Trained below what both ends support (width or speed). GPUs lower their speed at idle, so a
    /// verdict reads this under load.
    pub degraded: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sriov {
    pub total_vfs: u32,
    pub enabled_vfs: u32,
}

/// Totals of the PCIe Advanced Error Reporting counters since boot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Aer {
    pub correctable: Option<u64>,
    pub nonfatal: Option<u64>,
    pub fatal: Option<u64>,
}

/// Access Control Services capability and control registers (bridges and switch ports).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Acs {
    pub capability: u16,
    pub control: u16,
    /// P2P Request Redirect is on: peer-to-peer traffic goes up to the root complex (slow GPUDirect).
    pub p2p_redirected: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PciDevice {
    /// domain:bus:device.function, as the kernel names it.
    pub address: String,
    /// Four hex digits; `None` only where neither sysfs nor config space says.
    pub vendor_id: Option<String>,
    pub device_id: Option<String>,
    pub subsystem_vendor_id: Option<String>,
    pub subsystem_device_id: Option<String>,
    pub vendor_name: Option<String>,
    pub device_name: Option<String>,
    pub subsystem_name: Option<String>,
    /// Class and subclass as four hex digits ("0302"), and the programming interface.
    pub class: String,
    pub prog_if: String,
    /// What the function is: the subclass's name ("PCI bridge", "USB controller").
    pub class_name: Option<String>,
    /// How it is programmed, where pci.ids names it ("Normal decode", "UHCI", "NVM Express").
    pub prog_if_name: Option<String>,
    pub revision: Option<String>,
    pub driver: Option<String>,
    pub numa_node: Option<u32>,
    pub local_cpus: Option<String>,
    pub iommu_group: Option<u32>,
    pub link: Option<PciLink>,
    /// The host bridge ("pci0000:00") the device hangs from.
    pub host_bridge: Option<String>,
    /// The bridges and switch ports above the device, from the root port down to its parent.
    pub upstream: Vec<String>,
    pub sriov: Option<Sriov>,
    /// For a virtual function, its physical function.
    pub physfn: Option<String>,
    pub aer: Option<Aer>,
    pub acs: Option<Acs>,
}

impl PciDevice {
    pub fn vendor(&self) -> u16 {
        self.vendor_id.as_deref().and_then(|v| u16::from_str_radix(v, 16).ok()).unwrap_or(0)
    }
    pub fn device(&self) -> u16 {
        self.device_id.as_deref().and_then(|d| u16::from_str_radix(d, 16).ok()).unwrap_or(0)
    }
    pub fn is_bridge(&self) -> bool {
        self.class == "0604"
    }
    /// NVIDIA display or 3D controllers: the GPUs.
    pub fn is_nvidia_gpu(&self) -> bool {
        self.vendor() == 0x10de && (self.class == "0300" || self.class == "0302")
    }
    pub fn is_nvswitch(&self) -> bool {
        self.vendor() == 0x10de
            && (self.class == "0680" || self.device_name.as_deref().is_some_and(|n| n.contains("NVSwitch")))
    }
}

/// "32.0 GT/s PCIe" or "8 GT/s" -> 32.0, 8.0; "Unknown" -> None.
pub fn parse_link_speed(text: &str) -> Option<f64> {
    let value: f64 = text.split_whitespace().next()?.parse().ok()?;
    (value > 0.0).then_some(value)
}

pub fn pcie_gen(speed_gts: f64) -> Option<u32> {
    [(2.5, 1), (5.0, 2), (8.0, 3), (16.0, 4), (32.0, 5), (64.0, 6), (128.0, 7)]
        .iter()
        .find(|(s, _)| (speed_gts - s).abs() < 0.01)
        .map(|(_, g)| *g)
}

/// The `TOTAL_ERR_*` line of an `aer_dev_*` file.
pub fn parse_aer_total(text: &str) -> Option<u64> {
    text.lines().find(|l| l.starts_with("TOTAL_ERR")).and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
}

/// Finds the ACS extended capability (id 0x000d) in a config-space dump. Only root reads past
/// the first 64 bytes, so for others this finds nothing.
pub fn parse_acs(config: &[u8]) -> Option<Acs> {
    find_acs(|off| {
        let b = config.get(off..off + 4)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    })
}

/// Walks the extended capability list through `dword(offset)`. Reading config space is slow in
/// a VM (every dword traps to the hypervisor), so the live reader fetches only the dwords walked.
pub fn find_acs(dword: impl Fn(usize) -> Option<u32>) -> Option<Acs> {
    let mut offset = 0x100;
    for _ in 0..64 {
        let header = dword(offset)?;
        if header == 0 || header == 0xffff_ffff {
            return None;
        }
        if header & 0xffff == 0x000d {
            let regs = dword(offset + 4)?;
            let (capability, control) = (regs as u16, (regs >> 16) as u16);
            // Control bit 2 is P2P Request Redirect.
            return Some(Acs { capability, control, p2p_redirected: control & 0b100 != 0 });
        }
        let next = (header >> 20) as usize;
        if next < 0x100 {
            return None;
        }
        offset = next;
    }
    None
}

/// Looks like a PCI address: `0000:00:01.0` (domains may have more digits).
pub fn is_pci_address(s: &str) -> bool {
    let Some((rest, func)) = s.rsplit_once('.') else { return false };
    let parts: Vec<&str> = rest.split(':').collect();
    parts.len() == 3
        && func.len() == 1
        && parts.iter().all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_hexdigit()))
        && parts[1].len() == 2
        && parts[2].len() == 2
}

/// The nearest PCI function in a sysfs link target: its last PCI-address component
/// (`../../devices/pci0000:00/0000:00:03.0/virtio2/net/eth0` -> `0000:00:03.0`).
pub fn last_pci_address(target: &std::path::Path) -> Option<String> {
    target.components().filter_map(|c| c.as_os_str().to_str()).rfind(|c| is_pci_address(c)).map(str::to_string)
}

/// A sysfs `numa_node` value; -1 (no affinity) and garbage are `None`.
pub fn parse_numa_node(text: &str) -> Option<u32> {
    text.trim().parse::<i64>().ok().filter(|&n| n >= 0).and_then(|n| u32::try_from(n).ok())
}

/// The NUMA node of a PCI function.
pub fn numa_node_of(src: &Source, address: &str) -> Option<u32> {
    src.attr_with(&format!("{PCI_DIR}/{address}/numa_node"), "a NUMA node", &["-1"], parse_numa_node)
}

/// What a PCI function's `uevent` file says: its ids, class and driver in one read, where the
/// separate attribute files take six.
#[derive(Debug, Default, PartialEq)]
pub struct Uevent {
    pub driver: Option<String>,
    /// Six hex digits, lower case.
    pub class: Option<String>,
    pub vendor: Option<String>,
    pub device: Option<String>,
    pub subsystem_vendor: Option<String>,
    pub subsystem_device: Option<String>,
}

pub fn parse_uevent(text: &str) -> Uevent {
    let mut u = Uevent::default();
    let pair = |v: &str| -> Option<(String, String)> {
        let (a, b) = v.split_once(':')?;
        let ok = |x: &str| x.len() == 4 && x.chars().all(|c| c.is_ascii_hexdigit());
        (ok(a) && ok(b)).then(|| (a.to_ascii_lowercase(), b.to_ascii_lowercase()))
    };
    for line in text.lines() {
        let Some((key, value)) = line.split_once('=') else { continue };
        match key {
            "DRIVER" if !value.is_empty() => u.driver = Some(value.to_string()),
            "PCI_CLASS" if value.len() <= 6 && value.chars().all(|c| c.is_ascii_hexdigit()) => {
                u.class = Some(format!("{:0>6}", value.to_ascii_lowercase()));
            }
            "PCI_ID" => (u.vendor, u.device) = pair(value).unzip(),
            "PCI_SUBSYS_ID" => (u.subsystem_vendor, u.subsystem_device) = pair(value).unzip(),
            _ => {}
        }
    }
    u
}

fn hex_attr(src: &Source, rel: &str) -> Option<String> {
    let text = src.attr(rel)?;
    Some(text.trim_start_matches("0x").to_ascii_lowercase())
}

pub fn collect(src: &Source) -> Vec<PciDevice> {
    let addresses: Vec<String> = src.list_dir(PCI_DIR).into_iter().filter(|a| is_pci_address(a)).collect();
    if addresses.is_empty() {
        return Vec::new();
    }
    let ids = PciIds::get();
    let mut devices: Vec<PciDevice> = addresses.iter().map(|a| read_device(src, ids, a)).collect();
    devices.sort_by(|a, b| a.address.cmp(&b.address));
    devices
}

/// The device's link status: current and maximum speed and width, and whether it trained down.
fn read_link(src: &Source, base: &str) -> Option<PciLink> {
    // The kernel writes "Unknown" for a speed it cannot tell and 0 for a width without a link.
    let speed = |name: &str| {
        src.attr_with(
            &format!("{base}/{name}"),
            "a link speed (32.0 GT/s PCIe)",
            &["Unknown", "Unknown speed"],
            parse_link_speed,
        )
    };
    let width = |name: &str| {
        src.attr_with(&format!("{base}/{name}"), "a link width (1 to 32)", &["0"], |s| {
            s.parse::<u32>().ok().filter(|&w| w > 0 && w <= 32)
        })
    };
    // The kernel gives the four files to PCI Express functions only: with neither speed file
    // there is no link to read (a conventional PCI function, most of a VM's).
    if !src.exists(&format!("{base}/current_link_speed")) && !src.exists(&format!("{base}/max_link_speed")) {
        return None;
    }
    let current_speed = speed("current_link_speed");
    let max_speed = speed("max_link_speed");
    let current_width = width("current_link_width");
    let max_width = width("max_link_width");
    (current_speed.is_some() || current_width.is_some() || max_speed.is_some()).then(|| PciLink {
        current_gen: current_speed.and_then(pcie_gen),
        max_gen: max_speed.and_then(pcie_gen),
        degraded: matches!((current_width, max_width), (Some(c), Some(m)) if c < m)
            || matches!((current_speed, max_speed), (Some(c), Some(m)) if c + 0.01 < m),
        current_speed_gts: current_speed,
        current_width,
        max_speed_gts: max_speed,
        max_width,
    })
}

/// The ACS capability of a bridge, from its config space. Quiet on failure: without root only the
/// first 64 bytes read, and they never hold ACS.
fn read_acs(src: &Source, base: &str) -> Option<Acs> {
    let f = src.open(&format!("{base}/config")).ok()?;
    use std::os::unix::fs::FileExt;
    find_acs(|off| {
        let mut b = [0u8; 4];
        f.read_exact_at(&mut b, off as u64).ok()?;
        Some(u32::from_le_bytes(b))
    })
}

fn read_device(src: &Source, ids: &PciIds, address: &str) -> PciDevice {
    let base = format!("{PCI_DIR}/{address}");
    let uevent = src.read_optional(&format!("{base}/uevent")).map(|t| parse_uevent(&t));
    let from_uevent = |field: fn(&Uevent) -> &Option<String>| uevent.as_ref().and_then(|u| field(u).clone());
    let vendor_attr = from_uevent(|u| &u.vendor).or_else(|| hex_attr(src, &format!("{base}/vendor")));
    let device_attr = from_uevent(|u| &u.device).or_else(|| hex_attr(src, &format!("{base}/device")));
    let revision_attr = hex_attr(src, &format!("{base}/revision"));
    // Old kernels lack some attributes; the standard header (first 64 bytes of config space,
    // readable by anyone) has them all. Read it only then: config reads are slow in VMs.
    let complete = vendor_attr.is_some() && device_attr.is_some() && revision_attr.is_some();
    let header = if complete { None } else { read_config(src, &base, 0, 64).filter(|c| c.len() >= 0x30) };
    let from_header = |off: usize, len: usize| -> Option<String> {
        let h = header.as_ref()?;
        Some(match len {
            1 => format!("{:02x}", h[off]),
            _ => format!("{:04x}", u16::from_le_bytes([h[off], h[off + 1]])),
        })
    };
    let vendor_id = vendor_attr.or_else(|| from_header(0, 2));
    let device_id = device_attr.or_else(|| from_header(2, 2));
    // Subsystem ids live at 0x2c only in type-0 (endpoint) headers.
    let endpoint = header.as_ref().is_some_and(|h| h[0x0e] & 0x7f == 0);
    let sub_vendor = from_uevent(|u| &u.subsystem_vendor)
        .or_else(|| hex_attr(src, &format!("{base}/subsystem_vendor")))
        .or_else(|| from_header(0x2c, 2).filter(|_| endpoint));
    let sub_device = from_uevent(|u| &u.subsystem_device)
        .or_else(|| hex_attr(src, &format!("{base}/subsystem_device")))
        .or_else(|| from_header(0x2e, 2).filter(|_| endpoint));
    let class_raw = from_uevent(|u| &u.class).or_else(|| hex_attr(src, &format!("{base}/class"))).unwrap_or_default();
    let class_raw = format!("{class_raw:0>6}");
    let (class, prog_if) = (class_raw[..4].to_string(), class_raw[4..6].to_string());
    let h16 = |s: &str| u16::from_str_radix(s, 16).ok();
    let h8 = |s: &str| u8::from_str_radix(s, 16).ok();
    let (v, d) = (vendor_id.as_deref().and_then(h16), device_id.as_deref().and_then(h16));
    let vendor_name = v.and_then(|v| ids.vendor(v)).map(str::to_string);
    let device_name = v.zip(d).and_then(|(v, d)| ids.device(v, d)).map(str::to_string);
    let subsystem_name = match (v, d, sub_vendor.as_deref().and_then(h16), sub_device.as_deref().and_then(h16)) {
        (Some(v), Some(d), Some(sv), Some(sd)) => ids.subsystem(v, d, sv, sd).map(str::to_string),
        _ => None,
    };
    let (class_name, prog_if_name) = match (h8(&class[..2]), h8(&class[2..]), h8(&prog_if)) {
        (Some(c), Some(s), Some(p)) => {
            let (class_name, prog_if_name) = ids.class(c, s, p);
            (class_name.map(str::to_string), prog_if_name.map(str::to_string))
        }
        _ => (None, None),
    };

    let link = read_link(src, &base);

    // The device's sysfs link, e.g. ../../../devices/pci0000:00/0000:00:01.0/0000:01:00.0,
    // names every bridge above it.
    let (host_bridge, upstream) = match src.link_target(&base) {
        Some(target) => {
            let parts: Vec<String> =
                target.components().filter_map(|c| c.as_os_str().to_str().map(str::to_string)).collect();
            let host = parts.iter().find(|p| p.starts_with("pci") && p.contains(':')).cloned();
            let chain: Vec<String> = parts.into_iter().filter(|p| is_pci_address(p) && p != address).collect();
            (host, chain)
        }
        None => (None, Vec::new()),
    };

    let count = |name: &str| src.attr_with(&format!("{base}/{name}"), "a number", &[], |t| t.parse::<u32>().ok());
    let sriov = count("sriov_totalvfs")
        .filter(|&t| t > 0)
        .map(|total_vfs| Sriov { total_vfs, enabled_vfs: count("sriov_numvfs").unwrap_or(0) });
    let aer_total = |name: &str| {
        let rel = format!("{base}/{name}");
        let total = src.read_optional(&rel).map(|t| parse_aer_total(&t))?;
        if total.is_none() {
            src.problem(&rel, super::ProblemKind::Malformed, "no TOTAL_ERR_* line");
        }
        total
    };
    let aer = src.exists(&format!("{base}/aer_dev_correctable")).then(|| Aer {
        correctable: aer_total("aer_dev_correctable"),
        nonfatal: aer_total("aer_dev_nonfatal"),
        fatal: aer_total("aer_dev_fatal"),
    });
    let acs = if class == "0604" { read_acs(src, &base) } else { None };

    PciDevice {
        address: address.to_string(),
        vendor_id,
        device_id,
        subsystem_vendor_id: sub_vendor,
        subsystem_device_id: sub_device,
        vendor_name,
        device_name,
        subsystem_name,
        class,
        prog_if,
        class_name,
        prog_if_name,
        revision: revision_attr.or_else(|| from_header(8, 1)),
        // The uevent names the bound driver; without one the link is the only word.
        driver: match uevent {
            Some(u) => u.driver,
            None => src.link_name(&format!("{base}/driver")),
        },
        numa_node: numa_node_of(src, address),
        local_cpus: local_cpus(src, &base),
        iommu_group: src.link_name(&format!("{base}/iommu_group")).and_then(|g| g.parse().ok()),
        link,
        host_bridge,
        upstream,
        sriov,
        physfn: src.link_name(&format!("{base}/physfn")),
        aer,
        acs,
    }
}

/// The CPUs near a device: the mask file `local_cpus`, which every kernel has and hwloc reads
/// (where it and `local_cpulist` disagree, as in a hand-edited snapshot, hwloc follows the mask),
/// else `local_cpulist`.
fn local_cpus(src: &Source, base: &str) -> Option<String> {
    use super::cpulist::{format_list, parse_list, parse_mask};
    let mask = src.attr_with(&format!("{base}/local_cpus"), "a CPU mask", &[], parse_mask);
    let cpus = mask.or_else(|| src.attr_with(&format!("{base}/local_cpulist"), "a CPU list", &[], parse_list))?;
    Some(format_list(&cpus))
}

fn read_config(src: &Source, base: &str, offset: u64, len: usize) -> Option<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let file = src.open(&format!("{base}/config")).ok()?;
    let mut buf = vec![0u8; len];
    let n = file.read_at(&mut buf, offset).ok()?;
    buf.truncate(n);
    Some(buf)
}

/// The first link on the path from the root port down to `address` (inclusive) that trained
/// below its capability: a GPU at x16 behind a switch port at x8 is still slow.
pub fn degraded_on_path<'a>(devices: &'a [PciDevice], address: &str) -> Vec<&'a PciDevice> {
    let Some(dev) = devices.iter().find(|d| d.address == address) else { return Vec::new() };
    dev.upstream
        .iter()
        .filter_map(|a| devices.iter().find(|d| &d.address == a))
        .chain(std::iter::once(dev))
        .filter(|d| d.link.as_ref().is_some_and(|l| l.degraded))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_speeds() {
        assert_eq!(parse_link_speed("32.0 GT/s PCIe"), Some(32.0));
        assert_eq!(parse_link_speed("2.5 GT/s"), Some(2.5));
        assert_eq!(parse_link_speed("Unknown"), None);
        assert_eq!(parse_link_speed("0 GT/s"), None);
        assert_eq!(pcie_gen(16.0), Some(4));
        assert_eq!(pcie_gen(3.0), None);
    }

    #[test]
    fn addresses() {
        assert!(is_pci_address("0000:00:01.0"));
        assert!(is_pci_address("10000:e1:00.7"));
        assert!(!is_pci_address("pci0000:00"));
        assert!(!is_pci_address("virtio2"));
        assert!(!is_pci_address("0000:00:01"));
    }

    #[test]
    fn parents_and_nodes() {
        let p = std::path::Path::new("../../devices/pci0000:00/0000:00:03.0/virtio2/net/eth0");
        assert_eq!(last_pci_address(p).as_deref(), Some("0000:00:03.0"));
        assert_eq!(last_pci_address(std::path::Path::new("../../devices/virtual/net/lo")), None);
        assert_eq!(parse_numa_node("1\n"), Some(1));
        assert_eq!(parse_numa_node("-1"), None);
        assert_eq!(parse_numa_node("x"), None);
    }

    #[test]
    fn uevent_fields() {
        let u = parse_uevent(
            "DRIVER=nvidia\nPCI_CLASS=30200\nPCI_ID=10DE:2330\nPCI_SUBSYS_ID=10DE:16C1\nPCI_SLOT_NAME=0000:18:00.0\n",
        );
        assert_eq!(u.driver.as_deref(), Some("nvidia"));
        assert_eq!(u.class.as_deref(), Some("030200"));
        assert_eq!((u.vendor.as_deref(), u.device.as_deref()), (Some("10de"), Some("2330")));
        assert_eq!((u.subsystem_vendor.as_deref(), u.subsystem_device.as_deref()), (Some("10de"), Some("16c1")));
        let unbound = parse_uevent("PCI_CLASS=60400\nPCI_ID=8086:zzzz\n");
        assert!(unbound.driver.is_none() && unbound.vendor.is_none());
    }

    #[test]
    fn aer_totals() {
        assert_eq!(parse_aer_total("RxErr 3\nBadTLP 1\nTOTAL_ERR_COR 4\n"), Some(4));
        assert_eq!(parse_aer_total("Undefined 0\nTOTAL_ERR_FATAL 0\n"), Some(0));
        assert_eq!(parse_aer_total("garbage"), None);
    }

    #[test]
    fn acs_capability() {
        let mut config = vec![0u8; 4096];
        // Extended capability list: AER (0x0001) at 0x100 -> ACS (0x000d) at 0x148.
        config[0x100..0x104].copy_from_slice(&(0x0001u32 | (1 << 16) | (0x148 << 20)).to_le_bytes());
        config[0x148..0x14c].copy_from_slice(&(0x000du32 | (1 << 16)).to_le_bytes());
        config[0x14c..0x150].copy_from_slice(&(0x005fu32 | (0x001d << 16)).to_le_bytes());
        let acs = parse_acs(&config).unwrap();
        assert_eq!((acs.capability, acs.control), (0x5f, 0x1d));
        assert!(acs.p2p_redirected);
        assert_eq!(parse_acs(&config[..64]), None);
    }
}

//! Network interfaces (`/sys/class/net`): physical ones by default, virtual ones on request.
//! Each resolves to its PCI function, walking up from virtio and similar intermediate devices.

use serde::{Deserialize, Serialize};

use super::pci::{last_pci_address, numa_node_of};
use super::source::Source;

const NET_DIR: &str = "sys/class/net";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Nic {
    pub name: String,
    pub driver: Option<String>,
    pub driver_version: Option<String>,
    pub firmware_version: Option<String>,
    pub mac: Option<String>,
    pub mtu: Option<u32>,
    pub operstate: Option<String>,
    /// Megabits per second; `None` when the link is down or the driver does not say.
    pub speed_mbps: Option<u32>,
    pub duplex: Option<String>,
    /// "ethernet", "infiniband", "loopback" or the ARPHRD number.
    pub link_type: String,
    pub virtual_device: bool,
    pub pci_address: Option<String>,
    pub numa_node: Option<u32>,
    pub sriov_total_vfs: Option<u32>,
    pub sriov_enabled_vfs: Option<u32>,
}

fn link_type(code: Option<u32>) -> String {
    match code {
        Some(1) => "ethernet".into(),
        Some(32) => "infiniband".into(),
        Some(772) => "loopback".into(),
        Some(other) => format!("arphrd {other}"),
        None => "unknown".into(),
    }
}

pub fn collect(src: &Source, include_virtual: bool) -> Vec<Nic> {
    let mut out = Vec::new();
    for name in src.list_dir(NET_DIR) {
        let base = format!("{NET_DIR}/{name}");
        let target = src.link_target(&base);
        let virtual_device = target.as_ref().is_some_and(|t| t.components().any(|c| c.as_os_str() == "virtual"))
            || !src.exists(&format!("{base}/device"));
        if virtual_device && !include_virtual {
            continue;
        }
        // The nearest PCI function above the interface (a virtio NIC sits on virtioN, under PCI).
        let pci_address = target.as_deref().and_then(last_pci_address);
        let attr = |f: &str| src.attr(&format!("{base}/{f}"));
        let number = |rel: String| src.attr_with(&rel, "a number", &[], |t| t.parse::<u32>().ok());
        let pci_number = |f: &str| pci_address.as_ref().and_then(|a| number(format!("sys/bus/pci/devices/{a}/{f}")));
        let (driver_version, firmware_version) = if src.is_live() { ethtool_driver_info(&name) } else { (None, None) };
        out.push(Nic {
            driver: src.link_name(&format!("{base}/device/driver")),
            driver_version,
            firmware_version,
            mac: attr("address").filter(|m| m != "00:00:00:00:00:00"),
            mtu: number(format!("{base}/mtu")),
            operstate: attr("operstate"),
            // Reading speed of a down link fails with EINVAL: that is "unknown", not a problem.
            speed_mbps: src
                .open(&format!("{base}/speed"))
                .and_then(std::io::read_to_string)
                .ok()
                .and_then(|s| s.trim().parse::<i64>().ok())
                .filter(|&s| s > 0)
                .map(|s| s as u32),
            duplex: src
                .open(&format!("{base}/duplex"))
                .and_then(std::io::read_to_string)
                .ok()
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty() && s != "unknown"),
            link_type: link_type(src.attr_with(&format!("{base}/type"), "an ARPHRD number", &[], |t| t.parse().ok())),
            virtual_device,
            numa_node: pci_address.as_deref().and_then(|a| numa_node_of(src, a)),
            sriov_total_vfs: pci_number("sriov_totalvfs"),
            sriov_enabled_vfs: pci_number("sriov_numvfs"),
            pci_address,
            name,
        });
    }
    out
}

/// Driver version and firmware version through the ethtool ioctl (no root needed for this one).
#[cfg(target_os = "linux")]
fn ethtool_driver_info(name: &str) -> (Option<String>, Option<String>) {
    #[repr(C)]
    struct DrvInfo {
        cmd: u32,
        driver: [u8; 32],
        version: [u8; 32],
        fw_version: [u8; 32],
        bus_info: [u8; 32],
        erom_version: [u8; 32],
        reserved2: [u8; 12],
        n_priv_flags: u32,
        n_stats: u32,
        testinfo_len: u32,
        eedump_len: u32,
        regdump_len: u32,
    }
    #[repr(C)]
    struct IfReq {
        name: [u8; 16],
        data: *mut DrvInfo,
        _pad: [u8; 16],
    }
    const SIOCETHTOOL: libc::c_ulong = 0x8946;
    const ETHTOOL_GDRVINFO: u32 = 0x3;
    if name.len() >= 16 {
        return (None, None);
    }
    // SAFETY: plain socket/ioctl calls on zero-initialised, correctly laid-out structs; the
    // socket is closed before returning.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0);
        if fd < 0 {
            return (None, None);
        }
        let mut info: DrvInfo = std::mem::zeroed();
        info.cmd = ETHTOOL_GDRVINFO;
        let mut req = IfReq { name: [0; 16], data: &mut info, _pad: [0; 16] };
        req.name[..name.len()].copy_from_slice(name.as_bytes());
        let rc = libc::ioctl(fd, SIOCETHTOOL as _, &mut req);
        libc::close(fd);
        if rc != 0 {
            return (None, None);
        }
        let text = |b: &[u8]| {
            let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
            let s = String::from_utf8_lossy(&b[..end]).trim().to_string();
            (!s.is_empty() && s != "N/A").then_some(s)
        };
        (text(&info.version), text(&info.fw_version))
    }
}

#[cfg(not(target_os = "linux"))]
fn ethtool_driver_info(_: &str) -> (Option<String>, Option<String>) {
    (None, None)
}

//! RDMA devices (`/sys/class/infiniband`): InfiniBand HCAs and RoCE NICs, with their ports.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::pci::last_pci_address;
use super::source::Source;

const IB_DIR: &str = "sys/class/infiniband";

/// The kernel's port error counters (`ports/N/counters/<name>`, the IBA PortCounters attribute),
/// by their file names: each counts since the driver loaded or the counters were last cleared.
pub const ERROR_COUNTERS: [&str; 12] = [
    "symbol_error",
    "link_error_recovery",
    "link_downed",
    "port_rcv_errors",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "port_xmit_discards",
    "port_xmit_constraint_errors",
    "port_rcv_constraint_errors",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
    "VL15_dropped",
];

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RdmaPort {
    pub port: u32,
    /// "ACTIVE", "DOWN", "INIT", "ARMED".
    pub state: Option<String>,
    /// "LinkUp", "Polling", "Disabled", ...
    pub physical_state: Option<String>,
    pub rate_gbps: Option<f64>,
    /// The rate as the kernel says it ("400 Gb/sec (4X NDR)").
    pub rate: Option<String>,
    /// "InfiniBand" or "Ethernet" (RoCE).
    pub link_layer: Option<String>,
    pub lid: Option<String>,
    pub sm_lid: Option<String>,
    pub gid: Option<String>,
    /// The network interface this port maps to, where the kernel says.
    pub netdev: Option<String>,
    /// The link width from the rate ("4X"; absent in documents from before it was read).
    #[serde(default)]
    pub width: Option<String>,
    /// The [`ERROR_COUNTERS`] the kernel exposes for this port, by name.
    #[serde(default)]
    pub counters: BTreeMap<String, u64>,
    /// The port's partition keys that are set (not 0x0000), as the kernel writes them ("0xffff");
    /// `None` where the table is not readable.
    #[serde(default)]
    pub pkeys: Option<Vec<String>>,
}

/// "400 Gb/sec (4X NDR)" -> "4X".
pub fn width_of_rate(rate: &str) -> Option<String> {
    let inner = rate.split_once('(')?.1;
    let w = inner.split_whitespace().next()?.trim_end_matches(')');
    (w.ends_with('X') && w[..w.len() - 1].parse::<u32>().is_ok()).then(|| w.to_string())
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RdmaDevice {
    pub name: String,
    pub hca_type: Option<String>,
    pub board_id: Option<String>,
    pub firmware: Option<String>,
    pub node_guid: Option<String>,
    pub sys_image_guid: Option<String>,
    pub node_type: Option<String>,
    pub pci_address: Option<String>,
    pub ports: Vec<RdmaPort>,
}

/// "4: ACTIVE" -> "ACTIVE".
pub fn strip_code(text: &str) -> String {
    text.split_once(':').map_or(text, |(_, s)| s).trim().to_string()
}

pub fn collect(src: &Source) -> Vec<RdmaDevice> {
    let mut out = Vec::new();
    for name in src.list_dir(IB_DIR) {
        let base = format!("{IB_DIR}/{name}");
        let attr = |f: &str| src.attr(&format!("{base}/{f}"));
        let pci_address = src.link_target(&base).as_deref().and_then(last_pci_address);
        // Netdevs that share the device's PCI function, for kernels without gid_attrs/ndevs.
        let sibling_netdevs = src.list_dir(&format!("{base}/device/net"));
        let mut ports = Vec::new();
        for port in src.list_dir(&format!("{base}/ports")) {
            let Ok(number) = port.parse::<u32>() else { continue };
            let pbase = format!("{base}/ports/{port}");
            let pattr = |f: &str| src.attr(&format!("{pbase}/{f}"));
            let rate = pattr("rate");
            let counters: BTreeMap<String, u64> = ERROR_COUNTERS
                .iter()
                .filter_map(|&n| Some((n.to_string(), pattr(&format!("counters/{n}"))?.parse().ok()?)))
                .collect();
            let pkey_dir = format!("{pbase}/pkeys");
            let pkey_names = src.list_dir(&pkey_dir);
            let pkeys = (!pkey_names.is_empty()).then(|| {
                let mut set: Vec<(u32, String)> = pkey_names
                    .iter()
                    .filter_map(|i| Some((i.parse().ok()?, pattr(&format!("pkeys/{i}"))?)))
                    .filter(|(_, k)| u32::from_str_radix(k.trim_start_matches("0x"), 16).is_ok_and(|v| v & 0x7fff != 0))
                    .collect();
                set.sort();
                set.into_iter().map(|(_, k)| k).collect()
            });
            let netdev = pattr("gid_attrs/ndevs/0").or_else(|| {
                let i = (number as usize).checked_sub(1)?;
                sibling_netdevs.get(i).cloned()
            });
            ports.push(RdmaPort {
                port: number,
                state: pattr("state").map(|s| strip_code(&s)),
                physical_state: pattr("phys_state").map(|s| strip_code(&s)),
                rate_gbps: src.attr_with(&format!("{pbase}/rate"), "a rate (400 Gb/sec (4X NDR))", &[], |r| {
                    r.split_whitespace().next()?.parse().ok()
                }),
                width: rate.as_deref().and_then(width_of_rate),
                counters,
                pkeys,
                rate,
                link_layer: pattr("link_layer"),
                lid: pattr("lid"),
                sm_lid: pattr("sm_lid"),
                gid: pattr("gids/0").filter(|g| g != "0000:0000:0000:0000:0000:0000:0000:0000"),
                netdev,
            });
        }
        ports.sort_by_key(|p| p.port);
        out.push(RdmaDevice {
            hca_type: attr("hca_type"),
            board_id: attr("board_id"),
            firmware: attr("fw_ver"),
            node_guid: attr("node_guid"),
            sys_image_guid: attr("sys_image_guid"),
            node_type: attr("node_type").map(|s| strip_code(&s)),
            pci_address,
            ports,
            name,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes() {
        assert_eq!(strip_code("4: ACTIVE"), "ACTIVE");
        assert_eq!(strip_code("5: LinkUp"), "LinkUp");
        assert_eq!(strip_code("Polling"), "Polling");
    }

    #[test]
    fn widths() {
        assert_eq!(width_of_rate("400 Gb/sec (4X NDR)").as_deref(), Some("4X"));
        assert_eq!(width_of_rate("100 Gb/sec (2X HDR)").as_deref(), Some("2X"));
        assert_eq!(width_of_rate("25 Gb/sec (1X EDR)").as_deref(), Some("1X"));
        assert_eq!(width_of_rate("10 Gb/sec"), None);
    }
}

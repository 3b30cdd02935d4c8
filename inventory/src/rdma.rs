//! RDMA devices (`/sys/class/infiniband`): InfiniBand HCAs and RoCE NICs, with their ports.

use serde::{Deserialize, Serialize};

use super::pci::last_pci_address;
use super::source::Source;

const IB_DIR: &str = "sys/class/infiniband";

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
}

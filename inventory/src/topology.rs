//! The connection matrix `nvidia-smi topo -m` shows, computed from the PCI tree and NVLink:
//! for every pair of GPUs and NICs, NV# (# bonded NVLinks) or the PCIe path —
//! PIX (at most one PCIe switch), PXB (several switches, no host bridge), PHB (through the host
//! bridge), NODE (between host bridges of one NUMA node), SYS (across NUMA nodes).

use serde::{Deserialize, Serialize};

use super::gpu::{Gpus, RemoteType};
use super::net::Nic;
use super::numa::Numa;
use super::pci::PciDevice;
use super::rdma::RdmaDevice;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopoDevice {
    /// "GPU0", "NIC1", as in the matrix.
    pub label: String,
    /// The GPU's UUID or name, the NIC's RDMA or interface name.
    pub name: String,
    pub pci_address: Option<String>,
    pub cpu_affinity: Option<String>,
    pub numa_node: Option<u32>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Topology {
    pub devices: Vec<TopoDevice>,
    /// `matrix[i][j]`: the connection from `devices[i]` to `devices[j]`.
    pub matrix: Vec<Vec<String>>,
    /// Whether the GPUs reach each other through NVSwitches.
    pub nvswitch: bool,
}

/// Where a device hangs in the PCI tree.
pub struct Place<'a> {
    pub host_bridge: Option<&'a str>,
    /// Bridges from the root port down to the device's parent.
    pub upstream: &'a [String],
    pub numa_node: Option<u32>,
}

/// The PCIe path type between two devices.
pub fn pcie_path(a: &Place<'_>, b: &Place<'_>, numa_nodes: usize) -> &'static str {
    let same_numa = match (a.numa_node, b.numa_node) {
        (Some(x), Some(y)) => x == y,
        (None, None) => numa_nodes <= 1,
        _ => numa_nodes <= 1,
    };
    match (a.host_bridge, b.host_bridge) {
        (Some(x), Some(y)) if x == y => {
            let common = a.upstream.iter().zip(b.upstream).take_while(|(p, q)| p == q).count();
            if common == 0 {
                return "PHB";
            }
            // Below the last shared bridge, a switch's downstream port is one more bridge on
            // each side: one switch crossed is PIX, more is PXB.
            let below = (a.upstream.len() - common).max(b.upstream.len() - common);
            if below <= 1 {
                "PIX"
            } else {
                "PXB"
            }
        }
        (Some(_), Some(_)) if same_numa => "NODE",
        (Some(_), Some(_)) => "SYS",
        _ if same_numa && a.numa_node.is_some() => "NODE",
        _ => "SYS",
    }
}

pub fn compute(pci: &[PciDevice], gpus: &Gpus, nics: &[Nic], rdma: &[RdmaDevice], numa: &Numa) -> Topology {
    let find = |addr: &Option<String>| addr.as_ref().and_then(|a| pci.iter().find(|d| &d.address == a));
    let mut devices = Vec::new();
    for gpu in &gpus.devices {
        let dev = find(&gpu.pci_address);
        devices.push(TopoDevice {
            label: format!("GPU{}", gpu.index),
            name: gpu.uuid.clone().or_else(|| gpu.name.clone()).unwrap_or_default(),
            pci_address: gpu.pci_address.clone(),
            cpu_affinity: gpu.cpu_affinity.clone().or_else(|| dev.and_then(|d| d.local_cpus.clone())),
            numa_node: gpu.numa_node.or_else(|| dev.and_then(|d| d.numa_node)),
        });
    }
    // NICs: RDMA devices first (what NCCL uses), then physical interfaces on other PCI functions.
    let mut nic_addresses: Vec<Option<String>> = Vec::new();
    for r in rdma.iter().filter(|r| r.pci_address.is_some()) {
        nic_addresses.push(r.pci_address.clone());
        devices.push(nic(devices.len() - gpus.devices.len(), &r.name, &r.pci_address, find(&r.pci_address)));
    }
    for n in nics.iter().filter(|n| !n.virtual_device && n.pci_address.is_some()) {
        if nic_addresses.contains(&n.pci_address) {
            continue;
        }
        nic_addresses.push(n.pci_address.clone());
        devices.push(nic(devices.len() - gpus.devices.len(), &n.name, &n.pci_address, find(&n.pci_address)));
    }

    let switch_links = |i: usize| -> u32 {
        gpus.devices.get(i).map_or(0, |g| {
            g.nvlinks.iter().filter(|l| l.active && l.remote_type == RemoteType::Nvswitch).count() as u32
        })
    };
    let direct_links = |i: usize, j: usize| -> u32 {
        let (Some(a), Some(b)) = (gpus.devices.get(i), gpus.devices.get(j)) else { return 0 };
        a.nvlinks
            .iter()
            .filter(|l| {
                l.active
                    && l.remote_type == RemoteType::Gpu
                    && l.remote_bus_id == b.pci_address
                    && b.pci_address.is_some()
            })
            .count() as u32
    };
    let n = devices.len();
    let mut matrix = vec![vec![String::new(); n]; n];
    for i in 0..n {
        for j in 0..n {
            matrix[i][j] = if i == j {
                "X".to_string()
            } else {
                let nv = direct_links(i, j) + switch_links(i).min(switch_links(j));
                if nv > 0 {
                    format!("NV{nv}")
                } else {
                    match (find(&devices[i].pci_address), find(&devices[j].pci_address)) {
                        (Some(a), Some(b)) => pcie_path(&place(a), &place(b), numa.nodes.len()).to_string(),
                        // A device NVML reports but the PCI tree lacks (a snapshot of another box).
                        _ => "?".to_string(),
                    }
                }
            };
        }
    }
    Topology { nvswitch: (0..gpus.devices.len()).any(|i| switch_links(i) > 0), devices, matrix }
}

fn place(d: &PciDevice) -> Place<'_> {
    Place { host_bridge: d.host_bridge.as_deref(), upstream: &d.upstream, numa_node: d.numa_node }
}

fn nic(index: usize, name: &str, addr: &Option<String>, dev: Option<&PciDevice>) -> TopoDevice {
    TopoDevice {
        label: format!("NIC{index}"),
        name: name.to_string(),
        pci_address: addr.clone(),
        cpu_affinity: dev.and_then(|d| d.local_cpus.clone()),
        numa_node: dev.and_then(|d| d.numa_node),
    }
}

/// The matrix as `nvidia-smi topo -m` prints it, with the CPU and NUMA affinity columns.
pub fn render(topo: &Topology) -> String {
    let mut out = String::new();
    if topo.devices.is_empty() {
        return "no GPUs or NICs to relate\n".to_string();
    }
    out.push_str(&format!("{:<8}", ""));
    for d in &topo.devices {
        out.push_str(&format!("{:<7}", d.label));
    }
    out.push_str("CPU Affinity    NUMA Affinity\n");
    for (d, row) in topo.devices.iter().zip(&topo.matrix) {
        out.push_str(&format!("{:<8}", d.label));
        for cell in row {
            out.push_str(&format!("{cell:<7}"));
        }
        out.push_str(&format!(
            "{:<16}{}\n",
            d.cpu_affinity.as_deref().unwrap_or("N/A"),
            d.numa_node.map_or("N/A".to_string(), |n| n.to_string())
        ));
    }
    let nics: Vec<&TopoDevice> = topo.devices.iter().filter(|d| d.label.starts_with("NIC")).collect();
    if !nics.is_empty() {
        out.push_str("\nNIC legend:\n");
        for d in nics {
            out.push_str(&format!("  {}: {}\n", d.label, d.name));
        }
    }
    out.push_str(
        "\n  X = self, NV# = # bonded NVLinks, PIX = at most one PCIe switch, PXB = several PCIe switches,\n  \
         PHB = through a PCIe host bridge, NODE = between host bridges of one NUMA node, SYS = across NUMA nodes\n",
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at<'a>(hb: &'a str, up: &'a [String], numa: u32) -> Place<'a> {
        Place { host_bridge: Some(hb), upstream: up, numa_node: Some(numa) }
    }

    #[test]
    fn path_types() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let rp = s(&["0000:00:01.0"]);
        let sw_a = s(&["0000:00:01.0", "0000:01:00.0", "0000:02:00.0"]);
        let sw_b = s(&["0000:00:01.0", "0000:01:00.0", "0000:02:01.0"]);
        let two_switches = s(&["0000:00:01.0", "0000:01:00.0", "0000:02:02.0", "0000:05:00.0", "0000:06:00.0"]);
        let other_rp = s(&["0000:00:03.0"]);
        // Two devices on one switch: PIX. Down a second switch: PXB.
        assert_eq!(pcie_path(&at("pci0000:00", &sw_a, 0), &at("pci0000:00", &sw_b, 0), 2), "PIX");
        assert_eq!(pcie_path(&at("pci0000:00", &sw_a, 0), &at("pci0000:00", &two_switches, 0), 2), "PXB");
        // Functions of one device behind one root port: PIX.
        assert_eq!(pcie_path(&at("pci0000:00", &rp, 0), &at("pci0000:00", &rp, 0), 2), "PIX");
        // Different root ports of one host bridge: PHB.
        assert_eq!(pcie_path(&at("pci0000:00", &rp, 0), &at("pci0000:00", &other_rp, 0), 2), "PHB");
        // Different host bridges: NODE within a NUMA node, SYS across.
        assert_eq!(pcie_path(&at("pci0000:00", &rp, 0), &at("pci0000:40", &rp, 0), 2), "NODE");
        assert_eq!(pcie_path(&at("pci0000:00", &rp, 0), &at("pci0000:80", &rp, 1), 2), "SYS");
    }
}

//! NUMA nodes from `/sys/devices/system/node`: their CPUs, memory, hugepages and distances.

use serde::{Deserialize, Serialize};

use super::cpulist::{format_list, parse_list};
use super::memory::{collect_hugepages, parse_meminfo, HugePages};
use super::source::{ProblemKind, Source};

const NODE_DIR: &str = "sys/devices/system/node";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NumaNode {
    pub id: u32,
    /// The node's CPUs that exist (old kernels list every possible CPU in node 0); empty for a
    /// memory-only node.
    pub cpus: String,
    pub cpu_count: u32,
    pub memory_total_bytes: Option<u64>,
    pub memory_free_bytes: Option<u64>,
    pub hugepages: Vec<HugePages>,
    /// A node without CPUs: memory of a GPU (Grace Hopper, POWER9 NVLink), CXL, HBM or persistent
    /// memory. hwloc's default view hides these; the distance matrix keeps them.
    #[serde(default)]
    pub memory_only: bool,
    /// What device the node's memory is, where sysfs or NVML tells.
    #[serde(default)]
    pub memory_of: Option<MemoryDevice>,
    /// The kernel's memory tier (`/sys/devices/virtual/memory_tiering`), lower is faster.
    #[serde(default)]
    pub memory_tier: Option<u32>,
}

/// The device behind a node's memory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryDevice {
    /// `gpu`, `nvm` (persistent memory, an NVDIMM region), `spm` (EFI specific-purpose memory,
    /// usually HBM), `cxl`, or `dax` (a DAX device of unknown origin).
    pub kind: String,
    /// The DAX device (`dax1.0`) or the GPU's PCI address.
    pub device: String,
    /// Where it sits in sysfs (`platform/hmem.1`, `…/ndbus0/region7`), for DAX devices.
    pub parent: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Numa {
    /// Empty when the kernel exposes no NUMA information (the machine then has one implicit node).
    pub nodes: Vec<NumaNode>,
    /// `distances[i][j]`: relative access cost from `nodes[i]` to `nodes[j]` (10 = local).
    pub distances: Vec<Vec<u32>>,
    /// The nodes this process may allocate from, when narrower than all nodes.
    pub allowed_nodes: Option<String>,
}

pub fn parse_distances(text: &str) -> Option<Vec<u32>> {
    text.split_whitespace().map(|v| v.parse().ok()).collect()
}

/// The NUMA nodes; `present` are the CPUs that exist (a node's list is cut to them).
pub fn collect(src: &Source, present: &std::collections::BTreeSet<u32>) -> Numa {
    let mut ids: Vec<u32> =
        src.list_dir(NODE_DIR).iter().filter_map(|n| n.strip_prefix("node")?.parse().ok()).collect();
    ids.sort_unstable();
    let mut nodes = Vec::new();
    let mut distances = Vec::new();
    for id in ids {
        let base = format!("{NODE_DIR}/node{id}");
        // An empty list (a node without CPUs) falls through to the mask, all zeros.
        let cpus =
            super::cpu::read_cpu_set(src, &format!("{base}/cpulist"), &format!("{base}/cpumap")).unwrap_or_default();
        let (cpus, absent): (Vec<u32>, Vec<u32>) =
            cpus.into_iter().partition(|c| present.is_empty() || present.contains(c));
        if !absent.is_empty() {
            src.problem(
                &format!("{base}/cpulist"),
                ProblemKind::Malformed,
                format!("lists CPUs {} that do not exist: left out", format_list(&absent)),
            );
        }
        let meminfo = src.read_optional(&format!("{base}/meminfo")).map(|t| parse_meminfo(&t)).unwrap_or_default();
        let get = |key: &str| meminfo.iter().find(|(k, _)| k == key).map(|(_, v)| *v);
        let rel = format!("{base}/distance");
        match src.attr(&rel).map(|t| (parse_distances(&t), t)) {
            Some((Some(row), _)) => distances.push(row),
            Some((None, text)) => src.problem(&rel, ProblemKind::Malformed, format!("not a distance row: {text:?}")),
            None => {}
        }
        nodes.push(NumaNode {
            id,
            cpu_count: cpus.len() as u32,
            cpus: format_list(&cpus),
            memory_total_bytes: get("MemTotal"),
            memory_free_bytes: get("MemFree"),
            hugepages: collect_hugepages(src, &format!("{base}/hugepages")),
            memory_only: cpus.is_empty(),
            memory_of: None,
            memory_tier: None,
        });
    }
    // Rows longer than the node list are indexed by node id (nodes offline or absent in between).
    let ids: Vec<usize> = nodes.iter().map(|n| n.id as usize).collect();
    for row in distances.iter_mut() {
        if row.len() != ids.len() && ids.iter().all(|&id| id < row.len()) {
            *row = ids.iter().map(|&id| row[id]).collect();
        }
    }
    // A matrix that is not square (a node's file missing or short) would mislead: keep none.
    if distances.len() != nodes.len() || distances.iter().any(|r| r.len() != nodes.len()) {
        if !distances.is_empty() {
            src.problem(NODE_DIR, ProblemKind::Malformed, "NUMA distance rows do not form a square matrix");
        }
        distances.clear();
    }
    check_overlap(src, &nodes);
    mark_dax_memory(src, &mut nodes);
    mark_memory_tiers(src, &mut nodes);
    let all: Vec<u32> = nodes.iter().map(|n| n.id).collect();
    let allowed = super::cpu::allowed_mems(src).filter(|a| !nodes.is_empty() && *a != all);
    Numa { nodes, distances, allowed_nodes: allowed.map(|a| format_list(&a)) }
}

/// DAX devices onlined as system memory (`kmem`) name their node in `target_node`; their sysfs
/// path says what they are.
fn mark_dax_memory(src: &Source, nodes: &mut [NumaNode]) {
    const DAX: &str = "sys/bus/dax/devices";
    for name in src.list_dir(DAX) {
        let rel = format!("{DAX}/{name}");
        let Some(node) =
            src.attr_with(&format!("{rel}/target_node"), "a NUMA node", &["-1"], |t| t.parse::<u32>().ok())
        else {
            continue;
        };
        let Some(n) = nodes.iter_mut().find(|n| n.id == node) else { continue };
        let path = src.link_target(&rel).map(|t| t.to_string_lossy().into_owned()).unwrap_or_default();
        let kind = if path.contains("/ndbus") {
            "nvm"
        } else if path.contains("/hmem") {
            "spm"
        } else if path.contains("cxl") {
            "cxl"
        } else {
            "dax"
        };
        // "../../../devices/platform/hmem.1/dax1.0" -> "platform/hmem.1".
        let parent =
            path.split_once("devices/").map(|(_, p)| p).and_then(|p| p.rsplit_once('/')).map(|(p, _)| p.to_string());
        // A node keeps the first device that names it (several DAX devices may feed one node).
        n.memory_of.get_or_insert(MemoryDevice { kind: kind.to_string(), device: name, parent });
    }
}

fn mark_memory_tiers(src: &Source, nodes: &mut [NumaNode]) {
    const TIERS: &str = "sys/devices/virtual/memory_tiering";
    for name in src.list_dir(TIERS) {
        let Some(tier) = name.strip_prefix("memory_tier").and_then(|t| t.parse::<u32>().ok()) else { continue };
        let members =
            src.attr_with(&format!("{TIERS}/{name}/nodelist"), "a node list", &[], parse_list).unwrap_or_default();
        for n in nodes.iter_mut().filter(|n| members.contains(&n.id)) {
            n.memory_tier = Some(tier);
        }
    }
}

/// A GPU whose NUMA node (NVML's, on machines where GPU memory is a node) has no CPUs: that
/// node is the GPU's memory.
pub fn mark_gpu_memory(numa: &mut Numa, gpus: &super::gpu::Gpus) {
    for gpu in &gpus.devices {
        let (Some(node), Some(address)) = (gpu.numa_node, &gpu.pci_address) else { continue };
        if let Some(n) = numa.nodes.iter_mut().find(|n| n.id == node && n.memory_only) {
            n.memory_of.get_or_insert(MemoryDevice { kind: "gpu".into(), device: address.clone(), parent: None });
        }
    }
}

/// Firmware with broken NUMA tables makes every node claim the same CPUs; say so loudly,
/// since placement decisions (GPU affinity, pinned benchmarks) would be wrong.
fn check_overlap(src: &Source, nodes: &[NumaNode]) {
    let mut seen: std::collections::BTreeMap<u32, u32> = std::collections::BTreeMap::new();
    let mut overlapping = std::collections::BTreeSet::new();
    for node in nodes {
        for cpu in parse_list(&node.cpus).unwrap_or_default() {
            if let Some(first) = seen.insert(cpu, node.id) {
                overlapping.insert(first);
                overlapping.insert(node.id);
            }
        }
    }
    if !overlapping.is_empty() {
        let ids: Vec<u32> = overlapping.into_iter().collect();
        src.problem(
            NODE_DIR,
            ProblemKind::Malformed,
            format!(
                "NUMA nodes {} claim the same CPUs: the firmware's NUMA tables (SRAT/SLIT) look wrong",
                format_list(&ids)
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_meminfo() {
        let parsed =
            parse_meminfo("Node 0 MemTotal:       16384 kB\nNode 0 MemFree:  8 kB\nNode 0 HugePages_Total:     0\n");
        assert_eq!(parsed[0], ("MemTotal".to_string(), 16384 * 1024));
        assert_eq!(parsed[2], ("HugePages_Total".to_string(), 0));
    }

    #[test]
    fn distances() {
        assert_eq!(parse_distances("10 21\n"), Some(vec![10, 21]));
        assert_eq!(parse_distances("10 x"), None);
    }
}

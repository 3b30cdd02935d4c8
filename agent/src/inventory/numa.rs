//! NUMA nodes from `/sys/devices/system/node`: their CPUs, memory, hugepages and distances.

use serde::{Deserialize, Serialize};

use super::cpulist::{format_list, parse_list, parse_mask};
use super::memory::{collect_hugepages, parse_meminfo, HugePages};
use super::source::{ProblemKind, Source};

const NODE_DIR: &str = "sys/devices/system/node";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NumaNode {
    pub id: u32,
    /// Empty for a memory-only node (CXL, HBM or persistent memory exposed as a node).
    pub cpus: String,
    pub cpu_count: u32,
    pub memory_total_bytes: Option<u64>,
    pub memory_free_bytes: Option<u64>,
    pub hugepages: Vec<HugePages>,
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

pub fn collect(src: &Source) -> Numa {
    let mut ids: Vec<u32> =
        src.list_dir(NODE_DIR).iter().filter_map(|n| n.strip_prefix("node")?.parse().ok()).collect();
    ids.sort_unstable();
    let mut nodes = Vec::new();
    let mut distances = Vec::new();
    for id in ids {
        let base = format!("{NODE_DIR}/node{id}");
        let cpus = if src.attr(&format!("{base}/cpulist")).is_some() {
            src.attr_with(&format!("{base}/cpulist"), "a CPU list", &[], parse_list)
        } else {
            src.attr_with(&format!("{base}/cpumap"), "a CPU mask", &[], parse_mask)
        }
        .unwrap_or_default();
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
    let all: Vec<u32> = nodes.iter().map(|n| n.id).collect();
    let allowed = super::cpu::allowed_mems(src).filter(|a| !nodes.is_empty() && *a != all);
    Numa { nodes, distances, allowed_nodes: allowed.map(|a| format_list(&a)) }
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

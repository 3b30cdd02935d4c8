//! System memory: `/proc/meminfo`, hugepage pools, transparent hugepages and the DIMMs from SMBIOS.

use serde::{Deserialize, Serialize};

use super::smbios::{parse_memory_devices, Dimm};
use super::source::{ProblemKind, Source};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HugePages {
    pub size_bytes: u64,
    pub total: u64,
    pub free: u64,
    pub reserved: Option<u64>,
    pub surplus: Option<u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Memory {
    pub total_bytes: Option<u64>,
    pub available_bytes: Option<u64>,
    pub free_bytes: Option<u64>,
    pub swap_total_bytes: Option<u64>,
    pub hugepages: Vec<HugePages>,
    /// The transparent hugepage policy in force (`always`, `madvise`, `never`).
    pub transparent_hugepages: Option<String>,
    /// Every memory slot from SMBIOS; `None` when the table could not be read.
    pub dimms: Option<Vec<Dimm>>,
    pub dimm_slots: Option<u32>,
    pub dimms_populated: Option<u32>,
    /// The sum of the populated DIMMs: what was installed, unlike `total_bytes`, which the kernel shrinks.
    pub installed_bytes: Option<u64>,
}

/// Parses `/proc/meminfo`, or a NUMA node's `meminfo` ("Node 0 MemTotal:  131072 kB"), into
/// (key, value in bytes for kB lines, else the bare number). The key is the last word before the colon.
pub fn parse_meminfo(text: &str) -> Vec<(String, u64)> {
    text.lines()
        .filter_map(|line| {
            let (key, value) = line.split_once(':')?;
            let key = key.split_whitespace().last()?.to_string();
            let mut parts = value.split_whitespace();
            let number: u64 = parts.next()?.parse().ok()?;
            let mult = if parts.next() == Some("kB") { 1024 } else { 1 };
            Some((key, number.checked_mul(mult)?))
        })
        .collect()
}

/// The bracketed choice of a sysfs policy file: `always [madvise] never` -> `madvise`.
pub fn parse_bracketed(text: &str) -> Option<String> {
    let start = text.find('[')? + 1;
    let end = start + text[start..].find(']')?;
    Some(text[start..end].to_string())
}

/// Reads `hugepages-<N>kB` pools below a directory (system-wide or per NUMA node).
pub fn collect_hugepages(src: &Source, dir: &str) -> Vec<HugePages> {
    let mut pools: Vec<HugePages> = src
        .list_dir(dir)
        .iter()
        .filter_map(|name| {
            let kb: u64 = name.strip_prefix("hugepages-")?.strip_suffix("kB")?.parse().ok()?;
            let base = format!("{dir}/{name}");
            let total = src.attr_parse(&format!("{base}/nr_hugepages")).unwrap_or(0);
            let surplus = src.attr_parse(&format!("{base}/surplus_hugepages"));
            // An empty pool (no persistent, no surplus pages) has nothing free or reserved: two
            // reads saved per size, most machines' case. Reservations are kept system-wide only:
            // a node's pool has no resv_hugepages.
            if total == 0 && surplus.unwrap_or(0) == 0 {
                let reserved = (!dir.contains("/node/")).then_some(0);
                return Some(HugePages { size_bytes: kb * 1024, total, free: 0, reserved, surplus });
            }
            Some(HugePages {
                size_bytes: kb * 1024,
                total,
                free: src.attr_parse(&format!("{base}/free_hugepages")).unwrap_or(0),
                reserved: src.attr_parse(&format!("{base}/resv_hugepages")),
                surplus,
            })
        })
        .collect();
    pools.sort_by_key(|p| p.size_bytes);
    pools
}

const DMI_TABLE: &str = "sys/firmware/dmi/tables/DMI";
const DMI_ENTRIES: &str = "sys/firmware/dmi/entries";

fn read_dimms(src: &Source) -> Option<Vec<Dimm>> {
    if src.exists(DMI_TABLE) {
        if let Some(table) = src.read_bytes(DMI_TABLE, true) {
            return Some(parse_memory_devices(&table));
        }
        // Root-only on a live machine: the problem is recorded; the entries are root-only too.
        return None;
    }
    let entries: Vec<String> = src.list_dir(DMI_ENTRIES).into_iter().filter(|n| n.starts_with("17-")).collect();
    if entries.is_empty() {
        if src.exists("sys/firmware/dmi") || src.exists("sys/class/dmi/id") {
            src.problem(DMI_TABLE, ProblemKind::NotPresent, "no SMBIOS table: DIMMs unknown");
        }
        return None;
    }
    let mut dimms = Vec::new();
    // Entries are named 17-<instance>; order them numerically so DIMM_A10 follows DIMM_A9.
    let mut entries: Vec<(u32, String)> =
        entries.into_iter().map(|n| (n[3..].parse().unwrap_or(u32::MAX), n)).collect();
    entries.sort();
    for (_, name) in entries {
        let bytes = src.read_bytes(&format!("{DMI_ENTRIES}/{name}/raw"), true)?;
        dimms.extend(parse_memory_devices(&bytes));
    }
    Some(dimms)
}

pub fn collect(src: &Source) -> Memory {
    let info = src.read("proc/meminfo").map(|t| parse_meminfo(&t)).unwrap_or_default();
    let get = |key: &str| info.iter().find(|(k, _)| k == key).map(|(_, v)| *v);
    let dimms = read_dimms(src);
    let populated: Vec<&Dimm> = dimms.iter().flatten().filter(|d| d.populated).collect();
    Memory {
        total_bytes: get("MemTotal"),
        available_bytes: get("MemAvailable"),
        free_bytes: get("MemFree"),
        swap_total_bytes: get("SwapTotal"),
        hugepages: collect_hugepages(src, "sys/kernel/mm/hugepages"),
        transparent_hugepages: src.attr_with(
            "sys/kernel/mm/transparent_hugepage/enabled",
            "a bracketed choice (always [madvise] never)",
            &[],
            parse_bracketed,
        ),
        dimm_slots: dimms.as_ref().map(|d| d.len() as u32),
        dimms_populated: dimms.as_ref().map(|_| populated.len() as u32),
        installed_bytes: dimms.as_ref().map(|_| populated.iter().filter_map(|d| d.size_bytes).sum()),
        dimms,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo() {
        let parsed = parse_meminfo("MemTotal:       32836008 kB\nHugePages_Total:       4\nbogus\nX: y kB\n");
        assert_eq!(parsed, vec![("MemTotal".into(), 32836008 * 1024), ("HugePages_Total".into(), 4)]);
    }

    #[test]
    fn bracketed() {
        assert_eq!(parse_bracketed("always [madvise] never").as_deref(), Some("madvise"));
        assert_eq!(parse_bracketed("always madvise never"), None);
    }
}

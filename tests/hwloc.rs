//! Every hwloc snapshot in `tests/fixtures/hwloc` is a real machine's `/proc` and `/sys`.
//! `kiln inventory --root` must agree with hwloc's own expected topology (`expected.json`) and with
//! the raw facts read from each snapshot. The few cases where it cannot are listed in
//! [`KNOWN_DIFFERENCES`] with the reason; a listed difference that disappears fails the test too.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::util::{cpu_set, fixtures, hwloc_expected, inventory_json, unpack};

/// (case, field, why kiln and hwloc differ there).
const KNOWN_DIFFERENCES: &[(&str, &str, &str)] = &[
    (
        "8em64t-2s2ca2c-buggynuma",
        "NUMANode",
        "the kernel lists 8 nodes that all claim CPUs 0-7 at distance 10: hwloc discards such tables, \
         kiln reports the kernel's nodes and a problem entry naming the broken firmware tables",
    ),
    (
        "40intel64-4n10c+pci-conflicts",
        "Package",
        "the snapshot's cpusets were edited to conflict ('4th socket conflicts, ignored' in its .test): \
         hwloc drops the 4th package on that error, kiln reports the kernel's 4 packages",
    ),
    (
        "40intel64-4n10c+pci-conflicts",
        "L3Cache instances",
        "cpu2's L3 shared_cpu_map was edited to 0-3, across the other L3s ('3rd L3 conflicts, ignored'): \
         hwloc drops that L3 and the 4th package's, kiln follows the map and says the maps overlap",
    ),
    (
        "memorysidecaches",
        "L3Cache sizes",
        "hwloc takes the L3 size from the CPUID dump in the snapshot (28 MiB); the kernel's sysfs, which kiln \
         reads, says 28160K (11 ways × 40960 sets × 64 B)",
    ),
    (
        "fakeheterocpunuma",
        "online CPUs outside every NUMA node",
        "a hand-made snapshot (its .test says so) whose node cpumaps leave CPUs 4-7 in no node",
    ),
    (
        "offline-cpu0-node0",
        "online CPUs outside every NUMA node",
        "a hand-edited snapshot: node 0 is offline while its CPUs 4-20 (even) stay online",
    ),
    (
        "256ia64-64n2s2c",
        "raw cpuinfo model",
        "this Itanium's cpuinfo gives only a family number (32); kiln names it 'Itanium family 32'",
    ),
];

fn unquote(v: &str) -> String {
    let v = v.trim();
    let v = v.strip_prefix('"').and_then(|s| s.strip_suffix('"')).unwrap_or(v);
    v.trim().to_string()
}

/// The counts hwloc would show for the CPUs and nodes this process may use.
struct View {
    packages: usize,
    cores: usize,
    pus: usize,
    numa_nodes: usize,
    /// The CPUs hwloc shows; `None` for all of them.
    usable: Option<BTreeSet<u64>>,
    /// The CPUs of each NUMA node hwloc shows: memory keeps the caches above it in view.
    node_cpus: Vec<BTreeSet<u64>>,
}

impl View {
    /// Whether hwloc shows an object over `cpus`: it holds a CPU or a NUMA node hwloc shows.
    fn shows(&self, cpus: &BTreeSet<u64>) -> bool {
        self.usable.as_ref().is_none_or(|u| !cpus.is_disjoint(u))
            || self.node_cpus.iter().any(|n| !n.is_empty() && n.is_subset(cpus))
    }
}

/// What hwloc shows: with `--disallowed` the whole machine, else only what this process may use;
/// a package stays when it holds a usable CPU or a usable NUMA node (memory hangs off packages).
fn restricted_view(inv: &Value, whole_machine: bool) -> View {
    let cpu = &inv["cpu"];
    let online = cpu_set(cpu["online_cpus"].as_str().unwrap());
    let allowed = cpu["allowed_cpus"].as_str().map(cpu_set).unwrap_or_else(|| online.clone());
    let usable: BTreeSet<u64> = online.intersection(&allowed).copied().collect();
    let numa_nodes: Vec<u64> =
        inv["numa"]["nodes"].as_array().unwrap().iter().map(|n| n["id"].as_u64().unwrap()).collect();
    let allowed_nodes = inv["numa"]["allowed_nodes"].as_str().map(cpu_set);
    let nodes = match &allowed_nodes {
        Some(a) => numa_nodes.iter().filter(|n| a.contains(n)).count(),
        None => numa_nodes.len(),
    };
    if whole_machine || cpu["allowed_cpus"].is_null() && allowed_nodes.is_none() {
        let nodes = inv["numa"]["nodes"].as_array().unwrap().len();
        return View {
            packages: cpu["packages"].as_u64().unwrap() as usize,
            cores: cpu["cores"].as_u64().unwrap() as usize,
            pus: online.len(),
            numa_nodes: nodes,
            usable: None,
            node_cpus: Vec::new(),
        };
    }
    let logical = cpu["logical_cpus"].as_array().unwrap();
    let package_of = |id: u64| logical.iter().find(|c| c["id"] == id).map(|c| c["package_cpus"].to_string());
    let mut packages = BTreeSet::new();
    let mut cores = BTreeSet::new();
    for c in logical.iter().filter(|c| usable.contains(&c["id"].as_u64().unwrap())) {
        packages.insert(c["package_cpus"].to_string());
        cores.insert(c["core_cpus"].to_string());
    }
    let mut node_cpus = Vec::new();
    for node in inv["numa"]["nodes"].as_array().unwrap() {
        if allowed_nodes.as_ref().is_none_or(|a| a.contains(&node["id"].as_u64().unwrap())) {
            node_cpus.push(cpu_set(node["cpus"].as_str().unwrap()));
        }
        if allowed_nodes.as_ref().is_some_and(|a| a.contains(&node["id"].as_u64().unwrap())) {
            let node_packages: BTreeSet<_> =
                cpu_set(node["cpus"].as_str().unwrap()).into_iter().filter_map(package_of).collect();
            if node_packages.len() == 1 {
                packages.extend(node_packages);
            }
        }
    }
    View {
        packages: packages.len(),
        cores: cores.len(),
        pus: usable.len(),
        numa_nodes: nodes,
        usable: Some(usable),
        node_cpus,
    }
}

/// hwloc's cache object names to kiln's (level, type).
fn cache_key(name: &str) -> Option<(u64, &'static str)> {
    Some(match name {
        "L1dCache" | "L1Cache" => (1, "data"),
        "L1iCache" => (1, "instruction"),
        "L2Cache" => (2, "unified"),
        "L3Cache" => (3, "unified"),
        "L4Cache" => (4, "unified"),
        _ => return None,
    })
}

/// Parses hwloc's console latency matrix or its XML `distances2` values.
fn hwloc_matrix(text: &str) -> Option<Vec<Vec<u64>>> {
    if text.trim().is_empty() {
        return None;
    }
    if let Some(start) = text.find('[') {
        let values: Vec<u64> =
            text[start + 1..text.find(']')?].split_whitespace().map(|v| v.parse().unwrap()).collect();
        let n = (values.len() as f64).sqrt() as usize;
        return Some(values.chunks(n).map(<[u64]>::to_vec).collect());
    }
    let rows: Vec<Vec<u64>> = text
        .lines()
        .skip(2)
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.split_whitespace().skip(1).map(|v| v.parse().unwrap()).collect())
        .collect();
    Some(rows)
}

const DMI_FIELDS: &[(&str, &str, &str)] = &[
    ("DMIProductName", "product", "name"),
    ("DMIProductVersion", "product", "version"),
    ("DMIProductSerial", "product", "serial"),
    ("DMIProductUUID", "product", "uuid"),
    ("DMISysVendor", "product", "vendor"),
    ("DMIBoardVendor", "board", "vendor"),
    ("DMIBoardName", "board", "name"),
    ("DMIBoardVersion", "board", "version"),
    ("DMIBoardSerial", "board", "serial"),
    ("DMIBoardAssetTag", "board", "asset_tag"),
    ("DMIChassisVendor", "chassis", "vendor"),
    ("DMIChassisVersion", "chassis", "version"),
    ("DMIChassisSerial", "chassis", "serial"),
    ("DMIChassisAssetTag", "chassis", "asset_tag"),
    ("DMIBIOSVendor", "bios", "vendor"),
    ("DMIBIOSVersion", "bios", "version"),
    ("DMIBIOSDate", "bios", "date"),
];

// Long: one flat list of field comparisons in hwloc's order, each a few lines; split, it would read
// worse and share the one `check` closure through arguments.
fn compare(case: &str, expected: &Value, inv: &Value) -> Vec<(String, String)> {
    let mut diffs = Vec::new();
    let mut check = |field: &str, want: String, got: String| {
        if want != got {
            diffs.push((field.to_string(), format!("{case}: {field}: expected {want}, kiln says {got}")));
        }
    };
    let hw = &expected["hwloc_expected"];
    let counts = &hw["object_counts"];
    let whole_machine = expected["lstopo_options"].as_str().unwrap_or("").contains("--disallowed");
    let view = restricted_view(inv, whole_machine);
    let count = |k: &str| counts.get(k).and_then(Value::as_u64);
    if let Some(n) = count("Package") {
        check("Package", n.to_string(), view.packages.to_string());
    }
    if let Some(n) = count("Core") {
        check("Core", n.to_string(), view.cores.to_string());
    }
    if let Some(n) = count("PU") {
        check("PU", n.to_string(), view.pus.to_string());
    }
    if let Some(n) = count("NUMANode") {
        // hwloc always has one NUMA node holding the machine's memory; kiln lists the kernel's.
        check("NUMANode", n.to_string(), view.numa_nodes.max(1).to_string());
    }

    // Cache sizes per level and type.
    let caches = inv["cpu"]["caches"].as_array().unwrap();
    for (name, sizes) in hw["cache_sizes_KiB"].as_object().unwrap() {
        let Some((level, kind)) = cache_key(name) else { continue };
        let want: BTreeSet<u64> = sizes.as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
        let got: BTreeSet<u64> = caches
            .iter()
            .filter(|c| c["level"] == level && c["type"] == kind)
            .map(|c| c["size_bytes"].as_u64().unwrap() / 1024)
            .collect();
        check(&format!("{name} sizes"), format!("{want:?}"), format!("{got:?}"));
    }

    // Cache instances, each counted where it holds a CPU hwloc shows. A "structure" filter merges
    // levels that add no structure, so counts there are not kiln's to match.
    let options = expected["lstopo_options"].as_str().unwrap_or("");
    if !options.contains("structure") {
        for (name, want) in counts.as_object().unwrap() {
            let Some((level, kind)) = cache_key(name) else { continue };
            let got: usize = caches
                .iter()
                .filter(|c| c["level"] == level && c["type"] == kind)
                .flat_map(|c| c["instance_cpus"].as_array().unwrap())
                .filter(|set| view.shows(&cpu_set(set.as_str().unwrap())))
                .count();
            check(&format!("{name} instances"), want.to_string(), got.to_string());
        }
    }

    // NUMA distances, over the nodes this process may use.
    if let Some(want) = hw["numa_latency"].as_str().and_then(hwloc_matrix) {
        let nodes: Vec<u64> =
            inv["numa"]["nodes"].as_array().unwrap().iter().map(|n| n["id"].as_u64().unwrap()).collect();
        let allowed = inv["numa"]["allowed_nodes"].as_str().map(cpu_set);
        let keep: Vec<usize> = (0..nodes.len())
            .filter(|&i| whole_machine || allowed.as_ref().is_none_or(|a| a.contains(&nodes[i])))
            .collect();
        let full = inv["numa"]["distances"].as_array().unwrap();
        let got: Vec<Vec<u64>> =
            keep.iter().map(|&i| keep.iter().map(|&j| full[i][j].as_u64().unwrap()).collect()).collect();
        check("NUMA distances", format!("{want:?}"), format!("{got:?}"));
    }

    // DMI strings.
    for (hw_name, section, field) in DMI_FIELDS {
        if let Some(want) = hw["dmi"].get(*hw_name).and_then(Value::as_str) {
            let got = inv["system"][section][field].as_str().unwrap_or("");
            check(hw_name, unquote(want), got.to_string());
        }
    }
    if let Some(code) = hw["dmi"].get("DMIChassisType").and_then(Value::as_str) {
        check("DMIChassisType", unquote(code), inv["system"]["chassis"]["type_code"].to_string());
    }

    // Every online CPU sits in a NUMA node; none is lost in parsing. (Node lists may also name
    // offline CPUs.)
    let nodes = inv["numa"]["nodes"].as_array().unwrap();
    if !nodes.is_empty() {
        let in_nodes: BTreeSet<u64> = nodes.iter().flat_map(|n| cpu_set(n["cpus"].as_str().unwrap())).collect();
        let online = cpu_set(inv["cpu"]["online_cpus"].as_str().unwrap());
        let homeless: Vec<u64> = online.difference(&in_nodes).copied().collect();
        check("online CPUs outside every NUMA node", "[]".to_string(), format!("{homeless:?}"));
    }

    // Raw facts of the snapshot itself.
    let raw = &expected["raw_sysfs_facts"];
    let cpu = &inv["cpu"];
    if let Some(online) = raw.get("online").and_then(Value::as_str) {
        check(
            "raw online",
            format!("{:?}", cpu_set(online)),
            format!("{:?}", cpu_set(cpu["online_cpus"].as_str().unwrap())),
        );
    }
    if let Some(offline) = raw.get("offline").and_then(Value::as_str) {
        check(
            "raw offline",
            format!("{:?}", cpu_set(offline)),
            format!("{:?}", cpu_set(cpu["offline_cpus"].as_str().unwrap())),
        );
    }
    if let Some(possible) = raw.get("possible").and_then(Value::as_str) {
        check("raw possible", possible.to_string(), cpu["possible_cpus"].as_str().unwrap_or("").to_string());
    }
    if let Some(n) = raw.get("nodes").and_then(Value::as_u64) {
        check("raw nodes", n.to_string(), inv["numa"]["nodes"].as_array().unwrap().len().to_string());
    }
    if let Some(row) = raw.get("node0_distance").and_then(Value::as_str) {
        // The kernel's row is indexed by node id; kiln's matrix by its list of present nodes.
        let ids: Vec<usize> =
            inv["numa"]["nodes"].as_array().unwrap().iter().map(|n| n["id"].as_u64().unwrap() as usize).collect();
        let raw_row: Vec<&str> = row.split_whitespace().collect();
        let want: Vec<&str> =
            if raw_row.len() == ids.len() { raw_row } else { ids.iter().map(|&i| raw_row[i]).collect() };
        let got = inv["numa"]["distances"]
            .get(0)
            .map(|r| r.as_array().unwrap().iter().map(|v| v.to_string()).collect::<Vec<_>>().join(" "));
        check("raw node0_distance", want.join(" "), got.unwrap_or_default());
    }
    if let Some(kb) = raw.get("MemTotal_kB").and_then(Value::as_str) {
        check("raw MemTotal", kb.to_string(), (inv["memory"]["total_bytes"].as_u64().unwrap_or(0) / 1024).to_string());
    }
    if let Some(models) = raw.get("cpuinfo_models").and_then(Value::as_object) {
        if models.len() == 1 {
            let want = models.keys().next().unwrap();
            // Arm cpuinfo has no model name, only the MIDR part, which kiln keeps as `part`.
            let field = if want.starts_with("0x") { "part" } else { "model_name" };
            check("raw cpuinfo model", want.clone(), cpu[field].as_str().unwrap_or("").to_string());
        }
    }
    if let Some(text) = raw.get("cpu0_caches").and_then(Value::as_str) {
        for item in text.split_whitespace() {
            let (name, size) = item.split_once('=').unwrap();
            let level: u64 = name[1..2].parse().unwrap();
            let kind = match &name[2..] {
                "D" => "data",
                "I" => "instruction",
                _ => "unified",
            };
            let kib: u64 = size.trim_end_matches('K').parse().unwrap();
            let found =
                caches.iter().any(|c| c["level"] == level && c["type"] == kind && c["size_bytes"] == kib * 1024);
            check(
                &format!("raw cpu0 {name}"),
                format!("{kib} KiB"),
                if found { format!("{kib} KiB") } else { "absent".into() },
            );
        }
    }
    if let Some(dmi) = raw.get("dmi").and_then(Value::as_object) {
        for (key, want) in dmi {
            let (section, field) = match key.as_str() {
                "sys_vendor" => ("product", "vendor"),
                "product_name" => ("product", "name"),
                "board_name" => ("board", "name"),
                "board_vendor" => ("board", "vendor"),
                "bios_vendor" => ("bios", "vendor"),
                "bios_version" => ("bios", "version"),
                _ => continue,
            };
            check(
                &format!("raw dmi {key}"),
                want.as_str().unwrap().trim().to_string(),
                inv["system"][section][field].as_str().unwrap_or("").to_string(),
            );
        }
    }
    diffs
}

#[test]
fn hwloc_snapshots_agree_with_hwloc() {
    let dir = fixtures().join("hwloc");
    let expected = hwloc_expected();
    let mut unexpected = Vec::new();
    let mut seen_known = BTreeSet::new();
    let mut checked = 0;
    for (case, exp) in &expected {
        let tarball = dir.join(exp["tarball"].as_str().unwrap());
        if !tarball.exists() {
            unexpected.push(format!("{case}: tarball {} missing", tarball.display()));
            continue;
        }
        let root = unpack(&tarball).join(exp["raw_sysfs_facts"]["topdir"].as_str().unwrap());
        let inv = inventory_json(&root);
        checked += 1;
        for (field, message) in compare(case, exp, &inv) {
            match KNOWN_DIFFERENCES.iter().find(|(c, f, _)| *c == case && *f == field) {
                Some(_) => {
                    seen_known.insert((case.clone(), field));
                }
                None => unexpected.push(message),
            }
        }
    }
    for (case, field, why) in KNOWN_DIFFERENCES {
        if !seen_known.contains(&(case.to_string(), field.to_string())) {
            unexpected.push(format!("{case}: {field}: listed as a known difference ({why}) but kiln now agrees"));
        }
    }
    assert!(checked >= 40, "only {checked} hwloc cases ran");
    assert!(unexpected.is_empty(), "{} disagreements:\n{}", unexpected.len(), unexpected.join("\n"));
}

/// The DIMMs of `32em64t-2n8c+dax+nvme+mic+dimms`, from its SMBIOS entries, against the memory
/// modules in hwloc's expected XML.
#[test]
fn dimms_match_hwloc() {
    let dir = fixtures().join("hwloc");
    let root = unpack(&dir.join("32em64t-2n8c+dax+nvme+mic+dimms.tar.bz2")).join("32em64t-2n8c+1mic");
    let inv = inventory_json(&root);
    let memory = &inv["memory"];
    assert_eq!(memory["dimm_slots"], 24);
    assert_eq!(memory["dimms_populated"], 8);
    assert_eq!(memory["installed_bytes"].as_u64(), Some(32 << 30));

    // hwloc's XML: <object ... subtype="MemoryModule"> followed by <info name=".." value=".."/> lines.
    let xml = std::fs::read_to_string(dir.join("32em64t-2n8c+dax+nvme+mic+dimms.xml")).unwrap();
    let mut modules: Vec<BTreeMap<String, String>> = Vec::new();
    for line in xml.lines() {
        if line.contains("subtype=\"MemoryModule\"") {
            modules.push(BTreeMap::new());
        } else if let (Some(m), Some(rest)) = (modules.last_mut(), line.trim().strip_prefix("<info name=\"")) {
            if let Some((name, value)) = rest.split_once("\" value=\"") {
                m.entry(name.to_string()).or_insert_with(|| value.trim_end_matches("\"/>").to_string());
            }
        }
    }
    assert_eq!(modules.len(), 8, "hwloc lists 8 modules");
    let dimms: Vec<&Value> = memory["dimms"].as_array().unwrap().iter().filter(|d| d["populated"] == true).collect();
    for (module, dimm) in modules.iter().zip(&dimms) {
        assert_eq!(dimm["locator"].as_str().unwrap(), module["DeviceLocation"].trim());
        assert_eq!(dimm["serial"].as_str().unwrap(), module["SerialNumber"]);
        assert_eq!(dimm["part_number"].as_str().unwrap(), module["PartNumber"].trim());
        assert_eq!(dimm["memory_type"].as_str().unwrap(), module["Type"]);
        assert_eq!(dimm["form_factor"].as_str().unwrap(), module["FormFactor"]);
        let kib: u64 = module["Size"].trim_end_matches("KiB").parse().unwrap();
        assert_eq!(dimm["size_bytes"].as_u64(), Some(kib * 1024));
    }
    // Empty slots are slots: they keep their locator and carry no size or serial.
    let empty = memory["dimms"].as_array().unwrap().iter().find(|d| d["populated"] == false).unwrap();
    assert!(empty["locator"].is_string() && empty["size_bytes"].is_null() && empty["serial"].is_null());
}

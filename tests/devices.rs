//! The device inventory on real snapshots: PCI functions against hwloc's expected lists, NICs,
//! RDMA and NVMe from the hwloc server snapshot and prometheus/procfs's archive, and the live
//! machine's NICs resolved to their PCI functions.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::util::{cpu_set, fixtures, hwloc_case_inventory, hwloc_expected, inventory_json, kiln, unpack, unpack_ttar};

fn hwloc_root(tarball: &str, top: &str) -> std::path::PathBuf {
    unpack(&fixtures().join("hwloc").join(tarball)).join(top)
}

fn by_address(inv: &Value) -> BTreeMap<String, &Value> {
    inv["pci"].as_array().unwrap().iter().map(|d| (d["address"].as_str().unwrap().to_string(), d)).collect()
}

/// hwloc lists each PCI function as "class [vendor:device] [subvendor:subdevice] revision prog-if".
#[test]
fn pci_functions_agree_with_hwloc() {
    let expected = hwloc_expected();
    let mut checked = 0;
    let mut links = 0;
    let mut seen_tarballs = std::collections::BTreeSet::new();
    for exp in expected.values() {
        let list = exp["hwloc_expected"]["pci_devices"].as_array().unwrap();
        let tarball = exp["tarball"].as_str().unwrap();
        if list.is_empty() || !seen_tarballs.insert(tarball.to_string()) {
            continue;
        }
        let inv = hwloc_case_inventory(exp);
        let pci = by_address(&inv);
        assert_eq!(
            pci.len() as u64,
            exp["raw_sysfs_facts"]["pci_devices"].as_u64().unwrap(),
            "{tarball}: every function"
        );
        for entry in list {
            let addr = entry[0].as_str().unwrap();
            let desc = entry[1].as_str().unwrap();
            let dev = pci.get(addr).unwrap_or_else(|| panic!("{tarball}: {addr} missing"));
            if !desc.contains('[') {
                // The console form: "vendor:device" and "class(name)".
                let got = format!(
                    "{}:{} {}",
                    dev["vendor_id"].as_str().unwrap(),
                    dev["device_id"].as_str().unwrap(),
                    dev["class"].as_str().unwrap()
                );
                let class = &entry[2].as_str().unwrap()[..4];
                assert_eq!(got, format!("{desc} {class}"), "{tarball}: {addr}");
                checked += 1;
                continue;
            }
            let parts: Vec<&str> = desc.split_whitespace().collect();
            let (ids, sub) = (parts[1].trim_matches(['[', ']']), parts[2].trim_matches(['[', ']']));
            let got = format!(
                "{} [{}:{}] [{}:{}] {} {}",
                dev["class"].as_str().unwrap(),
                dev["vendor_id"].as_str().unwrap(),
                dev["device_id"].as_str().unwrap(),
                dev["subsystem_vendor_id"].as_str().unwrap_or("0000"),
                dev["subsystem_device_id"].as_str().unwrap_or("0000"),
                dev["revision"].as_str().unwrap(),
                dev["prog_if"].as_str().unwrap()
            );
            assert_eq!(got, format!("{} [{ids}] [{sub}] {} {}", parts[0], parts[3], parts[4]), "{tarball}: {addr}");
            // hwloc's link speed in GB/s: lanes x GT/s x encoding (8b/10b to PCIe 2, 128b/130b after) / 8.
            let want: f64 = entry[2].as_str().unwrap().parse().unwrap();
            assert!(
                (link_gbytes(dev) - want).abs() < 1e-5,
                "{tarball}: {addr}: link {} GB/s, hwloc {want}",
                link_gbytes(dev)
            );
            links += 1;
            checked += 1;
        }
    }
    assert_eq!(checked, 147, "every PCI function hwloc lists in the four snapshots with PCI data");
    assert_eq!(links, 142, "every link speed hwloc gives (the XML snapshots)");
}

/// A function's link as hwloc states it, in GB/s; 0 without a trained link.
fn link_gbytes(dev: &Value) -> f64 {
    let link = &dev["link"];
    match (link["current_speed_gts"].as_f64(), link["current_width"].as_f64()) {
        (Some(gts), Some(width)) => gts * width * if gts < 8.0 { 0.8 } else { 128.0 / 130.0 } / 8.0,
        _ => 0.0,
    }
}

fn mask_set(mask: &str) -> BTreeSet<u64> {
    let hex: String = mask.split(',').map(|w| w.trim_start_matches("0x")).collect();
    let mut set = BTreeSet::new();
    for (i, digit) in hex.chars().rev().enumerate() {
        let v = digit.to_digit(16).unwrap() as u64;
        set.extend((0..4).filter(|b| v >> b & 1 == 1).map(|b| i as u64 * 4 + b));
    }
    set
}

/// Where hwloc attaches each PCI function, as the CPUs of the object above it: from the XML's
/// nesting (the nearest enclosing object with a cpuset), or the console's indentation (the PUs
/// under the object its host bridge hangs from).
fn hwloc_localities(dir: &std::path::Path, expected_file: &str) -> BTreeMap<String, BTreeSet<u64>> {
    let text = std::fs::read_to_string(dir.join(expected_file)).unwrap();
    let mut out = BTreeMap::new();
    if expected_file.ends_with(".xml") {
        let mut stack: Vec<Option<BTreeSet<u64>>> = Vec::new();
        let attr = |line: &str, key: &str| {
            let at = line.find(&format!(" {key}=\""))? + key.len() + 3;
            Some(line[at..at + line[at..].find('"')?].to_string())
        };
        for line in text.lines().map(str::trim) {
            if line.starts_with("</object") {
                stack.pop();
            } else if line.starts_with("<object ") {
                if let Some(busid) = attr(line, "pci_busid").filter(|_| line.contains("type=\"PCIDev\"")) {
                    if let Some(Some(set)) = stack.iter().rev().find(|s| s.is_some()) {
                        out.insert(busid, set.clone());
                    }
                }
                if !line.ends_with("/>") {
                    stack.push(attr(line, "cpuset").map(|m| mask_set(&m)));
                }
            }
        }
        return out;
    }
    let lines: Vec<(usize, &str)> = text
        .lines()
        .take_while(|l| !l.starts_with("depth"))
        .map(|l| (l.len() - l.trim_start().len(), l.trim()))
        .collect();
    let pus_under = |at: usize| -> BTreeSet<u64> {
        let indent = lines[at].0;
        lines[at + 1..]
            .iter()
            .take_while(|(i, _)| *i > indent)
            .filter_map(|(_, l)| l.strip_prefix("PU ")?.split("(P#").nth(1)?.split(')').next()?.parse().ok())
            .collect()
    };
    for (i, (indent, line)) in lines.iter().enumerate() {
        if !line.starts_with("HostBridge") {
            continue;
        }
        let parent = (0..i).rev().find(|&j| lines[j].0 < *indent).unwrap();
        let cpus = pus_under(parent);
        for (_, l) in lines[i + 1..].iter().take_while(|(j, _)| j > indent) {
            if let Some(busid) = l.split("busid=").nth(1).and_then(|r| r.split_whitespace().next()) {
                if l.starts_with("PCI ") {
                    out.insert(busid.to_string(), cpus.clone());
                }
            }
        }
    }
    out
}

/// (case, PCI function, why kiln's locality differs from hwloc's there).
const LOCALITY_DIFFERENCES: &[(&str, &str, &str)] = &[(
    "32em64t-2n8c+dax+nvme+mic+dimms",
    "0000:00:02.0",
    "the NVMe added to this snapshot by hand (its .test says so) has local_cpus 0-3 under a host bridge \
     whose functions say 0-7: hwloc places I/O per host bridge, kiln reports each function's own",
)];

/// Each PCI function's locality (its `local_cpus`, over the CPUs online) is the CPU set of the
/// object hwloc hangs it from. fakepcilocalities takes its localities from an environment
/// variable (HWLOC_PCI_LOCALITY), not from sysfs, so it has nothing to compare.
#[test]
fn pci_localities_agree_with_hwloc() {
    let dir = fixtures().join("hwloc");
    let expected = hwloc_expected();
    let mut compared = 0;
    let mut wrong = Vec::new();
    for (case, exp) in &expected {
        if exp["hwloc_expected"]["pci_devices"].as_array().unwrap().is_empty() || case == "fakepcilocalities" {
            continue;
        }
        let inv = hwloc_case_inventory(exp);
        let online = cpu_set(inv["cpu"]["online_cpus"].as_str().unwrap());
        let pci = by_address(&inv);
        for (busid, want) in hwloc_localities(&dir, exp["expected_file"].as_str().unwrap()) {
            let dev = pci.get(&busid).unwrap_or_else(|| panic!("{case}: {busid} missing"));
            let local = dev["local_cpus"].as_str().map(cpu_set).unwrap_or_else(|| online.clone());
            let got: BTreeSet<u64> = local.intersection(&online).copied().collect();
            let got = if got.is_empty() { online.clone() } else { got };
            let known = LOCALITY_DIFFERENCES.iter().find(|(c, b, _)| c == case && *b == busid);
            match known {
                Some(_) => assert_ne!(got, want, "{case}: {busid}: listed as a known difference, but kiln agrees"),
                None if got != want => wrong.push(format!("{case}: {busid}: kiln {got:?}, hwloc {want:?}")),
                None => {}
            }
            compared += 1;
        }
    }
    assert!(wrong.is_empty(), "PCI localities differ from hwloc's:\n{}", wrong.join("\n"));
    assert_eq!(compared, 133, "every PCI function hwloc places, in the snapshots whose places come from sysfs");
}

#[test]
fn server_snapshot_nics_rdma_nvme_and_names() {
    let inv = inventory_json(&hwloc_root("32em64t-2n8c+dax+nvme+mic+dimms.tar.bz2", "32em64t-2n8c+1mic"));
    let pci = by_address(&inv);
    assert_eq!(pci["0000:02:00.0"]["device_name"], "I350 Gigabit Network Connection");
    assert_eq!(pci["0000:02:00.0"]["vendor_name"], "Intel Corporation");
    assert_eq!(pci["0000:82:00.0"]["device_name"], "MT27500 Family [ConnectX-3]");
    assert_eq!(pci["0000:02:00.0"]["numa_node"], 0);
    assert_eq!(pci["0000:82:00.0"]["numa_node"], 1);
    // Upstream chain: the ConnectX-3 hangs from root port 80:02.2 of host bridge pci0000:80.
    assert_eq!(pci["0000:82:00.0"]["upstream"], serde_json::json!(["0000:80:02.2"]));
    assert_eq!(pci["0000:82:00.0"]["host_bridge"], "pci0000:80");

    let nics: BTreeMap<&str, &Value> =
        inv["nics"].as_array().unwrap().iter().map(|n| (n["name"].as_str().unwrap(), n)).collect();
    assert_eq!(nics.keys().copied().collect::<Vec<_>>(), ["eth0", "eth1", "ib0"], "physical interfaces only");
    assert_eq!(nics["eth0"]["pci_address"], "0000:02:00.0");
    assert_eq!(nics["eth1"]["pci_address"], "0000:02:00.3");
    assert_eq!(nics["ib0"]["pci_address"], "0000:82:00.0");
    assert_eq!(nics["ib0"]["link_type"], "infiniband");

    let all = kiln(&["inventory", "--json", "--all", "--root", inv["root"].as_str().unwrap()], &[]).success().json();
    assert!(all["nics"].as_array().unwrap().iter().any(|n| n["name"] == "br0" && n["virtual_device"] == true));

    let rdma = inv["rdma"].as_array().unwrap();
    let mlx = rdma.iter().find(|r| r["name"] == "mlx4_0").unwrap();
    assert_eq!(mlx["pci_address"], "0000:82:00.0");
    assert_eq!(mlx["ports"][0]["netdev"], "ib0");
    assert_eq!(mlx["ports"][0]["state"], "ACTIVE");

    let nvme = inv["nvme"].as_array().unwrap();
    assert_eq!(nvme.len(), 1);
    assert_eq!(nvme[0]["pci_address"], "0000:00:02.0");
    assert_eq!(nvme[0]["namespaces"][0]["name"], "nvme0n1");
    assert!(nvme[0]["namespaces"][0]["size_bytes"].as_u64().unwrap() > 100 << 30);

    // The topology relates the NICs through the PCI tree: eth0 and eth1 are functions of one card.
    let topo = &inv["topology"];
    let labels: Vec<&str> = topo["devices"].as_array().unwrap().iter().map(|d| d["name"].as_str().unwrap()).collect();
    let at = |n: &str| labels.iter().position(|l| *l == n).unwrap();
    assert_eq!(topo["matrix"][at("eth0")][at("eth1")], "PIX");
    assert_eq!(topo["matrix"][at("eth0")][at("mlx4_0")], "SYS");
}

#[test]
fn link_speeds_are_read() {
    let inv = inventory_json(&hwloc_root("fakepcilocalities.tar.bz2", "fakepcilocalities"));
    let mut speeds: Vec<String> = inv["pci"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|d| d["link"]["current_speed_gts"].as_f64())
        .map(|s| format!("{s} GT/s"))
        .collect();
    speeds.sort();
    speeds.dedup();
    assert_eq!(speeds, ["2.5 GT/s", "5 GT/s", "8 GT/s"], "the speeds hwloc's raw facts list");
}

#[test]
fn prometheus_infiniband_and_nvme() {
    let dir = tempfile::tempdir().unwrap();
    unpack_ttar(&fixtures().join("sysfs/prometheus-procfs/fixtures.ttar"), dir.path());
    let inv = inventory_json(&dir.path().join("fixtures"));
    let rdma: BTreeMap<&str, &Value> =
        inv["rdma"].as_array().unwrap().iter().map(|r| (r["name"].as_str().unwrap(), r)).collect();
    assert_eq!(rdma.keys().copied().collect::<Vec<_>>(), ["hfi1_0", "mlx4_0", "mlx5_0"]);
    let mlx4 = rdma["mlx4_0"];
    assert_eq!(
        (mlx4["hca_type"].as_str(), mlx4["firmware"].as_str(), mlx4["board_id"].as_str()),
        (Some("MT4099"), Some("2.31.5050"), Some("SM_1141000001000"))
    );
    let p1 = &mlx4["ports"][0];
    assert_eq!(
        (p1["state"].as_str(), p1["physical_state"].as_str(), p1["link_layer"].as_str()),
        (Some("ACTIVE"), Some("LinkUp"), Some("InfiniBand"))
    );
    assert_eq!((p1["rate"].as_str(), p1["rate_gbps"].as_f64()), (Some("40 Gb/sec (4X QDR)"), Some(40.0)));
    assert_eq!(rdma["hfi1_0"]["ports"][0]["rate_gbps"].as_f64(), Some(100.0));

    let nvme = inv["nvme"].as_array().unwrap();
    let n0 = nvme.iter().find(|n| n["name"] == "nvme0").unwrap();
    assert_eq!(n0["model"], "Samsung SSD 970 PRO 512GB");
    assert_eq!(n0["serial"], "S680HF8N190894I");
    assert_eq!(n0["firmware"], "1B2QEXP7");
    assert_eq!(n0["state"], "live");
    let ns = &n0["namespaces"][0];
    assert_eq!(
        (ns["size_bytes"].as_u64(), ns["logical_block_bytes"].as_u64()),
        (Some(3_906_250_000 * 512), Some(4096))
    );
}

#[test]
fn passed_through_gpu_is_listed_from_pci() {
    let inv = inventory_json(&unpack(&fixtures().join("sysfs/ghw/linux-amd64-accel-nvidia.tar.gz")));
    let gpus = &inv["gpus"];
    assert_eq!(gpus["pci_gpus"].as_array().unwrap().len(), 1);
    let addr = gpus["pci_gpus"][0].as_str().unwrap();
    let dev = by_address(&inv)[addr];
    assert!(dev["device_name"].as_str().unwrap().contains("P100"), "{dev}");
    assert!(inv["fingerprints"]["config_name"].as_str().unwrap().contains("P100"));
}

#[test]
fn live_nics_resolve_to_their_pci_function() {
    let inv = kiln(&["inventory", "--json"], &[]).success().json();
    for nic in inv["nics"].as_array().unwrap() {
        let name = nic["name"].as_str().unwrap();
        let target = std::fs::read_link(format!("/sys/class/net/{name}")).unwrap();
        let expected = target
            .components()
            .filter_map(|c| c.as_os_str().to_str())
            .rfind(|c| c.len() >= 12 && c.as_bytes()[4] == b':' && c.contains('.'))
            .map(str::to_string);
        assert_eq!(nic["pci_address"].as_str().map(str::to_string), expected, "{name}");
        if let Some(addr) = &expected {
            assert!(by_address(&inv).contains_key(addr), "{name}'s function {addr} is in the PCI list");
        }
    }
}

/// The OS devices hwloc hangs below PCI functions that kiln lists too: network interfaces (kiln's
/// physical NICs), OpenFabrics devices (kiln's RDMA devices on PCI) and NVMe namespaces, the same
/// set on every fixture that has them.
#[test]
fn os_devices_agree_with_hwloc() {
    let expected = hwloc_expected();
    let mut compared = 0;
    for (case, exp) in &expected {
        let os = exp["hwloc_expected"]["os_devices"].as_array().unwrap();
        if os.is_empty() {
            continue;
        }
        let of_kind = |kinds: &[&str], prefix: &str| -> BTreeSet<String> {
            os.iter()
                .filter(|d| kinds.contains(&d[0].as_str().unwrap()) && d[2].as_str().unwrap().starts_with(prefix))
                .map(|d| d[2].as_str().unwrap().to_string())
                .collect()
        };
        let inv = hwloc_case_inventory(exp);
        let names = |key: &str, filter: &dyn Fn(&Value) -> bool| -> BTreeSet<String> {
            inv[key]
                .as_array()
                .unwrap()
                .iter()
                .filter(|d| filter(d))
                .map(|d| d["name"].as_str().unwrap().to_string())
                .collect()
        };
        let nics = names("nics", &|_| true);
        let rdma = names("rdma", &|d| d["pci_address"].is_string());
        let namespaces: BTreeSet<String> = inv["nvme"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|c| c["namespaces"].as_array().unwrap())
            .map(|n| n["name"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(nics, of_kind(&["Network", "16"], ""), "{case}: network interfaces");
        assert_eq!(rdma, of_kind(&["OpenFabrics", "48"], ""), "{case}: RDMA devices");
        assert_eq!(namespaces, of_kind(&["Storage", "1"], "nvme"), "{case}: NVMe namespaces");
        compared += 1;
    }
    assert_eq!(compared, 5, "the five fixtures with OS devices");
}

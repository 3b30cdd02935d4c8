//! Inventory classes found on machines outside the fixtures (issue 17), each tested on the fixture
//! that shows it or, where none does, on a minimal snapshot of the pattern built here (said at
//! each such test): AMD compute units, cache maps that contradict their lists, memory-only NUMA
//! nodes (DAX, GPU memory), node CPU lists naming CPUs that do not exist, POWER's missing package
//! ids, and PCI class names, unknown ids and the mask-only `local_cpus`.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

use crate::util::{fake_nvml, fixtures, inventory_json, kiln, unpack};

fn put(root: &Path, rel: &str, text: &str) {
    let path = root.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

fn hwloc_root(tarball: &str, top: &str) -> std::path::PathBuf {
    unpack(&fixtures().join("hwloc").join(tarball)).join(top)
}

fn problems(inv: &Value) -> Vec<String> {
    inv["problems"].as_array().unwrap().iter().map(|p| format!("{}: {}", p["path"], p["message"])).collect()
}

/// One logical CPU's topology and caches; `caches` is (index, level, type, size, shared list).
fn cpu(
    root: &Path,
    id: u32,
    package: Option<i64>,
    core: i64,
    threads: &str,
    package_cpus: &str,
    caches: &[(u32, u8, &str, &str, &str)],
) {
    let base = format!("sys/devices/system/cpu/cpu{id}");
    if let Some(p) = package {
        put(root, &format!("{base}/topology/physical_package_id"), &format!("{p}\n"));
    }
    put(root, &format!("{base}/topology/core_id"), &format!("{core}\n"));
    put(root, &format!("{base}/topology/thread_siblings_list"), &format!("{threads}\n"));
    put(root, &format!("{base}/topology/core_siblings_list"), &format!("{package_cpus}\n"));
    for (index, level, kind, size, shared) in caches {
        let dir = format!("{base}/cache/index{index}");
        put(root, &format!("{dir}/level"), &format!("{level}\n"));
        put(root, &format!("{dir}/type"), &format!("{kind}\n"));
        put(root, &format!("{dir}/size"), &format!("{size}\n"));
        put(root, &format!("{dir}/shared_cpu_list"), &format!("{shared}\n"));
    }
}

fn cpus_online(root: &Path, list: &str) {
    for name in ["online", "possible", "present"] {
        put(root, &format!("sys/devices/system/cpu/{name}"), &format!("{list}\n"));
    }
}

/// No fixture holds a Bulldozer-family machine: this is a minimal Opteron 6200-style snapshot of
/// one package with four modules. Each module's two CPUs are thread siblings with two core ids,
/// and share the L1i and L2 (the kernel's own sysfs for these parts).
#[test]
fn amd_compute_units_are_two_cores_each() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let mut cpuinfo = String::new();
    for id in 0..8u32 {
        cpuinfo += &format!(
            "processor\t: {id}\nvendor_id\t: AuthenticAMD\ncpu family\t: 21\nmodel\t\t: 1\n\
             model name\t: AMD Opteron(TM) Processor 6272\nphysical id\t: 0\ncore id\t\t: {id}\nflags\t\t: fpu lm avx fma4\n\n"
        );
        let module = format!("{}-{}", id & !1, id | 1);
        let caches = [
            (0, 1, "Data", "16K", id.to_string()),
            (1, 1, "Instruction", "64K", module.clone()),
            (2, 2, "Unified", "2048K", module.clone()),
            (3, 3, "Unified", "6144K", "0-7".to_string()),
        ];
        let caches: Vec<(u32, u8, &str, &str, &str)> =
            caches.iter().map(|(i, l, t, s, c)| (*i, *l, *t, *s, c.as_str())).collect();
        cpu(root, id, Some(0), i64::from(id), &module, "0-7", &caches);
    }
    put(root, "proc/cpuinfo", &cpuinfo);
    cpus_online(root, "0-7");

    let inv = inventory_json(root);
    let c = &inv["cpu"];
    assert_eq!((c["packages"].as_u64(), c["cores"].as_u64(), c["compute_units"].as_u64()), (Some(1), Some(8), Some(4)));
    assert_eq!(c["threads_per_core"], 1, "one thread per core, as the core ids say");
    let logical = c["logical_cpus"].as_array().unwrap();
    assert_eq!((logical[3]["core"].as_i64(), logical[3]["core_cpus"].as_str()), (Some(3), Some("3")));
    assert_eq!(logical[3]["compute_unit_cpus"], "2-3");
    let summary = kiln(&["inventory", "--root", root.to_str().unwrap()], &[]).success();
    assert!(
        summary.stdout().contains("1 package(s), 8 cores × 1 threads in 4 compute units"),
        "{}",
        summary.describe()
    );
    // Self-consistent: the cores counted are the distinct core sets listed.
    let distinct: std::collections::BTreeSet<&str> = logical.iter().map(|l| l["core_cpus"].as_str().unwrap()).collect();
    assert_eq!(distinct.len() as u64, c["cores"].as_u64().unwrap());
    let instances: BTreeMap<(u64, String), u64> = c["caches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| {
            ((x["level"].as_u64().unwrap(), x["type"].as_str().unwrap().to_string()), x["instances"].as_u64().unwrap())
        })
        .collect();
    assert_eq!(instances[&(1, "data".into())], 8);
    assert_eq!(instances[&(1, "instruction".into())], 4, "one L1i per compute unit");
    assert_eq!(instances[&(2, "unified".into())], 4);
    assert_eq!(instances[&(3, "unified".into())], 1);
    let cpu_problems: Vec<String> = problems(&inv).into_iter().filter(|p| p.contains("system/cpu")).collect();
    assert!(cpu_problems.is_empty(), "{cpu_problems:?}");
}

/// Ordinary SMT siblings share a core id and stay one core with two threads.
#[test]
fn smt_siblings_stay_one_core() {
    let inv = inventory_json(&hwloc_root("16em64t-4s2c2t.tar.bz2", "16em64t-4s2c2t"));
    assert_eq!((inv["cpu"]["cores"].as_u64(), inv["cpu"]["threads_per_core"].as_u64()), (Some(8), Some(2)));
    assert!(inv["cpu"]["compute_units"].is_null());
}

/// hwloc's "very old fake machine" lists, for every cache, a `shared_cpu_list` that contradicts
/// its `shared_cpu_map`: the map wins (hwloc's counts: 32 L1d, 16 L2, 8 L3) and the contradiction
/// is a problem entry.
#[test]
fn cache_map_wins_over_a_contradicting_list() {
    let inv = inventory_json(&hwloc_root("64fake-4n2s2ca2c2t.tar.bz2", "64fake-4n2s2ca2c2t"));
    let count = |level: u64, kind: &str| -> u64 {
        inv["cpu"]["caches"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["level"] == level && c["type"] == kind)
            .map(|c| c["instances"].as_u64().unwrap())
            .sum()
    };
    assert_eq!((count(1, "data"), count(2, "unified"), count(3, "unified")), (32, 16, 8));
    let said = problems(&inv);
    assert!(
        said.iter().any(|p| p.contains("shared_cpu_list")
            && p.contains("shared_cpu_map says")
            && p.contains("following the map")),
        "{said:#?}"
    );
}

/// ia64 kernels write an empty `shared_cpu_map` for the L3: it is the CPU's own core's (hwloc: 8
/// L3 on this 8-core machine, not one).
#[test]
fn an_empty_cache_map_is_the_core() {
    let inv = inventory_json(&hwloc_root("8ia64-2n2s2c.tar.bz2", "8ia64-2n2s2c"));
    let l3 = inv["cpu"]["caches"].as_array().unwrap().iter().find(|c| c["level"] == 3).unwrap();
    assert_eq!(l3["instances"], 8);
}

/// CPU-less nodes backed by DAX devices, against hwloc's own view of the same snapshot: every node
/// hwloc gives a `DAXDevice` carries that device and its kind in kiln.
#[test]
fn memory_only_nodes_name_their_dax_device() {
    let inv = inventory_json(&hwloc_root("fakeheteromemtiers.tar.bz2", "fakeheteromemtiers"));
    let nodes: BTreeMap<u64, &Value> =
        inv["numa"]["nodes"].as_array().unwrap().iter().map(|n| (n["id"].as_u64().unwrap(), n)).collect();
    let only: Vec<u64> = nodes.iter().filter(|(_, n)| n["memory_only"] == true).map(|(id, _)| *id).collect();
    assert_eq!(only, [4, 6, 8, 9]);
    assert_eq!(inv["numa"]["distances"].as_array().unwrap().len(), nodes.len(), "the matrix keeps memory-only nodes");

    let console = std::fs::read_to_string(fixtures().join("hwloc/fakeheteromemtiers.console")).unwrap();
    let mut compared = 0;
    for line in console.lines().filter(|l| l.contains("NUMANode(") && l.contains("DAXDevice=")) {
        let field =
            |key: &str| line.split_whitespace().find_map(|w| w.strip_prefix(key)).unwrap().trim_end_matches(')');
        let id: u64 = field("(P#").parse().unwrap();
        let kind = match field("DAXType=") {
            "SPM" => "spm",
            "NVM" => "nvm",
            other => panic!("DAXType {other}"),
        };
        let of = &nodes[&id]["memory_of"];
        assert_eq!((of["device"].as_str(), of["kind"].as_str()), (Some(field("DAXDevice=")), Some(kind)), "node {id}");
        let parent = field("DAXParent=");
        assert!(of["parent"].as_str().unwrap().ends_with(parent), "node {id}: {of} vs {parent}");
        compared += 1;
    }
    assert_eq!(compared, 5, "the five DAX-backed nodes hwloc lists");
}

/// A Grace Hopper-style machine, where each GPU's memory is a CPU-less NUMA node that NVML names:
/// no fixture has one, so this is a minimal snapshot (one CPU node, one GPU-memory node) with the
/// fake NVML serving one GPU on that node.
#[test]
fn gpu_memory_nodes_name_their_gpu() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    put(root, "proc/cpuinfo", "processor\t: 0\nCPU implementer\t: 0x41\nCPU architecture: 8\nCPU part\t: 0xd4f\n\n");
    cpus_online(root, "0");
    cpu(root, 0, Some(0), 0, "0", "0", &[]);
    put(root, "sys/devices/system/node/node0/cpulist", "0\n");
    put(root, "sys/devices/system/node/node0/distance", "10 80\n");
    put(root, "sys/devices/system/node/node1/cpulist", "\n");
    put(root, "sys/devices/system/node/node1/distance", "80 10\n");
    put(root, "sys/devices/system/node/node1/meminfo", "Node 1 MemTotal:       100663296 kB\n");
    let machine = root.join("gh200.txt");
    std::fs::write(&machine, "driver 560.35.03\nnvml 12.560.35.03\ncuda 12060\ngpu\nname NVIDIA GH200 480GB\nbus_id 00000009:01:00.0\nnuma 1\n")
        .unwrap();
    let lib = fake_nvml();
    let inv = kiln(
        &["inventory", "--json", "--root", root.to_str().unwrap(), "--nvml-lib", lib.to_str().unwrap()],
        &[("KILN_FAKE_NVML_FIXTURE", machine.as_path())],
    )
    .success()
    .json();
    let node1 = &inv["numa"]["nodes"][1];
    assert_eq!(node1["memory_only"], true);
    assert_eq!(node1["memory_of"], serde_json::json!({"kind": "gpu", "device": "0009:01:00.0", "parent": null}));
    assert_eq!(inv["numa"]["nodes"][0]["memory_only"], false);
    let summary = kiln(
        &["inventory", "--root", root.to_str().unwrap(), "--nvml-lib", lib.to_str().unwrap()],
        &[("KILN_FAKE_NVML_FIXTURE", machine.as_path())],
    )
    .success();
    assert!(summary.stdout().contains("node1 no CPUs (memory of gpu 0009:01:00.0)"), "{}", summary.describe());
}

/// Old kernels list every possible CPU in node 0 ("0-87" on a 32-CPU box): no fixture shows it, so
/// this minimal snapshot does. The node keeps the CPUs that exist, and says what it left out.
#[test]
fn node_cpus_are_cut_to_the_cpus_that_exist() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let mut cpuinfo = String::new();
    for id in 0..4u32 {
        cpuinfo += &format!("processor\t: {id}\nvendor_id\t: GenuineIntel\nmodel name\t: Xeon\nflags\t\t: lm\n\n");
        cpu(root, id, Some(0), i64::from(id), &id.to_string(), "0-3", &[]);
    }
    put(root, "proc/cpuinfo", &cpuinfo);
    cpus_online(root, "0-3");
    put(root, "sys/devices/system/cpu/possible", "0-87\n");
    put(root, "sys/devices/system/node/node0/cpulist", "0-87\n");
    let inv = inventory_json(root);
    let node = &inv["numa"]["nodes"][0];
    assert_eq!((node["cpus"].as_str(), node["cpu_count"].as_u64()), (Some("0-3"), Some(4)));
    let said = problems(&inv);
    assert!(said.iter().any(|p| p.contains("node0/cpulist") && p.contains("4-87")), "{said:#?}");
}

/// POWER kernels without `physical_package_id` (and s390, which writes -1): no fixture is a POWER
/// server, so this minimal snapshot is one (two chips of two SMT4 cores). Packages are numbered
/// from their CPU sets, as hwloc does; the s390 fixture's -1 gives way the same.
#[test]
fn package_ids_come_from_package_sets_where_the_kernel_gives_none() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let mut cpuinfo = String::new();
    for id in 0..16u32 {
        cpuinfo += &format!("processor\t: {id}\ncpu\t\t: POWER9, altivec supported\n\n");
        let core = id / 4;
        let threads = format!("{}-{}", core * 4, core * 4 + 3);
        let package = if id < 8 { "0-7" } else { "8-15" };
        cpu(root, id, None, i64::from(core), &threads, package, &[]);
    }
    put(root, "proc/cpuinfo", &cpuinfo);
    cpus_online(root, "0-15");
    let inv = inventory_json(root);
    let c = &inv["cpu"];
    assert_eq!(
        (c["packages"].as_u64(), c["cores"].as_u64(), c["threads_per_core"].as_u64()),
        (Some(2), Some(4), Some(4))
    );
    let packages: Vec<i64> =
        c["logical_cpus"].as_array().unwrap().iter().map(|l| l["package"].as_i64().unwrap()).collect();
    assert_eq!(packages, [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1]);

    let s390 = inventory_json(&unpack(&fixtures().join("hwloc/20s390-2g6s4c.tar.bz2")).join("20s390-2g2g2s4co"));
    assert!(s390["cpu"]["logical_cpus"]
        .as_array()
        .unwrap()
        .iter()
        .all(|l| l["package"].as_i64().is_some_and(|p| p >= 0)));
}

/// A bridge is a "PCI bridge" that decodes normally; an unknown id is null, not ""; `local_cpus`
/// comes from the mask file where the list file is absent (fakepcilocalities has only masks).
#[test]
fn pci_class_names_ids_and_locality() {
    let inv = inventory_json(&hwloc_root("32em64t-2n8c+dax+nvme+mic+dimms.tar.bz2", "32em64t-2n8c+1mic"));
    let port = inv["pci"].as_array().unwrap().iter().find(|d| d["address"] == "0000:00:01.0").unwrap();
    assert_eq!(
        (port["class_name"].as_str(), port["prog_if_name"].as_str()),
        (Some("PCI bridge"), Some("Normal decode"))
    );

    let local = inventory_json(&hwloc_root("fakepcilocalities.tar.bz2", "fakepcilocalities"));
    let devices = local["pci"].as_array().unwrap();
    assert!(devices.iter().all(|d| d["local_cpus"].is_string()), "every function's locality, from its mask");

    // A function whose sysfs holds neither id files nor config space: ids unknown.
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    put(root, "proc/cpuinfo", "processor\t: 0\n\n");
    put(root, "sys/bus/pci/devices/0000:00:1f.0/class", "0x060100\n");
    put(root, "sys/bus/pci/devices/0000:00:1f.0/local_cpus", "00000000,0000000f\n");
    let inv = inventory_json(root);
    let dev = &inv["pci"][0];
    assert!(dev["vendor_id"].is_null() && dev["device_id"].is_null(), "{dev}");
    assert_eq!((dev["class_name"].as_str(), dev["local_cpus"].as_str()), (Some("ISA bridge"), Some("0-3")));
}

/// Hugepage pools: an empty pool (no persistent, no surplus pages) is known empty without reading
/// its free and reserved counts; a used pool, or one of surplus pages only, is read whole; a node's
/// pool has no reservations of its own. A minimal snapshot, since every fixture's pools are plain.
#[test]
fn hugepage_pools_empty_used_and_surplus() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    put(root, "proc/cpuinfo", "processor\t: 0\n\n");
    let global = "sys/kernel/mm/hugepages";
    put(root, &format!("{global}/hugepages-2048kB/nr_hugepages"), "0\n");
    put(root, &format!("{global}/hugepages-2048kB/surplus_hugepages"), "0\n");
    put(root, &format!("{global}/hugepages-1048576kB/nr_hugepages"), "0\n");
    put(root, &format!("{global}/hugepages-1048576kB/surplus_hugepages"), "2\n");
    put(root, &format!("{global}/hugepages-1048576kB/free_hugepages"), "1\n");
    put(root, &format!("{global}/hugepages-1048576kB/resv_hugepages"), "1\n");
    let node = "sys/devices/system/node/node0/hugepages/hugepages-1048576kB";
    put(root, "sys/devices/system/node/node0/cpulist", "0\n");
    put(root, &format!("{node}/nr_hugepages"), "4\n");
    put(root, &format!("{node}/free_hugepages"), "3\n");
    put(root, &format!("{node}/surplus_hugepages"), "0\n");
    let inv = inventory_json(root);
    let pools = &inv["memory"]["hugepages"];
    assert_eq!(
        pools[0],
        serde_json::json!({"size_bytes": 2097152, "total": 0, "free": 0, "reserved": 0, "surplus": 0})
    );
    assert_eq!(
        pools[1],
        serde_json::json!({"size_bytes": 1073741824u64, "total": 0, "free": 1, "reserved": 1, "surplus": 2})
    );
    assert_eq!(
        inv["numa"]["nodes"][0]["hugepages"][0],
        serde_json::json!({"size_bytes": 1073741824u64, "total": 4, "free": 3, "reserved": null, "surplus": 0})
    );
}

//! ghw's snapshots (`tests/fixtures/sysfs/ghw`): an arm64 cloud instance, an s390x guest, a VM
//! with offline CPUs, a hybrid laptop, a two-socket Xeon server. Expected values are the machines'
//! published specifications and the snapshot's own files.

use serde_json::Value;

use crate::util::{fixtures, inventory_json, unpack};

fn ghw(name: &str) -> Value {
    inventory_json(&unpack(&fixtures().join("sysfs/ghw").join(format!("{name}.tar.gz"))))
}

fn kinds(inv: &Value) -> Vec<(String, String)> {
    inv["cpu"]["core_kinds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| (k["name"].as_str().unwrap().to_string(), k["cpus"].as_str().unwrap().to_string()))
        .collect()
}

#[test]
fn arm64_graviton2() {
    let inv = ghw("linux-arm64-c288e0776090cd558ef793b2a4e61939");
    let cpu = &inv["cpu"];
    assert_eq!(cpu["architecture"], "aarch64");
    assert_eq!(cpu["model_name"], "ARM Neoverse-N1", "Graviton2 is Neoverse-N1 (MIDR 0x41/0xd0c)");
    assert_eq!(cpu["part"], "0xd0c");
    assert_eq!((cpu["packages"].as_u64(), cpu["cores"].as_u64(), cpu["online"].as_u64()), (Some(1), Some(1), Some(1)));
    assert_eq!(cpu["ml_features"], serde_json::json!(["asimd", "asimdhp", "asimddp"]));
    assert!(cpu["family"].is_null(), "x86 fields stay empty on Arm");
    // No DMI on this instance: a problem entry, not a failure.
    assert!(inv["problems"]
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p["path"].as_str().unwrap().ends_with("sys/class/dmi/id")));
}

#[test]
fn s390x_guest() {
    let inv = ghw("linux-s390x-snapshot");
    let cpu = &inv["cpu"];
    assert_eq!(cpu["architecture"], "s390x");
    assert_eq!(
        (cpu["cores"].as_u64(), cpu["online"].as_u64(), cpu["threads_per_core"].as_u64()),
        (Some(4), Some(8), Some(2))
    );
    assert!(cpu["vendor"].as_str().unwrap().contains("S390"));
}

#[test]
fn offline_cpus() {
    let inv = ghw("linux-amd64-offlineCPUs");
    let cpu = &inv["cpu"];
    assert_eq!(cpu["online_cpus"], "0-1");
    assert_eq!(cpu["offline_cpus"], "2-3");
    assert_eq!(cpu["possible_cpus"], "0-3");
    let offline: Vec<&Value> =
        cpu["logical_cpus"].as_array().unwrap().iter().filter(|c| c["online"] == false).collect();
    assert_eq!(offline.len(), 2);
    assert!(offline.iter().all(|c| c["package"].is_null()), "an offline CPU has no known place");
}

#[test]
fn hybrid_laptop_has_two_core_kinds() {
    // Core i7-1270P: 4 performance cores with 2 threads each, 8 efficiency cores.
    let inv = ghw("linux-amd64-415ee03b8c4d1c4f07ae2e9d8b3d3d6d");
    let cpu = &inv["cpu"];
    assert_eq!(cpu["model_name"], "12th Gen Intel(R) Core(TM) i7-1270P");
    assert_eq!((cpu["cores"].as_u64(), cpu["online"].as_u64()), (Some(12), Some(16)));
    assert!(cpu["threads_per_core"].is_null(), "mixed SMT has no single threads-per-core figure");
    assert_eq!(kinds(&inv), [("performance".into(), "0-7".into()), ("efficiency".into(), "8-15".into())]);
    assert!(cpu["ml_features"].as_array().unwrap().iter().any(|f| f == "avx_vnni"));
}

#[test]
fn two_socket_xeon_server() {
    // 2× Xeon L5640: 6 cores, 12 threads and 12 MiB L3 per socket; one NUMA node per socket.
    let inv = ghw("linux-amd64-8581cf3a529e5d8b97ea876eade2f60d");
    let cpu = &inv["cpu"];
    assert_eq!(
        (cpu["packages"].as_u64(), cpu["cores"].as_u64(), cpu["online"].as_u64()),
        (Some(2), Some(12), Some(24))
    );
    assert_eq!((cpu["cores_per_package"].as_u64(), cpu["threads_per_core"].as_u64()), (Some(6), Some(2)));
    let l3 = cpu["caches"].as_array().unwrap().iter().find(|c| c["level"] == 3).unwrap();
    assert_eq!(
        (l3["size_bytes"].as_u64(), l3["instances"].as_u64(), l3["cpus_per_instance"].as_u64()),
        (Some(12 << 20), Some(2), Some(12))
    );
    assert_eq!(inv["numa"]["distances"], serde_json::json!([[10, 20], [20, 10]]));
    assert_eq!(inv["numa"]["nodes"][0]["cpus"], "0,2,4,6,8,10,12,14,16,18,20,22");
    assert_eq!(inv["fingerprints"]["config_name"], "2× Intel Xeon L5640 · 64 GiB");
}

#[test]
fn same_build_same_config_fingerprint() {
    // The configuration fingerprint ignores everything that varies between boxes of one build.
    let a = ghw("linux-amd64-8581cf3a529e5d8b97ea876eade2f60d");
    let b = ghw("linux-amd64-8581cf3a529e5d8b97ea876eade2f60d");
    assert_eq!(a["fingerprints"]["config"], b["fingerprints"]["config"]);
    let c = ghw("linux-amd64-61797caf7c0b6bca1725ad7975ed4773");
    assert_ne!(a["fingerprints"]["config"], c["fingerprints"]["config"]);
}

//! How fast is a verdict? The targets are the anchors, printed as ratios in one run:
//!
//! 1. `kiln_sku::verdict::judge` on the stored evidence of an 8-GPU box (the inventory of the synthetic
//!    Azure ND H100 v5 tree served by the fake NVML, read back from the database as `kiln verdict`
//!    reads it) against the shipped H100 spec — target < 20 ms;
//! 2. the whole process `kiln verdict --inventory ID --no-save` (open the database, read the
//!    evidence, judge, print) — same target;
//! 3. the whole process `kiln commission --no-bench --spec … --root <synthetic HGX>` with the fake
//!    NVML — target < 50 ms.
//!
//! Run with `cargo bench --bench verdict` (needs `cc` for the fake NVML).

#[path = "../tests/synthetic.rs"]
#[allow(dead_code)]
mod synthetic;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use kiln_bench::stats::summarize;

const ROUNDS: usize = 30;

fn run(argv: &[&str], env: &[(&str, &Path)]) -> (f64, Vec<u8>) {
    let started = Instant::now();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kiln"));
    cmd.args(argv).stdin(Stdio::null()).stderr(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("running kiln");
    let ms = started.elapsed().as_secs_f64() * 1e3;
    assert!(matches!(out.status.code(), Some(0 | 1 | 3)), "kiln {argv:?}: {:?}", out.status);
    (ms, out.stdout)
}

fn report(what: &str, samples: &[f64], target_ms: f64) {
    let s = summarize(samples).expect("samples");
    println!(
        "{what}: median {:.2} ms (95% CI {:.2}..{:.2}, min {:.2}, n {}) = {:.3}x the {target_ms} ms target",
        s.median,
        s.median_ci.0,
        s.median_ci.1,
        s.min,
        s.n,
        s.median / target_ms
    );
}

fn main() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lib = Path::new(env!("CARGO_TARGET_TMPDIR")).join("verdict-bench-libnvidia-ml.so.1");
    if let Err(e) = synthetic::compile_fake_nvml(&lib) {
        println!("verdict bench: {e}; skipped");
        return;
    }
    let xml = std::fs::read_to_string(repo.join("tests/fixtures/nvidia/nccl-topology/azure_ndv5-topo.xml"))
        .expect("tests/fixtures/nvidia/nccl-topology/azure_ndv5-topo.xml");
    let (tree, gpus) = synthetic::ndv5_tree(&xml, None);
    synthetic::finish_root(&tree, "[    1.0] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  565.57.01\n");
    let machine = std::fs::read_to_string(repo.join("tests/fake-nvml/machines/hgx-h100x8.txt")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let fixture = dir.path().join("machine.txt");
    std::fs::write(&fixture, synthetic::on_bus_ids(&machine, &gpus)).unwrap();
    let db = dir.path().join("kiln.db");
    let spec = repo.join("specs/hgx-h100-sxm5-80gb-8x.toml");
    let (db_s, spec_s, root_s, lib_s) =
        (db.to_str().unwrap(), spec.to_str().unwrap(), tree.root().to_str().unwrap(), lib.to_str().unwrap());
    let env = [("KILN_FAKE_NVML_FIXTURE", fixture.as_path())];
    let commission =
        ["--db", db_s, "commission", "--no-bench", "--json", "--spec", spec_s, "--root", root_s, "--nvml-lib", lib_s];
    let (_, first) = run(&commission, &env);
    let doc: serde_json::Value = serde_json::from_slice(&first).unwrap();
    assert_eq!(doc["verdict"], "accept", "the clean synthetic box is accepted");
    let inventory = doc["stored"]["inventory_id"].as_str().unwrap().to_string();
    let rejudge = ["--db", db_s, "verdict", "--inventory", &inventory, "--spec", spec_s, "--no-save", "--json"];

    // The evidence as `kiln verdict` reads it.
    let inv: kiln_inventory::Inventory = serde_json::from_value(doc["inventory"].clone()).unwrap();
    let loaded = kiln_sku::spec::load(&spec).unwrap();
    let fleet = std::collections::BTreeMap::new();
    let evidence = kiln_sku::verdict::Evidence {
        inventory: &inv,
        inventory_id: Some(&inventory),
        runs: &[],
        fleet: &fleet,
        performance_judged: false,
        baseline: None,
    };
    let checks = kiln_sku::verdict::judge(&loaded, &evidence, false).checks.len();

    let (mut judge_ms, mut verdict_ms, mut commission_ms) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        let t = Instant::now();
        let v = kiln_sku::verdict::judge(&loaded, &evidence, false);
        judge_ms.push(t.elapsed().as_secs_f64() * 1e3);
        std::hint::black_box(v);
        verdict_ms.push(run(&rejudge, &env).0);
        commission_ms.push(run(&commission, &env).0);
    }
    println!("8x H100 evidence: {} GPUs, {} PCI functions, {checks} checks", inv.gpus.devices.len(), inv.pci.len());
    report("judge (library)", &judge_ms, 20.0);
    report("kiln verdict --inventory (process)", &verdict_ms, 20.0);
    report("kiln commission --no-bench --spec --root (process)", &commission_ms, 50.0);
}

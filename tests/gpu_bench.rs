//! `kiln bench gpu gemm` as a technician runs it, on this CPU machine: skipped with its reason
//! where there is no GPU, no kiln-gpu or no CUDA; and on the fake NVML's 8× H100, with a stand-in
//! for kiln-gpu (a shell script, as the fake NVML stands in for the driver) printing documents
//! that the real `kiln_gpu` library measured on the CPU — one GPU right, one hung, one computing
//! wrong, one disagreeing with the rest — judged, stored and read back with its 10 Hz telemetry.

use std::path::{Path, PathBuf};

use candle_core::Device;
use kiln_gpu::gemm::{self, Options};

use crate::util::{fake_nvml, kiln, needs, Run};

fn h100x8() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake-nvml/machines/hgx-h100x8.txt")
}

/// `kiln bench gpu gemm` with the fake NVML serving 8× H100 and `KILN_GPU` naming `program`.
fn on_fake_hgx(args: &[&str], program: &Path, db: &Path) -> Run {
    let lib = fake_nvml();
    let mut all = vec!["bench", "gpu", "gemm", "--json"];
    all.extend(args);
    let fixture = h100x8();
    kiln(&all, &[("KILN_NVML_LIB", &lib), ("KILN_FAKE_NVML_FIXTURE", &fixture), ("KILN_GPU", program), ("KILN_DB", db)])
}

#[test]
fn without_a_gpu_the_benchmark_is_skipped_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("kiln.db");
    // This machine's own NVML: none here (a GPU machine running the tests has one).
    let run = kiln(
        &["bench", "gpu", "gemm", "--json"],
        &[("KILN_DB", &db), ("KILN_NVML_LIB", Path::new("/nonexistent/libnvidia-ml.so.1"))],
    );
    assert_eq!(run.code(), Some(3), "{}", run.describe());
    let doc = run.json();
    assert_eq!(doc["benchmark"], "gpu-gemm");
    assert!(doc["skipped"].as_str().unwrap().contains("no NVIDIA GPU"), "{doc}");
    // GPUs, but KILN_GPU names nothing.
    let run = on_fake_hgx(&[], Path::new("/nonexistent/kiln-gpu"), &db);
    assert_eq!(run.code(), Some(3), "{}", run.describe());
    assert!(run.json()["skipped"].as_str().unwrap().contains("KILN_GPU names /nonexistent/kiln-gpu"));
    // Nothing was measured, so nothing was stored.
    let runs = kiln(&["runs", "--json"], &[("KILN_DB", &db)]).success().json();
    assert!(runs["runs"].as_array().is_none_or(Vec::is_empty), "{runs}");
}

/// The real kiln-gpu of the default build (no CUDA) says what to build; kiln passes that on.
#[test]
fn a_kiln_gpu_built_without_cuda_skips_saying_what_to_build() {
    let real = Path::new(env!("CARGO_BIN_EXE_kiln")).with_file_name("kiln-gpu");
    if !real.is_file() {
        let why = "kiln-gpu built beside kiln (cargo test --workspace builds it)".to_string();
        assert!(!needs("a_kiln_gpu_built_without_cuda_skips_saying_what_to_build", &[why]));
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let run = on_fake_hgx(&["--no-save"], &real, &dir.path().join("kiln.db"));
    assert_eq!(run.code(), Some(3), "{}", run.describe());
    let why = run.json()["skipped"].as_str().unwrap().to_string();
    assert!(why.contains("built without CUDA") && why.contains("cuda-root.sh"), "{why}");
}

/// A document of `kiln-gpu gemm` for `device`, measured on the CPU by the real library; its
/// times made steady (the CPU's are not what is under test).
fn measured(device: usize) -> gemm::Report {
    let options = Options { device, dtype: gemm::Precision::Bf16, shape: gemm::Shape::square(64), reps: 4, samples: 8 };
    let mut r = gemm::measure(&Device::Cpu, &options, Some("NVIDIA H100 80GB HBM3".into())).unwrap();
    r.seconds = vec![1.0e-3; 4];
    r.tflops_median = r.flops_per_rep / 1.0e-3 / 1e12;
    r.tflops_best = r.tflops_median;
    r
}

/// A stand-in for kiln-gpu: `devices` prints the four devices; `gemm --device N` prints
/// `gemm-N.json` and `bandwidth --device N` `bandwidth-N.json`, or hangs where `hang-N` exists.
fn stand_in(dir: &Path, docs: &[(usize, Option<gemm::Report>)]) -> PathBuf {
    let devices: Vec<kiln_gpu::DeviceInfo> = (0..4)
        .map(|ordinal| kiln_gpu::DeviceInfo {
            ordinal,
            name: "NVIDIA H100 80GB HBM3".into(),
            compute_capability: "9.0".into(),
            memory_bytes: 80 << 30,
        })
        .collect();
    let doc = |v: serde_json::Value| {
        let mut v = v;
        v["schema_version"] = 1.into();
        v.to_string()
    };
    std::fs::write(dir.join("devices.json"), doc(serde_json::json!({ "devices": devices }))).unwrap();
    for (device, report) in docs {
        match report {
            Some(r) => {
                std::fs::write(dir.join(format!("gemm-{device}.json")), doc(serde_json::to_value(r).unwrap())).unwrap()
            }
            None => std::fs::write(dir.join(format!("hang-{device}")), "").unwrap(),
        }
    }
    let script = dir.join("kiln-gpu");
    std::fs::write(
        &script,
        "#!/bin/sh\n\
         dir=$(dirname \"$0\")\n\
         if [ \"$1\" = devices ]; then cat \"$dir/devices.json\"; exit 0; fi\n\
         command=$1\n\
         dev=0\n\
         while [ $# -gt 0 ]; do if [ \"$1\" = --device ]; then dev=$2; fi; shift; done\n\
         if [ -e \"$dir/hang-$dev\" ]; then exec sleep 60; fi\n\
         cat \"$dir/$command-$dev.json\"\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    script
}

#[test]
fn right_gpus_pass_and_a_hung_a_wrong_and_a_disagreeing_gpu_are_each_named() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("kiln.db");

    // Two right GPUs: measured alone and together, stored as a result.
    let good = tempfile::tempdir().unwrap();
    let program = stand_in(good.path(), &[(0, Some(measured(0))), (1, Some(measured(1)))]);
    // And a sweep of shapes on each, measured by the real library on the CPU: 64 is made the
    // fastest, so that --n 64 reaches 100 % of the best shape.
    for device in [0, 1] {
        let args: Vec<String> =
            "--dtype bf16 --shapes 32,64,48x64x32 --reps 2 --samples 8".split_whitespace().map(String::from).collect();
        let options =
            gemm::SweepOptions { device, ..kiln_gpu::request::checked::<kiln_gpu::request::SweepArgs>(&args).unwrap() };
        let mut sweep = gemm::sweep(&Device::Cpu, &options, Some("NVIDIA H100 80GB HBM3".into())).unwrap();
        for (i, r) in sweep.results.iter_mut().enumerate() {
            let rate = if i == 1 { measured(device).tflops_median } else { 1e-6 };
            r.seconds = vec![r.flops_per_rep / rate / 1e12; 2];
            (r.tflops_median, r.tflops_best) = (rate, rate);
        }
        sweep.best = Some(1);
        let mut doc = serde_json::to_value(&sweep).unwrap();
        doc["schema_version"] = 1.into();
        std::fs::write(good.path().join(format!("sweep-{device}.json")), doc.to_string()).unwrap();
    }
    let run = on_fake_hgx(
        &["--gpus", "0,1", "--reps", "4", "--n", "64", "--samples", "8", "--sweep", "32,64,48x64x32"],
        &program,
        &db,
    );
    assert_eq!(run.code(), Some(0), "{}", run.describe());
    let doc = run.json();
    assert_eq!(doc["status"], "ok", "{doc}");
    let results = doc["report"]["results"].as_array().unwrap();
    assert_eq!(results.len(), 4, "two GPUs alone, then both at once: {doc}");
    assert_eq!(doc["report"]["agreement"][0]["ok"], true);
    assert!(results.iter().all(|r| (r["peak_tflops"].as_f64().unwrap() - 989.4).abs() < 1e-9));
    let shown = kiln(&["show", "run", doc["run_id"].as_str().unwrap(), "--json"], &[("KILN_DB", &db)]).success().json();
    let names: Vec<&str> = shown["metrics"].as_array().unwrap().iter().map(|m| m["name"].as_str().unwrap()).collect();
    let sweeps = doc["report"]["sweeps"].as_array().unwrap();
    assert_eq!(sweeps.len(), 2, "{doc}");
    assert!(sweeps.iter().all(|s| s["best_shape"] == "64x64x64"), "{doc}");
    let alone = results.iter().filter(|r| r["together"] == false);
    assert!(alone.clone().all(|r| (r["fraction_of_best"].as_f64().unwrap() - 1.0).abs() < 1e-9), "{doc}");
    for want in [
        "gpu0.gemm.bf16.64.tflops",
        "gpu1.gemm.bf16.64.all_tflops",
        "gpus.gemm.bf16.64.tflops",
        "gpu1.gemm.bf16.best_tflops",
    ] {
        assert!(names.contains(&want), "{want} in {names:?}");
    }

    // GPU 1 hangs, GPU 2 computes wrong, GPU 3 passes its own check but disagrees with the rest.
    let bad = tempfile::tempdir().unwrap();
    let mut wrong = measured(2);
    wrong.check.ok = false;
    wrong.check.worst_ratio = 37.0;
    wrong.check.worst_at = (9, 18);
    let mut odd = measured(3);
    odd.check.sampled_sum += 10.0 * odd.check.allowed_sum;
    let program = stand_in(bad.path(), &[(0, Some(measured(0))), (1, None), (2, Some(wrong)), (3, Some(odd))]);
    let started = std::time::Instant::now();
    let run = on_fake_hgx(
        &["--gpus", "0,1,2,3", "--reps", "4", "--n", "64", "--samples", "8", "--timeout", "2"],
        &program,
        &db,
    );
    assert!(started.elapsed().as_secs() < 30, "the hung GPU was stopped at its deadline, twice");
    assert_eq!(run.code(), Some(1), "{}", run.describe());
    let doc = run.json();
    assert_eq!(doc["status"], "failed");
    let failures: Vec<&str> =
        doc["report"]["failures"].as_array().unwrap().iter().map(|f| f.as_str().unwrap()).collect();
    let named = |gpu: &str, what: &str| failures.iter().any(|f| f.starts_with(gpu) && f.contains(what));
    assert!(named("GPU 1 (bf16): ", "did not finish within 2 s"), "{failures:#?}");
    assert!(named("GPU 1 (bf16, all GPUs at once): ", "did not finish within 2 s"), "{failures:#?}");
    assert!(named("GPU 2 (bf16) ", "computed wrong: C[9][18]"), "{failures:#?}");
    assert!(named("GPU 3 (bf16) ", "disagrees with the other GPUs"), "{failures:#?}");
    assert!(!failures.iter().any(|f| f.starts_with("GPU 0")), "GPU 0 is right: {failures:#?}");
    // NVML telemetry at 10 Hz for every GPU, over the whole run (two 2 s deadlines at least).
    let shown = kiln(&["show", "run", doc["run_id"].as_str().unwrap(), "--json"], &[("KILN_DB", &db)]).success().json();
    let telemetry = shown["telemetry"].as_array().unwrap();
    for gpu in 0..8 {
        // (ms since start, source, name, value); the fake NVML serves temperatures of its readings.
        let source = format!("gpu{gpu}");
        let readings = telemetry.iter().filter(|t| t[1] == source.as_str() && t[2] == "temperature_c").count();
        assert!(readings >= 25, "{source}: {readings} temperature readings in over 4 s");
    }
    // Stored as what it was: failed, never a result.
    let runs = kiln(&["runs", "--json"], &[("KILN_DB", &db)]).success().json();
    let statuses: Vec<&str> = runs["runs"].as_array().unwrap().iter().map(|r| r["status"].as_str().unwrap()).collect();
    assert_eq!(statuses.iter().filter(|s| **s == "failed").count(), 1, "{runs}");
    // No stand-in is left running.
    let left = std::process::Command::new("pgrep").args(["-f", &bad.path().display().to_string()]).output();
    if let Ok(out) = left {
        assert!(out.stdout.is_empty(), "left running: {}", String::from_utf8_lossy(&out.stdout));
    }
}

/// A `kiln-gpu bandwidth` document: copies at the given rates, the data intact or not.
fn bandwidth(device: usize, hbm_gbps: f64, link_gbps: f64, intact: bool) -> kiln_gpu::bandwidth::Report {
    use kiln_gpu::bandwidth::Copies;
    let bytes = (1u64 << 30) as f64;
    let copies = |counted: f64, gbps: f64| Copies::new(counted, vec![counted / gbps / 1e9; 4], intact);
    kiln_gpu::bandwidth::Report {
        device,
        name: Some("NVIDIA H100 80GB HBM3".into()),
        bytes: 1 << 30,
        cpus: None,
        device_copy: copies(2.0 * bytes, hbm_gbps),
        triad: Some(copies(3.0 * bytes, hbm_gbps)),
        triad_error: None,
        host_to_device: copies(bytes, link_gbps),
        device_to_host: copies(bytes, link_gbps),
    }
}

#[test]
fn memory_bandwidth_is_stored_per_gpu_and_changed_data_fails_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("kiln.db");
    let stand = tempfile::tempdir().unwrap();
    let program = stand_in(stand.path(), &[]);
    for (device, intact) in [(0, true), (1, true)] {
        let doc = serde_json::to_value(bandwidth(device, 2900.0, 53.0, intact)).unwrap();
        std::fs::write(stand.path().join(format!("bandwidth-{device}.json")), doc.to_string()).unwrap();
    }
    let run = on_fake_hgx_memory(&["--gpus", "0,1", "--mib", "1024", "--reps", "4"], &program, &db);
    assert_eq!(run.code(), Some(0), "{}", run.describe());
    let doc = run.json();
    assert_eq!(doc["status"], "ok", "{doc}");
    // The fake machine's GPUs are not on this machine's PCI tree: their NUMA node is unknown, so
    // the host side is not pinned; alone, then together.
    let results = doc["report"]["results"].as_array().unwrap();
    assert_eq!(results.len(), 4, "{doc}");
    assert!(results.iter().all(|r| r["placement"] == "unpinned"), "{doc}");
    let ceiling = &doc["report"]["ceilings"][0];
    assert_eq!(ceiling["memory_gbps"], 3350.0, "{ceiling}");
    // The host link's most is a ceiling only where the hardware set it: in a virtual machine (as
    // the inventory says this one is, or not) NVML's figure may be the hypervisor's port's.
    let live = kiln(&["inventory", "--json"], &[]).success().json();
    let virtual_machine = live["os"]["virtualization"]["is_virtual"].as_bool().unwrap();
    let bound = if virtual_machine { "virtual_port" } else { "device" };
    assert_eq!(ceiling["link_bound"], bound, "{ceiling}");
    let shown = kiln(&["show", "run", doc["run_id"].as_str().unwrap(), "--json"], &[("KILN_DB", &db)]).success().json();
    let metric = |name: &str| {
        shown["metrics"].as_array().unwrap().iter().find(|m| m["name"] == name).map(|m| m["value"].as_f64().unwrap())
    };
    assert!((metric("gpu1.hbm_copy_gbps").unwrap() - 2900.0).abs() < 1e-6, "{}", shown["metrics"]);
    assert!((metric("gpus.h2d_gbps").unwrap() - 106.0).abs() < 1e-6);

    // GPU 1's copies arrive changed: named, the run failed.
    let doc = serde_json::to_value(bandwidth(1, 2900.0, 53.0, false)).unwrap();
    std::fs::write(stand.path().join("bandwidth-1.json"), doc.to_string()).unwrap();
    let run = on_fake_hgx_memory(&["--gpus", "0,1", "--reps", "4"], &program, &db);
    assert_eq!(run.code(), Some(1), "{}", run.describe());
    let text = run.json()["report"]["failures"].to_string();
    assert!(text.contains("GPU 1: the device copy arrived changed"), "{text}");
    assert!(!text.contains("GPU 0"), "{text}");
}

/// `kiln bench gpu memory` on the fake 8× H100.
fn on_fake_hgx_memory(args: &[&str], program: &Path, db: &Path) -> Run {
    let lib = fake_nvml();
    let mut all = vec!["bench", "gpu", "memory", "--json"];
    all.extend(args);
    let fixture = h100x8();
    kiln(&all, &[("KILN_NVML_LIB", &lib), ("KILN_FAKE_NVML_FIXTURE", &fixture), ("KILN_GPU", program), ("KILN_DB", db)])
}

#[test]
fn a_burn_names_the_gpu_that_miscomputed_while_all_ran_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("kiln.db");
    let stand = tempfile::tempdir().unwrap();
    let program = stand_in(stand.path(), &[]);
    // A real burn of the library on the CPU, then GPU 1's copy with a failed check.
    let args: Vec<String> = "--n 64 --seconds 1.2 --samples 8".split_whitespace().map(String::from).collect();
    let burn =
        gemm::burn(&Device::Cpu, &kiln_gpu::request::checked::<kiln_gpu::request::BurnArgs>(&args).unwrap(), None)
            .unwrap();
    for device in [0, 1] {
        let mut b = burn.clone();
        b.device = device;
        if device == 1 {
            (b.failed_checks, b.first_failure_s) = (1, Some(1.0));
            b.intervals[0].ok = false;
        }
        let mut doc = serde_json::to_value(&b).unwrap();
        doc["schema_version"] = 1.into();
        std::fs::write(stand.path().join(format!("burn-{device}.json")), doc.to_string()).unwrap();
    }
    let run = on_fake_hgx(&["--gpus", "0,1", "--n", "64", "--burn", "2s"], &program, &db);
    assert_eq!(run.code(), Some(1), "{}", run.describe());
    let doc = run.json();
    assert_eq!((doc["benchmark"].as_str(), doc["status"].as_str()), (Some("gpu-burn"), Some("failed")), "{doc}");
    let failures = doc["report"]["failures"].to_string();
    assert!(failures.contains("GPU 1 computed wrong in 1 of"), "{failures}");
    assert!(!failures.contains("GPU 0"), "{failures}");
    let shown = kiln(&["show", "run", doc["run_id"].as_str().unwrap(), "--json"], &[("KILN_DB", &db)]).success().json();
    let names: Vec<&str> = shown["metrics"].as_array().unwrap().iter().map(|m| m["name"].as_str().unwrap()).collect();
    assert!(names.contains(&"gpu0.burn.bf16.tflops") && names.contains(&"gpu1.burn.bf16.min_tflops"), "{names:?}");
    // A duration that is none is refused before anything runs.
    let run = on_fake_hgx(&["--burn", "10 parsecs"], &program, &db);
    assert_eq!(run.code(), Some(2), "{}", run.describe());
}

/// A `kiln-gpu p2p` document over `gpus`: every pair at `gbps` one way, the `slow` pairs at theirs.
fn p2p_matrix(gpus: &[usize], gbps: f64, slow: &[(usize, usize, f64)]) -> kiln_gpu::p2p::Report {
    use kiln_gpu::bandwidth::Copies;
    use kiln_gpu::p2p::{Both, Pair};
    let bytes = (256u64 << 20) as f64;
    let rate = |a: usize, b: usize| slow.iter().find(|s| (s.0, s.1) == (a, b)).map_or(gbps, |s| s.2);
    let copies = |counted: f64, rate: f64| Copies::new(counted, vec![counted / rate / 1e9; 4], true);
    kiln_gpu::p2p::Report {
        devices: gpus.to_vec(),
        names: vec!["NVIDIA H100 80GB HBM3".into(); gpus.len()],
        bytes: 256 << 20,
        reps: 4,
        one_way: kiln_gpu::p2p::ordered_pairs(gpus)
            .into_iter()
            .map(|(from, to)| Pair {
                from,
                to,
                peer_access: true,
                copies: copies(bytes, rate(from, to)),
                small_copy_us: 9.0,
                small_copy_samples_us: vec![9.0; 4],
            })
            .collect(),
        both_ways: gpus
            .iter()
            .flat_map(|&a| gpus.iter().filter(move |&&b| b > a).map(move |&b| (a, b)))
            .map(|(a, b)| Both { a, b, copies: copies(2.0 * bytes, rate(a, b) + rate(b, a)) })
            .collect(),
    }
}

/// `kiln bench gpu p2p` on the fake 8× H100 (NVSwitch: every pair `NV18`, 450 GB/s one way).
#[test]
fn the_p2p_matrix_names_a_gpu_that_receives_slowly_and_is_stored_per_pair() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("kiln.db");
    let stand = tempfile::tempdir().unwrap();
    let program = stand_in(stand.path(), &[]);
    let lib = fake_nvml();
    let fixture = h100x8();
    let p2p = |args: &[&str]| {
        let mut all = vec!["bench", "gpu", "p2p", "--json"];
        all.extend(args);
        kiln(
            &all,
            &[("KILN_NVML_LIB", &lib), ("KILN_FAKE_NVML_FIXTURE", &fixture), ("KILN_GPU", &program), ("KILN_DB", &db)],
        )
    };
    let write = |m: &kiln_gpu::p2p::Report| {
        std::fs::write(stand.path().join("p2p-0.json"), serde_json::to_string(m).unwrap()).unwrap();
    };
    // Four GPUs, even: nothing named, stored per pair.
    write(&p2p_matrix(&[0, 1, 2, 3], 370.0, &[]));
    let run = p2p(&["--gpus", "0,1,2,3", "--reps", "4"]);
    assert_eq!(run.code(), Some(0), "{}", run.describe());
    let doc = run.json();
    assert_eq!(doc["status"], "ok", "{doc}");
    let path = &doc["report"]["paths"][0];
    assert_eq!((path["kind"].as_str(), path["ceiling_gbps"].as_f64()), (Some("NV18"), Some(450.0)), "{path}");
    let shown = kiln(&["show", "run", doc["run_id"].as_str().unwrap(), "--json"], &[("KILN_DB", &db)]).success().json();
    let metric = |name: &str| {
        shown["metrics"].as_array().unwrap().iter().find(|m| m["name"] == name).map(|m| m["value"].as_f64().unwrap())
    };
    assert!((metric("gpu3.p2p_to_gpu0_gbps").unwrap() - 370.0).abs() < 1e-6, "{}", shown["metrics"]);
    assert!((metric("gpu0.p2p_both_gpu3_gbps").unwrap() - 740.0).abs() < 1e-6);
    assert!((metric("gpus.p2p_small_median_us").unwrap() - 9.0).abs() < 1e-9);

    // GPU 2 receives at half rate from everyone: it alone is named, the run fails (exit 1).
    write(&p2p_matrix(&[0, 1, 2, 3], 370.0, &[(0, 2, 180.0), (1, 2, 178.0), (3, 2, 185.0)]));
    let run = p2p(&["--gpus", "0,1,2,3", "--reps", "4"]);
    assert_eq!(run.code(), Some(1), "{}", run.describe());
    let failures: Vec<String> = serde_json::from_value(run.json()["report"]["failures"].clone()).unwrap();
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert!(failures[0].starts_with("GPU 2 over NV18 paths: slow when it receives: 180.0 GB/s"), "{failures:?}");

    // Faster than 18 NVLink 4 links carry: invalid, stored as such.
    write(&p2p_matrix(&[0, 1], 520.0, &[]));
    let run = p2p(&["--gpus", "0,1", "--reps", "4"]);
    assert_eq!(run.code(), Some(1), "{}", run.describe());
    assert_eq!(run.json()["status"], "invalid");
    // One GPU: nothing to pair, skipped with the reason.
    let run = p2p(&["--gpus", "3", "--no-save"]);
    assert_eq!(run.code(), Some(3), "{}", run.describe());
    assert!(run.json()["skipped"].as_str().unwrap().contains("two GPUs or more"));
}

/// `kiln bench gpu collectives` on the fake 8× H100 with a stand-in printing NCCL's rows.
#[test]
fn nccl_collectives_are_stored_per_size_and_a_wrong_result_fails_the_run() {
    use kiln_bench::cluster::{bandwidths, Collective};
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("kiln.db");
    let stand = tempfile::tempdir().unwrap();
    let program = stand_in(stand.path(), &[]);
    let (lib, fixture) = (fake_nvml(), h100x8());
    let run = |args: &[&str]| {
        let mut all = vec!["bench", "gpu", "collectives", "--json"];
        all.extend(args);
        kiln(
            &all,
            &[("KILN_NVML_LIB", &lib), ("KILN_FAKE_NVML_FIXTURE", &fixture), ("KILN_GPU", &program), ("KILN_DB", &db)],
        )
    };
    // Rows as NCCL over 8 GPUs gives them: bus bandwidth rising with size to 360 GB/s.
    let write = |wrong: Option<(Collective, u64)>| {
        let mut rows = Vec::new();
        for c in kiln_gpu::collectives::NCCL_COLLECTIVES {
            for (bytes, busbw) in [(1u64 << 10, 2.0), (1 << 20, 90.0), (1 << 30, 360.0)] {
                let seconds = bytes as f64 * c.bus_factor(8) / (busbw * 1e9);
                let (algbw_gbs, busbw_gbs) = bandwidths(c, 8, bytes, seconds);
                rows.push(kiln_gpu::collectives::Row {
                    collective: c,
                    bytes,
                    count: bytes / 4,
                    iterations: 20,
                    time_us: seconds * 1e6,
                    algbw_gbs,
                    busbw_gbs,
                    correct: wrong != Some((c, bytes)),
                });
            }
        }
        let doc = kiln_gpu::collectives::Report {
            devices: (0..8).collect(),
            rank: None,
            ranks: 8,
            names: vec!["NVIDIA H100 80GB HBM3".into(); 8],
            nccl_version: Some(23007),
            rows,
        };
        std::fs::write(stand.path().join("collectives-0.json"), serde_json::to_string(&doc).unwrap()).unwrap();
    };
    write(None);
    let ok = run(&[]);
    assert_eq!(ok.code(), Some(0), "{}", ok.describe());
    let doc = ok.json();
    assert_eq!(doc["report"]["bound"]["via"], "NV18", "{doc}");
    let shown = kiln(&["show", "run", doc["run_id"].as_str().unwrap(), "--json"], &[("KILN_DB", &db)]).success().json();
    let metric = |name: &str| {
        shown["metrics"].as_array().unwrap().iter().find(|m| m["name"] == name).map(|m| m["value"].as_f64().unwrap())
    };
    assert!((metric("gpus.nccl.all_reduce.busbw_gbs_max").unwrap() - 360.0).abs() < 1e-6, "{}", shown["metrics"]);
    assert!(metric("gpus.nccl.reduce_scatter.time_us_smallest").is_some());

    write(Some((Collective::ReduceScatter, 1 << 20)));
    let bad = run(&["--no-save"]);
    assert_eq!(bad.code(), Some(1), "{}", bad.describe());
    let failures = bad.json()["report"]["failures"].to_string();
    assert!(failures.contains("reduce_scatter of 1048576 B over 8 GPUs: a GPU received a wrong result"), "{failures}");
    // NCCL has no all-to-all call: refused before anything runs.
    let refused = run(&["--ops", "all-to-all", "--no-save"]);
    assert_eq!(refused.code(), Some(2), "{}", refused.describe());
    assert!(refused.stderr().contains("NCCL has no all-to-all call"), "{}", refused.describe());
}

/// `kiln bench gpu train` on the fake 8× H100: each GPU's document is a real run of the reference
/// model that `kiln_gpu::train` trained on the CPU; one of them made not to learn.
#[test]
fn gpu_training_is_stored_per_gpu_and_a_gpu_whose_model_does_not_learn_fails_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("kiln.db");
    let stand = tempfile::tempdir().unwrap();
    let program = stand_in(stand.path(), &[]);
    let (lib, fixture) = (fake_nvml(), h100x8());
    let run = |args: &[&str]| {
        let mut all = vec!["bench", "gpu", "train", "--json", "--size", "tiny", "--steps", "20"];
        all.extend(args);
        kiln(
            &all,
            &[("KILN_NVML_LIB", &lib), ("KILN_FAKE_NVML_FIXTURE", &fixture), ("KILN_GPU", &program), ("KILN_DB", &db)],
        )
    };
    let options = kiln_gpu::train::Options {
        device: 0,
        size: "tiny".into(),
        steps: Some(20),
        batch: None,
        precision: kiln_gpu::gemm::Precision::Tf32,
        as_rank: None,
    };
    let trained =
        kiln_gpu::train::measure(&Device::Cpu, &options, Some("NVIDIA H100 80GB HBM3".into()), |_, _, _| {}, None)
            .unwrap();
    assert!(trained.run.learned);
    for (device, learned) in [(0, true), (1, false)] {
        let mut doc = trained.clone();
        doc.device = device;
        doc.run.learned = learned;
        std::fs::write(stand.path().join(format!("train-{device}.json")), serde_json::to_string(&doc).unwrap())
            .unwrap();
    }
    let ok = run(&["--gpus", "0"]);
    assert_eq!(ok.code(), Some(0), "{}", ok.describe());
    let doc = ok.json();
    let shown = kiln(&["show", "run", doc["run_id"].as_str().unwrap(), "--json"], &[("KILN_DB", &db)]).success().json();
    let metric = |name: &str| {
        shown["metrics"].as_array().unwrap().iter().find(|m| m["name"] == name).map(|m| m["value"].as_f64().unwrap())
    };
    assert!((metric("gpu0.train.tiny.tokens_per_s").unwrap() - trained.run.tokens_per_s).abs() < 1e-6);
    assert!(metric("gpu0.train.tiny.mfu").is_some(), "{}", shown["metrics"]);
    // The GEMM ceiling at the model's own products, measured by kiln-gpu after the run, and the
    // utilisation against it.
    let ceiling = trained.ceiling.as_ref().expect("kiln-gpu train measures the model's products");
    for (name, want) in [("gemm_ceiling_tflops", ceiling.tflops.unwrap()), ("mfu_of_gemm", ceiling.mfu.unwrap())] {
        let got = metric(&format!("gpu0.train.tiny.{name}")).unwrap_or_else(|| panic!("{name}: {}", shown["metrics"]));
        assert!((got - want).abs() <= 1e-9 * want.abs(), "{name}: {got} against {want}");
    }

    let bad = run(&["--gpus", "0,1"]);
    assert_eq!(bad.code(), Some(1), "{}", bad.describe());
    let failures = bad.json()["report"]["failures"].to_string();
    assert!(failures.contains("GPU 1: the model did not learn"), "{failures}");
    assert!(!failures.contains("GPU 0"), "{failures}");
    // Data-parallel over GPUs 0 and 1: one NCCL id, made once, reaches both ranks, each on its GPU.
    let script = std::fs::read_to_string(&program).unwrap();
    std::fs::write(&program, script.replacen("\n", "\necho \"$*\" >> \"$(dirname \"$0\")/args.log\"\n", 1)).unwrap();
    std::fs::write(stand.path().join("nccl-id-0.json"), format!("{{\"nccl_id\":\"{}\"}}", "5a".repeat(128))).unwrap();
    for device in [0, 1] {
        let mut doc = trained.clone();
        doc.device = device;
        doc.run.parallel = Some(kiln_bench::train::ParallelStats {
            rank: device,
            ranks: 2,
            gradient_values: doc.run.parameters,
            comm_s: kiln_bench::stats::summarize(&[0.002, 0.002]).unwrap(),
            comm_share: 0.1 + 0.1 * device as f64,
        });
        std::fs::write(stand.path().join(format!("train-{device}.json")), serde_json::to_string(&doc).unwrap())
            .unwrap();
    }
    let dp = run(&["--gpus", "0,1", "--data-parallel"]);
    assert_eq!(dp.code(), Some(0), "{}", dp.describe());
    let log = std::fs::read_to_string(stand.path().join("args.log")).unwrap();
    let calls: Vec<&str> = log.lines().filter(|l| !l.starts_with("devices")).collect();
    assert_eq!(calls.iter().filter(|l| l.starts_with("nccl-id")).count(), 1, "{log}");
    // The id names a loopback port where rank 0's own process hosts NCCL's bootstrap, and every
    // rank is told it: `nccl-id` exits before any rank joins, so nothing of it may be needed then.
    let made = calls.iter().find(|l| l.starts_with("nccl-id")).unwrap();
    let root = made.strip_prefix("nccl-id --root ").unwrap_or_else(|| panic!("{made}"));
    let port: u16 = root.strip_prefix("127.0.0.1:").and_then(|p| p.parse().ok()).unwrap_or_else(|| panic!("{root}"));
    assert!(port > 0, "{root}");
    let id = "5a".repeat(128);
    for rank in [0, 1] {
        let mine = format!("--device {rank} ");
        let call = calls.iter().find(|l| l.starts_with("train") && l.contains(&mine)).expect("a train call per GPU");
        assert!(call.contains(&format!("--nccl-id {id} --rank {rank} --ranks 2 --nccl-root {root}")), "{call}");
    }
    let shown =
        kiln(&["show", "run", dp.json()["run_id"].as_str().unwrap(), "--json"], &[("KILN_DB", &db)]).success().json();
    let names: Vec<&str> = shown["metrics"].as_array().unwrap().iter().map(|m| m["name"].as_str().unwrap()).collect();
    for name in ["gpu1.train_dp.tiny.comm_share", "gpus.train_dp.tiny.tokens_per_s"] {
        assert!(names.contains(&name), "{name} in {names:?}");
    }
    assert_eq!(shown["config"]["data_parallel"], true);
    // Data-parallel on one GPU is no data parallelism.
    let one = run(&["--gpus", "0", "--data-parallel", "--no-save"]);
    assert_eq!(one.code(), Some(3), "{}", one.describe());

    // Sizes and precisions are checked before anything runs.
    let refused = run(&["--dtype", "f16", "--no-save"]);
    assert_eq!(refused.code(), Some(2), "{}", refused.describe());
    assert!(refused.stderr().contains("f16 would need loss scaling"), "{}", refused.describe());
}

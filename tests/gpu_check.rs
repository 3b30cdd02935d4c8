//! `scripts/gpu-check.sh`, the GPU machine's one prepared call, run here where there is no GPU:
//! from a bundle of this build's kiln and kiln-gpu, it must finish, write its eight files (what
//! comes back from a GPU machine: at most eight), each readable, and say in `summary.json` which
//! step did what — the inventory taken, kiln-gpu's devices refused (no CUDA in this build), the
//! GEMM and memory benchmarks skipped with their reason, PyTorch's anchor skipped ("no torch")
//! or measured — exiting 1.

use std::path::Path;
use std::process::Command;

use crate::util::needs;

#[test]
fn the_gpu_check_runs_every_step_and_says_what_each_did_without_a_gpu() {
    let debug = Path::new(env!("CARGO_BIN_EXE_kiln")).parent().unwrap();
    if !debug.join("kiln-gpu").is_file() {
        let why = "kiln-gpu built beside kiln (cargo test --workspace builds it)".to_string();
        assert!(!needs("the_gpu_check_runs_every_step_and_says_what_each_did_without_a_gpu", &[why]));
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // The bundle as scripts/gpu-bundle.sh makes it: a gzipped tar of kiln, kiln-gpu and COMMIT.
    let bundle = dir.path().join("bundle.tar.gz");
    {
        let gz = flate2::write::GzEncoder::new(std::fs::File::create(&bundle).unwrap(), flate2::Compression::fast());
        let mut tar = tar::Builder::new(gz);
        tar.append_path_with_name(debug.join("kiln"), "kiln").unwrap();
        tar.append_path_with_name(debug.join("kiln-gpu"), "kiln-gpu").unwrap();
        let commit = b"test-bundle\n";
        let mut header = tar::Header::new_gnu();
        header.set_size(commit.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        tar.append_data(&mut header, "COMMIT", &commit[..]).unwrap();
        tar.into_inner().unwrap().finish().unwrap();
    }
    let out = dir.path().join("out");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/gpu-check.sh");
    let python = ["python3", "python"].into_iter().find(|p| Command::new(p).arg("-V").output().is_ok());
    let run = Command::new("bash")
        .arg(&script)
        .args([&bundle, &out])
        .env("KILN_CHECK_N", "64")
        .env("KILN_CHECK_MIB", "4")
        .env("KILN_CHECK_SWEEP", "32,64")
        .env("KILN_CHECK_PYTHON", python.unwrap_or("/nonexistent/python3"))
        .env_remove("KILN_GPU")
        .env_remove("KILN_DB")
        .output()
        .unwrap();
    let log = std::fs::read_to_string(out.join("log.txt")).unwrap_or_default();
    assert_eq!(run.status.code(), Some(1), "{}\n{log}", String::from_utf8_lossy(&run.stderr));
    let mut files: Vec<String> =
        std::fs::read_dir(&out).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    files.sort();
    assert_eq!(
        files,
        [
            "devices.json",
            "gemm.json",
            "inventory.json",
            "log.txt",
            "memory.json",
            "nvidia-smi.txt",
            "summary.json",
            "torch.json"
        ]
    );
    let json = |name: &str| -> serde_json::Value {
        let text = std::fs::read_to_string(out.join(name)).unwrap();
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name} is not JSON ({e}): {text}\n{log}"))
    };
    let summary = json("summary.json");
    assert_eq!(summary["bundle"], "test-bundle");
    let status = |step: &str| {
        let s = summary["steps"].as_array().unwrap().iter().find(|s| s["step"] == step);
        s.unwrap_or_else(|| panic!("no step {step}: {summary}"))["status"].as_str().unwrap().to_string()
    };
    assert_eq!(status("inventory"), "ok", "{log}");
    assert!(json("inventory.json")["cpu"].is_object());
    assert_eq!(status("devices"), "failed");
    assert!(json("devices.json")["error"].as_str().unwrap().contains("built without CUDA"));
    assert_eq!(status("gemm"), "skipped", "{log}");
    let gemm = json("gemm.json");
    assert_eq!(gemm["benchmark"], "gpu-gemm", "{gemm}");
    assert!(gemm["skipped"].is_string());
    assert_eq!(status("memory"), "skipped", "{log}");
    assert_eq!(json("memory.json")["benchmark"], "gpu-memory");
    // CUDA sees no device here: peer to peer is skipped without a document.
    assert_eq!(status("p2p"), "skipped", "{log}");
    assert!(summary["p2p"].is_null(), "{summary}");
    // Training is skipped like every GPU benchmark, and PyTorch's run of it then has no shapes.
    assert_eq!(status("train"), "skipped", "{log}");
    assert!(summary["train"]["skipped"].as_str().unwrap().contains("no NVIDIA GPU"), "{summary}");
    assert_eq!(status("torch-train"), "skipped", "{log}");
    // The one-rank NCCL run of data parallelism's device path: no NCCL id without CUDA, so no run.
    assert_eq!(status("nccl-id"), "failed", "{log}");
    assert_eq!(status("train-nccl"), "skipped", "{log}");
    assert!(summary["train"]["nccl1"].is_null(), "{summary}");
    // PyTorch: absent here (its anchors skipped, saying so, without failing the check), or
    // measuring on a machine that has it.
    let has_torch =
        python.is_some_and(|p| Command::new(p).args(["-c", "import torch"]).output().is_ok_and(|o| o.status.success()));
    let torch = json("torch.json");
    if has_torch {
        assert!(torch["error"].is_string() || torch["gemm"].is_array(), "{torch}");
    } else {
        assert_eq!(status("torch"), "skipped", "{log}");
        assert!(torch["skipped"].as_str().unwrap().starts_with("no torch"), "{torch}");
        let why = summary["steps"].as_array().unwrap().iter().find(|s| s["step"] == "torch").unwrap()["why"].clone();
        assert_eq!(why, "no torch", "{summary}");
    }
    if std::process::Command::new("nvidia-smi").arg("-L").output().is_err() {
        assert_eq!(status("nvidia-smi"), "skipped");
    }
    assert!(summary["kiln_over_torch"].is_array());
}

/// With its time budget spent, the check starts no further step and says why in `summary.json`.
#[test]
fn the_gpu_check_starts_no_step_past_its_budget() {
    let dir = tempfile::tempdir().unwrap();
    // A bundle of two programs that only print an empty document: nothing here needs a build.
    let bundle = dir.path().join("bundle");
    std::fs::create_dir(&bundle).unwrap();
    for name in ["kiln", "kiln-gpu"] {
        std::fs::write(bundle.join(name), "#!/bin/sh\necho '{}'\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(bundle.join(name), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let out = dir.path().join("out");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/gpu-check.sh");
    let run = Command::new("bash")
        .arg(&script)
        .args([&bundle, &out])
        .env("KILN_CHECK_BUDGET", "5")
        .env("KILN_CHECK_PYTHON", "/nonexistent/python3")
        .output()
        .unwrap();
    let log = std::fs::read_to_string(out.join("log.txt")).unwrap_or_default();
    assert_eq!(run.status.code(), Some(1), "{}\n{log}", String::from_utf8_lossy(&run.stderr));
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    let steps = summary["steps"].as_array().unwrap();
    let inventory = steps.iter().find(|s| s["step"] == "inventory").unwrap();
    assert_eq!(inventory["status"], "skipped", "{summary}");
    assert!(inventory["why"].as_str().unwrap().contains("5 s were spent"), "{summary}");
}

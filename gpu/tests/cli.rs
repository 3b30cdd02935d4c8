//! `kiln-gpu` as kiln runs it: one JSON document on stdout, exit 2 with `error` when it cannot
//! measure.

use std::process::Command;

fn kiln_gpu(args: &[&str]) -> (Option<i32>, serde_json::Value) {
    let out = Command::new(env!("CARGO_BIN_EXE_kiln-gpu")).args(args).output().expect("running kiln-gpu");
    let doc = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("kiln-gpu {args:?}: stdout is not one JSON document ({e}): {}", String::from_utf8_lossy(&out.stdout))
    });
    (out.status.code(), doc)
}

/// The default build (no CUDA) says what to build, for every command that needs a GPU.
#[cfg(not(feature = "cuda"))]
#[test]
fn without_cuda_every_gpu_command_says_what_to_build() {
    for args in [
        &["devices"][..],
        &["gemm", "--n", "64"],
        &["sweep", "--shapes", "64"],
        &["burn", "--seconds", "1"],
        &["bandwidth", "--mib", "1"],
        &["p2p", "--mib", "1"],
        &["collectives", "--max-bytes", "1K"],
        &["train", "--size", "tiny", "--steps", "10"],
    ] {
        let (code, doc) = kiln_gpu(args);
        assert_eq!(code, Some(2), "{doc}");
        let error = doc["error"].as_str().unwrap();
        assert!(error.contains("built without CUDA") && error.contains("cuda-root.sh"), "{error}");
        assert_eq!(doc["schema_version"], 1);
    }
}

/// Bad options are refused before any device is touched, in every build.
#[test]
fn bad_options_are_refused_with_the_reason() {
    let (code, doc) = kiln_gpu(&["gemm", "--dtype", "fp4"]);
    assert_eq!(code, Some(2));
    assert!(doc["error"].as_str().unwrap().contains("bf16, f16, f32, tf32 or fp8"), "{doc}");
    let (code, doc) = kiln_gpu(&["train", "--size", "7b"]);
    assert_eq!(code, Some(2));
    assert!(doc["error"].as_str().unwrap().contains("gpt2, 350m or 1b"), "{doc}");
    let (code, doc) = kiln_gpu(&["collectives", "--ops", "all_to_all"]);
    assert_eq!(code, Some(2));
    assert!(doc["error"].as_str().unwrap().contains("all_reduce, all_gather or reduce_scatter"), "{doc}");
    let (code, doc) = kiln_gpu(&["melt"]);
    assert_eq!(code, Some(2));
    assert!(doc["error"].as_str().unwrap().contains("unknown command"), "{doc}");
}

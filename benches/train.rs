//! kiln's reference training step against PyTorch eager on the same model and configuration,
//! for the named sizes `tiny`, `anchor` (the anchor: vocab 256, d_model 256, 4 layers,
//! 4 heads, seq 128, batch 8, 3.3 M parameters) and `small` (~25 M), interleaved round by round,
//! tokens/s as the measure. At `anchor`, kiln's `--kernels composed` (candle's elementary ops
//! and autograd only, the straightforward candle version) runs in the same rounds.
//!
//! The PyTorch side is `benches/anchors/torch_train.py`, a copy of the issue's
//! `anchors/torch_train.py` that takes the sizes as arguments.
//! Needs a Python with torch: `KILN_TORCH_PYTHON=/path/to/venv/bin/python cargo bench --bench train`
//! (`python3 -m venv v && v/bin/pip install torch`; the default wheel is about 5 GB).
//! `KILN_BENCH_SIZES=anchor` limits the sizes.

use std::process::Command;

use kiln_bench::stats::summarize;
use kiln_bench::train::Config;

/// tokens/s, and the GEMM the dense layers went through (`--gemm auto`: a library where found).
fn kiln_tokens_per_s(size: &str, steps: usize, kernels: &str) -> (f64, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args([
            "bench",
            "train",
            "--size",
            size,
            "--steps",
            &steps.to_string(),
            "--kernels",
            kernels,
            "--no-save",
            "--json",
        ])
        .output()
        .expect("running kiln");
    assert!(out.status.success(), "kiln bench train --size {size}: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("kiln's JSON");
    let train = &v["report"]["train"];
    (train["tokens_per_s"].as_f64().expect("tokens_per_s"), train["config"]["gemm"].as_str().unwrap_or("?").to_string())
}

fn torch_tokens_per_s(python: &std::ffi::OsStr, c: &Config, steps: usize) -> f64 {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/anchors/torch_train.py");
    let sizes = [c.vocab, c.d_model, c.layers, c.heads, c.seq, c.batch].map(|v| v.to_string());
    let out = Command::new(python)
        .arg(&script)
        .arg(steps.to_string())
        .arg("eager")
        .args(&sizes)
        .output()
        .expect("running the anchor");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.starts_with("RESULT"))
        .unwrap_or_else(|| panic!("no RESULT line: {text}{}", String::from_utf8_lossy(&out.stderr)));
    line.split_whitespace()
        .find_map(|w| w.strip_prefix("tokens_per_s_median="))
        .and_then(|v| v.parse().ok())
        .expect("tokens_per_s_median")
}

fn main() {
    let Some(python) = std::env::var_os("KILN_TORCH_PYTHON") else {
        eprintln!("set KILN_TORCH_PYTHON to a python that has torch (see the header of benches/train.rs)");
        std::process::exit(1);
    };
    let sizes = std::env::var("KILN_BENCH_SIZES").unwrap_or_else(|_| "tiny,anchor,small".to_string());
    let mut lines = Vec::new();
    for size in sizes.split(',') {
        let c = Config::preset(size).unwrap_or_else(|| panic!("unknown size {size}"));
        // Enough steps for a stable median after the three excluded warm-up steps.
        let steps = match size {
            "tiny" => 60,
            "anchor" => 40,
            _ => 12,
        };
        let (mut fused, mut composed, mut torch) = (Vec::new(), Vec::new(), Vec::new());
        let mut gemm = String::new();
        for round in 1..=3 {
            let (tps, through) = kiln_tokens_per_s(size, steps, "fused");
            fused.push(tps);
            gemm = through;
            if size == "anchor" {
                composed.push(kiln_tokens_per_s(size, steps, "composed").0);
            }
            torch.push(torch_tokens_per_s(&python, &c, steps));
            eprintln!(
                "{size} round {round}: kiln {:.0} tokens/s, PyTorch eager {:.0} tokens/s",
                fused[round - 1],
                torch[round - 1]
            );
        }
        let (k, t) = (summarize(&fused).unwrap(), summarize(&torch).unwrap());
        let params =
            format!("d_model {}, {} layers, {} heads, seq {}, batch {}", c.d_model, c.layers, c.heads, c.seq, c.batch);
        lines.push(format!("{size} ({params}), {steps} steps, 3 interleaved rounds:"));
        lines.push(format!(
            "  kiln (fused kernels, GEMM through {gemm}) {:>8.0} tokens/s (CV {:.1} %)",
            k.median,
            k.cv * 100.0
        ));
        if let Some(s) = summarize(&composed) {
            lines.push(format!(
                "  kiln (candle, composed ops)   {:>8.0} tokens/s (CV {:.1} %), {:.2}x PyTorch",
                s.median,
                s.cv * 100.0,
                s.median / t.median
            ));
        }
        lines.push(format!("  PyTorch eager (CPU)           {:>8.0} tokens/s (CV {:.1} %)", t.median, t.cv * 100.0));
        lines.push(format!("  ratio kiln / PyTorch          {:.2}", k.median / t.median));
    }
    println!("training on the CPU, kiln against PyTorch eager:");
    for line in lines {
        println!("{line}");
    }
}

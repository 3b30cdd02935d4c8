//! kiln's reference training step against PyTorch eager on the same model and configuration
//! (`../shared/anchors/torch_train.py`: vocab 256, d_model 256, 4 layers, 4 heads, seq 128,
//! batch 8, AdamW; kiln's `anchor` size), interleaved round by round, tokens/s as the measure.
//!
//! Needs a Python with torch: `KILN_TORCH_PYTHON=/path/to/venv/bin/python cargo bench --bench train`
//! (`python3 -m venv v && v/bin/pip install torch`; the default wheel is about 5 GB).

use std::process::Command;

use kiln_bench::stats::summarize;

fn main() {
    let kiln = env!("CARGO_BIN_EXE_kiln");
    let Some(python) = std::env::var_os("KILN_TORCH_PYTHON") else {
        eprintln!("set KILN_TORCH_PYTHON to a python that has torch (see the header of benches/train.rs)");
        std::process::exit(1);
    };
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/anchors/torch_train.py");
    let steps = std::env::var("KILN_BENCH_STEPS").unwrap_or_else(|_| "40".to_string());
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for round in 1..=3 {
        let out = Command::new(kiln)
            .args(["bench", "train", "--size", "anchor", "--steps", &steps, "--no-save", "--json"])
            .output()
            .expect("running kiln");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("kiln's JSON");
        ours.push(v["report"]["train"]["tokens_per_s"].as_f64().unwrap());
        let out = Command::new(&python).arg(&script).args([steps.as_str(), "eager"]).output().expect("running the anchor");
        let text = String::from_utf8_lossy(&out.stdout);
        let line = text.lines().find(|l| l.starts_with("RESULT")).unwrap_or_else(|| panic!("no RESULT line: {text}"));
        let tps: f64 = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("tokens_per_s_median="))
            .and_then(|v| v.parse().ok())
            .expect("tokens_per_s_median");
        theirs.push(tps);
        eprintln!("round {round}: kiln {:.0} tokens/s, PyTorch eager {tps:.0} tokens/s", ours[round - 1]);
    }
    let (k, t) = (summarize(&ours).unwrap(), summarize(&theirs).unwrap());
    println!("training, 3.3 M-parameter GPT (vocab 256, d 256, 4 layers, 4 heads, seq 128, batch 8), {steps} steps, 3 interleaved rounds:");
    println!("  kiln (candle, CPU)   {:.0} tokens/s (CV {:.1} %)", k.median, k.cv * 100.0);
    println!("  PyTorch eager (CPU)  {:.0} tokens/s (CV {:.1} %)", t.median, t.cv * 100.0);
    println!("  ratio kiln / PyTorch {:.2}", k.median / t.median);
}

//! GEMM: candle (kiln's built-in path) against the maintained libraries the issue names as anchors
//! (OpenBLAS for f32, oneDNN for f32 and bf16), all measured by `kiln bench gemm` in the same
//! process, three rounds; per size and type the median of the rounds' medians and the ratios.
//! kiln reports every backend it found with its version, and its best figure per type is the
//! fastest of them: with oneDNN installed, kiln's bf16 is oneDNN's by construction, and the lines
//! "candle" and "kiln's own kernel" (bf16 through `vdpbf16ps`, AVX512-BF16) say what kiln reaches
//! without it.
//!
//! Run with `cargo bench --bench gemm` (Debian's libopenblas0-pthread, libblis4-pthread and
//! libdnnl2 installed; a missing one is left out). `KILN_BENCH_SIZES=1024,2048` picks the sizes.

use std::collections::BTreeMap;
use std::process::Command;

fn main() {
    let sizes = std::env::var("KILN_BENCH_SIZES").unwrap_or_else(|_| "1024,2048,4096".into());
    let rounds = 3;
    // (backend, dtype, n) -> the median of each round
    let mut medians: BTreeMap<(String, String, u64), Vec<f64>> = BTreeMap::new();
    let mut libraries = Vec::new();
    let mut cpu = String::new();
    for round in 0..rounds {
        let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
            .args(["bench", "gemm", "--sizes", &sizes, "--dtypes", "f32,bf16", "--repetitions", "5", "--no-save"])
            .arg("--json")
            .output()
            .expect("running kiln");
        assert!(out.status.success(), "kiln bench gemm: {}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("kiln's JSON");
        for r in v["report"]["results"].as_array().expect("results") {
            let key = (
                r["backend"].as_str().unwrap_or("?").to_string(),
                r["dtype"].as_str().unwrap_or("?").to_string(),
                r["n"].as_u64().unwrap_or(0),
            );
            medians.entry(key).or_default().push(r["summary"]["median"].as_f64().unwrap_or(f64::NAN));
            if let Some(i) = r["implementation"].as_str() {
                if !libraries.contains(&i.to_string()) {
                    libraries.push(i.to_string());
                }
            }
        }
        if round == 0 {
            cpu = format!(
                "{}; f32 peak {:.1} GFLOP/s, bf16 peak {}",
                v["report"]["peak"]["isa"].as_str().unwrap_or("?"),
                v["report"]["peak"]["summary"]["median"].as_f64().unwrap_or(f64::NAN),
                v["report"]["peaks"].as_array().and_then(|p| p.iter().find(|p| p["dtype"] == "bf16")).map_or(
                    "none".into(),
                    |p| format!("{:.1} GFLOP/s", p["summary"]["median"].as_f64().unwrap_or(0.0))
                )
            );
        }
        for s in v["report"]["skipped"].as_array().into_iter().flatten() {
            if round == 0 {
                println!("skipped: {}", s.as_str().unwrap_or("?"));
            }
        }
    }
    let median = |v: &Vec<f64>| kiln_bench::stats::median(v);
    println!("\n{rounds} rounds, this machine ({cpu}); libraries: {}", libraries.join("; "));
    println!("{:<9} {:<5} {:>6} {:>10}", "backend", "dtype", "n", "GFLOP/s");
    for ((backend, dtype, n), v) in &medians {
        println!("{backend:<9} {dtype:<5} {n:>6} {:>10.1}", median(v));
    }
    println!();
    let get = |b: &str, d: &str, n: u64| medians.get(&(b.to_string(), d.to_string(), n)).map(median);
    let ns: Vec<u64> = sizes.split(',').filter_map(|s| s.trim().parse().ok()).collect();
    for n in ns {
        let best = |d: &str| {
            medians
                .iter()
                .filter(|((_, dt, nn), _)| dt == d && *nn == n)
                .map(|((b, _, _), v)| (median(v), b.clone()))
                .max_by(|a, b| a.0.total_cmp(&b.0))
        };
        for (dtype, anchor) in [("f32", "openblas"), ("f32", "onednn"), ("bf16", "onednn")] {
            let Some(a) = get(anchor, dtype, n) else { continue };
            let candle = get("candle", dtype, n).unwrap_or(f64::NAN);
            let (b, by) = best(dtype).unwrap_or((f64::NAN, "?".into()));
            // kiln's own kernel (bf16 on AVX512-BF16): what kiln reaches with no library installed.
            let own =
                get("kiln", dtype, n).map_or(String::new(), |k| format!("; kiln's own kernel {k:.1} = {:.2}x", k / a));
            println!(
                "{dtype} {n}³ vs {anchor} {a:.1}: candle {candle:.1} = {:.2}x{own}; kiln's best ({by}) {b:.1} = {:.2}x",
                candle / a,
                b / a
            );
        }
    }
}

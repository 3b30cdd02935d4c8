//! kiln's STREAM triad against a C/OpenMP triad (`benches/anchors/triad.c`, built here with
//! `cc -O3 -march=native -fopenmp`), same array size and thread count, interleaved round by round.
//! Run with `cargo bench --bench membw`; `KILN_BENCH_MIB` sets the array size (default 256 MiB).

use std::process::Command;

use kiln_bench::stats::summarize;

fn main() {
    let kiln = env!("CARGO_BIN_EXE_kiln");
    let mib: usize = std::env::var("KILN_BENCH_MIB").ok().and_then(|v| v.parse().ok()).unwrap_or(256);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let anchor = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("triad-anchor");
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/anchors/triad.c");
    let built = Command::new("cc").args(["-O3", "-march=native", "-fopenmp", "-o"]).arg(&anchor).arg(&src).status();
    if !built.is_ok_and(|s| s.success()) {
        eprintln!("cannot build the C anchor (needs cc with OpenMP: apt-get install gcc)");
        std::process::exit(1);
    }
    let elements = (mib << 20) / 8;
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for round in 0..5 {
        let out = Command::new(kiln)
            .args(["bench", "membw", "--no-save", "--json", "--repetitions", "20", "--array-mib"])
            .arg(mib.to_string())
            .output()
            .expect("running kiln");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("kiln's JSON");
        let all = v["report"]["scopes"].as_array().unwrap().iter().find(|s| s["scope"] == "all").unwrap();
        let triad = all["kernels"].as_array().unwrap().iter().find(|k| k["kernel"] == "triad").unwrap();
        ours.push(triad["summary"]["median"].as_f64().unwrap());
        let out = Command::new(&anchor)
            .args([elements.to_string(), "20".to_string()])
            .env("OMP_NUM_THREADS", threads.to_string())
            .env("OMP_PROC_BIND", "true")
            .output()
            .expect("running the anchor");
        let text = String::from_utf8_lossy(&out.stdout);
        theirs.push(text.split_whitespace().next().unwrap().parse::<f64>().unwrap());
        eprintln!("round {}: kiln {:.1} GB/s, C {:.1} GB/s", round + 1, ours[round], theirs[round]);
    }
    let (k, c) = (summarize(&ours).unwrap(), summarize(&theirs).unwrap());
    println!("STREAM triad, {mib} MiB per array, {threads} threads, 5 interleaved rounds of 20 repetitions (median of medians):");
    println!("  kiln membw       {:.1} GB/s (CV {:.1} %)", k.median, k.cv * 100.0);
    println!("  C/OpenMP triad   {:.1} GB/s (CV {:.1} %)", c.median, c.cv * 100.0);
    println!("  ratio kiln / C   {:.2}", k.median / c.median);
}

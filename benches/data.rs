//! Storage that feeds training: kiln's data loader (`kiln_bench::data`, flat out) against fio with
//! the same pattern, in the same run, on the same directory, alternately, three rounds each:
//!
//! - tokens: 8 reader threads, 1 MiB O_DIRECT reads, sequential within a shard — fio `rw=read
//!   bs=1M numjobs=8 ioengine=psync direct=1`, each job its own file;
//! - samples: 8 readers, records of 100 KB–1 MB in shuffled order — fio `rw=randread` with a
//!   128 KiB–1 MiB block size split (mean ≈ 540 KB, as the uniform 100 KB–1 MB records'), reads
//!   4 KiB-aligned as kiln's packed records are, 8 jobs.
//!
//! Each pattern twice: kiln's reader threads against fio's `psync` jobs, and kiln's io_uring
//! engine (one thread, 8 reads in flight) against fio's `io_uring` engine (one job, `iodepth=8`);
//! then which of kiln's two engines reads faster here.
//!
//! The target (issue 39): kiln's loader ≥ 0.9× fio's throughput for the same pattern.
//! Run with `cargo bench --bench data [-- DIR]` (needs fio; DIR defaults to a directory under
//! `target/`, which is on the same filesystem as the build).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::AtomicBool;

use kiln_bench::data::{measure, Config, Engine, Layout};
use kiln_bench::stats::median;

const ROUNDS: usize = 3;
const READERS: usize = 8;
const DATASET_MIB: u64 = 1024;
const SECONDS: f64 = 5.0;

fn kiln(dir: &Path, layout: Layout, engine: Engine) -> f64 {
    let config = Config {
        dirs: vec![dir.to_path_buf()],
        layout,
        dataset_bytes: DATASET_MIB << 20,
        shard_bytes: 64 << 20,
        readers: READERS,
        engine,
        buffered: false,
        prefetch: 64,
        batch: 8,
        accelerators: 1,
        rate: None,
        seconds: SECONDS,
    };
    let r = measure(&config, &AtomicBool::new(false), |_| {}).expect("kiln bench data");
    assert!(r.direct, "the filesystem refused O_DIRECT: pick a directory on a real drive");
    r.flat_out.delivered_gbps * 1e9
}

fn fio(dir: &Path, layout: Layout, engine: Engine) -> f64 {
    let scratch = dir.join(format!(".kiln-bench-fio-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).unwrap();
    let mut cmd = Command::new("fio");
    let (jobs, depth, ioengine) = match engine {
        Engine::Threads => (READERS, 1, "psync"),
        Engine::Uring => (1, READERS, "io_uring"),
    };
    cmd.args(["--name=loader", "--direct=1", "--time_based", "--group_reporting"])
        .arg(format!("--ioengine={ioengine}"))
        .arg(format!("--iodepth={depth}"))
        .arg(format!("--directory={}", scratch.display()))
        .arg(format!("--numjobs={jobs}"))
        .arg(format!("--size={}M", DATASET_MIB / jobs as u64))
        .arg(format!("--runtime={SECONDS}"))
        .arg("--output-format=json");
    match layout {
        Layout::Tokens => cmd.args(["--rw=read", "--bs=1M"]),
        // Records packed 4 KiB-aligned, as kiln's: fio would align each read to its smallest
        // block (128 KiB) otherwise.
        Layout::Samples => {
            cmd.args(["--rw=randread", "--bssplit=128k/20:256k/20:512k/20:768k/20:1m/20", "--blockalign=4k"])
        }
    };
    let out = cmd.output().expect("fio (Debian package fio)");
    let _ = std::fs::remove_dir_all(&scratch);
    assert!(out.status.success(), "fio: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    // fio may print notes before its JSON.
    let doc: serde_json::Value = serde_json::from_str(&text[text.find('{').unwrap_or(0)..]).expect("fio's JSON");
    doc["jobs"][0]["read"]["bw_bytes"].as_f64().expect("read.bw_bytes")
}

fn main() {
    let dir: PathBuf = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench-data"));
    std::fs::create_dir_all(&dir).unwrap();
    if Command::new("fio").arg("--version").output().is_err() {
        println!("data: SKIPPED — needs fio (Debian package fio)");
        return;
    }
    println!("kiln bench data's loader against fio, same pattern, {} in {}", READERS, dir.display());
    for layout in [Layout::Tokens, Layout::Samples] {
        let mut engines = Vec::new();
        for engine in [Engine::Threads, Engine::Uring] {
            let (mut ours, mut theirs) = (Vec::new(), Vec::new());
            for _ in 0..ROUNDS {
                ours.push(kiln(&dir, layout, engine));
                theirs.push(fio(&dir, layout, engine));
            }
            let (k, f) = (median(&ours), median(&theirs));
            let gb = |v: &[f64]| v.iter().map(|x| format!("{:.3}", x / 1e9)).collect::<Vec<_>>().join(", ");
            println!("{layout:?} {engine:?} rounds: kiln {} GB/s; fio {} GB/s", gb(&ours), gb(&theirs));
            println!(
                "{layout:?} {engine:?}: kiln {:.3} GB/s, fio {:.3} GB/s (medians of {ROUNDS}, alternating) = {:.2}× fio (target ≥ 0.9×)",
                k / 1e9,
                f / 1e9,
                k / f
            );
            engines.push(k);
        }
        println!("{layout:?}: kiln's io_uring engine reads {:.2}× its reader threads here", engines[1] / engines[0]);
    }
}

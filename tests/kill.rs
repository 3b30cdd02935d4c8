//! kiln killed with SIGKILL at seeded random moments, as a power cut or the OOM killer would: after
//! each kill the database opens and passes `kiln db check`, every run it holds is whole, and the
//! next run leaves no scratch file behind.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::util::kiln;

/// Delays in milliseconds from a seed (SplitMix64), so a failing kill can be replayed.
pub fn delays(seed: u64, n: usize, max_ms: u64) -> Vec<u64> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            (z ^ (z >> 31)) % max_ms
        })
        .collect()
}

/// Starts `kiln args…`, kills it with SIGKILL after `ms` (or lets it finish first).
fn kill_after(args: &[&str], db: &Path, ms: u64) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .env("KILN_DB", db)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(ms));
    let _ = child.kill(); // SIGKILL
    let _ = child.wait();
}

/// The database is sound and every run in it is whole; returns how many runs it holds.
#[track_caller]
fn sound(db: &Path, context: &str) -> usize {
    if !db.exists() {
        return 0;
    }
    let check = kiln(&["db", "check"], &[("KILN_DB", db)]);
    assert_eq!(check.code(), Some(0), "{context}: {}", check.describe());
    let runs = kiln(&["runs", "--json", "--limit", "100000"], &[("KILN_DB", db)]).success().json();
    let runs = runs["runs"].as_array().unwrap();
    for r in runs {
        assert!(!r["metrics"].as_array().unwrap().is_empty(), "{context}: a run without its metrics: {r}");
    }
    runs.len()
}

#[test]
fn killed_suites_and_commissions_keep_what_finished() {
    let dir = tempfile::tempdir().unwrap();
    let scratch = dir.path().join("scratch");
    std::fs::create_dir(&scratch).unwrap();
    let scratch_arg = scratch.to_str().unwrap().to_string();
    for (i, ms) in delays(0x6b696c6e, 5, 12_000).into_iter().enumerate() {
        let db = dir.path().join(format!("suite{i}.db"));
        kill_after(&["bench", "suite", "--quick", "--disk-path", &scratch_arg], &db, ms);
        sound(&db, &format!("bench suite killed after {ms} ms"));
    }
    for (i, ms) in delays(0x636f6d6d, 3, 3_000).into_iter().enumerate() {
        let db = dir.path().join(format!("commission{i}.db"));
        kill_after(&["commission"], &db, ms + 300);
        let context = format!("commission killed after {} ms", ms + 300);
        sound(&db, &context);
        // The inventory is stored before the first benchmark starts.
        let hosts = kiln(&["hosts", "--json"], &[("KILN_DB", &db)]).success().json();
        assert_eq!(hosts["hosts"].as_array().unwrap().len(), 1, "{context}: {hosts}");
    }
    // The next disk run removes what the killed ones left in the scratch directory.
    kiln(&["bench", "disk", &scratch_arg, "--size-mib", "4", "--seconds", "0.05", "--qd", "1", "--no-save"], &[])
        .success();
    let left: Vec<_> = std::fs::read_dir(&scratch).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(left.is_empty(), "scratch files left behind: {left:?}");
}

#[test]
fn a_killed_import_imports_all_or_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let spec = crate::fleet::spec_seeded(7);
    let (text, _, _, _) = crate::fleet_gen::generate(&spec);
    let file = dir.path().join("fleet.jsonl");
    std::fs::write(&file, text).unwrap();
    let file_arg = file.to_str().unwrap().to_string();
    for (i, ms) in delays(0x696d706f, 6, 1_500).into_iter().enumerate() {
        let db = dir.path().join(format!("import{i}.db"));
        kill_after(&["import", &file_arg], &db, ms);
        let runs = sound(&db, &format!("import killed after {ms} ms"));
        assert!(runs == 0 || runs == 1200, "import killed after {ms} ms: {runs} of 1200 runs, not all or nothing");
    }
}

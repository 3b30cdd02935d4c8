//! Benchmarks as users run them: `kiln bench membw` stores a run that `kiln runs` and
//! `kiln show run` read back with every raw sample. Timings are not asserted (see benches/).

use crate::util::kiln;

#[test]
fn membw_run_is_measured_stored_and_shown() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("kiln.db");
    let run = kiln(&["bench", "membw", "--array-mib", "2", "--repetitions", "3", "--warmup", "1", "--json"], &[("KILN_DB", &db)]).success();
    let out = run.json();
    let scopes = out["report"]["scopes"].as_array().unwrap();
    let all = scopes.iter().find(|s| s["scope"] == "all").unwrap();
    let kernels: Vec<&str> = all["kernels"].as_array().unwrap().iter().map(|k| k["kernel"].as_str().unwrap()).collect();
    assert_eq!(kernels, ["copy", "scale", "add", "triad"]);
    for k in all["kernels"].as_array().unwrap() {
        assert_eq!(k["samples_gbps"].as_array().unwrap().len(), 3);
        assert!(k["summary"]["median"].as_f64().unwrap() > 0.0);
    }
    let run_id = out["run_id"].as_str().unwrap();

    let runs = kiln(&["runs", "--json"], &[("KILN_DB", &db)]).success().json();
    let runs = runs["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0]["benchmark"], "membw");
    assert!(runs[0]["metrics"].as_array().unwrap().iter().any(|m| m["name"] == "membw.all.triad_gbps" && m["unit"] == "GB/s" && m["direction"] == "higher"));

    let shown = kiln(&["show", "run", &run_id[..8], "--json"], &[("KILN_DB", &db)]).success().json();
    assert_eq!(shown["id"], run_id);
    let scope_count = scopes.len();
    assert_eq!(shown["samples"].as_array().unwrap().len(), scope_count * 4 * 3, "every raw sample is kept");
    assert!(shown["software"].as_str().unwrap().contains("\"kernel\""));
    let human = kiln(&["show", "run", run_id], &[("KILN_DB", &db)]).success().stdout();
    assert!(human.contains("membw.all.triad_gbps"), "{human}");
    // The run hangs off the host the inventory identified.
    let hosts = kiln(&["hosts", "--json"], &[("KILN_DB", &db)]).success().json();
    assert_eq!(hosts["hosts"][0]["id"], shown["host_id"]);
}

#[test]
fn membw_rejects_nonsense_sizes() {
    for args in [&["bench", "membw", "--no-save", "--repetitions", "0"][..], &["bench", "membw", "--no-save", "--array-mib", "0"][..]] {
        let run = kiln(args, &[]);
        assert_eq!(run.code(), Some(2), "{}", run.describe());
        assert!(run.stderr().contains("must be at least 1"), "{}", run.describe());
    }
}

//! The command line as users run it: the live machine, the results database, exit codes.

use std::path::Path;
use std::process::{Command, Stdio};

use crate::util::{fixtures, kiln, unpack};

fn live_online_cpus() -> usize {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap();
    text.trim()
        .split(',')
        .map(|part| match part.split_once('-') {
            Some((a, b)) => b.parse::<usize>().unwrap() - a.parse::<usize>().unwrap() + 1,
            None => 1,
        })
        .sum()
}

#[test]
fn live_inventory_summary_and_json() {
    let summary = kiln(&["inventory"], &[]).success();
    let text = summary.stdout();
    for label in ["config ", "cpu ", "memory ", "os "] {
        assert!(text.contains(label), "summary lacks {label:?}\n{}", summary.describe());
    }
    let inv = kiln(&["inventory", "--json"], &[]).success().json();
    assert_eq!(inv["schema_version"], kiln_inventory::SCHEMA_VERSION);
    assert_eq!(inv["root"], "/");
    assert_eq!(inv["cpu"]["online"].as_u64().unwrap() as usize, live_online_cpus());
    assert!(inv["cpu"]["cores"].as_u64().unwrap() >= 1);
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let kb: u64 = meminfo.lines().next().unwrap().split_whitespace().nth(1).unwrap().parse().unwrap();
    assert_eq!(inv["memory"]["total_bytes"].as_u64(), Some(kb * 1024));
    assert_eq!(inv["fingerprints"]["config"].as_str().unwrap().len(), 16);
    // Every problem names a path and a reason.
    for p in inv["problems"].as_array().unwrap() {
        assert!(p["path"].as_str().unwrap().starts_with('/'), "{p}");
        assert!(!p["message"].as_str().unwrap().is_empty(), "{p}");
    }
}

#[test]
fn json_document_has_the_documented_shape() {
    let root = unpack(&fixtures().join("hwloc/16em64t-4s2c2t.tar.bz2")).join("16em64t-4s2c2t");
    let inv = kiln(&["inventory", "--json", "--root", root.to_str().unwrap()], &[]).success().json();
    let object_keys = |v: &serde_json::Value| -> Vec<String> { v.as_object().unwrap().keys().cloned().collect() };
    let mut top = object_keys(&inv);
    top.sort();
    assert_eq!(
        top,
        [
            "collected_at",
            "collection_micros",
            "cpu",
            "fingerprints",
            "gpus",
            "hwmon",
            "kernel_log",
            "kiln_version",
            "memory",
            "nics",
            "numa",
            "nvme",
            "os",
            "pci",
            "problems",
            "rdma",
            "root",
            "schema_version",
            "system",
            "topology"
        ]
    );
    assert_eq!(
        (inv["cpu"]["packages"].as_u64(), inv["cpu"]["cores"].as_u64(), inv["cpu"]["online"].as_u64()),
        (Some(4), Some(8), Some(16))
    );
    assert!(inv["collected_at"].as_str().unwrap().ends_with('Z'));
    // The snapshot's inventory does not leak the live machine: no hostname in this snapshot.
    assert!(inv["os"]["hostname"].is_null());
}

#[test]
fn commission_stores_into_the_database() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("results/kiln.db");
    let db_arg = db.to_str().unwrap();
    // A mistyped directory is not created: the database goes only where its directory exists.
    let nowhere = kiln(&["--db", db_arg, "commission", "--no-bench"], &[]);
    assert_eq!(nowhere.code(), Some(2), "{}", nowhere.describe());
    assert!(nowhere.stderr().contains("no such directory"), "{}", nowhere.describe());
    assert!(!dir.path().join("results").exists());
    // Nor does a read create anything.
    let read = kiln(&["--db", db_arg, "runs"], &[]);
    assert_eq!(read.code(), Some(2), "{}", read.describe());
    assert!(read.stderr().contains("no database here"), "{}", read.describe());
    std::fs::create_dir(dir.path().join("results")).unwrap();
    let first = kiln(&["--db", db_arg, "commission", "--no-bench"], &[]).success();
    assert!(first.stderr().contains("created the results database"), "{}", first.describe());
    assert!(first.stdout().contains(db_arg), "commission says where the result went\n{}", first.describe());
    assert!(first.stdout().contains("new host"), "{}", first.describe());
    let second = kiln(&["commission", "--no-bench", "--json"], &[("KILN_DB", &db)]).success().json();
    assert_eq!(second["stored"]["new_host"], false);
    assert_eq!(second["kind"], "commission");

    let hosts = kiln(&["--db", db_arg, "hosts", "--json"], &[]).success().json();
    let hosts = hosts["hosts"].as_array().unwrap();
    assert_eq!(hosts.len(), 1);
    assert_eq!(hosts[0]["inventories"], 2);
    assert_eq!(hosts[0]["id"], second["stored"]["host_id"]);

    let id = second["stored"]["inventory_id"].as_str().unwrap();
    let shown = kiln(&["--db", db_arg, "show", "inventory", &id[..8], "--json"], &[]).success().json();
    assert_eq!(shown, second["inventory"], "the stored document is the one printed");
    let human = kiln(&["--db", db_arg, "show", "inventory", id], &[]).success();
    assert!(human.stdout().contains(id));
    let missing = kiln(&["--db", db_arg, "show", "inventory", "ffffffff"], &[]);
    assert_eq!(missing.code(), Some(2));
    assert!(missing.stderr().contains("no inventory matches"), "{}", missing.describe());
}

#[test]
fn inventory_save_from_snapshots_keeps_hosts_apart() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("kiln.db");
    for (tarball, top) in [("16em64t-4s2c2t.tar.bz2", "16em64t-4s2c2t"), ("2arm-2c.tar.bz2", "2arm-2c")] {
        let root = unpack(&fixtures().join("hwloc").join(tarball)).join(top);
        let run = kiln(&["inventory", "--save", "--root", root.to_str().unwrap()], &[("KILN_DB", &db)]).success();
        assert!(run.stderr().contains("stored inventory"), "{}", run.describe());
    }
    let hosts = kiln(&["hosts"], &[("KILN_DB", &db)]).success();
    assert_eq!(hosts.stdout().lines().count(), 3, "a header and two hosts\n{}", hosts.describe());
}

#[track_caller]
fn assert_refused_untouched(db: &Path, expect: &str) {
    let before = std::fs::read(db).unwrap();
    for args in
        [&["commission"][..], &["hosts"][..], &["inventory", "--save"][..], &["bench", "membw", "--array-mib", "1"][..]]
    {
        let run = kiln(args, &[("KILN_DB", db)]);
        assert_eq!(run.code(), Some(2), "{}", run.describe());
        let err = run.stderr();
        assert!(err.contains(db.to_str().unwrap()) && err.contains(expect), "{}", run.describe());
        assert!(!err.contains("panicked"), "{}", run.describe());
    }
    assert_eq!(std::fs::read(db).unwrap(), before, "the file must be left untouched");
}

#[test]
fn a_file_that_is_not_a_database_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("kiln.db");
    std::fs::write(&db, b"these are somebody's notes, not a database\n").unwrap();
    assert_refused_untouched(&db, "not an SQLite database");
}

#[test]
fn a_corrupt_database_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("kiln.db");
    kiln(&["commission", "--no-bench"], &[("KILN_DB", &db)]).success();
    // Keep SQLite's header, wreck everything after it (a disk error or a torn copy).
    let mut bytes = std::fs::read(&db).unwrap();
    assert!(bytes.len() > 4096);
    for (i, b) in bytes.iter_mut().enumerate().skip(100) {
        *b = (i * 7 % 251) as u8;
    }
    std::fs::write(&db, &bytes).unwrap();
    let _ = std::fs::remove_file(dir.path().join("kiln.db-wal"));
    let _ = std::fs::remove_file(dir.path().join("kiln.db-shm"));
    assert_refused_untouched(&db, "corrupt");
}

#[test]
fn closed_stdout_is_not_an_error() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["inventory", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take()); // as `kiln inventory --json | head -0` would
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    assert!(out.stderr.is_empty(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn usage_errors_exit_2() {
    let run = kiln(&["inventory", "--no-such-flag"], &[]);
    assert_eq!(run.code(), Some(2), "{}", run.describe());
    let run = kiln(&["--help"], &[]).success();
    for cmd in ["inventory", "commission", "hosts", "show"] {
        assert!(run.stdout().contains(cmd), "{}", run.describe());
    }
}

/// Several kilns opening one new database at once (a nightly job and a technician): one migrates,
/// the others wait for it, none fails.
#[test]
fn concurrent_first_opens_of_a_database() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("new.db");
    let children: Vec<std::process::Child> = (0..6)
        .map(|_| {
            std::process::Command::new(env!("CARGO_BIN_EXE_kiln"))
                .args(["inventory", "--save", "--json"])
                .env("KILN_DB", &db)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for c in children {
        let out = c.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
}

/// Every command's `--help` parses: clap checks each command's definition (unique names, valid
/// defaults) only when that command is reached, so a broken one would otherwise surface as a panic
/// in a user's hands.
#[test]
fn every_command_has_help() {
    let commands: &[&[&str]] = &[
        &["inventory"],
        &["commission"],
        &["topo"],
        &["runs"],
        &["hosts"],
        &["bench", "membw"],
        &["bench", "gemm"],
        &["bench", "train"],
        &["bench", "disk"],
        &["bench", "net"],
        &["bench", "suite"],
        &["show", "inventory"],
        &["show", "run"],
        &["provision", "plan"],
        &["provision", "apply"],
        &["provision", "verify"],
        &["provision", "status"],
        &["provision", "lint"],
        &["provision", "log"],
    ];
    for c in commands {
        let mut args = c.to_vec();
        args.push("--help");
        let run = kiln(&args, &[]).success();
        assert!(run.stdout().contains("Usage: kiln"), "{}", run.describe());
    }
}

/// The main job end to end: inventory, the quick benchmark suite, everything stored.
#[test]
fn commission_runs_the_quick_suite() {
    // No MPI job beside it (they oversubscribe both CPUs).
    let _quiet = crate::util::machine_to_itself();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("kiln.db");
    let data = dir.path().join("data-drive");
    std::fs::create_dir(&data).unwrap();
    // A budget above the quick suite's 110 s: on two CPUs shared with the other tests the data
    // benchmark, last, must not be skipped for time.
    let data_arg = data.to_str().unwrap();
    let run = kiln(&["commission", "--json", "--budget", "300", "--data-dir", data_arg], &[("KILN_DB", &db)]);
    let out = run.json();
    // Accepted; or, since the other tests share these two CPUs, rejected for performance alone
    // (CI saw GEMM at 7 % of the FMA peak beside them): every failed check a performance one.
    let failed: Vec<&serde_json::Value> =
        out["checks"].as_array().unwrap().iter().filter(|c| c["status"] == "fail").collect();
    let slow_only = !failed.is_empty() && failed.iter().all(|c| c["severity"] == "performance");
    assert!(run.code() == Some(0) || (run.code() == Some(1) && slow_only), "{}", commission_summary(&run));
    let mut benchmarks: Vec<&str> =
        out["benchmarks"].as_array().unwrap().iter().map(|b| b["benchmark"].as_str().unwrap()).collect();
    let runs = kiln(&["runs", "--json"], &[("KILN_DB", &db)]).success().json();
    assert_eq!(runs["runs"].as_array().unwrap().len(), benchmarks.len());
    // A run that came out unstable on a busy machine is measured again (at most three times).
    assert!(benchmarks.len() <= 12, "{benchmarks:?}");
    benchmarks.dedup();
    assert_eq!(benchmarks, ["membw", "gemm", "train", "sdc", "disk", "data"]);
    // The data drive fed accelerators at the rate the suite's training consumed, and its dataset
    // is gone.
    let data_run = out["benchmarks"].as_array().unwrap().iter().find(|b| b["benchmark"] == "data").unwrap();
    assert!(data_run["headline"].as_str().unwrap().contains("AU"), "{data_run}");
    assert_eq!(std::fs::read_dir(&data).unwrap().count(), 0, "the dataset is removed");
    // The silent-data-corruption screen ran on every CPU and passed the verdict.
    assert!(out["checks"].as_array().unwrap().iter().any(|c| c["id"] == "cpu.sdc" && c["status"] == "pass"), "{out}");
    // Every run points at the inventory the commission stored.
    let train = out["benchmarks"].as_array().unwrap().iter().find(|b| b["benchmark"] == "train").unwrap();
    let id = train["run_id"].as_str().unwrap();
    let shown = kiln(&["show", "run", id, "--json"], &[("KILN_DB", &db)]).success().json();
    assert_eq!(shown["host_id"], out["stored"]["host_id"]);
    // The box was judged against the built-in CPU-server spec, with its performance, and the
    // verdict heads the host's report.
    assert_eq!(out["spec"]["name"], "cpu-server", "{out}");
    assert_eq!(out["performance_judged"], true);
    assert!(out["checks"].as_array().unwrap().iter().any(|c| c["id"] == "perf.gemm.f32.n.gflops"), "{out}");
    let md = dir.path().join("report.md");
    let host = out["stored"]["host_id"].as_str().unwrap();
    kiln(&["report", "--host", host, "--markdown", md.to_str().unwrap()], &[("KILN_DB", &db)]).success();
    let report = std::fs::read_to_string(&md).unwrap();
    let verdict_at = report.find("## Verdict").expect("a verdict section");
    assert!(verdict_at < report.find("## Inventory").unwrap(), "{report}");
    assert!(report.contains("against spec cpu-server"), "{report}");
    // A spec captured from this box's stored evidence (floors at 90 % of what it measured) loads,
    // and re-judging the same evidence against it accepts, performance included.
    let captured = dir.path().join("golden.toml");
    let inventory = out["stored"]["inventory_id"].as_str().unwrap();
    kiln(&["spec", "capture", "--inventory", inventory, "-o", captured.to_str().unwrap()], &[("KILN_DB", &db)])
        .success();
    kiln(&["spec", "lint", captured.to_str().unwrap()], &[]).success();
    let text = std::fs::read_to_string(&captured).unwrap();
    assert!(text.contains("metric = \"membw.all.triad_gbps\"") && text.contains("GB/s"), "{text}");
    let judged = kiln(
        &["verdict", "--inventory", inventory, "--spec", captured.to_str().unwrap(), "--no-save", "--json"],
        &[("KILN_DB", &db)],
    );
    let v = judged.json();
    assert_eq!(v["verdict"], "accept", "{v}");
    assert!(v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .any(|c| c["id"] == "perf.membw.all.triad_gbps" && c["status"] == "pass"));
    // A snapshot is inventoried, never benchmarked.
    let root = unpack(&fixtures().join("hwloc/16em64t-4s2c2t.tar.bz2")).join("16em64t-4s2c2t");
    let snap = kiln(&["commission", "--root", root.to_str().unwrap()], &[("KILN_DB", &db)]).success();
    assert!(snap.stdout().contains("benchmarks skipped"), "{}", snap.describe());
}

/// What a failed commission says, without its long inventory: each run's status and headline, the
/// verdict and every check that did not pass, with its evidence, then standard error.
fn commission_summary(run: &crate::util::Run) -> String {
    let mut text = format!("command: {}\nexit: {:?}\n", run.cmdline, run.code());
    match serde_json::from_str::<serde_json::Value>(&run.stdout()) {
        Ok(out) => {
            for b in out["benchmarks"].as_array().into_iter().flatten() {
                text.push_str(&format!("run {} {}: {}\n", b["benchmark"], b["status"], b["headline"]));
            }
            text.push_str(&format!("verdict {} against {}\n", out["verdict"], out["spec"]["name"]));
            for c in out["checks"].as_array().into_iter().flatten().filter(|c| c["status"] != "pass") {
                text.push_str(&format!("check {c}\n"));
            }
        }
        Err(_) => text.push_str(&format!("--- stdout\n{}\n", crate::util::cut_middle(&run.stdout(), 6000))),
    }
    text + "--- stderr\n" + &run.stderr()
}

/// `-o PATH` as a careful user expects: `-` is stdout, a FIFO (or a device) is written in place,
/// a symbolic link is refused and left as it was, a regular file is replaced whole, a missing
/// directory is not created, and no `.partial` file is ever left behind.
#[test]
fn export_output_paths_are_never_replaced_by_mistake() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("kiln.db");
    kiln(&["commission", "--no-bench"], &[("KILN_DB", &db)]).success();
    let export = |out: &Path| kiln(&["export", "-o", out.to_str().unwrap()], &[("KILN_DB", &db)]);
    // Standard output.
    let stdout = kiln(&["export", "-o", "-"], &[("KILN_DB", &db)]).success().stdout();
    assert!(stdout.starts_with("{\"kiln_export\":1"), "{stdout}");
    // A FIFO stays a FIFO and receives the export.
    let fifo = dir.path().join("pipe");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::read_to_string(fifo).unwrap())
    };
    export(&fifo).success();
    assert!(reader.join().unwrap().starts_with("{\"kiln_export\":1"));
    assert!(std::os::unix::fs::FileTypeExt::is_fifo(&std::fs::symlink_metadata(&fifo).unwrap().file_type()));
    // A symbolic link is refused; it and its target stay as they were.
    let victim = dir.path().join("victim");
    std::fs::write(&victim, "precious").unwrap();
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    let refused = export(&link);
    assert_eq!(refused.code(), Some(2), "{}", refused.describe());
    assert!(refused.stderr().contains("a symbolic link"), "{}", refused.describe());
    assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
    // A regular file is replaced whole, keeping its mode.
    let file = dir.path().join("out.jsonl");
    std::fs::write(&file, "old").unwrap();
    std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o640)).unwrap();
    export(&file).success();
    assert!(std::fs::read_to_string(&file).unwrap().starts_with("{\"kiln_export\":1"));
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&file).unwrap().permissions()) & 0o777,
        0o640
    );
    // A directory that does not exist is not created.
    let nowhere = dir.path().join("no/such/dir/out.jsonl");
    let missing = export(&nowhere);
    assert_eq!(missing.code(), Some(2), "{}", missing.describe());
    assert!(!dir.path().join("no").exists());
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".partial"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// Read-only commands open the database read-only: they work on a file and directory the user may
/// not write (as `nobody` when the tests run as root), and `kiln db check` runs there too.
#[test]
fn read_only_commands_work_on_a_read_only_database() {
    use std::os::unix::fs::PermissionsExt;
    let root = nix::unistd::geteuid().is_root();
    let setpriv = crate::util::program("setpriv", "util-linux").filter(|_| root);
    if !crate::util::needs("read_only_commands_work_on_a_read_only_database", &setpriv.into_iter().collect::<Vec<_>>())
    {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("kiln.db");
    kiln(&["commission", "--no-bench"], &[("KILN_DB", &db)]).success();
    std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o444)).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o555)).unwrap();
    let as_reader = |args: &[&str]| {
        let mut cmd = if root {
            let mut c = Command::new("setpriv");
            c.args(["--reuid=65534", "--regid=65534", "--clear-groups", env!("CARGO_BIN_EXE_kiln")]);
            c
        } else {
            Command::new(env!("CARGO_BIN_EXE_kiln"))
        };
        cmd.args(args).env("KILN_DB", &db).env_remove("KILN_LOG").output().unwrap()
    };
    let hosts = as_reader(&["hosts", "--json"]);
    assert!(hosts.status.success(), "{}", String::from_utf8_lossy(&hosts.stderr));
    let hosts: serde_json::Value = serde_json::from_slice(&hosts.stdout).unwrap();
    assert_eq!(hosts["hosts"].as_array().unwrap().len(), 1);
    let check = as_reader(&["db", "check"]);
    assert!(check.status.success(), "{}", String::from_utf8_lossy(&check.stderr));
    assert!(String::from_utf8_lossy(&check.stdout).contains("integrity check passed"));
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// A database with a damaged page is refused before the first write, untouched, and `kiln db
/// check` names the damage.
#[test]
fn a_damaged_page_is_found_before_any_write() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("kiln.db");
    for _ in 0..3 {
        kiln(&["commission", "--no-bench"], &[("KILN_DB", &db)]).success();
    }
    // Garble the middle of the last page (an inventory's document or an index over it).
    let mut bytes = std::fs::read(&db).unwrap();
    let page = 4096;
    let last = bytes.len() / page - 1;
    for b in &mut bytes[last * page + 8..last * page + 200] {
        *b = 0xff;
    }
    std::fs::write(&db, &bytes).unwrap();
    let write = kiln(&["commission", "--no-bench"], &[("KILN_DB", &db)]);
    assert_eq!(write.code(), Some(2), "{}", write.describe());
    assert!(write.stderr().contains("integrity check") || write.stderr().contains("corrupt"), "{}", write.describe());
    assert_eq!(std::fs::read(&db).unwrap(), bytes, "the damaged file was left as it was");
    let check = kiln(&["db", "check"], &[("KILN_DB", &db)]);
    assert_ne!(check.code(), Some(0), "{}", check.describe());
}

/// A writer that finds the database held past the busy timeout says so plainly, writes nothing.
#[test]
fn a_database_held_by_another_program_is_waited_for_then_named() {
    use sqlx::Connection;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("kiln.db");
    kiln(&["commission", "--no-bench"], &[("KILN_DB", &db)]).success();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let mut holder = rt.block_on(sqlx::SqliteConnection::connect(&format!("sqlite://{}", db.display()))).unwrap();
    rt.block_on(sqlx::query("BEGIN EXCLUSIVE").execute(&mut holder)).unwrap();
    let started = std::time::Instant::now();
    let run = kiln(&["inventory", "--save"], &[("KILN_DB", &db)]);
    assert_eq!(run.code(), Some(2), "{}", run.describe());
    assert!(run.stderr().contains("another program has held the database"), "{}", run.describe());
    assert!(started.elapsed().as_secs() >= 9, "it waited for the busy timeout first");
    rt.block_on(sqlx::query("ROLLBACK").execute(&mut holder)).unwrap();
}

/// `kiln snapshot` captures what kiln reads: the archive, unpacked anywhere, inventories as this
/// machine does (all but the live-only probes: CPUID's hypervisor leaf, ethtool, free memory), and
/// nothing but the archive is written.
#[test]
fn a_snapshot_inventories_like_the_live_machine() {
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("box.tar");
    let out = kiln(&["snapshot", "-o", archive.to_str().unwrap(), "--json"], &[]).success().json();
    assert!(out["files"].as_u64().unwrap() > 100, "{out}");
    let entries: Vec<_> = std::fs::read_dir(dir.path()).unwrap().flatten().map(|e| e.file_name()).collect();
    assert_eq!(entries, [std::ffi::OsString::from("box.tar")], "only the archive is written");
    let root = dir.path().join("box");
    std::fs::create_dir(&root).unwrap();
    tar::Archive::new(std::fs::File::open(&archive).unwrap()).unpack(&root).unwrap();
    let snap = kiln(&["inventory", "--json", "--root", root.to_str().unwrap()], &[]).success().json();
    let live = kiln(&["inventory", "--json"], &[]).success().json();
    for key in ["cpu", "system", "pci", "nvme", "rdma", "topology", "fingerprints"] {
        assert_eq!(snap[key], live[key], "{key}");
    }
    assert_eq!(snap["memory"]["total_bytes"], live["memory"]["total_bytes"]);
    assert_eq!(snap["numa"]["nodes"].as_array().unwrap().len(), live["numa"]["nodes"].as_array().unwrap().len());
    let names = |v: &serde_json::Value| -> Vec<String> {
        v["nics"].as_array().unwrap().iter().map(|n| n["name"].as_str().unwrap().to_string()).collect()
    };
    assert_eq!(names(&snap), names(&live));
    assert_eq!(snap["os"]["kernel_release"], live["os"]["kernel_release"]);
    // Standard output works too, with the summary on stderr.
    let piped = kiln(&["snapshot", "-o", "-"], &[]).success();
    assert!(piped.stderr().contains("files"), "{}", piped.describe());
}

//! Odd input gives clear output and never a panic: missing, empty, truncated and garbled
//! snapshots, unreadable files, non-UTF-8 firmware strings.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::util::{copy_tree, fixtures, kiln, unpack};

/// A private, writable copy of a hwloc snapshot.
fn damaged_copy(tarball: &str, top: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    copy_tree(&unpack(&fixtures().join("hwloc").join(tarball)).join(top), &root);
    (dir, root)
}

#[track_caller]
fn inventory_ok(root: &Path) -> Value {
    let run = kiln(&["inventory", "--json", "--root", root.to_str().unwrap()], &[]);
    assert!(!run.stderr().contains("panicked"), "{}", run.describe());
    run.success().json()
}

fn problems_for<'a>(inv: &'a Value, suffix: &str) -> Vec<&'a Value> {
    inv["problems"].as_array().unwrap().iter().filter(|p| p["path"].as_str().unwrap().ends_with(suffix)).collect()
}

#[test]
fn missing_or_empty_root_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope");
    let run = kiln(&["inventory", "--root", missing.to_str().unwrap()], &[]);
    assert_eq!(run.code(), Some(2), "{}", run.describe());
    assert!(run.stderr().contains("no such directory"), "{}", run.describe());
    let run = kiln(&["inventory", "--root", dir.path().to_str().unwrap()], &[]);
    assert_eq!(run.code(), Some(2), "{}", run.describe());
    assert!(run.stderr().contains("neither proc/ nor sys/"), "{}", run.describe());
}

#[test]
fn a_bare_proc_is_an_inventory_full_of_problems() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("proc")).unwrap();
    let inv = inventory_ok(dir.path());
    assert!(!problems_for(&inv, "proc/cpuinfo").is_empty());
    assert!(!problems_for(&inv, "proc/meminfo").is_empty());
    assert!(inv["memory"]["total_bytes"].is_null());
    assert_eq!(inv["cpu"]["architecture"], "unknown");
}

#[test]
fn truncated_snapshot_files() {
    let (_dir, root) = damaged_copy("16em64t-4s2c2t.tar.bz2", "16em64t-4s2c2t");
    // Cut every text file in half, mid-line, as an interrupted copy would.
    fn halve(dir: &Path) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let entry = entry.unwrap();
            let kind = entry.file_type().unwrap();
            if kind.is_dir() {
                halve(&entry.path());
            } else if kind.is_file() {
                let bytes = std::fs::read(entry.path()).unwrap();
                std::fs::write(entry.path(), &bytes[..bytes.len() / 2]).unwrap();
            }
        }
    }
    halve(&root);
    let inv = inventory_ok(&root);
    assert!(!inv["problems"].as_array().unwrap().is_empty(), "half-files must produce problems");
}

#[test]
fn garbage_cpuinfo_and_sysfs_values() {
    let (_dir, root) = damaged_copy("16em64t-4s2c2t.tar.bz2", "16em64t-4s2c2t");
    let mut garbage = Vec::new();
    let mut x: u32 = 12345;
    for _ in 0..4096 {
        x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
        garbage.push((x >> 16) as u8);
    }
    std::fs::write(root.join("proc/cpuinfo"), &garbage).unwrap();
    std::fs::write(root.join("sys/devices/system/cpu/cpu0/topology/physical_package_id"), "banana\n").unwrap();
    std::fs::write(root.join("sys/devices/system/node/node0/distance"), "10 ten\n").unwrap();
    std::fs::write(root.join("sys/devices/system/cpu/cpu1/topology/thread_siblings_list"), "9-3\n").unwrap();
    let inv = inventory_ok(&root);
    let cpuinfo = problems_for(&inv, "proc/cpuinfo");
    assert!(cpuinfo.iter().any(|p| p["kind"] == "malformed"), "{cpuinfo:?}");
    assert_eq!(problems_for(&inv, "cpu0/topology/physical_package_id")[0]["kind"], "malformed");
    assert_eq!(problems_for(&inv, "node0/distance")[0]["kind"], "malformed");
    assert_eq!(problems_for(&inv, "cpu1/topology/thread_siblings_list")[0]["kind"], "malformed");
    // The rest of the topology still stands.
    assert_eq!(inv["cpu"]["online"], 16);
}

/// Every value that does not parse is a `problems` entry naming its file and what was expected,
/// never a silent "unknown"; the kernel's own "no value" texts (`-1`, `Unknown`, width 0) are not.
#[test]
fn garbled_sysfs_values_are_each_a_problem() {
    let (_dir, root) = damaged_copy("fakepcilocalities.tar.bz2", "fakepcilocalities");
    let pci = root.join("sys/bus/pci/devices");
    // The snapshot's links may be absolute (to /sys/devices/…): resolved inside the root.
    let inside = |name: &std::ffi::OsStr| {
        let target = std::fs::read_link(pci.join(name)).unwrap();
        match target.strip_prefix("/") {
            Ok(abs) => root.join(abs),
            Err(_) => pci.join(target),
        }
    };
    let names: Vec<_> = std::fs::read_dir(&pci).unwrap().flatten().map(|e| e.file_name()).collect();
    let dev = inside(names.iter().min().unwrap());
    let dev2 = inside(names.iter().max().unwrap());
    let table: &[(PathBuf, &str, &str)] = &[
        (root.join("sys/devices/system/cpu/online"), "0-banana\n", "a CPU list expected"),
        (root.join("sys/kernel/mm/transparent_hugepage/enabled"), "always madvise never\n", "a bracketed choice"),
        (dev.join("numa_node"), "zero\n", "a NUMA node expected"),
        (dev.join("current_link_speed"), "fast\n", "a link speed"),
        (dev.join("current_link_width"), "64\n", "a link width"),
        (dev.join("aer_dev_fatal"), "garbage\n", "no TOTAL_ERR_* line"),
        (dev.join("sriov_totalvfs"), "-4\n", "a number expected"),
        (dev2.join("numa_node"), "-1\n", ""),
        (dev2.join("current_link_speed"), "Unknown\n", ""),
    ];
    for (path, text, _) in table {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    std::fs::write(dev.join("aer_dev_correctable"), "TOTAL_ERR_COR 0\n").unwrap();
    let inv = inventory_ok(&root);
    for (path, _, message) in table {
        // The device's directory and the file: what the problem's path ends with.
        let parts: Vec<&str> = path.iter().rev().take(2).map(|c| c.to_str().unwrap()).collect();
        let tail = format!("{}/{}", parts[1], parts[0]);
        let name = path.display();
        let found = problems_for(&inv, &tail);
        if message.is_empty() {
            assert!(found.is_empty(), "{name}: the kernel's no-value text is not a problem: {found:?}");
        } else {
            assert!(
                found.iter().any(|p| p["kind"] == "malformed" && p["message"].as_str().unwrap().contains(message)),
                "{name}: {found:?}\n{:#?}",
                inv["problems"]
            );
        }
    }
}

#[test]
fn non_utf8_dmi_strings() {
    let (_dir, root) = damaged_copy("20em64t-hybrid-1p6c2t+2ca4co1t.tar.bz2", "20em64t-hybrid-1p6c2t+2ca4co1t");
    std::fs::write(root.join("sys/class/dmi/id/product_name"), b"Pro\xffLiant \xfe\xfd\n").unwrap();
    let inv = inventory_ok(&root);
    assert_eq!(inv["system"]["product"]["name"], "Pro\u{fffd}Liant \u{fffd}\u{fffd}");
    assert_eq!(problems_for(&inv, "dmi/id/product_name")[0]["kind"], "malformed");
}

#[test]
fn another_architecture_is_recognised() {
    for (tarball, top, arch) in [
        ("2arm-2c.tar.bz2", "2arm-2c", "arm"),
        ("128arm-2pa2n8cluster4co.tar.bz2", "128arm-2pa2n8cluster4co", "aarch64"),
        ("16ia64-8n2s.tar.bz2", "16ia64-8n2s", "ia64"),
        ("2ps3-2t.tar.bz2", "2ps3-2t", "ppc64"),
        ("2pa-pcidomain32bits.tar.bz2", "2pa-pcidomain32bits", "x86_64"),
        ("20s390-2g6s4c.tar.bz2", "20s390-2g2g2s4co", "s390x"),
    ] {
        let root = unpack(&fixtures().join("hwloc").join(tarball)).join(top);
        let inv = inventory_ok(&root);
        assert_eq!(inv["cpu"]["architecture"], arch, "{tarball}");
    }
}

#[test]
fn gb10_names_both_core_kinds() {
    let root = unpack(&fixtures().join("hwloc/nvidia-dgx-gb10.tar.bz2")).join("nvidia-dgx-gb10");
    let inv = inventory_ok(&root);
    assert_eq!(inv["cpu"]["model_name"], "ARM Cortex-X925 + Cortex-A725");
    let kinds: Vec<(&str, u64)> = inv["cpu"]["core_kinds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| (k["name"].as_str().unwrap(), k["cpu_count"].as_u64().unwrap()))
        .collect();
    assert_eq!(kinds, [("Cortex-X925", 10), ("Cortex-A725", 10)]);
}

#[test]
fn unreadable_files_become_problems() {
    let (_dir, root) = damaged_copy("20em64t-hybrid-1p6c2t+2ca4co1t.tar.bz2", "20em64t-hybrid-1p6c2t+2ca4co1t");
    // A directory where a file should be: unreadable whoever runs the test.
    let meminfo = root.join("proc/meminfo");
    std::fs::remove_file(&meminfo).unwrap();
    std::fs::create_dir(&meminfo).unwrap();
    let inv = inventory_ok(&root);
    assert_eq!(problems_for(&inv, "proc/meminfo")[0]["kind"], "unreadable");
    assert!(inv["memory"]["total_bytes"].is_null());
}

/// Root-only DMI fields, as on a live machine without root. Root reads everything, so as root the
/// test drops to `nobody` with setpriv to see what an ordinary user sees.
#[test]
fn root_only_dmi_fields_are_reported_as_such() {
    use std::os::unix::fs::PermissionsExt;
    let (dir, root) = damaged_copy("20em64t-hybrid-1p6c2t+2ca4co1t.tar.bz2", "20em64t-hybrid-1p6c2t+2ca4co1t");
    let serial = root.join("sys/class/dmi/id/product_serial");
    std::fs::write(&serial, "CZC1234567\n").unwrap();
    std::fs::set_permissions(&serial, std::fs::Permissions::from_mode(0o400)).unwrap();
    let bin = env!("CARGO_BIN_EXE_kiln");
    let args = ["inventory", "--json", "--root", root.to_str().unwrap()];
    let root = nix::unistd::geteuid().is_root();
    let setpriv = crate::util::program("setpriv", "util-linux").filter(|_| root);
    if !crate::util::needs("root_only_dmi_fields_are_reported_as_such", &setpriv.into_iter().collect::<Vec<_>>()) {
        return;
    }
    let output = if root {
        // nobody must be able to reach the binary and the snapshot.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::process::Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", bin])
            .args(args)
            .output()
            .expect("setpriv (util-linux) is needed to run this test as root")
    } else {
        std::process::Command::new(bin).args(args).output().unwrap()
    };
    assert_eq!(output.status.code(), Some(0), "stderr: {}", String::from_utf8_lossy(&output.stderr));
    let inv: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert!(inv["system"]["product"]["serial"].is_null());
    assert_eq!(inv["system"]["root_only"], serde_json::json!(["product_serial"]));
    assert_eq!(problems_for(&inv, "dmi/id/product_serial")[0]["kind"], "permission_denied");
    assert_eq!(inv["os"]["kiln_is_root"], false);
}

/// `--root` is a boundary: what a hostile snapshot links, plants or inflates never reaches past
/// it, hangs kiln or exhausts its memory. Each row: what the snapshot's file becomes → the problem
/// kind kiln must report for it (the run must succeed, quickly).
#[test]
fn the_snapshot_root_is_a_boundary() {
    let outside = tempfile::tempdir().unwrap();
    let secret = outside.path().join("secret");
    std::fs::write(&secret, "HOST-SECRET-1234\n").unwrap();
    type Plant = Box<dyn Fn(&Path)>;
    let cases: Vec<(&str, &str, Plant, &str)> = vec![
        (
            "absolute link to a host file",
            "sys/class/dmi/id/product_serial",
            Box::new({
                let secret = secret.clone();
                move |p: &Path| std::os::unix::fs::symlink(&secret, p).unwrap()
            }),
            "",
        ),
        (
            "relative link climbing out",
            "sys/class/dmi/id/product_serial",
            Box::new({
                let secret = secret.clone();
                move |p: &Path| {
                    let up = "../".repeat(40);
                    std::os::unix::fs::symlink(format!("{up}{}", secret.display()), p).unwrap()
                }
            }),
            "",
        ),
        (
            "link to /dev/zero",
            "proc/cpuinfo",
            Box::new(|p: &Path| std::os::unix::fs::symlink("/dev/zero", p).unwrap()),
            "not_present",
        ),
        (
            "a FIFO",
            "proc/cpuinfo",
            Box::new(|p: &Path| nix::unistd::mkfifo(p, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap()),
            "unreadable",
        ),
        (
            "a file larger than any /proc file",
            "proc/meminfo",
            Box::new(|p: &Path| {
                let f = std::fs::File::create(p).unwrap();
                f.set_len(40 << 20).unwrap();
            }),
            "unreadable",
        ),
        ("a link loop", "proc/cpuinfo", Box::new(|p: &Path| std::os::unix::fs::symlink("cpuinfo", p).unwrap()), ""),
    ];
    for (what, rel, plant, kind) in cases {
        let (_dir, root) = damaged_copy("20em64t-hybrid-1p6c2t+2ca4co1t.tar.bz2", "20em64t-hybrid-1p6c2t+2ca4co1t");
        let file = root.join(rel);
        let _ = std::fs::remove_file(&file);
        plant(&file);
        let started = std::time::Instant::now();
        let run = kiln(&["inventory", "--json", "--root", root.to_str().unwrap()], &[]);
        assert!(started.elapsed().as_secs() < 20, "{what}: took {:?}", started.elapsed());
        assert!(!run.stdout().contains("HOST-SECRET"), "{what}: a host file leaked into the inventory");
        let inv = run.success().json();
        assert!(inv["system"]["product"]["serial"].is_null(), "{what}: {}", inv["system"]["product"]);
        if !kind.is_empty() {
            let found: Vec<&Value> = problems_for(&inv, rel);
            assert!(found.iter().any(|p| p["kind"] == kind), "{what}: want a {kind} problem for {rel}: {found:?}");
        }
    }
}

/// A full disk under the database, made for real: a 4 MiB tmpfs in a user and mount namespace of
/// the test's own (`unshare -rm`, so no root is needed and nothing outlives the test). A stored
/// result, the disk filled, another save refused with the reason, a benchmark refused before it
/// measures, and after space is freed the database checks clean with the first result in it.
#[test]
fn a_full_disk_is_named_and_loses_nothing() {
    let mut missing: Vec<String> = crate::util::program("unshare", "util-linux").into_iter().collect();
    let works = missing.is_empty()
        && std::process::Command::new("unshare")
            .args(["-rm", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /tmp"])
            .status()
            .is_ok_and(|s| s.success());
    if missing.is_empty() && !works {
        missing.push("user and mount namespaces (unshare -rm with a tmpfs mount)".into());
    }
    if !crate::util::needs("a_full_disk_is_named_and_loses_nothing", &missing) {
        return;
    }
    let root = unpack(&fixtures().join("hwloc/16em64t-4s2c2t.tar.bz2")).join("16em64t-4s2c2t");
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk");
    std::fs::create_dir(&disk).unwrap();
    let (kiln, root, disk) = (env!("CARGO_BIN_EXE_kiln"), root.display(), disk.display());
    let script = format!(
        r#"mount -t tmpfs -o size=4m tmpfs {disk} || exit 97
db={disk}/kiln.db
"{kiln}" --db "$db" inventory --save --root {root} >/dev/null 2>&1; echo "first=$?"
dd if=/dev/zero of={disk}/filler bs=16k >/dev/null 2>&1
"{kiln}" --db "$db" inventory --save --root {root} >/dev/null 2>{disk}/../second.err; echo "second=$?"
"{kiln}" --db "$db" bench membw --array-mib 1 --repetitions 1 >/dev/null 2>{disk}/../bench.err; echo "bench=$?"
rm {disk}/filler
"{kiln}" --db "$db" db check >/dev/null 2>&1; echo "check=$?"
"{kiln}" --db "$db" hosts --json
"#
    );
    let out = std::process::Command::new("unshare")
        .args(["-rm", "sh", "-c", &script])
        .env_remove("KILN_DB")
        .env("KILN_MAX_CONTENTION", "100")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{said}{}", String::from_utf8_lossy(&out.stderr));
    for want in ["first=0", "second=2", "bench=2", "check=0"] {
        assert!(said.contains(want), "{want}:\n{said}");
    }
    let second = std::fs::read_to_string(dir.path().join("second.err")).unwrap();
    assert!(second.contains("kiln.db: the filesystem holding the database is full"), "{second}");
    let bench = std::fs::read_to_string(dir.path().join("bench.err")).unwrap();
    assert!(bench.contains("KiB free") && bench.contains("nothing was measured"), "{bench}");
    let hosts: Value =
        serde_json::from_str(said.lines().skip_while(|l| !l.starts_with('{')).collect::<Vec<_>>().join("\n").as_str())
            .unwrap();
    assert_eq!(hosts["hosts"].as_array().unwrap().len(), 1, "the first result is still there: {said}");
}

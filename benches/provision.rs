//! `kiln provision plan` of a 60-step image on an already-provisioned root, against the target of
//! one second, and against the anchor of reading the state the naive way: one `dpkg-query -W` of
//! the root's packages plus one `pip freeze` of its venv (what a plan would spend if it shelled out
//! for both). The image: 10 apt packages from a local repository, 30 files, 20 guarded commands (5
//! of them with an `unless` probe), a venv with two wheels, sysctl settings and modules — 61 steps
//! on an empty root. Needs root (the first apply installs packages). `cargo bench --bench provision`.

#[path = "../tests/lab.rs"]
mod lab;

use std::process::Command;
use std::time::Instant;

use kiln_bench::stats::summarize;

fn main() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("the plan benchmark applies its image first, which needs root");
        std::process::exit(1);
    }
    let kiln = env!("CARGO_BIN_EXE_kiln");
    let lab = lab::Lab::new();
    let mut spec = String::from("[image]\nname = \"bench-60\"\nversion = \"1\"\n\n[[apt.repository]]\nname = \"bench\"\nuri = \"file:@REPO@\"\nsuite = \"./\"\ntrusted = true\n\n[apt]\nhold = [\"bench-pkg-0\", \"bench-pkg-1\"]\n\n[apt.packages]\n");
    for i in 0..10 {
        lab.deb(&format!("bench-pkg-{i}"), "1.0", None, &[(&format!("/usr/share/bench-pkg-{i}/data"), "x\n")]);
        spec += &format!("bench-pkg-{i} = \"1.0\"\n");
    }
    for i in 0..30 {
        spec += &format!(
            "\n[[file]]\npath = \"/etc/bench/file-{i}.conf\"\nmode = \"0640\"\ncontent = \"setting-{i} = {i}\\n\"\n"
        );
    }
    for i in 0..20 {
        if i < 5 {
            spec += &format!("\n[[command]]\nname = \"probe-{i}\"\nrun = [\"touch\", \"${{root}}/var/bench-{i}\"]\nunless = [\"test\", \"-e\", \"${{root}}/var/bench-{i}\"]\n");
        } else {
            spec += &format!("\n[[command]]\nname = \"step-{i}\"\nrun = [\"touch\", \"${{root}}/var/bench-{i}\"]\ncreates = \"/var/bench-{i}\"\n");
        }
    }
    let wheels = lab.path().join("wheels");
    std::fs::create_dir_all(&wheels).unwrap();
    lab::wheel(&wheels, "benchwheel", "1.0");
    lab::wheel(&wheels, "benchtool", "2.0");
    spec += "\n[[venv]]\npath = \"/opt/bench/venv\"\nwheels = \"wheels\"\npackages = [\"benchwheel==1.0\", \"benchtool==2.0\"]\n";
    spec += "\n[sysctl]\n\"vm.max_map_count\" = 1048576\n\"kernel.numa_balancing\" = 0\n\n[[module]]\nname = \"msr\"\n\n[[module]]\nname = \"nvidia_peermem\"\n";
    let spec = lab.spec("bench-60", &spec);
    let root = lab.root();
    let db = lab.path().join("kiln.db");
    let args = |verb: &str| {
        vec![
            "provision".to_string(),
            verb.to_string(),
            spec.display().to_string(),
            "--root".into(),
            root.display().to_string(),
        ]
    };

    let fresh = Command::new(kiln).args(args("plan")).arg("--json").output().unwrap();
    let plan: serde_json::Value = serde_json::from_slice(&fresh.stdout).expect("plan JSON");
    let steps = plan["steps"].as_array().unwrap().len();
    eprintln!("fresh root: {steps} steps");
    let applied = Command::new(kiln).args(args("apply")).env("KILN_DB", &db).output().unwrap();
    assert!(applied.status.success(), "apply failed: {}", String::from_utf8_lossy(&applied.stderr));
    let again = Command::new(kiln).args(args("plan")).output().unwrap();
    assert!(
        String::from_utf8_lossy(&again.stdout).contains("nothing to change"),
        "{}",
        String::from_utf8_lossy(&again.stdout)
    );

    let (mut ours, mut naive) = (Vec::new(), Vec::new());
    let admindir = format!("--admindir={}", root.join("var/lib/dpkg").display());
    let pip = root.join("opt/bench/venv/bin/python");
    for round in 0..15 {
        let t = Instant::now();
        let out = Command::new(kiln).args(args("plan")).output().unwrap();
        ours.push(t.elapsed().as_secs_f64() * 1e3);
        assert!(out.status.success());
        let t = Instant::now();
        let q = Command::new("dpkg-query")
            .arg(&admindir)
            .args(["-W", "-f=${Package}\t${Version}\t${db:Status-Abbrev}\n"])
            .output()
            .unwrap();
        let f =
            Command::new(&pip).args(["-m", "pip", "freeze", "--all", "--disable-pip-version-check"]).output().unwrap();
        naive.push(t.elapsed().as_secs_f64() * 1e3);
        assert!(q.status.success() && f.status.success());
        if round == 0 {
            eprintln!("pip freeze: {}", String::from_utf8_lossy(&f.stdout).trim().replace('\n', ", "));
        }
    }
    let (o, n) = (summarize(&ours).expect("samples"), summarize(&naive).expect("samples"));
    println!("plan of {steps}-step image on a provisioned root: median {:.1} ms (min {:.1}, max {:.1}), target < 1000 ms: {:.0}x under", o.median, o.min, o.max, 1000.0 / o.median);
    println!(
        "anchor, one dpkg-query + one pip freeze: median {:.1} ms; kiln's whole plan / anchor = {:.2}",
        n.median,
        o.median / n.median
    );
}

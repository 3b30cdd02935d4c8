//! `deploy/`: what a site installs. The systemd units pass `systemd-analyze verify` (and the fleet
//! service's sandbox its `security` score), the Kubernetes manifests parse and hold what a cluster
//! needs, the Slurm script is valid shell, every kiln command line in them is one the built binary
//! accepts, and the Debian package installs into a scratch root and is removed without a trace.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::util::{kiln, needs, program};

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Checks that `kiln ARGS…` (a command line from a deploy file) parses: each subcommand exists and
/// each `--flag` is one that subcommand's `--help` lists.
#[track_caller]
fn accepted(words: &[String], from: &str) {
    assert_eq!(words.first().map(|w| w.rsplit('/').next().unwrap()), Some("kiln"), "{from}: {words:?}");
    let mut path: Vec<&str> = Vec::new();
    let mut flags: Vec<&str> = Vec::new();
    let mut i = 1;
    while i < words.len() {
        let w = words[i].as_str();
        if let Some(flag) = w.strip_prefix("--") {
            flags.push(flag.split('=').next().unwrap());
            // A flag's value follows it unless it is a switch or given with `=`.
            if !w.contains('=') && words.get(i + 1).is_some_and(|v| !v.starts_with("--")) {
                i += 1;
            }
        } else if !w.starts_with('$') {
            path.push(w);
        }
        i += 1;
    }
    let mut help_args = path.clone();
    help_args.push("--help");
    let help = kiln(&help_args, &[]).success().stdout();
    for flag in flags {
        assert!(help.contains(&format!("--{flag}")), "{from}: `kiln {}` has no --{flag}", path.join(" "));
    }
}

fn split_shell(line: &str) -> Vec<String> {
    line.split_whitespace().map(|w| w.trim_matches('"').to_string()).collect()
}

#[test]
fn the_systemd_units_verify_and_the_service_is_sandboxed() {
    let units: Vec<PathBuf> = ["kiln-serve.service", "kiln-nightly.service", "kiln-nightly.timer"]
        .iter()
        .map(|u| deploy().join("systemd").join(u))
        .collect();
    for unit in &units {
        for line in read(unit).lines().filter_map(|l| l.strip_prefix("ExecStart=")) {
            accepted(&split_shell(line), &unit.display().to_string());
        }
    }
    let serve = read(&units[0]);
    for want in ["NoNewPrivileges=yes", "ProtectSystem=strict", "DynamicUser=yes", "StateDirectory=kiln-fleet"] {
        assert!(serve.contains(want), "kiln-serve.service lacks {want}");
    }
    assert!(read(&units[1]).contains("NoNewPrivileges=yes") && read(&units[1]).contains("ProtectSystem="));

    let missing: Vec<String> = program("systemd-analyze", "systemd").into_iter().collect();
    if !needs("the_systemd_units_verify_and_the_service_is_sandboxed (systemd-analyze)", &missing) {
        return;
    }
    // verify checks that ExecStart's program exists: point the units at the built binary.
    let dir = tempfile::tempdir().unwrap();
    let copies: Vec<PathBuf> = units
        .iter()
        .map(|u| {
            let copy = dir.path().join(u.file_name().unwrap());
            std::fs::write(&copy, read(u).replace("/usr/bin/kiln", env!("CARGO_BIN_EXE_kiln"))).unwrap();
            copy
        })
        .collect();
    let out = Command::new("systemd-analyze").arg("verify").args(&copies).output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && said.trim().is_empty(), "systemd-analyze verify: {said}");
    // The fleet service's exposure (0 best … 10 worst, ×10 for --threshold) stays low.
    let out = Command::new("systemd-analyze")
        .args(["security", "--offline=yes", "--threshold=20"])
        .arg(&copies[0])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", text.lines().last().unwrap_or_default());
}

#[test]
fn the_kubernetes_manifests_parse_and_run_commands_kiln_has() {
    use serde::Deserialize;
    let mut kinds = Vec::new();
    for file in ["kiln-serve.yaml", "kiln-agent.yaml", "kiln-nightly.yaml"] {
        let path = deploy().join("k8s").join(file);
        let text = read(&path);
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let v: serde_json::Value =
                serde_json::Value::deserialize(doc).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let kind = v["kind"].as_str().unwrap_or_else(|| panic!("{}: a document without kind", path.display()));
            assert!(v["apiVersion"].is_string() && v["metadata"]["name"].is_string(), "{file}: {kind}");
            kinds.push(kind.to_string());
            let pod = match kind {
                "Deployment" | "DaemonSet" => &v["spec"]["template"]["spec"],
                "CronJob" => &v["spec"]["jobTemplate"]["spec"]["template"]["spec"],
                _ => continue,
            };
            if kind != "CronJob" {
                let selector = &v["spec"]["selector"]["matchLabels"];
                assert_eq!(
                    selector, &v["spec"]["template"]["metadata"]["labels"],
                    "{file}: the selector selects its pods"
                );
            }
            for c in pod["containers"].as_array().unwrap() {
                let words: Vec<String> =
                    c["command"].as_array().unwrap().iter().map(|w| w.as_str().unwrap().to_string()).collect();
                accepted(&words, &format!("{file} {kind}"));
                let probe = &c["readinessProbe"]["httpGet"]["path"];
                if !probe.is_null() {
                    assert_eq!(probe, "/healthz");
                }
            }
        }
    }
    kinds.sort();
    assert_eq!(
        kinds,
        ["ConfigMap", "CronJob", "DaemonSet", "Deployment", "Namespace", "Service", "Service", "StatefulSet"],
        "the DaemonSet (agents), the CronJob (nightly), the Deployment and Service (kiln serve) and PostgreSQL's \
         StatefulSet and Service"
    );
}

#[test]
fn the_slurm_script_is_valid_shell_and_runs_one_task_per_node() {
    let path = deploy().join("slurm/kiln-nightly.sbatch");
    let text = read(&path);
    assert!(text.contains("#SBATCH --ntasks-per-node=1") && text.contains("#SBATCH --exclusive"));
    let srun = text.lines().skip_while(|l| !l.starts_with("srun")).collect::<Vec<_>>().join(" ");
    let words = split_shell(&srun.replace('\\', " "));
    let at = words.iter().position(|w| w == "$KILN").expect("srun runs $KILN");
    let mut command = vec!["kiln".to_string()];
    command.extend(words[at + 1..].iter().cloned());
    accepted(&command, "kiln-nightly.sbatch");
    let out = Command::new("bash").arg("-n").arg(&path).output().unwrap();
    assert!(out.status.success(), "bash -n: {}", String::from_utf8_lossy(&out.stderr));
}

// Long: build, install, check and purge in one sequence, each step's state checked before the next.
#[test]
fn the_debian_package_installs_and_purges_cleanly() {
    let missing: Vec<String> = [program("dpkg-deb", "dpkg"), program("dpkg", "dpkg")].into_iter().flatten().collect();
    if !needs("the_debian_package_installs_and_purges_cleanly", &missing) {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let out = Command::new("bash")
        .arg(deploy().join("deb/build-deb.sh"))
        .args(["--binary", env!("CARGO_BIN_EXE_kiln"), "--compress", "gzip", "--out"])
        .arg(work.path().join("out"))
        .output()
        .unwrap();
    assert!(out.status.success(), "build-deb.sh: {}", String::from_utf8_lossy(&out.stderr));
    let deb = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    assert!(deb.file_name().unwrap().to_str().unwrap().starts_with("kiln_"), "{}", deb.display());
    let info = Command::new("dpkg-deb").arg("--info").arg(&deb).output().unwrap();
    let info = String::from_utf8_lossy(&info.stdout);
    assert!(info.contains("Package: kiln") && info.contains("Depends: libc6 (>= 2.31)"), "{info}");

    // A scratch dpkg database and root: the machine's own are never touched.
    let admin = work.path().join("admin");
    let root = work.path().join("root");
    for d in ["info", "updates", "triggers"] {
        std::fs::create_dir_all(admin.join(d)).unwrap();
    }
    std::fs::write(admin.join("status"), "").unwrap();
    std::fs::write(admin.join("available"), "").unwrap();
    std::fs::create_dir_all(&root).unwrap();
    let dpkg = |args: &[&str]| {
        let out = Command::new("dpkg")
            .arg(format!("--admindir={}", admin.display()))
            .arg(format!("--instdir={}", root.display()))
            .args(["--force-not-root", "--force-depends", "--force-script-chrootless"])
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "dpkg {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    dpkg(&["-i", deb.to_str().unwrap()]);
    for file in [
        "usr/bin/kiln",
        "lib/systemd/system/kiln-serve.service",
        "lib/systemd/system/kiln-nightly.timer",
        "usr/share/kiln/images/cpu-base.toml",
        "usr/share/kiln/specs/cpu-server.toml",
        "usr/share/doc/kiln/agent.toml.example",
    ] {
        assert!(root.join(file).is_file(), "the package installs /{file}");
    }
    assert!(root.join("var/lib/kiln").is_dir());
    let version = Command::new(root.join("usr/bin/kiln")).arg("--version").output().unwrap();
    assert!(String::from_utf8_lossy(&version.stdout).starts_with("kiln "), "the installed binary runs");

    dpkg(&["--purge", "kiln"]);
    let left: Vec<PathBuf> = walk(&root).into_iter().filter(|p| !p.is_dir()).collect();
    assert!(left.is_empty(), "files left after purge: {left:?}");
    assert!(!root.join("usr/share/kiln").exists() && !root.join("var/lib/kiln").exists());
}

// Long: the stand-in libraries and program, then the package built from them, then a refusal.
#[test]
fn the_gpu_package_depends_on_the_libraries_kiln_gpu_links() {
    let missing: Vec<String> = [program("dpkg-deb", "dpkg"), program("readelf", "binutils"), program("cc", "gcc")]
        .into_iter()
        .flatten()
        .collect();
    if !needs("the_gpu_package_depends_on_the_libraries_kiln_gpu_links", &missing) {
        return;
    }
    // A stand-in kiln-gpu that links libraries under CUDA 13's and NCCL's sonames, as the CUDA
    // build does (the real build takes CUDA and minutes: deploy/release/build.sh --gpu).
    let work = tempfile::tempdir().unwrap();
    let dir = work.path();
    let cc = |args: &[&str]| {
        let out = Command::new("cc").current_dir(dir).args(args).output().unwrap();
        assert!(out.status.success(), "cc {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    for (lib, soname, symbol) in [
        ("cublas", "libcublas.so.13", "cublasCreate_v2"),
        ("nccl", "libnccl.so.2", "ncclGetUniqueId"),
        ("mystery", "libmystery.so.1", "mystery"),
    ] {
        std::fs::write(dir.join(format!("{lib}.c")), format!("int {symbol}(void) {{ return 0; }}\n")).unwrap();
        cc(&["-shared", "-fPIC", &format!("-Wl,-soname,{soname}"), "-o", &format!("lib{lib}.so"), &format!("{lib}.c")]);
    }
    std::fs::write(dir.join("gpu.c"), "int cublasCreate_v2(void); int ncclGetUniqueId(void);\nint main(void) { return cublasCreate_v2() + ncclGetUniqueId(); }\n").unwrap();
    cc(&["-o", "kiln-gpu", "gpu.c", "-L.", "-Wl,--no-as-needed", "-lcublas", "-lnccl"]);
    std::fs::write(dir.join("odd.c"), "int mystery(void);\nint main(void) { return mystery(); }\n").unwrap();
    cc(&["-o", "odd-gpu", "odd.c", "-L.", "-Wl,--no-as-needed", "-lmystery"]);

    let build = |gpu: &str| {
        Command::new("bash")
            .arg(deploy().join("deb/build-deb.sh"))
            .args(["--binary", env!("CARGO_BIN_EXE_kiln"), "--compress", "gzip", "--gpu-binary"])
            .arg(dir.join(gpu))
            .arg("--out")
            .arg(dir.join("out"))
            .output()
            .unwrap()
    };
    let out = build("kiln-gpu");
    assert!(out.status.success(), "build-deb.sh: {}", String::from_utf8_lossy(&out.stderr));
    let debs: Vec<PathBuf> = String::from_utf8_lossy(&out.stdout).lines().map(PathBuf::from).collect();
    assert_eq!(debs.len(), 2, "kiln's package and kiln-gpu's: {debs:?}");
    assert!(debs[1].file_name().unwrap().to_str().unwrap().starts_with("kiln-gpu_"), "{debs:?}");
    let info = Command::new("dpkg-deb").arg("--field").arg(&debs[1]).arg("Depends").output().unwrap();
    let depends = String::from_utf8_lossy(&info.stdout);
    let version = env!("CARGO_PKG_VERSION");
    for dep in [
        format!("kiln (= {version})"),
        "libcublas-13-0".into(),
        "libnccl2 (>= 2.27.7)".into(),
        "libc6 (>= 2.31)".into(),
    ] {
        assert!(depends.contains(&dep), "kiln-gpu depends on {dep}: {depends}");
    }
    let contents = Command::new("dpkg-deb").arg("--contents").arg(&debs[1]).output().unwrap();
    let contents = String::from_utf8_lossy(&contents.stdout);
    assert!(contents.contains("./usr/bin/kiln-gpu"), "installed beside kiln, where kiln looks: {contents}");

    // A library no package is known to hold is named, and no package is made of it.
    std::fs::remove_dir_all(dir.join("out")).unwrap();
    let out = build("odd-gpu");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("links libmystery.so.1, which no package is known to hold"), "{stderr}");
    let made: Vec<_> = std::fs::read_dir(dir.join("out")).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(!made.iter().any(|n| n.to_string_lossy().starts_with("kiln-gpu")), "{made:?}");
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        }
        out.push(p);
    }
    out
}

//! Benchmarks as users run them: `kiln bench membw` stores a run that `kiln runs` and
//! `kiln show run` read back with every raw sample. Timings are not asserted (see benches/).

use crate::util::{kiln, needs};

#[test]
fn membw_run_is_measured_stored_and_shown() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("kiln.db");
    let run = kiln(
        &["bench", "membw", "--array-mib", "2", "--repetitions", "3", "--warmup", "1", "--json"],
        &[("KILN_DB", &db)],
    )
    .success();
    let out = run.json();
    let typed: kiln_app::runs::MembwReport = run.report();
    assert!(typed.scopes.iter().all(|s| s.kernels.len() == 4), "{typed:?}");
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
    assert!(runs[0]["metrics"]
        .as_array()
        .unwrap()
        .iter()
        .any(|m| m["name"] == "membw.all.triad_gbps" && m["unit"] == "GB/s" && m["direction"] == "higher"));

    let shown = kiln(&["show", "run", &run_id[..8], "--json"], &[("KILN_DB", &db)]).success().json();
    assert_eq!(shown["id"], run_id);
    let scope_count = scopes.len();
    assert_eq!(shown["samples"].as_array().unwrap().len(), scope_count * 4 * 3, "every raw sample is kept");
    assert!(shown["software"]["kernel"].is_string(), "the software stack is an object: {}", shown["software"]);
    let human = kiln(&["show", "run", run_id], &[("KILN_DB", &db)]).success().stdout();
    assert!(human.contains("membw.all.triad_gbps"), "{human}");
    // What --json holds shows for people too: the raw samples and the software stack.
    assert!(human.contains(&format!("samples ({} raw values)", scope_count * 4 * 3)), "{human}");
    assert!(human.contains("software\n") && human.contains("  kernel "), "{human}");
    // The run hangs off the host the inventory identified.
    let hosts = kiln(&["hosts", "--json"], &[("KILN_DB", &db)]).success().json();
    assert_eq!(hosts["hosts"][0]["id"], shown["host_id"]);
}

#[test]
fn membw_rejects_nonsense_sizes() {
    for args in [
        &["bench", "membw", "--no-save", "--repetitions", "0"][..],
        &["bench", "membw", "--no-save", "--array-mib", "0"][..],
    ] {
        let run = kiln(args, &[]);
        assert_eq!(run.code(), Some(2), "{}", run.describe());
        assert!(run.stderr().contains("must be at least 1"), "{}", run.describe());
    }
}

#[test]
fn disk_run_in_a_directory_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("target");
    std::fs::create_dir(&target).unwrap();
    let db = dir.path().join("kiln.db");
    let out = kiln(
        &["bench", "disk", target.to_str().unwrap(), "--size-mib", "4", "--seconds", "0.05", "--qd", "1,4", "--json"],
        &[("KILN_DB", &db)],
    )
    .success()
    .json();
    let tests: Vec<&str> =
        out["report"]["tests"].as_array().unwrap().iter().map(|t| t["test"].as_str().unwrap()).collect();
    assert_eq!(tests, ["seq_write", "seq_read", "rand_read", "rand_read", "rand_write", "rand_write"]);
    assert_eq!(std::fs::read_dir(&target).unwrap().count(), 0, "the test file is gone");
    let shown = kiln(&["show", "run", out["run_id"].as_str().unwrap(), "--json"], &[("KILN_DB", &db)]).success().json();
    assert!(shown["metrics"].as_array().unwrap().iter().any(|m| m["name"] == "disk.rand_read_4k_qd4.iops"));
}

#[test]
fn disk_interrupted_removes_its_file_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["bench", "disk", dir.path().to_str().unwrap(), "--size-mib", "8", "--seconds", "30", "--no-save"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until the test file exists, then interrupt as Ctrl-C would.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while std::fs::read_dir(dir.path()).unwrap().count() == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    std::thread::sleep(std::time::Duration::from_millis(200));
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("interrupted"), "{stderr}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "nothing left behind");
}

#[test]
fn disk_refuses_what_is_neither_a_directory_nor_a_device() {
    // A regular file is neither a directory nor a block device: refused with the path.
    let file = tempfile::NamedTempFile::new().unwrap();
    let run = kiln(&["bench", "disk", file.path().to_str().unwrap(), "--no-save"], &[]);
    assert_eq!(run.code(), Some(2), "{}", run.describe());
    assert!(run.stderr().contains("not a directory or a block device"), "{}", run.describe());
}

#[test]
fn net_between_two_kiln_processes_on_loopback() {
    use std::io::BufRead;
    let mut server = std::process::Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["bench", "net", "--serve", "127.0.0.1:0", "--idle", "20"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(server.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let addr = line.trim().strip_prefix("listening on ").unwrap_or_else(|| panic!("{line:?}")).to_string();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("kiln.db");
    let out = kiln(
        &["bench", "net", "--connect", &addr, "--seconds", "0.1", "--repetitions", "2", "--streams", "2", "--json"],
        &[("KILN_DB", &db)],
    )
    .success()
    .json();
    let _ = server.kill();
    let _ = server.wait();
    assert_eq!(out["report"]["throughput_gbps"].as_array().unwrap().len(), 2);
    assert!(out["report"]["throughput"]["median"].as_f64().unwrap() > 0.0);
    assert!(out["report"]["rtt_us"]["median"].as_f64().unwrap() > 0.0);
    let shown = kiln(&["show", "run", out["run_id"].as_str().unwrap(), "--json"], &[("KILN_DB", &db)]).success().json();
    assert_eq!(shown["benchmark"], "net");
    assert_eq!(shown["samples"].as_array().unwrap().len(), 2);
}

#[test]
fn net_without_a_server_says_what_to_do() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    drop(listener);
    let run = kiln(&["bench", "net", "--connect", &addr, "--no-save"], &[]);
    assert_eq!(run.code(), Some(2), "{}", run.describe());
    assert!(run.stderr().contains("is `kiln bench net --serve` running there?"), "{}", run.describe());
}

#[test]
fn tiny_training_run_learns_and_is_stored() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("kiln.db");
    let run = kiln(&["bench", "train", "--size", "tiny", "--seq", "32", "--json"], &[("KILN_DB", &db)]);
    let out = run.json();
    let typed: kiln_app::runs::TrainReport = run.report();
    assert_eq!(typed.train.loss_curve.len(), typed.train.config.steps);
    let r = &out["report"]["train"];
    assert_eq!(out["status"].as_str().map(|s| s != "failed"), Some(true), "{}", run.describe());
    assert_eq!(run.code(), Some(0), "{}", run.describe());
    assert!(r["learned"].as_bool().unwrap());
    let (start, end, chance) =
        (r["loss_start"].as_f64().unwrap(), r["loss_end"].as_f64().unwrap(), r["loss_chance"].as_f64().unwrap());
    assert!(end < 0.6 * chance && end < start, "loss {start} -> {end}, chance {chance}");
    assert_eq!(r["loss_curve"].as_array().unwrap().len(), 100);
    assert!(r["tokens_per_s"].as_f64().unwrap() > 0.0);
    assert!(r["mfu"].as_f64().unwrap() > 0.0 && r["mfu"].as_f64().unwrap() < 1.0);
    assert_eq!(r["config"]["seed"], 1234);
    let shown = kiln(&["show", "run", out["run_id"].as_str().unwrap(), "--json"], &[("KILN_DB", &db)]).success().json();
    let samples = shown["samples"].as_array().unwrap();
    assert_eq!(samples.iter().filter(|s| s[0] == "train.tiny.loss").count(), 100);
    assert_eq!(samples.iter().filter(|s| s[0] == "train.tiny.step_s").count(), 100);
}

#[test]
fn both_kernel_paths_train_the_same_model_from_the_seed() {
    // The fused CPU kernels and candle's composed ops start from the same seeded parameters and
    // batches, so the whole loss curve agrees (to float rounding), and repeats run to run.
    let curve = |kernels: &str| {
        let out = kiln(
            &["bench", "train", "--size", "tiny", "--seq", "32", "--kernels", kernels, "--no-save", "--json"],
            &[],
        )
        .success()
        .json();
        assert_eq!(out["report"]["train"]["config"]["kernels"], kernels);
        out["report"]["train"]["loss_curve"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect::<Vec<_>>()
    };
    let (fused, composed, again) = (curve("fused"), curve("composed"), curve("fused"));
    assert_eq!(fused.len(), 100);
    for (step, ((f, c), a)) in fused.iter().zip(&composed).zip(&again).enumerate() {
        assert!((f - c).abs() < 1e-3 * f, "step {step}: fused {f}, composed {c}");
        assert!((f - a).abs() < 1e-5 * f, "step {step}: {f} then {a} from the same seed");
    }
    let bad = kiln(&["bench", "train", "--kernels", "fast", "--no-save"], &[]);
    assert_eq!(bad.code(), Some(2), "{}", bad.describe());
    assert!(bad.stderr().contains("unknown kernels \"fast\": choose fused or composed"), "{}", bad.describe());
}

/// Beside a CPU hog, STREAM still reports only what memory moved: every stored sample is under the
/// physical ceiling the run states (the window cannot miss work), and the run is not `invalid`.
/// It is `disturbed`: the hogs' share of the machine is measured, stated, and keeps the run from
/// being a result.
#[test]
fn membw_beside_a_cpu_hog_stays_under_its_ceiling() {
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let hogs: Vec<_> = (0..2)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut x = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
                }
            })
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("kiln.db");
    let limit = std::path::Path::new("10");
    // Long enough (about 3 s here) that the machine's CPU time over the run is counted: a run
    // shorter than telemetry's MIN_TICKS (200 ticks: 1 s of 2 CPUs) states no contention, and
    // then is only `unstable`.
    let run = kiln(
        &["bench", "membw", "--array-mib", "64", "--repetitions", "120", "--json"],
        &[("KILN_DB", &db), ("KILN_MAX_CONTENTION", limit)],
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for h in hogs {
        h.join().unwrap();
    }
    let out = run.success().json();
    let report = &out["report"];
    assert!(report["invalid"].is_null(), "{report}");
    assert_eq!(out["status"], "disturbed", "two hogs on this machine's CPUs");
    let runs = kiln(&["runs", "--json"], &[("KILN_DB", &db)]).success().json();
    let stored = &runs["runs"][0];
    assert_eq!(stored["status"], "disturbed", "{stored}");
    let reason = stored["status_reason"].as_str().unwrap_or_default();
    assert!(reason.contains("other processes took") && reason.contains("limit 10 %"), "{stored}");
    for (scope, ceiling) in report["scopes"].as_array().unwrap().iter().zip(report["ceilings"].as_array().unwrap()) {
        let ceiling = ceiling["gbps"].as_f64().unwrap();
        for k in scope["kernels"].as_array().unwrap() {
            for s in k["samples_gbps"].as_array().unwrap() {
                assert!(s.as_f64().unwrap() <= ceiling, "{} above {ceiling}", s);
            }
        }
    }
}

#[test]
fn training_too_short_to_judge_is_refused() {
    // Three steps say nothing about learning: refused up front, naming the minimum (a run that
    // cannot learn is tested in the bench crate, with a zero learning rate).
    let run = kiln(&["bench", "train", "--size", "tiny", "--steps", "3", "--no-save"], &[]);
    assert_eq!(run.code(), Some(2), "{}", run.describe());
    assert!(run.stderr().contains("at least 10 steps"), "{}", run.describe());
    // Fifty steps learn, short as they are: no false alarm.
    let run = kiln(&["bench", "train", "--size", "tiny", "--steps", "50", "--no-save", "--json"], &[]).success();
    assert_eq!(run.json()["report"]["train"]["learned"], true);
    let bad = kiln(&["bench", "train", "--size", "tiny", "--heads", "5", "--no-save"], &[]);
    assert_eq!(bad.code(), Some(2), "{}", bad.describe());
    assert!(bad.stderr().contains("not a multiple of heads"), "{}", bad.describe());
}

#[test]
fn gemm_small_sizes_against_the_peak() {
    let run = kiln(
        &[
            "bench",
            "gemm",
            "--sizes",
            "64,128",
            "--dtypes",
            "f32,bf16",
            "--repetitions",
            "3",
            "--libraries",
            "none",
            "--no-save",
            "--json",
        ],
        &[],
    )
    .success();
    let out = run.json();
    let typed: kiln_app::runs::GemmReport = run.report();
    // candle's f32 and bf16 at both sizes, and kiln's own bf16 kernel where the CPU has AVX512-BF16.
    let expected = if kiln_bench::bf16::available() { 6 } else { 4 };
    assert_eq!(typed.results.len(), expected);
    assert!(out["report"]["peak"]["summary"]["median"].as_f64().unwrap() > 0.0);
    // Where the processor is in the FLOPs-per-cycle table, the datasheet view comes with it.
    let t = &out["report"]["theoretical_peak"];
    if !t.is_null() {
        assert!(t["flops_per_cycle"].as_u64().unwrap() >= 8 && t["implied_clock_mhz"].as_f64().unwrap() > 0.0, "{t}");
    }
    let results = out["report"]["results"].as_array().unwrap();
    assert_eq!(results.len(), expected);
    assert!(results.iter().all(|r| r["percent_of_peak"].as_f64().unwrap() > 0.0));
    // Every type has a measured ceiling, and no GEMM repetition is above it (issue 16).
    assert_eq!(typed.ceilings.iter().map(|c| c.dtype.as_str()).collect::<Vec<_>>(), ["f32", "bf16"]);
    for r in &typed.results {
        let ceiling = typed.ceilings.iter().find(|c| c.dtype == r.dtype).unwrap();
        assert!(r.gflops.iter().all(|g| *g <= ceiling.gflops), "{} {}: {:?} above {ceiling:?}", r.dtype, r.n, r.gflops);
    }
    assert!(typed.invalid.is_none() && out["status"] != "invalid", "{}", out["report"]["invalid"]);
    // The peaks per type this CPU has instructions for, each with its rate per cycle at the
    // measured clock.
    let dtypes: Vec<&str> = typed.peaks.iter().map(|p| p.dtype.as_str()).collect();
    assert_eq!(dtypes[0], "f32");
    #[cfg(target_arch = "x86_64")]
    {
        assert_eq!(dtypes.contains(&"bf16"), std::arch::is_x86_feature_detected!("avx512bf16"), "{dtypes:?}");
        assert_eq!(dtypes.contains(&"int8"), std::arch::is_x86_feature_detected!("avx512vnni"), "{dtypes:?}");
    }
    let clock = typed.clock.as_ref().expect("x86-64 and aarch64 measure the clock");
    assert!((500.0..7000.0).contains(&clock.summary.median), "{clock:?}");
    assert!(typed.peaks.iter().all(|p| p.per_cycle.unwrap() > 0.0));
    let fma = typed.fma_per_cycle.unwrap();
    assert!(fma > 0.0 && fma < 8.0, "{fma}");
}

/// The maintained GEMM libraries this machine has (OpenBLAS, BLIS, oneDNN; `.ci/run` installs
/// Debian's), found at run time: each multiplies f32 (oneDNN bf16 and int8 too) beside candle,
/// under the same ceilings, with its version recorded and its figures under metric names of its
/// own.
#[test]
fn gemm_through_the_libraries_found() {
    let solib = |soname: &str, package: &str| {
        let found = ["/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib"]
            .iter()
            .any(|d| std::path::Path::new(d).join(soname).exists());
        (!found).then(|| format!("{soname} (Debian package {package})"))
    };
    let missing: Vec<String> = [
        solib("libopenblas.so.0", "libopenblas0-pthread"),
        solib("libblis.so.4", "libblis4-pthread"),
        solib("libdnnl.so.2", "libdnnl2"),
    ]
    .into_iter()
    .flatten()
    .collect();
    if !needs("gemm_through_the_libraries_found", &missing) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("kiln.db");
    let args = ["bench", "gemm", "--sizes", "96", "--dtypes", "f32,bf16,int8", "--repetitions", "2", "--json"];
    let run = kiln(&args, &[("KILN_DB", &db)]).success();
    let typed: kiln_app::runs::GemmReport = run.report();
    let got: Vec<(&str, &str)> = typed.results.iter().map(|r| (r.backend.as_str(), r.dtype.as_str())).collect();
    // oneDNN 2.x multiplies bf16 on AVX-512 CPUs only (its avx512_core and newer kernels).
    #[cfg(target_arch = "x86_64")]
    let onednn_bf16 = std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512vl")
        && std::arch::is_x86_feature_detected!("avx512dq");
    #[cfg(not(target_arch = "x86_64"))]
    let onednn_bf16 = true;
    // kiln's own bf16 kernel runs where the CPU has AVX512-BF16.
    let own: &[(&str, &str)] = if kiln_bench::bf16::available() { &[("kiln", "bf16")] } else { &[] };
    assert_eq!(
        got,
        [
            &[("candle", "f32"), ("candle", "bf16")][..],
            own,
            &[("openblas", "f32"), ("blis", "f32"), ("onednn", "f32")][..],
            if onednn_bf16 { &[("onednn", "bf16")][..] } else { &[] },
            &[("onednn", "int8")][..],
        ]
        .concat(),
        "{:?}",
        typed.skipped
    );
    // Where oneDNN has no bf16 kernel for the CPU, kiln says so rather than fail the run.
    assert!(
        onednn_bf16
            || typed.skipped.iter().any(|s| s.starts_with("onednn bf16") && s.contains("no kernel for it on this CPU")),
        "{:?}",
        typed.skipped
    );
    // candle has no integer matmul, and says so.
    assert!(
        typed.skipped.iter().any(|s| s.starts_with("candle int8: candle has no int8 matmul")),
        "{:?}",
        typed.skipped
    );
    for r in &typed.results {
        let Some(ceiling) = typed.ceilings.iter().find(|c| c.dtype == r.dtype) else {
            // int8 is bounded by its own peak only, measured where the CPU has AVX512-VNNI.
            #[cfg(target_arch = "x86_64")]
            assert!(
                r.dtype == "int8" && !std::arch::is_x86_feature_detected!("avx512vnni"),
                "{} has no ceiling",
                r.dtype
            );
            continue;
        };
        assert!(
            r.gflops.iter().all(|g| *g <= ceiling.gflops),
            "{} {}: {:?} above {ceiling:?}",
            r.backend,
            r.dtype,
            r.gflops
        );
        if r.backend != "candle" {
            let version = r.implementation.as_deref().unwrap();
            assert!(
                ["OpenBLAS 0.", "BLIS 0.", "oneDNN 2.", "kiln vdpbf16ps"].iter().any(|v| version.starts_with(v)),
                "{version}"
            );
        }
    }
    // The stored metrics keep candle's names and give each library its own.
    let id = run.json()["run_id"].as_str().unwrap().to_string();
    let shown = kiln(&["show", "run", &id, "--json"], &[("KILN_DB", &db)]).success().json();
    let names: Vec<&str> = shown["metrics"].as_array().unwrap().iter().map(|m| m["name"].as_str().unwrap()).collect();
    for name in ["gemm.f32.96.gflops", "gemm.openblas.f32.96.gflops", "gemm.onednn.int8.96.gops"] {
        assert!(names.contains(&name), "{name} not in {names:?}");
    }
    assert_eq!(names.contains(&"gemm.onednn.bf16.96.gflops"), onednn_bf16, "{names:?}");
    // A library asked for by name and absent is said, not silently dropped.
    let onednn_only = |env: &[(&str, &std::path::Path)]| {
        let args = ["bench", "gemm", "--sizes", "32", "--dtypes", "f32", "--repetitions", "1", "--libraries", "onednn"];
        kiln(&[&args[..], &["--no-save", "--json"]].concat(), env)
    };
    let skipped = onednn_only(&[]).success().json()["report"]["skipped"].clone();
    assert_eq!(skipped, serde_json::json!([]), "oneDNN is installed: nothing to skip");
    let hidden = onednn_only(&[("KILN_GEMM_LIBRARIES", std::path::Path::new(""))]);
    let skipped = hidden.success().json()["report"]["skipped"].clone();
    assert!(skipped[0].as_str().unwrap().starts_with("onednn: not found (install it"), "{skipped}");
    let wrong = kiln(&["bench", "gemm", "--libraries", "mkl", "--no-save"], &[]);
    assert_eq!(wrong.code(), Some(2), "{}", wrong.describe());
    assert!(wrong.stderr().contains("give all, none, or some of openblas, blis, onednn"), "{}", wrong.describe());
}

/// A loop device over a file, detached when dropped.
struct Loop {
    device: String,
}

impl Loop {
    fn new(backing: &std::path::Path) -> Loop {
        let out = std::process::Command::new("losetup").args(["-f", "--show"]).arg(backing).output().unwrap();
        assert!(out.status.success(), "losetup: {}", String::from_utf8_lossy(&out.stderr));
        Loop { device: String::from_utf8(out.stdout).unwrap().trim().to_string() }
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = std::process::Command::new("losetup").args(["-d", &self.device]).status();
    }
}

/// A block device is read, never written, without --destructive; with it, a device the kernel
/// has in use is refused; and what it held is said either way. Needs root for loop devices.
#[test]
fn disk_never_writes_a_device_without_destructive() {
    use sha2::Digest;
    let missing: Vec<String> = [crate::util::root("loop devices"), crate::util::program("losetup", "util-linux")]
        .into_iter()
        .flatten()
        .collect();
    if !crate::util::needs("disk_never_writes_a_device_without_destructive", &missing) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let backing = dir.path().join("disk.img");
    let mut image = vec![0x5au8; 8 << 20];
    image[4086..4096].copy_from_slice(b"SWAPSPACE2");
    std::fs::write(&backing, &image).unwrap();
    let digest = || sha2::Sha256::digest(std::fs::read(&backing).unwrap());
    let before = digest();
    let dev = Loop::new(&backing);
    let args = |extra: &[&'static str]| {
        let mut a = vec!["bench", "disk", dev.device.as_str(), "--size-mib", "4", "--seconds", "0.05", "--qd", "1"];
        a.extend_from_slice(extra);
        a.extend_from_slice(&["--no-save", "--json"]);
        a.into_iter().map(String::from).collect::<Vec<_>>()
    };
    let run = |extra: &[&'static str]| {
        let a = args(extra);
        kiln(&a.iter().map(String::as_str).collect::<Vec<_>>(), &[])
    };
    // Without --destructive: the read tests only, the swap area named, not a byte changed.
    let read = run(&[]).success();
    let report: kiln_bench::disk::Report = read.report();
    assert!(report.read_only && report.held.as_deref() == Some("a swap area"), "{report:?}");
    assert!(report.tests.iter().all(|t| t.test.ends_with("read")) && !report.tests.is_empty(), "{report:?}");
    assert_eq!(digest(), before, "a read-only run changed the device");
    // With --destructive while someone holds the device exclusively: refused, nothing written.
    {
        use std::os::unix::fs::OpenOptionsExt;
        let _held = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_EXCL).open(&dev.device).unwrap();
        let refused = run(&["--destructive"]);
        assert_eq!(refused.code(), Some(2), "{}", refused.describe());
        assert!(refused.stderr().contains("in use"), "{}", refused.describe());
        assert_eq!(digest(), before, "a refused run changed the device");
    }
    // With --destructive and nobody holding it: written, and what it held is said.
    let wrote = run(&["--destructive"]).success();
    let report: kiln_bench::disk::Report = wrote.report();
    assert!(!report.read_only && report.held.as_deref() == Some("a swap area"), "{report:?}");
    assert!(report.tests.iter().any(|t| t.test == "rand_write"), "{report:?}");
    assert_ne!(digest(), before);
}

/// The silent-data-corruption screen as a technician runs it: a healthy machine's CPUs agree and
/// the run is stored `ok`; with a wrong result injected on CPU 0 (a test build's
/// `KILN_SDC_INJECT`), the run fails (exit 1) naming the CPU, the kernel and the first wrong word,
/// and the verdict of that inventory REJECTs with `cpu.sdc`.
#[test]
fn sdc_screen_names_a_cpu_that_computes_wrong_and_the_verdict_rejects_it() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("kiln.db");
    let clean = kiln(&["bench", "sdc", "--seconds", "0.5", "--json"], &[("KILN_DB", &db)]).success().json();
    assert_eq!(clean["status"], "ok");
    assert_eq!(clean["report"]["wrong"].as_array().unwrap().len(), 0);
    assert_eq!(clean["report"]["kernels"].as_array().unwrap().len(), kiln_bench::sdc::KERNELS.len());
    let inject = std::path::Path::new("0:sha256");
    let run = kiln(&["bench", "sdc", "--seconds", "0.5", "--json"], &[("KILN_DB", &db), ("KILN_SDC_INJECT", inject)]);
    assert_eq!(run.code(), Some(1), "{}", run.describe());
    let faulty = run.json();
    assert_eq!(faulty["status"], "failed");
    let wrong = faulty["report"]["wrong"].as_array().unwrap();
    assert!(wrong.iter().all(|w| w["cpu"] == 0 && w["kernel"] == "sha256"), "{wrong:?}");
    assert_eq!(wrong[0]["round"], 0);
    assert!(wrong[0]["what"].as_str().unwrap().contains("output word 0 is"), "{wrong:?}");
    let human = kiln(&["show", "run", faulty["run_id"].as_str().unwrap()], &[("KILN_DB", &db)]).success().stdout();
    assert!(human.contains("sdc.cpu0.wrong"), "{human}");
    // The faulty run's inventory: its verdict REJECTs whatever else passes.
    let hosts = kiln(&["hosts", "--json"], &[("KILN_DB", &db)]).success().json();
    let inventory = hosts["hosts"][0]["latest_inventory"].as_str().unwrap().to_string();
    let verdict = kiln(&["verdict", "--inventory", &inventory, "--no-save", "--json"], &[("KILN_DB", &db)]);
    assert_eq!(verdict.code(), Some(1), "{}", verdict.describe());
    let v = verdict.json();
    let sdc: Vec<&serde_json::Value> =
        v["checks"].as_array().unwrap().iter().filter(|c| c["id"] == "cpu.sdc").collect();
    assert!(sdc.iter().any(|c| c["status"] == "fail" && c["measured"].as_str().unwrap().contains("CPU 0")), "{sdc:?}");
    assert!(sdc[0]["remedy"]["source"].as_str().unwrap().contains("Silent Data Corruptions at Scale"), "{sdc:?}");
    let text = kiln(&["verdict", "--inventory", &inventory, "--no-save"], &[("KILN_DB", &db)]).stdout();
    assert!(text.contains("What to do:\n- cpu.sdc (CPUs): take the box out of service"), "{text}");
}

/// A loop device with an ext4 filesystem mounted in a directory of the test's: a drive kiln can be
/// pointed at. Unmounted and detached however the test ends.
struct Mounted {
    dir: std::path::PathBuf,
    major_minor: String,
    dev: Loop,
}

impl Mounted {
    fn new(backing: &std::path::Path, mib: u64, dir: std::path::PathBuf) -> Mounted {
        let f = std::fs::File::create(backing).unwrap();
        f.set_len(mib << 20).unwrap();
        let dev = Loop::new(backing);
        let ok = |c: &mut std::process::Command| assert!(c.status().unwrap().success(), "{c:?}");
        ok(std::process::Command::new("mkfs.ext4").args(["-q", "-F", &dev.device]));
        std::fs::create_dir_all(&dir).unwrap();
        ok(std::process::Command::new("mount").arg(&dev.device).arg(&dir));
        let name = dev.device.trim_start_matches("/dev/");
        let major_minor = std::fs::read_to_string(format!("/sys/block/{name}/dev")).unwrap().trim().to_string();
        Mounted { dir, major_minor, dev }
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.dir).status();
    }
}

/// A block-I/O cgroup reading one device at `bytes_per_s` at most: cgroup v2's `io.max` where the
/// io controller is there, else v1's `blkio.throttle.read_bps_device`. Removed at the end.
struct Throttle {
    dir: std::path::PathBuf,
}

impl Throttle {
    /// Where this kernel lets a throttle be set, if anywhere.
    fn available() -> Option<(std::path::PathBuf, bool)> {
        for v2 in ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"] {
            let controllers = std::fs::read_to_string(format!("{v2}/cgroup.controllers")).unwrap_or_default();
            if controllers.split_whitespace().any(|c| c == "io") {
                return Some((v2.into(), true));
            }
        }
        let v1 = std::path::Path::new("/sys/fs/cgroup/blkio");
        v1.join("blkio.throttle.read_bps_device").exists().then(|| (v1.to_path_buf(), false))
    }

    fn new(major_minor: &str, bytes_per_s: u64) -> Throttle {
        let (base, v2) = Throttle::available().unwrap();
        let dir = base.join(format!("kiln-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        if v2 {
            let _ = std::fs::write(base.join("cgroup.subtree_control"), "+io");
            std::fs::write(dir.join("io.max"), format!("{major_minor} rbps={bytes_per_s}")).unwrap();
        } else {
            std::fs::write(dir.join("blkio.throttle.read_bps_device"), format!("{major_minor} {bytes_per_s}")).unwrap();
        }
        Throttle { dir }
    }
}

impl Drop for Throttle {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// `kiln bench data` on two drives, one of them throttled by the kernel (a cgroup's read limit):
/// the accelerators wait (AU below 90 %) and the throttled directory is named as the bottleneck;
/// without the throttle the same rate keeps them busy. Nothing is left on either drive. Needs root
/// (loop devices, mount, cgroups).
#[test]
fn data_names_a_throttled_drive_as_the_bottleneck_and_passes_without_it() {
    let mut missing: Vec<String> = [
        crate::util::root("loop devices, mount and a block-I/O cgroup"),
        crate::util::program("losetup", "util-linux"),
        crate::util::program("mkfs.ext4", "e2fsprogs"),
    ]
    .into_iter()
    .flatten()
    .collect();
    if missing.is_empty() && Throttle::available().is_none() {
        missing.push("a cgroup v2 io controller or the v1 blkio controller".into());
    }
    if !crate::util::needs("data_names_a_throttled_drive_as_the_bottleneck_and_passes_without_it", &missing) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let slow = Mounted::new(&dir.path().join("slow.img"), 400, dir.path().join("slow"));
    let fast = Mounted::new(&dir.path().join("fast.img"), 400, dir.path().join("fast"));
    let (slow_dir, fast_dir) = (slow.dir.to_str().unwrap(), fast.dir.to_str().unwrap());
    let run = |throttle: Option<&Throttle>| {
        let args = [
            "bench",
            "data",
            slow_dir,
            fast_dir,
            "--size-mib",
            "256",
            "--shard-mib",
            "16",
            "--seconds",
            "3",
            "--rate",
            "0.08",
            "--accelerators",
            "2",
            "--readers",
            "8",
            "--no-save",
            "--json",
        ];
        let mut cmd = std::process::Command::new("sh");
        let script = match throttle {
            Some(t) => format!("echo $$ > {}/cgroup.procs && exec \"$0\" \"$@\"", t.dir.display()),
            None => "exec \"$0\" \"$@\"".into(),
        };
        cmd.arg("-c").arg(script).arg(env!("CARGO_BIN_EXE_kiln")).args(args);
        let run = crate::util::Run { cmdline: format!("{cmd:?}"), output: cmd.output().unwrap() };
        assert_eq!(run.code(), Some(0), "{}", run.describe());
        run.report::<kiln_bench::data::Report>()
    };
    let _machine = crate::util::machine_to_itself();
    let unthrottled = run(None);
    let at = unthrottled.at_rate.as_ref().unwrap();
    assert!(at.au >= 0.9 && unthrottled.bottleneck.is_none(), "{unthrottled:#?}");
    // 10 MB/s from the slow drive, where 80 MB/s are needed over both.
    let throttle = Throttle::new(&slow.major_minor, 10 << 20);
    let throttled = run(Some(&throttle));
    let at = throttled.at_rate.as_ref().unwrap();
    assert!(at.au < 0.9, "{throttled:#?}");
    let why = throttled.bottleneck.clone().unwrap_or_default();
    // Named by its directory and the block device under it.
    let device = slow.dev.device.trim_start_matches("/dev/");
    assert!(why.starts_with(&format!("the drive under {slow_dir} ({device}):")), "{why}\n{throttled:#?}");
    for d in [&slow.dir, &fast.dir] {
        let left: Vec<_> = std::fs::read_dir(d).unwrap().flatten().map(|e| e.file_name()).collect();
        assert!(left.iter().all(|n| n == "lost+found"), "{}: {left:?}", d.display());
    }
}

/// `kiln bench data` stores a `data` run (every metric one a spec can name) and leaves nothing in
/// its directories; Ctrl-C while the dataset is written removes it too; a file is refused.
#[test]
fn data_run_is_stored_and_leaves_nothing_behind_even_when_interrupted() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    std::fs::create_dir(&a).unwrap();
    std::fs::create_dir(&b).unwrap();
    let db = dir.path().join("kiln.db");
    let args = [
        "bench",
        "data",
        a.to_str().unwrap(),
        b.to_str().unwrap(),
        "--layout",
        "samples",
        "--size-mib",
        "32",
        "--shard-mib",
        "8",
        "--seconds",
        "0.5",
        "--rate",
        "0.01",
        "--accelerators",
        "2",
        "--json",
    ];
    let out = kiln(&args, &[("KILN_DB", &db)]).success().json();
    let report: kiln_bench::data::Report = serde_json::from_value(out["report"].clone()).unwrap();
    assert_eq!((report.shards, report.flat_out.dirs.len()), (4, 2), "{report:?}");
    assert!(report.at_rate.as_ref().unwrap().au > 0.0, "{report:?}");
    for d in [&a, &b] {
        assert_eq!(std::fs::read_dir(d).unwrap().count(), 0, "{} is left as it was", d.display());
    }
    let shown = kiln(&["show", "run", out["run_id"].as_str().unwrap(), "--json"], &[("KILN_DB", &db)]).success().json();
    let names: Vec<&str> = shown["metrics"].as_array().unwrap().iter().map(|m| m["name"].as_str().unwrap()).collect();
    for want in ["data.max_gbps", "data.au", "data.needed_gbps", "data.dir1.max_gbps", "data.read_p99_us"] {
        assert!(names.contains(&want), "{want}: {names:?}");
    }

    // Interrupted while the dataset is being written: nothing stays.
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["bench", "data", a.to_str().unwrap(), "--size-mib", "2048", "--shard-mib", "64", "--no-save"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let has_shard = || {
        std::fs::read_dir(&a)
            .unwrap()
            .flatten()
            .any(|e| std::fs::read_dir(e.path()).is_ok_and(|mut d| d.next().is_some()))
    };
    while !has_shard() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("interrupted"), "{stderr}");
    assert_eq!(std::fs::read_dir(&a).unwrap().count(), 0, "nothing left behind");

    let file = dir.path().join("kiln.db");
    let refused = kiln(&["bench", "data", file.to_str().unwrap(), "--no-save"], &[]);
    assert_eq!(refused.code(), Some(2), "{}", refused.describe());
    assert!(refused.stderr().contains("not a directory"), "{}", refused.describe());
}

/// `kiln bench train --data DIR`: the batches come from shards under DIR through the input
/// pipeline, the run learns as it does from memory (the same tokens), says how long its steps
/// waited on storage (stored as `train.tiny.input_wait_share`), and leaves DIR as it was.
#[test]
fn train_from_disk_reads_the_same_corpus_and_reports_its_input_wait() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let db = dir.path().join("kiln.db");
    let base = ["bench", "train", "--size", "tiny", "--steps", "12", "--gemm", "candle", "--json"];
    let from_disk: Vec<&str> = base.iter().copied().chain(["--data", data.to_str().unwrap()]).collect();
    let disk = kiln(&from_disk, &[("KILN_DB", &db)]);
    assert!(matches!(disk.code(), Some(0 | 1)), "{}", disk.describe());
    let disk = disk.json();
    let memory = kiln(&base.iter().copied().chain(["--no-save"]).collect::<Vec<_>>(), &[]).json();
    let input = &disk["report"]["train"]["input"];
    assert!(
        input["wait_share"].as_f64().unwrap() >= 0.0 && input["bytes_per_step"].as_u64().unwrap() >= 4096,
        "{input}"
    );
    assert!(memory["report"]["train"].get("input").is_none(), "{memory}");
    // The first step's loss is computed from the same tokens before any update.
    let first = |v: &serde_json::Value| v["report"]["train"]["loss_curve"][0].as_f64().unwrap();
    assert!((first(&disk) - first(&memory)).abs() < 1e-4, "{} vs {}", first(&disk), first(&memory));
    assert_eq!(std::fs::read_dir(&data).unwrap().count(), 0, "the shards are gone");
    let shown =
        kiln(&["show", "run", disk["run_id"].as_str().unwrap(), "--json"], &[("KILN_DB", &db)]).success().json();
    assert!(shown["metrics"].as_array().unwrap().iter().any(|m| m["name"] == "train.tiny.input_wait_share"), "{shown}");
}

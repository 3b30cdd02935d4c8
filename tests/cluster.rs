//! `kiln cluster`: as users run it, every rank a `kiln` process started by Open MPI's `mpirun` on
//! this host. The MPI build (`--features mpi`) is made by the first test that needs it, in its own
//! target directory, from the system's Open MPI. The fabric test's cluster is four network
//! namespaces joined through a bridge in a fifth, one node's link slowed with `tc`: the only
//! addresses any traffic goes to are those namespaces' own.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use nix::unistd::Pid;

use serde_json::Value;

use crate::util::{kiln, needs, program, root, Run};

/// What building kiln with MPI needs here, for [`needs`].
fn mpi_missing() -> Vec<String> {
    let mut missing: Vec<String> =
        [program("mpirun", "openmpi-bin"), program("mpicc", "libopenmpi-dev")].into_iter().flatten().collect();
    let libclang = std::fs::read_dir("/usr/lib")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("llvm-"))
        .any(|e| e.path().join("lib/libclang.so.1").exists());
    if !libclang {
        missing.push("libclang (Debian package libclang-dev), for the MPI bindings".into());
    }
    missing
}

/// The kiln binary built with `--features mpi` (once per test process), or `None` (skipped, said).
fn mpi_kiln(test: &str) -> Option<PathBuf> {
    if !needs(test, &mpi_missing()) {
        return None;
    }
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let built = BUILT.get_or_init(|| {
        // target/debug/kiln → target/
        let target = Path::new(env!("CARGO_BIN_EXE_kiln")).parent().and_then(Path::parent).expect("target dir");
        let dir = target.join("mpi");
        let out = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .args(["build", "--locked", "--features", "mpi", "--bin", "kiln", "--target-dir"])
            .arg(&dir)
            .output()
            .map_err(|e| format!("cargo: {e}"))?;
        if !out.status.success() {
            return Err(format!("cargo build --features mpi failed:\n{}", String::from_utf8_lossy(&out.stderr)));
        }
        Ok(dir.join("debug/kiln"))
    });
    Some(built.clone().unwrap_or_else(|e| panic!("{e}")))
}

/// A rail's findings about bandwidth (what the test's link caps decide).
fn bandwidth_findings(rail: &Value) -> Vec<Value> {
    let all = rail["verdict"]["findings"].as_array().expect("a verdict with findings");
    all.iter().filter(|f| f["quantity"] != "latency").cloned().collect()
}

/// `mpirun -np N` of `kiln --db DIR/dbRANK.sqlite ARGS…`, the runtime kept on loopback and the
/// ranks on shared memory; and its shell line.
fn mpirun_command(kiln: &Path, np: usize, dir: &Path, args: &str) -> (Command, String) {
    let script = format!("exec '{}' --db '{}'/db$OMPI_COMM_WORLD_RANK.sqlite {args}", kiln.display(), dir.display());
    let mut cmd = Command::new("mpirun");
    cmd.args(["-np", &np.to_string(), "--oversubscribe", "--mca", "btl", "self,vader"])
        .args(["--mca", "oob_tcp_if_include", "lo", "sh", "-c", &script])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("KILN_MAX_CONTENTION", "100")
        .env("KILN_AGENT_CONFIG", "/nonexistent/kiln-agent.toml");
    for var in ["KILN_DB", "KILN_LOG", "KILN_SERVER", "KILN_TOKEN", "KILN_CA_CERT"] {
        cmd.env_remove(var);
    }
    (cmd, script)
}

/// [`mpirun_command`] run to its end.
fn mpirun(kiln: &Path, np: usize, dir: &Path, args: &str) -> Run {
    let (mut cmd, script) = mpirun_command(kiln, np, dir, args);
    let _job = crate::util::machine_to_itself();
    let output = cmd.output().expect("mpirun runs");
    Run { cmdline: format!("mpirun -np {np} sh -c {script:?}"), output }
}

/// A four-rank job of `kiln ARGS…` whose rank 2 gets `signal` once it has run for `after`: the
/// job's output, and how long after the signal it ended (it fails past `limit`). Rank 2 is killed
/// at the end whatever happened, so that no rank is left behind.
fn signal_rank_2(
    kiln: &Path,
    dir: &Path,
    args: &str,
    after: Duration,
    signal: Signal,
    limit: Duration,
) -> (Output, f64) {
    use std::process::Stdio;
    let (mut cmd, _) = mpirun_command(kiln, 4, dir, args);
    let _job = crate::util::machine_to_itself();
    let mut job = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let victim = format!("{}/db2.sqlite", dir.display());
    let started = Instant::now();
    let pid = loop {
        if let Some(pid) = pid_with(&victim) {
            break Pid::from_raw(pid);
        }
        assert!(started.elapsed().as_secs() < 30, "rank 2 never started");
        std::thread::sleep(Duration::from_millis(50));
    };
    std::thread::sleep(after);
    nix::sys::signal::kill(pid, signal).unwrap();
    let signalled = Instant::now();
    let out = loop {
        if job.try_wait().unwrap().is_some() {
            break job.wait_with_output().unwrap();
        }
        if signalled.elapsed() > limit {
            let _ = nix::sys::signal::kill(pid, Signal::SIGKILL);
            let _ = job.kill();
            panic!("the job went on {limit:?} after rank 2 got {signal}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let waited = signalled.elapsed().as_secs_f64();
    if pid_with(&victim).is_some() {
        let _ = nix::sys::signal::kill(pid, Signal::SIGKILL);
    }
    (out, waited)
}

/// The JSON document rank 0 printed (the launcher adds its own lines to stderr only).
fn document(run: &Run) -> Value {
    serde_json::from_str(run.stdout().trim()).unwrap_or_else(|e| panic!("{e}\n{}", run.describe()))
}

/// Every rank's stored runs of `benchmark`: (rank, run id, config).
fn stored(dir: &Path, np: usize, benchmark: &str) -> Vec<(usize, Value)> {
    (0..np)
        .flat_map(|r| {
            let db = dir.join(format!("db{r}.sqlite"));
            let run = kiln(&["--db", db.to_str().unwrap(), "runs", "--json"], &[]);
            assert!(run.output.status.success(), "{}", run.describe());
            let doc: Value = serde_json::from_str(&run.stdout()).unwrap();
            doc["runs"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|x| x["benchmark"] == benchmark)
                .map(|x| (r, x.clone()))
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn without_a_launcher_cluster_says_what_it_needs_and_reads_its_launcher() {
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["cluster", "env", "--json"])
        .env("SLURM_PROCID", "3")
        .env("SLURM_NTASKS", "8")
        .env("SLURM_LOCALID", "1")
        .env("SLURM_NODEID", "1")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["launch"]["launcher"], "slurm");
    assert_eq!((doc["launch"]["rank"].as_u64(), doc["launch"]["world_size"].as_u64()), (Some(3), Some(8)));
    let run = kiln(&["cluster", "fabric", "--no-save"], &[]);
    assert_eq!(run.code(), Some(2), "{}", run.describe());
    if doc["mpi_built"] == false {
        // The README's build: what to install and build.
        let err = run.stderr();
        assert!(err.contains("--features mpi") && err.contains("libopenmpi-dev"), "{}", run.describe());
    } else {
        // Built with MPI, started alone: one rank is no cluster.
        assert!(run.stderr().contains("one rank"), "{}", run.describe());
    }
    let bad = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["cluster", "env"])
        .env("OMPI_COMM_WORLD_RANK", "two")
        .env("OMPI_COMM_WORLD_SIZE", "4")
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("OMPI_COMM_WORLD_RANK=\"two\""));
}

#[test]
fn collectives_over_mpi_are_correct_and_stored_by_every_rank() {
    let Some(kiln_mpi) = mpi_kiln("collectives_over_mpi_are_correct_and_stored_by_every_rank") else { return };
    let dir = tempfile::tempdir().unwrap();
    // Every rank also uploads its part to a fleet service, as a nightly job's ranks would.
    let site = crate::serve::Site::new();
    let agent = site.token("ranks", "agent");
    let server = crate::serve::Server::start(&site.server_db(), &[]);
    let args =
        format!("--server {} --token {agent} cluster collectives --max-bytes 256K --iterations 5 --json", server.url);
    let run = mpirun(&kiln_mpi, 4, dir.path(), &args);
    assert_eq!(run.code(), Some(0), "{}", run.describe());
    let doc = document(&run);
    let report = &doc["report"];
    assert_eq!(report["world_size"], 4);
    assert_eq!(report["checked"], true, "every result checked against what it must hold");
    let rows = report["rows"].as_array().unwrap();
    for op in ["all_reduce", "all_gather", "reduce_scatter", "all_to_all"] {
        let mine: Vec<&Value> = rows.iter().filter(|r| r["collective"] == op).collect();
        assert!(mine.len() >= 14, "{op}: 8 B (16 B where 4 ranks need a share each) to 256 KiB, doubling");
        assert_eq!(mine.last().unwrap()["bytes"], 256 << 10);
        for r in mine {
            let (alg, bus) = (r["algbw_gbs"].as_f64().unwrap(), r["busbw_gbs"].as_f64().unwrap());
            let factor = if op == "all_reduce" { 1.5 } else { 0.75 };
            assert!((bus - alg * factor).abs() <= 1e-9 * alg.max(1.0), "{op}: nccl-tests' bus factor: {r}");
            let bytes = r["bytes"].as_f64().unwrap();
            let time = r["time_us"].as_f64().unwrap() * 1e-6;
            assert!((alg - bytes / time / 1e9).abs() <= 1e-6 * alg.max(1e-9), "{r}");
        }
    }
    let runs = stored(dir.path(), 4, "collectives");
    assert_eq!(runs.len(), 4, "every rank stores its part");
    let run_id = doc["run_id"].as_str().unwrap();
    assert!(runs.iter().any(|(r, x)| *r == 0 && x["id"] == run_id), "{runs:?}");
    let id = &report["cluster_id"];
    assert!(runs.iter().all(|(_, x)| &x["config"]["cluster_id"] == id), "one cluster run: {runs:?}");
    // The fleet service holds the four parts as one cluster run, and draws it.
    let there = site.admin(&["runs", "--json"]).success().json();
    let parts: Vec<&Value> =
        there["runs"].as_array().unwrap().iter().filter(|x| x["benchmark"] == "collectives").collect();
    assert_eq!(parts.len(), 4, "every rank's part uploaded: {there}");
    assert!(parts.iter().all(|x| &x["config"]["cluster_id"] == id), "{parts:?}");
    let reader = site.token("ops", "reader");
    let page = dir.path().join("cluster.md");
    let id = id.as_str().unwrap();
    kiln(
        &["--server", &server.url, "--token", &reader, "report", "--cluster", id, "--markdown", page.to_str().unwrap()],
        &[],
    )
    .success();
    let text = std::fs::read_to_string(&page).unwrap();
    assert!(text.contains(&format!("Cluster run {}", &id[..8])) && text.contains("4 ranks over MPI"), "{text}");
}

/// Four namespaces `kc<id>-0..3`, each with a veth into the bridge namespace `kc<id>-br`, removed
/// on drop (the veths go with their namespaces).
struct Fabric {
    name: String,
}

impl Fabric {
    fn ip(args: &[&str]) {
        let out = Command::new("ip").args(args).output().expect("ip runs");
        assert!(out.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
    }

    fn new(nodes: usize) -> Fabric {
        let f = Fabric { name: format!("kc{}", std::process::id()) };
        let br = format!("{}-br", f.name);
        Fabric::ip(&["netns", "add", &br]);
        Fabric::ip(&["-n", &br, "link", "add", "kb0", "type", "bridge"]);
        Fabric::ip(&["-n", &br, "link", "set", "kb0", "up"]);
        for r in 0..nodes {
            let ns = format!("{}-{r}", f.name);
            let port = format!("p{r}");
            Fabric::ip(&["netns", "add", &ns]);
            Fabric::ip(&["-n", &ns, "link", "set", "lo", "up"]);
            Fabric::ip(&["-n", &ns, "link", "add", "veth0", "type", "veth", "peer", "name", &port, "netns", &br]);
            Fabric::ip(&["-n", &ns, "addr", "add", &format!("10.211.0.{}/24", r + 1), "dev", "veth0"]);
            Fabric::ip(&["-n", &ns, "link", "set", "veth0", "up"]);
            Fabric::ip(&["-n", &br, "link", "set", &port, "master", "kb0"]);
            Fabric::ip(&["-n", &br, "link", "set", &port, "up"]);
        }
        f
    }

    /// Caps what `node` sends at `rate` (a token bucket on its veth: `tbf`, as this kernel has no
    /// netem), replacing the cap it had.
    fn cap_sender(&self, node: usize, rate: &str) {
        let ns = format!("{}-{node}", self.name);
        let out = Command::new("ip")
            .args(["netns", "exec", &ns, "tc", "qdisc", "replace", "dev", "veth0", "root", "tbf", "rate", rate])
            .args(["burst", "512kb", "latency", "20ms"])
            .output()
            .unwrap();
        assert!(out.status.success(), "tc: {}", String::from_utf8_lossy(&out.stderr));
    }
}

impl Drop for Fabric {
    fn drop(&mut self) {
        let list = Command::new("ip").args(["netns", "list"]).output().map(|o| o.stdout).unwrap_or_default();
        for line in String::from_utf8_lossy(&list).lines() {
            let name = line.split_whitespace().next().unwrap_or("");
            if name.starts_with(&format!("{}-", self.name)) {
                let _ = Command::new("ip").args(["netns", "del", name]).status();
            }
        }
    }
}

#[test]
fn the_fabric_test_names_the_slow_node_and_nothing_on_a_symmetric_cluster() {
    let test = "the_fabric_test_names_the_slow_node_and_nothing_on_a_symmetric_cluster";
    let mut missing = mpi_missing();
    missing.extend(root("network namespaces"));
    missing.extend(program("ip", "iproute2"));
    missing.extend(program("tc", "iproute2"));
    if !needs(test, &missing) {
        return;
    }
    let kiln_mpi = mpi_kiln(test).expect("checked above");
    let fabric = Fabric::new(4);
    // Links, not this host's two CPUs, set the pace, as on a real fabric: every node sends at
    // 2 Gb/s at most (the four ranks share the CPUs; uncapped, a pair's rate is the scheduler's).
    for node in 0..4 {
        fabric.cap_sender(node, "2gbit");
    }
    let args = format!(
        "cluster fabric --netns /run/netns/{}-{{rank}} --seconds 0.25 --repetitions 2 --streams 2 --json",
        fabric.name
    );

    let dir = tempfile::tempdir().unwrap();
    let run = mpirun(&kiln_mpi, 4, dir.path(), &args);
    let doc = document(&run);
    let rail = &doc["report"]["rails"][0];
    assert_eq!(rail["interface"], "veth0");
    assert_eq!(rail["links"].as_array().unwrap().len(), 12, "both ways between every pair");
    assert_eq!(doc["report"]["rounds"], 3, "N−1 rounds for N nodes");
    // The links set the bandwidth; the small-message latency of four ranks on two CPUs, beside
    // the other tests, is the scheduler's (a 64 µs round trip against a median of 8 was seen in
    // CI). So here a latency finding may come and fail the run; a bandwidth one may not.
    let findings = bandwidth_findings(rail);
    assert!(findings.is_empty(), "a symmetric cluster names nothing: {findings:?}\n{}", run.describe());
    let latency_only = rail["verdict"]["findings"].as_array().unwrap().iter().all(|f| f["quantity"] == "latency");
    assert!(run.code() == Some(0) || (run.code() == Some(1) && latency_only), "{}", run.describe());

    fabric.cap_sender(2, "300mbit");
    let dir = tempfile::tempdir().unwrap();
    let run = mpirun(&kiln_mpi, 4, dir.path(), &args);
    assert_eq!(run.code(), Some(1), "a slow node fails the fabric\n{}", run.describe());
    let doc = document(&run);
    let findings = bandwidth_findings(&doc["report"]["rails"][0]);
    assert_eq!(findings.len(), 1, "that node, and no other: {findings:?}\n{}", run.describe());
    let f = &findings[0];
    assert_eq!((&f["subject"]["kind"], &f["subject"]["node"]), (&Value::from("node"), &Value::from(2)), "{f}");
    assert_eq!((&f["direction"], &f["quantity"]), (&Value::from("send"), &Value::from("bandwidth")), "{f}");
    assert!(f["measured"].as_f64().unwrap() < 0.35, "300 Mb/s is what it can send: {f}");
    assert!(run.stdout().contains(&format!("{}-2", fabric.name)), "named by its namespace");

    // Every rank stored its part under the one cluster run.
    let runs = stored(dir.path(), 4, "fabric");
    assert_eq!(runs.len(), 4, "{runs:?}");
    let id = doc["report"]["cluster_id"].as_str().unwrap();
    for (rank, r) in &runs {
        assert_eq!(r["config"]["cluster_id"], id, "rank {rank}'s run names the cluster run");
        assert_eq!(r["config"]["rank"].as_u64(), Some(*rank as u64));
    }

    // The ranks' exports in one database (as the fleet service would hold them): the report draws
    // the matrix from every rank's stored row and names the same node again.
    let all = dir.path().join("all.sqlite");
    for rank in 0..4 {
        let export = dir.path().join(format!("rank{rank}.jsonl"));
        let db = dir.path().join(format!("db{rank}.sqlite"));
        let run = kiln(&["--db", db.to_str().unwrap(), "export", "-o", export.to_str().unwrap()], &[]);
        assert!(run.output.status.success(), "{}", run.describe());
        let run = kiln(&["--db", all.to_str().unwrap(), "import", export.to_str().unwrap()], &[]);
        assert!(run.output.status.success(), "{}", run.describe());
    }
    let (html, md) = (dir.path().join("c.html"), dir.path().join("c.md"));
    let run = kiln(
        &[
            "--db",
            all.to_str().unwrap(),
            "report",
            "--cluster",
            &id[..8],
            "--html",
            html.to_str().unwrap(),
            "--markdown",
            md.to_str().unwrap(),
        ],
        &[],
    );
    assert!(run.output.status.success(), "{}", run.describe());
    let md = std::fs::read_to_string(md).unwrap();
    // Bandwidth findings only: on two shared CPUs, four ranks' round trips are the scheduler's
    // (a node's latency finding comes and goes), while the bandwidth the links allow is exact.
    let slow: Vec<&str> = md.lines().filter(|l| l.starts_with("SLOW") && !l.contains("round trips")).collect();
    assert_eq!(slow.len(), 1, "{md}");
    assert!(
        slow[0].contains(&format!("node vm/{}-2", fabric.name)) || slow[0].contains(&format!("{}-2", fabric.name)),
        "{md}"
    );
    assert!(slow[0].contains("when it sends"), "{md}");
    let html = std::fs::read_to_string(html).unwrap();
    assert_eq!(html.matches("<rect ").count(), 16, "a 4 × 4 heat map");
    assert_eq!(html.matches("not measured").count(), 4, "the diagonal");
}

#[test]
fn data_parallel_training_scales_from_one_rank_to_the_world_and_learns() {
    let Some(kiln_mpi) = mpi_kiln("data_parallel_training_scales_from_one_rank_to_the_world_and_learns") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let run = mpirun(&kiln_mpi, 2, dir.path(), "cluster train --steps 15 --json");
    assert_eq!(run.code(), Some(0), "{}", run.describe());
    let doc = document(&run);
    let rows = doc["report"]["rows"].as_array().unwrap();
    assert_eq!(rows.iter().map(|r| r["ranks"].as_u64().unwrap()).collect::<Vec<_>>(), [1, 2]);
    assert_eq!(rows[0]["efficiency"], 1.0);
    assert_eq!(rows[0]["comm_share"], 0.0, "one rank all-reduces nothing");
    let share = rows[1]["comm_share"].as_f64().unwrap();
    assert!(share > 0.0 && share < 1.0, "{}", rows[1]);
    assert!(rows.iter().all(|r| r["learned"] == true), "{rows:?}");
    let per_rank = rows[1]["tokens_per_s_per_rank"].as_f64().unwrap();
    assert!((rows[1]["tokens_per_s_total"].as_f64().unwrap() - 2.0 * per_rank).abs() < 1e-6 * per_rank);
    let parallel = &doc["report"]["run"]["parallel"];
    assert_eq!(parallel["ranks"], 2);
    assert_eq!(parallel["gradient_values"], doc["report"]["run"]["parameters"]);
    let runs = stored(dir.path(), 2, "scaling");
    assert_eq!(runs.len(), 2, "every rank stores its part: {runs:?}");
}

/// The pid of the process whose command line holds `needle`.
fn pid_with(needle: &str) -> Option<i32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
        let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        (text.contains(needle) && !text.starts_with("sh ")).then_some(pid)
    })
}

#[test]
fn a_rank_killed_mid_run_stops_the_job_naming_it_and_what_finished_stays_stored() {
    let Some(kiln_mpi) = mpi_kiln("a_rank_killed_mid_run_stops_the_job_naming_it_and_what_finished_stays_stored")
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let first = mpirun(&kiln_mpi, 4, dir.path(), "cluster collectives --max-bytes 1K --json");
    assert_eq!(first.code(), Some(0), "{}", first.describe());
    // A fabric test of minutes (loopback), rank 2 killed once it is under way.
    let args = "cluster fabric --seconds 1 --repetitions 60";
    let (out, _) =
        signal_rank_2(&kiln_mpi, dir.path(), args, Duration::from_secs(2), Signal::SIGKILL, Duration::from_secs(30));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("rank 2") && err.contains("signal 9"), "the launcher names the dead rank:\n{err}");
    assert!(pid_with(&dir.path().display().to_string()).is_none(), "no rank is left behind");
    // What finished before is intact in every rank's database, and nothing half-done was stored.
    assert_eq!(stored(dir.path(), 4, "collectives").len(), 4);
    assert!(stored(dir.path(), 4, "fabric").is_empty());
}

#[test]
fn a_rank_that_hangs_stops_the_job_within_the_stall_timeout_saying_where_it_waited() {
    let Some(kiln_mpi) = mpi_kiln("a_rank_that_hangs_stops_the_job_within_the_stall_timeout_saying_where_it_waited")
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // A hung rank is alive to the launcher, so only the ranks' own watchdogs can end the job. Each
    // phase is 4 × 0.25 s; with --stall-timeout 3 a rank gives up 4 s after it last moved.
    let args = "cluster fabric --seconds 0.25 --repetitions 4 --stall-timeout 3";
    let (out, waited) = signal_rank_2(
        &kiln_mpi,
        dir.path(),
        args,
        Duration::from_millis(1500),
        Signal::SIGSTOP,
        Duration::from_secs(60),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    // Rank 0 hears who reached each round's end; the hung rank's partner waits on it: either way
    // another rank names it.
    let named = err.lines().any(|l| {
        l.contains("nothing moved for")
            && !l.starts_with("kiln: rank 2:")
            && l.contains("round ")
            && l.contains("rank 2 (")
    });
    assert!(named, "another rank says it waited for rank 2:\n{err}");
    assert!(waited < 30.0, "the job ended {waited:.1} s after the hang, a 4 s limit:\n{err}");
    assert!(stored(dir.path(), 4, "fabric").is_empty(), "nothing of the stopped command is stored");
}

/// A stand-in for kiln-gpu on every rank: `nccl-id` prints an id made from its pid (and counts its
/// calls); `collectives` writes down the id and device it was given and prints `collectives-R.json`.
fn nccl_stand_in(dir: &Path, parts: &[kiln_gpu::collectives::Report]) -> PathBuf {
    for (rank, part) in parts.iter().enumerate() {
        let mut doc = serde_json::to_value(part).unwrap();
        doc["schema_version"] = 1.into();
        std::fs::write(dir.join(format!("collectives-{rank}.json")), doc.to_string()).unwrap();
    }
    let script = dir.join("kiln-gpu");
    std::fs::write(
        &script,
        "#!/bin/sh\n\
         dir=$(dirname \"$0\")\n\
         if [ \"$1\" = nccl-id ]; then echo call >> \"$dir/nccl-id-calls\"; \
            printf '{\"schema_version\":1,\"nccl_id\":\"%0256x\"}\\n' $$; exit 0; fi\n\
         shift\n\
         while [ $# -gt 1 ]; do\n\
           case \"$1\" in --nccl-id) id=$2;; --rank) rank=$2;; --device) dev=$2;; --nccl-root) root=$2;; esac\n\
           shift 2\n\
         done\n\
         echo \"$id $dev $root\" > \"$dir/seen-$rank\"\n\
         cat \"$dir/collectives-$rank.json\"\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    script
}

/// Rank `rank`'s part of an all-reduce over four GPUs at three sizes, at `busbw` GB/s.
fn nccl_part(rank: usize, busbw: f64, correct: bool) -> kiln_gpu::collectives::Report {
    use kiln_bench::cluster::{bandwidths, Collective};
    let rows = [1u64 << 10, 1 << 20, 1 << 26]
        .into_iter()
        .map(|bytes| {
            let seconds = bytes as f64 * 1.5 / (busbw * 1e9);
            let (algbw_gbs, busbw_gbs) = bandwidths(Collective::AllReduce, 4, bytes, seconds);
            kiln_gpu::collectives::Row {
                collective: Collective::AllReduce,
                bytes,
                count: bytes / 4,
                iterations: 20,
                time_us: seconds * 1e6,
                algbw_gbs,
                busbw_gbs,
                correct,
            }
        })
        .collect();
    kiln_gpu::collectives::Report {
        devices: vec![rank],
        rank: Some(rank),
        ranks: 4,
        names: vec!["NVIDIA H100 80GB HBM3".into()],
        nccl_version: Some(23007),
        rows,
    }
}

#[test]
fn nccl_collectives_hand_rank_0s_id_to_every_rank_and_keep_the_slowest_ranks_time() {
    let Some(kiln_mpi) = mpi_kiln("nccl_collectives_hand_rank_0s_id_to_every_rank_and_keep_the_slowest_ranks_time")
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let stand = tempfile::tempdir().unwrap();
    // Rank 2 is the slow one: 100 GB/s where the others reach 200.
    let parts: Vec<_> = (0..4).map(|r| nccl_part(r, if r == 2 { 100.0 } else { 200.0 }, true)).collect();
    let program = nccl_stand_in(stand.path(), &parts);
    let args = "cluster collectives --nccl --ops all-reduce --min-bytes 1K --max-bytes 64M --json";
    let (mut cmd, script) = mpirun_command(&kiln_mpi, 4, dir.path(), args);
    cmd.env("KILN_GPU", &program).env_remove("CUDA_VISIBLE_DEVICES");
    let _job = crate::util::machine_to_itself();
    let run = Run { cmdline: format!("mpirun -np 4 sh -c {script:?}"), output: cmd.output().unwrap() };
    assert_eq!(run.code(), Some(0), "{}", run.describe());
    // One id, made once by rank 0, reached every rank; each rank took its local rank's GPU.
    assert_eq!(std::fs::read_to_string(stand.path().join("nccl-id-calls")).unwrap().lines().count(), 1);
    let seen: Vec<String> =
        (0..4).map(|r| std::fs::read_to_string(stand.path().join(format!("seen-{r}"))).unwrap()).collect();
    let id = seen[0].split_whitespace().next().unwrap();
    assert_eq!(id.len(), 256, "{seen:?}");
    // With the id, where rank 0's own process hosts NCCL's bootstrap: the process that made the
    // id has exited by the time the ranks join.
    let root = seen[0].split_whitespace().nth(2).unwrap_or_else(|| panic!("{seen:?}"));
    assert!(root.rsplit_once(':').is_some_and(|(_, p)| p.parse::<u16>().is_ok_and(|p| p > 0)), "{root}");
    for (r, s) in seen.iter().enumerate() {
        assert_eq!(s.split_whitespace().collect::<Vec<_>>(), [id, &r.to_string(), root], "rank {r}");
    }
    let doc = document(&run);
    let report = &doc["report"];
    assert_eq!(report["library"], "NCCL 2.30.7");
    assert_eq!(report["checked"], true);
    // Every size's time is rank 2's, the slowest: 100 GB/s of bus bandwidth.
    let rows = report["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 3, "{report}");
    for r in rows {
        assert!((r["busbw_gbs"].as_f64().unwrap() - 100.0).abs() < 1e-6, "{r}");
    }
    let runs = stored(dir.path(), 4, "collectives");
    assert_eq!(runs.len(), 4, "every rank stores its part");
    let shown = kiln(
        &[
            "--db",
            dir.path().join("db3.sqlite").to_str().unwrap(),
            "show",
            "run",
            runs[3].1["id"].as_str().unwrap(),
            "--json",
        ],
        &[],
    )
    .success()
    .json();
    let names: Vec<&str> = shown["metrics"].as_array().unwrap().iter().map(|m| m["name"].as_str().unwrap()).collect();
    assert!(names.contains(&"coll.nccl.all_reduce.busbw_gbs_max"), "NCCL's figures apart from MPI's: {names:?}");

    // Rank 1's GPU computes wrong: every rank's part says so, the job exits 1.
    let mut parts = parts;
    parts[1] = nccl_part(1, 200.0, false);
    nccl_stand_in(stand.path(), &parts);
    let (mut cmd, script) = mpirun_command(&kiln_mpi, 4, dir.path(), &format!("{args} --no-save"));
    cmd.env("KILN_GPU", &program).env_remove("CUDA_VISIBLE_DEVICES");
    let run = Run { cmdline: format!("mpirun -np 4 sh -c {script:?}"), output: cmd.output().unwrap() };
    assert_eq!(run.code(), Some(1), "{}", run.describe());
    assert_eq!(document(&run)["report"]["checked"], false);
    // All-to-all is no NCCL call: refused before any rank starts.
    let refused =
        Command::new(&kiln_mpi).args(["cluster", "collectives", "--nccl", "--ops", "all-to-all"]).output().unwrap();
    assert_eq!(refused.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("NCCL has no all-to-all call"));
}

/// A stand-in for kiln-gpu's `train` on every rank: `nccl-id` prints an id made from its pid
/// (counting its calls); `train` writes its arguments down and prints `train-RANK-RANKS.json`
/// (`--rank`/`--ranks` absent: 0 of 1), exiting with the status in `train-RANK-RANKS.status`.
fn train_stand_in(dir: &Path) -> PathBuf {
    let script = dir.join("kiln-gpu");
    std::fs::write(
        &script,
        "#!/bin/sh\n\
         dir=$(dirname \"$0\")\n\
         if [ \"$1\" = nccl-id ]; then echo call >> \"$dir/nccl-id-calls\"; \
            printf '{\"schema_version\":1,\"nccl_id\":\"%0256x\"}\\n' $$; exit 0; fi\n\
         echo \"$*\" >> \"$dir/train-calls\"\n\
         sleep ${STAND_IN_SLEEP:-0}\n\
         shift\n\
         rank=0; ranks=1\n\
         while [ $# -gt 1 ]; do\n\
           case \"$1\" in --rank) rank=$2;; --ranks) ranks=$2;; esac\n\
           shift 2\n\
         done\n\
         cat \"$dir/train-$rank-$ranks.json\"\n\
         exit $(cat \"$dir/train-$rank-$ranks.status\" 2>/dev/null || echo 0)\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    script
}

/// Rank `rank` of `ranks`: `trained` at `tokens_per_s`, with the all-reduce's share where it had
/// peers.
fn train_part(trained: &kiln_gpu::train::Report, rank: usize, ranks: usize, tokens_per_s: f64) -> Value {
    let mut doc = trained.clone();
    doc.device = rank;
    doc.run.tokens_per_s = tokens_per_s;
    doc.run.mfu = Some(tokens_per_s * doc.run.flops_per_token / 989e12);
    doc.run.parallel = (ranks > 1).then(|| kiln_bench::train::ParallelStats {
        rank,
        ranks,
        gradient_values: doc.run.parameters,
        comm_s: kiln_bench::stats::summarize(&[0.002, 0.002]).unwrap(),
        comm_share: 0.05 * ranks as f64 + 0.01 * rank as f64,
    });
    let mut doc = serde_json::to_value(doc).unwrap();
    doc["schema_version"] = 1.into();
    doc
}

#[test]
// Long: one job's whole story — the ids, the curve, the stored metrics, then a rank that fails and one that does not learn.
fn nccl_training_gives_each_group_a_fresh_id_and_scales_from_one_gpu_to_the_world() {
    let Some(kiln_mpi) = mpi_kiln("nccl_training_gives_each_group_a_fresh_id_and_scales_from_one_gpu_to_the_world")
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let stand = tempfile::tempdir().unwrap();
    let program = train_stand_in(stand.path());
    // One real run of the tiny model through kiln-gpu's own training path (on the CPU), each
    // rank's document that run at its own speed: 1000 tokens/s alone, less with peers.
    let options = kiln_gpu::train::Options {
        device: 0,
        size: "tiny".into(),
        steps: Some(20),
        batch: None,
        precision: kiln_gpu::gemm::Precision::Bf16,
        as_rank: None,
    };
    let trained = kiln_gpu::train::measure(
        &candle_core::Device::Cpu,
        &options,
        Some("NVIDIA H100 80GB HBM3".into()),
        |_, _, _| {},
        None,
    )
    .unwrap();
    assert!(trained.run.learned);
    let speed =
        |rank: usize, ranks: usize| 1000.0 - if ranks > 1 { 40.0 * ranks as f64 + 10.0 * rank as f64 } else { 0.0 };
    let write = |rank: usize, ranks: usize, doc: &Value, status: u8| {
        std::fs::write(stand.path().join(format!("train-{rank}-{ranks}.json")), doc.to_string()).unwrap();
        std::fs::write(stand.path().join(format!("train-{rank}-{ranks}.status")), status.to_string()).unwrap();
    };
    for ranks in [1, 2, 4] {
        for rank in 0..ranks {
            write(rank, ranks, &train_part(&trained, rank, ranks, speed(rank, ranks)), 0);
        }
    }
    let args = "cluster train --nccl --size tiny --steps 20 --json";
    let run_job = |extra: &str| {
        let (mut cmd, script) = mpirun_command(&kiln_mpi, 4, dir.path(), &format!("{args}{extra}"));
        cmd.env("KILN_GPU", &program).env_remove("CUDA_VISIBLE_DEVICES");
        let _job = crate::util::machine_to_itself();
        Run { cmdline: format!("mpirun -np 4 sh -c {script:?}"), output: cmd.output().unwrap() }
    };
    let run = run_job("");
    assert_eq!(run.code(), Some(0), "{}", run.describe());

    // Alone, rank 0 trains without NCCL; each group of 2 and 4 gets an id of its own, made once
    // by rank 0, and each rank of it trains on its local rank's GPU as rank r of the group.
    assert_eq!(std::fs::read_to_string(stand.path().join("nccl-id-calls")).unwrap().lines().count(), 2);
    let log = std::fs::read_to_string(stand.path().join("train-calls")).unwrap();
    let calls: Vec<&str> = log.lines().collect();
    assert_eq!(calls.len(), 1 + 2 + 4, "{log}");
    let alone: Vec<&&str> = calls.iter().filter(|c| !c.contains("--nccl-id")).collect();
    assert_eq!(alone.len(), 1, "{log}");
    assert!(alone[0].contains("--device 0 --size tiny --dtype bf16 --steps 20"), "{log}");
    let id_of = |call: &str| call.split("--nccl-id ").nth(1).unwrap().split(' ').next().unwrap().to_string();
    let mut ids = std::collections::BTreeSet::new();
    for ranks in [2usize, 4] {
        let group: Vec<&&str> = calls.iter().filter(|c| c.contains(&format!("--ranks {ranks} "))).collect();
        assert_eq!(group.len(), ranks, "{log}");
        let id = id_of(group[0]);
        // Every rank of the group is told where rank 0 hosts NCCL's bootstrap, the same place.
        let root_of = |call: &str| call.split("--nccl-root ").nth(1).map(str::to_string);
        let root = root_of(group[0]).unwrap_or_else(|| panic!("no --nccl-root: {log}"));
        assert!(group.iter().all(|c| root_of(c).as_ref() == Some(&root)), "{log}");
        assert_eq!(id.len(), 256);
        for rank in 0..ranks {
            let mine = format!("--device {rank} ");
            let call = group.iter().find(|c| c.contains(&mine)).unwrap_or_else(|| panic!("rank {rank}: {log}"));
            assert!(call.contains(&format!("--nccl-id {id} --rank {rank} --ranks {ranks}")), "{call}");
        }
        ids.insert(id);
    }
    assert_eq!(ids.len(), 2, "a fresh id per group");

    let doc = document(&run);
    let report = &doc["report"];
    assert_eq!(report["library"], "NCCL");
    assert_eq!(report["gpu"], "NVIDIA H100 80GB HBM3");
    let rows = report["rows"].as_array().unwrap();
    assert_eq!(rows.iter().map(|r| r["ranks"].as_u64().unwrap()).collect::<Vec<_>>(), [1, 2, 4]);
    for r in rows {
        let k = r["ranks"].as_u64().unwrap() as usize;
        let per_rank = (0..k).map(|rank| speed(rank, k)).sum::<f64>() / k as f64;
        let near = |field: &str, want: f64| {
            let got = r[field].as_f64().unwrap();
            assert!((got - want).abs() <= 1e-9 * want.abs().max(1.0), "{field} at {k}: {got} against {want}");
        };
        near("tokens_per_s_per_rank", per_rank);
        near("efficiency", per_rank / 1000.0);
        // The largest rank's share: the slowest to leave the all-reduce.
        near("comm_share", if k > 1 { 0.05 * k as f64 + 0.01 * (k - 1) as f64 } else { 0.0 });
        near("mfu", per_rank * trained.run.flops_per_token / 989e12);
        assert_eq!(r["learned"], true);
    }
    let runs = stored(dir.path(), 4, "scaling");
    assert_eq!(runs.len(), 4, "every rank stores its part");
    let shown = kiln(
        &[
            "--db",
            dir.path().join("db0.sqlite").to_str().unwrap(),
            "show",
            "run",
            runs[0].1["id"].as_str().unwrap(),
            "--json",
        ],
        &[],
    )
    .success()
    .json();
    let names: Vec<&str> = shown["metrics"].as_array().unwrap().iter().map(|m| m["name"].as_str().unwrap()).collect();
    for name in
        ["cluster.train.nccl.tokens_per_s_per_rank", "cluster.train.nccl.scaling_efficiency", "cluster.train.nccl.mfu"]
    {
        assert!(names.contains(&name), "the GPUs' figures apart from the CPUs': {name} in {names:?}");
    }

    // Rank 3's GPU fails at the full world: the curve stops there, saying which rank and why, and
    // the points before it are stored as a failed run by every rank (exit 1).
    write(3, 4, &serde_json::json!({"schema_version": 1, "error": "CUDA_ERROR_OUT_OF_MEMORY"}), 2);
    let failed = run_job("");
    assert_eq!(failed.code(), Some(1), "{}", failed.describe());
    let report = document(&failed)["report"].clone();
    assert_eq!(report["rows"].as_array().unwrap().len(), 2, "1 and 2 ranks stand: {report}");
    let stopped = report["stopped"].as_str().unwrap_or_default();
    assert!(stopped.contains("rank 3 could not train on 4 ranks (rank 3: "), "{report}");
    assert!(stopped.contains("CUDA_ERROR_OUT_OF_MEMORY"), "{report}");
    let runs = stored(dir.path(), 4, "scaling");
    assert_eq!(runs.len(), 8, "every rank stored the stopped curve too: {runs:?}");
    assert_eq!(runs.iter().filter(|(_, r)| r["status"] == "failed").count(), 4, "{runs:?}");
    // The single rank's own failure leaves no point: nothing is stored, the job stops (exit 2).
    write(0, 1, &serde_json::json!({"schema_version": 1, "error": "CUDA_ERROR_NO_DEVICE"}), 2);
    let none = run_job(" --no-save");
    assert_eq!(none.code(), Some(2), "{}", none.describe());
    assert!(none.stderr().contains("CUDA_ERROR_NO_DEVICE"), "{}", none.describe());
    write(0, 1, &train_part(&trained, 0, 1, speed(0, 1)), 0);
    // Rank 1's model does not learn with four: the run fails its check, exit 1.
    write(3, 4, &train_part(&trained, 3, 4, speed(3, 4)), 0);
    let mut lazy = train_part(&trained, 1, 4, speed(1, 4));
    lazy["run"]["learned"] = false.into();
    write(1, 4, &lazy, 0);
    let unlearned = run_job(" --no-save");
    assert_eq!(unlearned.code(), Some(1), "{}", unlearned.describe());
    assert_eq!(document(&unlearned)["report"]["rows"][2]["learned"], false);
    // --dtype belongs to --nccl, and f16 is refused before any rank starts.
    for (extra, says) in [("--dtype bf16", "--nccl"), ("--nccl --dtype f16", "f16 would need loss scaling")] {
        let mut all = vec!["cluster", "train"];
        all.extend(extra.split(' '));
        let refused = Command::new(&kiln_mpi).args(&all).output().unwrap();
        assert_eq!(refused.status.code(), Some(2), "{extra}");
        assert!(
            String::from_utf8_lossy(&refused.stderr).contains(says),
            "{extra}: {}",
            String::from_utf8_lossy(&refused.stderr)
        );
    }
}

/// `n` ranks of `kiln --db DIR/dbRANK.sqlite ARGS…` as torchrun starts them (RANK, WORLD_SIZE,
/// LOCAL_RANK, GROUP_RANK, MASTER_ADDR 127.0.0.1, MASTER_PORT; `env` besides, `{port}` and
/// `{rank}` in its values replaced), the default build (no MPI), each
/// run to its end or killed after `limit`; `absent` ranks are never started. Their outputs, by
/// rank (absent ones `None`), and how long the slowest took.
/// A loopback port for a job's rendezvous, free now and below the kernel's ephemeral range, so
/// that no connection another test makes meanwhile takes it (`bind(0)` draws from that range, and
/// a client's port from it once held the port one above a torchrun agent's); with `pair`, the
/// port above it is free too (kiln listens there under torchrun's agent store).
fn quiet_port(pair: bool) -> u16 {
    let first_ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|t| t.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32768)
        .clamp(12_000, 65_000);
    let span = first_ephemeral - 10_001;
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
    let seed = nanos ^ (std::process::id() << 8);
    let free = |p: u32| std::net::TcpListener::bind(("127.0.0.1", p as u16)).is_ok();
    (0..10_000u32)
        .map(|i| 10_000 + (seed.wrapping_add(i.wrapping_mul(7919))) % span)
        .find(|&p| free(p) && (!pair || free(p + 1)))
        .expect("a free loopback port below the ephemeral range") as u16
}

fn torchrun(
    n: usize,
    dir: &Path,
    args: &str,
    env: &[(&str, &str)],
    absent: &[usize],
    limit: Duration,
) -> (Vec<Option<Run>>, f64) {
    use std::process::Stdio;
    let port = quiet_port(true);
    let _job = crate::util::machine_to_itself();
    let started = Instant::now();
    let children: Vec<Option<(String, std::process::Child)>> = (0..n)
        .map(|rank| {
            if absent.contains(&rank) {
                return None;
            }
            let db = dir.join(format!("db{rank}.sqlite"));
            let mut cmd = Command::new(env!("CARGO_BIN_EXE_kiln"));
            cmd.arg("--db").arg(&db).args(args.split_whitespace());
            for var in ["KILN_DB", "KILN_LOG", "KILN_SERVER", "KILN_TOKEN", "KILN_CA_CERT", "CUDA_VISIBLE_DEVICES"] {
                cmd.env_remove(var);
            }
            for var in ["OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS"] {
                cmd.env_remove(var);
            }
            cmd.env("KILN_AGENT_CONFIG", "/nonexistent/kiln-agent.toml")
                .env("KILN_MAX_CONTENTION", "100")
                .env("RANK", rank.to_string())
                .env("LOCAL_RANK", rank.to_string())
                .env("GROUP_RANK", "0")
                .env("WORLD_SIZE", n.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", port.to_string())
                .envs(env.iter().map(|(k, v)| {
                    (k.to_string(), v.replace("{port}", &port.to_string()).replace("{rank}", &rank.to_string()))
                }))
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            let line = format!("RANK={rank} WORLD_SIZE={n} MASTER_PORT={port} kiln --db {} {args}", db.display());
            Some((line, cmd.spawn().unwrap()))
        })
        .collect();
    let runs = children
        .into_iter()
        .map(|child| {
            let (cmdline, mut child) = child?;
            while child.try_wait().unwrap().is_none() && started.elapsed() < limit {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            Some(Run { cmdline, output: child.wait_with_output().unwrap() })
        })
        .collect();
    (runs, started.elapsed().as_secs_f64())
}

#[test]
// Long: the two NCCL commands under torchrun, then torchrun's own store on the port, a rank that never comes, a CPU command.
fn under_torchrun_the_nccl_commands_meet_through_kilns_rendezvous_without_mpi() {
    let dir = tempfile::tempdir().unwrap();
    let stand = tempfile::tempdir().unwrap();
    // The collectives: rank 2 the slow one; every size's time is its.
    let parts: Vec<_> = (0..4).map(|r| nccl_part(r, if r == 2 { 100.0 } else { 200.0 }, true)).collect();
    let program = nccl_stand_in(stand.path(), &parts);
    let gpu = program.to_str().unwrap();
    let limit = Duration::from_secs(60);
    let args = "cluster collectives --nccl --ops all-reduce --min-bytes 1K --max-bytes 64M --json";
    let (runs, _) = torchrun(4, dir.path(), args, &[("KILN_GPU", gpu)], &[], limit);
    let runs: Vec<Run> = runs.into_iter().flatten().collect();
    for (r, run) in runs.iter().enumerate() {
        assert_eq!(run.code(), Some(0), "rank {r}: {}", run.describe());
    }
    assert!(runs[1..].iter().all(|r| r.stdout().is_empty()), "rank 0 alone prints the job's result");
    assert_eq!(std::fs::read_to_string(stand.path().join("nccl-id-calls")).unwrap().lines().count(), 1);
    let seen: Vec<String> =
        (0..4).map(|r| std::fs::read_to_string(stand.path().join(format!("seen-{r}"))).unwrap()).collect();
    let id = seen[0].split_whitespace().next().unwrap();
    let root = seen[0].split_whitespace().nth(2).unwrap_or_else(|| panic!("no NCCL root: {seen:?}"));
    for (r, s) in seen.iter().enumerate() {
        let want = [id, &r.to_string(), root];
        assert_eq!(s.split_whitespace().collect::<Vec<_>>(), want, "rank {r}: one id and root, its GPU");
    }
    let report = &document(&runs[0])["report"];
    assert_eq!(report["launcher"]["launcher"], "torchrun", "{report}");
    assert_eq!(report["checked"], true);
    for r in report["rows"].as_array().unwrap() {
        assert!((r["busbw_gbs"].as_f64().unwrap() - 100.0).abs() < 1e-6, "the slowest rank's time: {r}");
    }
    assert_eq!(stored(dir.path(), 4, "collectives").len(), 4, "every rank stores its part");

    // Under Slurm (its variables win over torchrun's) with a kiln built without MPI, the same
    // through KILN_RENDEZVOUS.
    let slurm = [
        ("KILN_GPU", gpu),
        ("SLURM_PROCID", "{rank}"),
        ("SLURM_LOCALID", "{rank}"),
        ("SLURM_NTASKS", "4"),
        ("KILN_RENDEZVOUS", "127.0.0.1:{port}"),
        ("MASTER_PORT", "1"),
    ];
    let (runs, _) = torchrun(4, dir.path(), &format!("{args} --no-save"), &slurm, &[], limit);
    let runs: Vec<Run> = runs.into_iter().flatten().collect();
    for (r, run) in runs.iter().enumerate() {
        assert_eq!(run.code(), Some(0), "rank {r}: {}", run.describe());
    }
    assert_eq!(document(&runs[0])["report"]["launcher"]["launcher"], "slurm");
    // Training, with torchrun's own store holding MASTER_PORT: kiln meets one port above it.
    let trained = kiln_gpu::train::measure(
        &candle_core::Device::Cpu,
        &kiln_gpu::train::Options {
            device: 0,
            size: "tiny".into(),
            steps: Some(20),
            batch: None,
            precision: kiln_gpu::gemm::Precision::Bf16,
            as_rank: None,
        },
        Some("NVIDIA H100 80GB HBM3".into()),
        |_, _, _| {},
        None,
    )
    .unwrap();
    let program = train_stand_in(stand.path());
    for ranks in [1, 2] {
        for rank in 0..ranks {
            let doc = train_part(&trained, rank, ranks, 1000.0 - 50.0 * (ranks - 1) as f64);
            std::fs::write(stand.path().join(format!("train-{rank}-{ranks}.json")), doc.to_string()).unwrap();
        }
    }
    // torchrun's agent store holds MASTER_PORT; kiln listens one above it.
    let agent = std::net::TcpListener::bind(("0.0.0.0", quiet_port(true))).unwrap();
    let held = agent.local_addr().unwrap().port().to_string();
    // Each run takes longer than the stall limit: rank 1, waiting while rank 0 trains alone, is
    // allowed what rank 0's run is.
    let (runs, _) = torchrun(
        2,
        dir.path(),
        "cluster --stall-timeout 1.5 train --nccl --size tiny --steps 20 --json",
        &[
            ("KILN_GPU", program.to_str().unwrap()),
            ("TORCHELASTIC_USE_AGENT_STORE", "True"),
            ("MASTER_PORT", &held),
            ("STAND_IN_SLEEP", "5"),
        ],
        &[],
        limit,
    );
    let runs: Vec<Run> = runs.into_iter().flatten().collect();
    for (r, run) in runs.iter().enumerate() {
        assert_eq!(run.code(), Some(0), "rank {r}: {}", run.describe());
    }
    let rows = document(&runs[0])["report"]["rows"].clone();
    assert_eq!(rows.as_array().unwrap().len(), 2, "{rows}");
    assert!((rows[1]["efficiency"].as_f64().unwrap() - 0.95).abs() < 1e-9, "{rows}");
    drop(agent);

    // Rank 3 never comes: rank 0 says it waited for it, and every started rank stops.
    let (runs, waited) = torchrun(
        4,
        dir.path(),
        &format!("{} --no-save", args.replacen("cluster ", "cluster --stall-timeout 3 ", 1)),
        &[("KILN_GPU", gpu)],
        &[3],
        limit,
    );
    assert!(waited < 20.0, "the job ended {waited:.1} s in, a 3 s limit");
    let zero = runs[0].as_ref().unwrap();
    assert_eq!(zero.code(), Some(2), "{}", zero.describe());
    assert!(zero.stderr().contains("waiting for rank 3 to join kiln's rendezvous"), "{}", zero.describe());
    for run in runs[1..3].iter().flatten() {
        assert_eq!(run.code(), Some(2), "{}", run.describe());
    }
    // What needs MPI for its data says so under torchrun, before anything starts.
    let (runs, _) = torchrun(2, dir.path(), "cluster collectives --no-save", &[], &[1], limit);
    let zero = runs[0].as_ref().unwrap();
    assert_eq!(zero.code(), Some(2), "{}", zero.describe());
    assert!(zero.stderr().contains("whose processes MPI cannot join"), "{}", zero.describe());
    assert!(zero.stderr().contains("the CPU collectives and CPU training need MPI"), "{}", zero.describe());
}

#[test]
fn under_torchrun_the_fabric_test_runs_its_tournament_through_kilns_rendezvous_without_mpi() {
    let dir = tempfile::tempdir().unwrap();
    // Four ranks on loopback: three rounds, every directed link measured both ways once.
    let args = "cluster fabric --iface lo --streams 1 --seconds 0.2 --repetitions 1 --json";
    let (runs, _) = torchrun(4, dir.path(), args, &[], &[], Duration::from_secs(90));
    let runs: Vec<Run> = runs.into_iter().flatten().collect();
    // Loopback is one shared machine, so a link may be judged slow (exit 1): the verdict is the
    // namespace test's; here the tournament and the gather are.
    assert!(matches!(runs[0].code(), Some(0 | 1)), "{}", runs[0].describe());
    for (r, run) in runs.iter().enumerate().skip(1) {
        assert_eq!(run.code(), Some(0), "rank {r}: {}", run.describe());
    }
    let report = &document(&runs[0])["report"];
    assert_eq!(report["rounds"], 3, "N-1 rounds for N nodes: {report}");
    assert_eq!(report["launcher"]["launcher"], "torchrun");
    let links = report["rails"][0]["links"].as_array().unwrap();
    assert_eq!(links.len(), 12, "every ordered pair: {report}");
    for l in links {
        assert!(l["gbps"].as_f64().unwrap() > 0.0, "{l}");
        assert!(l["rtt_us"].as_f64().unwrap() > 0.0, "{l}");
    }
    let labels: Vec<&str> = report["nodes"].as_array().unwrap().iter().map(|n| n["label"].as_str().unwrap()).collect();
    assert!(labels.iter().enumerate().all(|(r, l)| l.ends_with(&format!("#{r}"))), "one host, told apart: {labels:?}");
    assert_eq!(stored(dir.path(), 4, "fabric").len(), 4, "every rank stores its part");
}

#[test]
fn a_rank_frozen_inside_a_collective_is_named_by_rank_0_as_the_one_that_went_silent() {
    let Some(kiln_mpi) = mpi_kiln("a_rank_frozen_inside_a_collective_is_named_by_rank_0_as_the_one_that_went_silent")
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // Every rank waits inside the same collective for the frozen one: only the heartbeats tell
    // rank 0 which rank stopped.
    let args = "cluster collectives --min-bytes 1K --max-bytes 256M --seconds-per-size 0.3 --stall-timeout 3 --no-save";
    let (out, waited) = signal_rank_2(
        &kiln_mpi,
        dir.path(),
        args,
        Duration::from_millis(2500),
        Signal::SIGSTOP,
        Duration::from_secs(60),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    let zero = err.lines().find(|l| l.starts_with("kiln: rank 0: nothing moved for")).unwrap_or_else(|| {
        panic!("rank 0 speaks first:\n{err}");
    });
    assert!(zero.contains("with every rank; what the other ranks last said: rank 2 silent for"), "{zero}");
    assert!(!zero.contains("rank 1 silent") && !zero.contains("rank 3 silent"), "only rank 2: {zero}");
    assert!(waited < 30.0, "the job ended {waited:.1} s after the freeze, a 3 s limit:\n{err}");
}

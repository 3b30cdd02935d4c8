//! The fleet service under a fleet's nightly upload: 1,000 simulated agents (tokio tasks, each its
//! own TCP connection and HTTP/1.1 POST of its night's export: one host, its inventory, one run
//! with metrics, samples and GPU telemetry) started at once against `kiln serve` on loopback.
//! Prints uploads/s, p50/p99/max latency, and checks that every host and run is stored once.
//! The anchor, measured in the same run: `kiln import` of the same records as one local file.
//! Then the same night through two `kiln serve` replicas on one database (another database of the
//! same engine), agents spread over both as a load balancer would: uploads/s and p99 against the
//! one replica's of the same run, every record stored once, and both replicas answering the same
//! hosts and runs.
//!
//! Then the fleet questions through the server on a large fleet (`KILN_BENCH_FLEET=HOSTSxNIGHTSxMETRICS`,
//! default 10000x90x20: 18 M metric rows, imported first): `compare --by config`, `outliers` and
//! `regressions` over HTTP, each against the target of 2 s, and the same commands run
//! locally on the file for comparison. `KILN_BENCH_FLEET=0` skips it.
//!
//! Everything runs on both engines: an SQLite file, then PostgreSQL in a throwaway cluster with
//! default durability (skipped with the reason where PostgreSQL is not installed;
//! `KILN_BENCH_ENGINES=sqlite` or `=postgresql` picks one).
//!
//! `cargo bench --bench serve`; `KILN_BENCH_AGENTS` sets the number of agents.

#[path = "../tests/fleet_gen.rs"]
mod fleet_gen;
#[path = "../tests/pg_cluster.rs"]
mod pg_cluster;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn kiln(db: &Path, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_kiln")).args(args).env("KILN_DB", db).output().expect("running kiln");
    assert!(out.status.success(), "kiln {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

async fn upload(addr: std::net::SocketAddr, token: &str, body: &str) -> Result<(u16, Duration), String> {
    let start = Instant::now();
    let mut stream = tokio::net::TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let request = format!(
        "POST /api/v1/records HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nContent-Type: \
         application/x-ndjson\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.map_err(|e| e.to_string())?;
    stream.write_all(body.as_bytes()).await.map_err(|e| e.to_string())?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&answer);
    let status =
        text.split_whitespace().nth(1).and_then(|s| s.parse().ok()).ok_or_else(|| format!("no status: {text}"))?;
    Ok((status, start.elapsed()))
}

/// Starts `kiln serve` on `db`; returns the child and its address.
fn start_server(db: &Path) -> (std::process::Child, std::net::SocketAddr) {
    let mut server = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["serve", "--listen", "127.0.0.1:0", "--anonymous-read"])
        .env("KILN_DB", db)
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting kiln serve");
    let mut said = BufReader::new(server.stderr.take().unwrap());
    let mut line = String::new();
    while !line.contains("listening on") {
        line.clear();
        assert!(said.read_line(&mut line).unwrap() > 0, "kiln serve stopped");
    }
    // Keep reading its stderr, so that it never blocks on a full pipe.
    std::thread::spawn(move || std::io::copy(&mut said, &mut std::io::sink()));
    (server, line.rsplit("http://").next().unwrap().trim().parse().unwrap())
}

fn stop(mut server: std::process::Child) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(server.id() as i32), nix::sys::signal::Signal::SIGTERM);
    let _ = server.wait();
}

/// The median of `n` timings of `f`, in milliseconds.
fn median_ms(n: usize, mut f: impl FnMut()) -> f64 {
    let mut t: Vec<f64> = (0..n)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed().as_secs_f64() * 1000.0
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[n / 2]
}

/// The fleet questions through the server on a fleet of `hosts × nights × metrics`, stored at
/// `db` (a file in `dir`, or a PostgreSQL URL).
fn large_fleet(engine: &str, db: &Path, hosts: usize, nights: usize, metrics: usize) {
    // `KILN_BENCH_LARGE_DB=FILE` keeps the SQLite large fleet in FILE and reuses it when it exists
    // (the import takes minutes; the questions are what a change to the read path moves).
    let kept = std::env::var_os("KILN_BENCH_LARGE_DB").filter(|_| engine == "sqlite").map(std::path::PathBuf::from);
    let db = kept.as_deref().unwrap_or(db);
    if kept.as_ref().is_some_and(|k| k.exists()) {
        println!("{engine}: large fleet: reusing {}", db.display());
    } else {
        import_large_fleet(engine, db, hosts, nights, metrics);
    }
    let (server, addr) = start_server(db);
    let client: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
    let since = format!("{}d", nights + 10);
    let questions: [(&str, String, Vec<&str>); 3] = [
        ("compare --by config", format!("/api/v1/compare?by=config&since={since}"), vec!["compare", "--by", "config"]),
        ("outliers", format!("/api/v1/outliers?since={since}"), vec!["outliers"]),
        ("regressions", format!("/api/v1/regressions?since={since}"), vec!["regressions"]),
    ];
    for (name, path, args) in questions {
        let url = format!("http://{addr}{path}");
        let served = median_ms(3, || {
            let mut r = client.get(&url).call().expect("asking the server");
            assert_eq!(r.status().as_u16(), 200, "{url}");
            let _ = r.body_mut().with_config().limit(1 << 30).read_to_string().unwrap();
        });
        let mut local_args = args.clone();
        local_args.extend(["--since", &since, "--json"]);
        let local = median_ms(3, || {
            let _ = Command::new(env!("CARGO_BIN_EXE_kiln")).args(&local_args).env("KILN_DB", db).output();
        });
        println!(
            "  {engine}: {name}: through the server {served:.0} ms (target < 2000 ms: {:.2}x of it), `kiln {}` directly on the database {local:.0} ms",
            served / 2000.0,
            args.join(" ")
        );
    }
    stop(server);
}

/// Generates the large fleet and imports it into `db`.
fn import_large_fleet(engine: &str, db: &Path, hosts: usize, nights: usize, metrics: usize) {
    let spec = fleet_gen::FleetSpec {
        hosts,
        configs: 8,
        nights,
        metrics,
        samples_per_metric: 0,
        sampled_metrics: 0,
        gpus: 0,
        telemetry_points: 0,
        end: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64 - 3600,
        seed: 5,
    };
    let t = Instant::now();
    let (export, rows, ..) = fleet_gen::generate(&spec);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("fleet.jsonl");
    std::fs::write(&file, &export).unwrap();
    drop(export);
    let generated = t.elapsed().as_secs_f64();
    let t = Instant::now();
    kiln(db, &["import", file.to_str().unwrap()]);
    println!(
        "{engine}: large fleet: {hosts} hosts × {nights} nights × {metrics} metrics = {rows} metric rows (generated in \
         {generated:.0} s, imported in {:.0} s)",
        t.elapsed().as_secs_f64()
    );
}

fn main() {
    let engines = std::env::var("KILN_BENCH_ENGINES").unwrap_or_else(|_| "sqlite,postgresql".into());
    let fleet = std::env::var("KILN_BENCH_FLEET").unwrap_or_else(|_| "10000x90x20".into());
    let dims: Vec<usize> = fleet.split('x').filter_map(|v| v.parse().ok()).collect();
    for engine in engines.split(',') {
        let dir = tempfile::tempdir().unwrap();
        let cluster = match engine {
            "sqlite" => None,
            "postgresql" => match pg_cluster::missing() {
                Some(missing) => {
                    println!("postgresql: SKIPPED — needs {missing}");
                    continue;
                }
                None => Some(pg_cluster::PgCluster::start_durable()),
            },
            other => panic!("KILN_BENCH_ENGINES: unknown engine {other:?} (sqlite, postgresql)"),
        };
        // The service's database, the anchor's and the large fleet's: files, or databases of the cluster.
        let db = |name: &str| -> std::path::PathBuf {
            match &cluster {
                None => dir.path().join(format!("{name}.db")),
                Some(c) => {
                    c.psql("postgres", &format!("CREATE DATABASE {name}"));
                    std::path::PathBuf::from(c.url.replace("/kiln?", &format!("/{name}?")))
                }
            }
        };
        agents_bench(engine, &db("service"), &db("replicas"), &db("anchor"), dir.path());
        if let [hosts, nights, metrics] = dims[..] {
            large_fleet(engine, &db("large"), hosts, nights, metrics);
        }
    }
}

/// 1,000 agents uploading at once to a service on `db`; the anchor imports the same records into
/// `local`; then the same night again through two replicas of the service on `two` (another
/// database of the same engine), the agents spread over both, as behind a load balancer.
fn agents_bench(engine: &str, db: &Path, two: &Path, local: &Path, dir: &Path) {
    let agents: usize = std::env::var("KILN_BENCH_AGENTS").ok().and_then(|v| v.parse().ok()).unwrap_or(1000);
    let spec = fleet_gen::FleetSpec {
        hosts: agents,
        configs: 4,
        nights: 1,
        metrics: 20,
        samples_per_metric: 5,
        sampled_metrics: 4,
        gpus: 8,
        telemetry_points: 20,
        end: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64,
        seed: 11,
    };
    let (export, metrics, samples, telemetry) = fleet_gen::generate(&spec);
    let bodies = fleet_gen::split_by_host(&export, agents);
    assert_eq!(bodies.len(), agents);
    let bytes: usize = bodies.iter().map(String::len).sum();
    println!(
        "{agents} agents, one night each: {metrics} metric rows, {samples} samples, {telemetry} telemetry points, \
         {:.1} KiB per upload",
        bytes as f64 / agents as f64 / 1024.0
    );

    // The anchor: the same records as one import.
    let file = dir.join("fleet.jsonl");
    std::fs::write(&file, &export).unwrap();
    let t = Instant::now();
    kiln(local, &["import", file.to_str().unwrap()]);
    let import_secs = t.elapsed().as_secs_f64();

    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let one = night(&rt, engine, db, bodies.clone(), 1);
    let both = night(&rt, engine, two, bodies, 2);
    println!(
        "{engine}: anchor: kiln import of the same records as one file: {import_secs:.2} s; one replica takes them at \
         {:.2}x that speed, two replicas at {:.2}x",
        import_secs / one.wall,
        import_secs / both.wall
    );
    println!(
        "{engine}: two replicas against one, same run: {:.2}x the uploads/s, p99 {:.2}x",
        one.wall / both.wall,
        both.p99_ms / one.p99_ms
    );
    // Both services hold the same fleet: the same hosts, each stored once.
    let identities = |db: &Path| -> Vec<String> {
        let hosts: serde_json::Value = serde_json::from_str(&kiln(db, &["hosts", "--json"])).unwrap();
        let mut ids: Vec<String> =
            hosts["hosts"].as_array().unwrap().iter().map(|h| h["identity"].as_str().unwrap().to_string()).collect();
        ids.sort();
        ids
    };
    assert_eq!(identities(db), identities(two), "one replica and two stored the same hosts");
}

/// What one night's uploads measured.
struct Night {
    wall: f64,
    p99_ms: f64,
}

/// Every agent's upload (`bodies`, each with a token of its own) sent at once to `replicas`
/// services on `db`, agent i to replica i mod `replicas`; checks that every run and host is
/// stored once, and that every replica answers the same fleet.
fn night(rt: &tokio::runtime::Runtime, engine: &str, db: &Path, bodies: Vec<String>, replicas: usize) -> Night {
    let agents = bodies.len();
    // Each agent its own token, as on a fleet (an agent token speaks for one host: the one its
    // first upload carries), made through the library: a thousand `kiln token create` would time
    // process starts, not the service.
    let tokens: Vec<String> = rt.block_on(async {
        use kiln_db::Queries;
        let location = kiln_db::Location::parse(&db.to_string_lossy()).unwrap();
        let mut store = kiln_db::AnyStore::open(&location, kiln_db::Access::Write).await.unwrap();
        let at = "2026-12-07T00:00:00Z";
        let mut tokens = Vec::with_capacity(agents);
        for n in 0..agents {
            let t = kiln_serve::auth::new_token();
            let name = format!("agent-{n}");
            store.create_token(&t.id, &name, kiln_db::Role::Agent, &t.secret_sha256, at, None).await.unwrap();
            tokens.push(t.token);
        }
        store.close().await.unwrap();
        tokens
    });
    let servers: Vec<_> = (0..replicas).map(|_| start_server(db)).collect();
    let addrs: Vec<std::net::SocketAddr> = servers.iter().map(|(_, addr)| *addr).collect();

    let t = Instant::now();
    let results: Vec<Result<(u16, Duration), String>> = rt.block_on(async {
        let mut tasks = Vec::new();
        for (i, (body, token)) in bodies.into_iter().zip(tokens).enumerate() {
            let addr = addrs[i % replicas];
            tasks.push(tokio::spawn(async move {
                tokio::time::timeout(Duration::from_secs(300), upload(addr, &token, &body))
                    .await
                    .unwrap_or_else(|_| Err("no answer within 300 s".into()))
            }));
        }
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.unwrap());
        }
        out
    });
    let wall = t.elapsed().as_secs_f64();
    let mut latencies: Vec<f64> = Vec::new();
    let mut failures = Vec::new();
    for r in results {
        match r {
            Ok((200, took)) => latencies.push(took.as_secs_f64()),
            Ok((status, _)) => failures.push(format!("HTTP {status}")),
            Err(e) => failures.push(e),
        }
    }
    // Reads are consistent: every replica answers the same hosts and runs.
    let client: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
    let answers: Vec<(String, String)> = addrs
        .iter()
        .map(|addr| {
            let read = |path: &str| {
                let mut r = client.get(&format!("http://{addr}{path}")).call().expect("asking a replica");
                assert_eq!(r.status().as_u16(), 200, "{path}");
                r.body_mut().with_config().limit(1 << 30).read_to_string().unwrap()
            };
            (read("/api/v1/hosts"), read("/api/v1/runs?limit=1000000"))
        })
        .collect();
    for (server, _) in servers {
        stop(server);
    }
    assert!(failures.is_empty(), "{} uploads failed: {:?}", failures.len(), &failures[..failures.len().min(5)]);
    assert!(answers.windows(2).all(|w| w[0] == w[1]), "every replica answers the same hosts and runs");
    latencies.sort_by(f64::total_cmp);
    let pct = |p: f64| latencies[((latencies.len() - 1) as f64 * p).round() as usize] * 1000.0;
    let runs: serde_json::Value = serde_json::from_str(&kiln(db, &["runs", "--limit", "1000000", "--json"])).unwrap();
    let hosts: serde_json::Value = serde_json::from_str(&kiln(db, &["hosts", "--json"])).unwrap();
    let (n_runs, n_hosts) = (runs["runs"].as_array().unwrap().len(), hosts["hosts"].as_array().unwrap().len());
    assert_eq!((n_runs, n_hosts), (agents, agents), "every agent's run and host is stored, once");
    let served = if replicas == 1 { "one replica".to_string() } else { format!("{replicas} replicas") };
    println!(
        "{engine}: serve, {served}: {agents} concurrent uploads in {wall:.2} s: {:.0} uploads/s, latency p50 {:.0} ms, \
         p99 {:.0} ms, max {:.0} ms; all {n_runs} runs and {n_hosts} hosts stored once",
        agents as f64 / wall,
        pct(0.50),
        pct(0.99),
        pct(1.0)
    );
    Night { wall, p99_ms: pct(0.99) }
}

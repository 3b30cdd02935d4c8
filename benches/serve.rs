//! The fleet service under a fleet's nightly upload: 1,000 simulated agents (tokio tasks, each its
//! own TCP connection and HTTP/1.1 POST of its night's export: one host, its inventory, one run
//! with metrics, samples and GPU telemetry) started at once against `kiln serve` on loopback.
//! Prints uploads/s, p50/p99/max latency, and checks that every host and run is stored once.
//! The anchor, measured in the same run: `kiln import` of the same records as one local file.
//!
//! `cargo bench --bench serve`; `KILN_BENCH_AGENTS` sets the number of agents.

#[path = "../tests/fleet_gen.rs"]
mod fleet_gen;

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

/// One export per host: the header, the shared software records, the host's own records, the end.
fn per_host(export: &str) -> Vec<String> {
    let lines: Vec<&str> = export.lines().collect();
    let header = lines[0];
    let software: Vec<&str> = lines.iter().copied().filter(|l| l.starts_with(r#"{"type":"software""#)).collect();
    let mut groups: Vec<Vec<&str>> = Vec::new();
    for l in &lines[1..lines.len() - 1] {
        if l.starts_with(r#"{"type":"host""#) {
            groups.push(Vec::new());
        }
        if let Some(g) = groups.last_mut() {
            g.push(l);
        }
    }
    groups
        .into_iter()
        .map(|g| {
            let mut text = format!("{header}\n");
            for l in software.iter().chain(&g) {
                text.push_str(l);
                text.push('\n');
            }
            text.push_str(&format!("{{\"type\":\"end\",\"records\":{}}}\n", software.len() + g.len()));
            text
        })
        .collect()
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

fn main() {
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
    let bodies = per_host(&export);
    assert_eq!(bodies.len(), agents);
    let bytes: usize = bodies.iter().map(String::len).sum();
    println!(
        "{agents} agents, one night each: {metrics} metric rows, {samples} samples, {telemetry} telemetry points, \
         {:.1} KiB per upload",
        bytes as f64 / agents as f64 / 1024.0
    );

    let dir = tempfile::tempdir().unwrap();
    // The anchor: the same records as one local import.
    let file = dir.path().join("fleet.jsonl");
    std::fs::write(&file, &export).unwrap();
    let local = dir.path().join("local.db");
    let t = Instant::now();
    kiln(&local, &["import", file.to_str().unwrap()]);
    let import_secs = t.elapsed().as_secs_f64();

    let db = dir.path().join("fleet.db");
    let made = kiln(&db, &["token", "create", "--name", "bench", "--json"]);
    let token = serde_json::from_str::<serde_json::Value>(&made).unwrap()["token"].as_str().unwrap().to_string();
    let mut server = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env("KILN_DB", &db)
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting kiln serve");
    let mut said = BufReader::new(server.stderr.take().unwrap());
    let mut line = String::new();
    while !line.contains("listening on") {
        line.clear();
        assert!(said.read_line(&mut line).unwrap() > 0, "kiln serve stopped");
    }
    let addr: std::net::SocketAddr = line.rsplit("http://").next().unwrap().trim().parse().unwrap();

    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let t = Instant::now();
    let results: Vec<Result<(u16, Duration), String>> = rt.block_on(async {
        let mut tasks = Vec::new();
        for body in bodies {
            let token = token.clone();
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
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(server.id() as i32), nix::sys::signal::Signal::SIGTERM);
    let _ = server.wait();
    assert!(failures.is_empty(), "{} uploads failed: {:?}", failures.len(), &failures[..failures.len().min(5)]);
    latencies.sort_by(f64::total_cmp);
    let pct = |p: f64| latencies[((latencies.len() - 1) as f64 * p).round() as usize] * 1000.0;
    let runs: serde_json::Value = serde_json::from_str(&kiln(&db, &["runs", "--limit", "1000000", "--json"])).unwrap();
    let hosts: serde_json::Value = serde_json::from_str(&kiln(&db, &["hosts", "--json"])).unwrap();
    let (n_runs, n_hosts) = (runs["runs"].as_array().unwrap().len(), hosts["hosts"].as_array().unwrap().len());
    assert_eq!((n_runs, n_hosts), (agents, agents), "every agent's run and host is stored, once");
    println!(
        "serve: {agents} concurrent uploads in {wall:.2} s: {:.0} uploads/s, latency p50 {:.0} ms, p99 {:.0} ms, max \
         {:.0} ms; all {n_runs} runs and {n_hosts} hosts stored",
        agents as f64 / wall,
        pct(0.50),
        pct(0.99),
        pct(1.0)
    );
    println!(
        "anchor: kiln import of the same records as one file: {import_secs:.2} s; the server takes them at {:.2}x \
         that speed",
        import_secs / wall
    );
}

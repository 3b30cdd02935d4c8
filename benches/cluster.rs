//! The fabric test's own overhead: its TCP throughput between two endpoints on loopback (the code
//! each pair of ranks runs, `kiln_bench::net`) against `iperf3` with the same stream count, the two
//! interleaved round by round; and the tournament's round count (N−1 for N nodes, not N²/2).
//! Run with `cargo bench --bench cluster` (needs iperf3); `KILN_BENCH_STREAMS` (default 4) and
//! `KILN_BENCH_SECONDS` (default 2) set the streams and the seconds per measurement.

use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::Duration;

use kiln_bench::cluster::tournament;
use kiln_bench::stats::median;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// One iperf3 measurement on loopback: received Gb/s.
fn iperf3(streams: usize, seconds: f64) -> f64 {
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port().to_string();
    let mut server = Command::new("iperf3")
        .args(["-s", "-1", "-B", "127.0.0.1", "-p", &port])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("iperf3 (apt-get install iperf3)");
    std::thread::sleep(Duration::from_millis(200));
    let out = Command::new("iperf3")
        .args(["-c", "127.0.0.1", "-p", &port, "-J", "-P", &streams.to_string(), "-t"])
        .arg(format!("{seconds}"))
        .output()
        .expect("iperf3 client");
    let _ = server.wait();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("iperf3's JSON");
    v["end"]["sum_received"]["bits_per_second"].as_f64().expect("sum_received") / 1e9
}

fn main() {
    let streams = env_or("KILN_BENCH_STREAMS", 4usize);
    let seconds = env_or("KILN_BENCH_SECONDS", 2.0f64);
    if Command::new("iperf3").arg("--version").output().is_err() {
        eprintln!("cluster bench: needs iperf3 (apt-get install iperf3)");
        std::process::exit(1);
    }
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || kiln_bench::net::serve(listener, Duration::from_secs(3600)));
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for round in 1..=5 {
        ours.push(kiln_bench::net::throughput_once(&addr, streams, seconds).expect("loopback"));
        theirs.push(iperf3(streams, seconds));
        eprintln!("round {round}: kiln {:.2} Gb/s, iperf3 {:.2} Gb/s", ours[round - 1], theirs[round - 1]);
    }
    let (k, i) = (median(&ours), median(&theirs));
    println!(
        "loopback, {streams} streams, {seconds} s: kiln fabric {k:.2} Gb/s, iperf3 {i:.2} Gb/s: {:.2}x iperf3 (goal >= 0.9x)",
        k / i
    );
    for n in [2, 4, 8, 16, 64, 256, 1024] {
        let rounds = tournament(n);
        let pairs: usize = rounds.iter().map(Vec::len).sum();
        println!("tournament of {n} nodes: {} rounds, {pairs} pairs (N²/2 = {})", rounds.len(), n * n / 2);
    }
}

//! The fleet commands at fleet scale: 2,000 hosts × 30 nightly runs × 40 metrics (2.4 M metric
//! rows), with raw samples and GPU power telemetry, generated as an export file
//! (`tests/fleet_gen.rs`), then timed through the `kiln` binary as users run it:
//! - `kiln import` (metric rows/s; target ≥ 500 k/s), against sqlx inserting the same rows one
//!   statement at a time and batched, measured here in the same run;
//! - `kiln compare --by config` (target < 300 ms), `kiln outliers`;
//! - `kiln regressions` over the whole fleet (target < 2 s);
//! - `kiln report --host … --html` (target < 1 s).
//!
//! Then the same on PostgreSQL (a throwaway cluster with default durability, skipped with the
//! reason where PostgreSQL is not installed): the import against a batched sqlx insert of the same
//! rows there, and the read commands.
//!
//! `cargo bench --bench fleet`; `KILN_BENCH_HOSTS` scales the fleet.

#[path = "../tests/fleet_gen.rs"]
mod fleet_gen;
#[path = "../tests/pg_cluster.rs"]
mod pg_cluster;

use std::process::Command;
use std::time::Instant;

use kiln_bench::stats::median;

fn time(args: &[&str], db: &(impl AsRef<std::ffi::OsStr> + ?Sized), ok_codes: &[i32]) -> f64 {
    let t = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_kiln")).args(args).env("KILN_DB", db).output().expect("running kiln");
    let secs = t.elapsed().as_secs_f64();
    assert!(
        ok_codes.contains(&out.status.code().unwrap_or(-1)),
        "kiln {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    secs
}

/// Metric rows (run id, name, value, unit, direction: the shape of kiln's first schema) inserted
/// through sqlx in one transaction, in key order, either one statement per row (the naive way) or
/// batched with `QueryBuilder::push_values` (the anchors: ~19 k and ~810 k rows/s there).
async fn anchor(db: &std::path::Path, rows: usize, batched: bool) -> f64 {
    use sqlx::{Connection, Executor};
    let _ = std::fs::remove_file(db);
    let mut c = sqlx::sqlite::SqliteConnection::connect(&format!("sqlite://{}?mode=rwc", db.display())).await.unwrap();
    c.execute("PRAGMA journal_mode = WAL").await.unwrap();
    c.execute("CREATE TABLE metrics (run_id TEXT NOT NULL, name TEXT NOT NULL, value REAL NOT NULL, unit TEXT NOT NULL, direction TEXT NOT NULL, PRIMARY KEY (run_id, name)) WITHOUT ROWID").await.unwrap();
    let ids: Vec<String> =
        (0..rows / 40 + 1).map(|r| format!("03000000-{:04x}-4000-8000-{:012x}", r % 65536, r)).collect();
    let names: Vec<String> = (0..40).map(|m| format!("metric_{m:02}")).collect();
    let t = Instant::now();
    let mut tx = c.begin().await.unwrap();
    if batched {
        for start in (0..rows).step_by(6000) {
            let mut q = sqlx::QueryBuilder::new("INSERT INTO metrics (run_id, name, value, unit, direction) ");
            q.push_values(start..(start + 6000).min(rows), |mut b, i| {
                b.push_bind(&ids[i / 40])
                    .push_bind(&names[i % 40])
                    .push_bind(i as f64)
                    .push_bind("u")
                    .push_bind("higher");
            });
            q.build().execute(&mut *tx).await.unwrap();
        }
    } else {
        for i in 0..rows {
            sqlx::query("INSERT INTO metrics (run_id, name, value, unit, direction) VALUES (?, ?, ?, ?, ?)")
                .bind(&ids[i / 40])
                .bind(&names[i % 40])
                .bind(i as f64)
                .bind("u")
                .bind("higher")
                .execute(&mut *tx)
                .await
                .unwrap();
        }
    }
    tx.commit().await.unwrap();
    rows as f64 / t.elapsed().as_secs_f64()
}

/// The batched anchor on PostgreSQL: the same rows into the same shape of table, through
/// `QueryBuilder::push_values` in one transaction.
async fn pg_anchor(url: &str, rows: usize) -> f64 {
    use sqlx::{Connection, Executor};
    let mut c = sqlx::postgres::PgConnection::connect(url).await.unwrap();
    c.execute("DROP TABLE IF EXISTS anchor_metrics").await.unwrap();
    c.execute("CREATE TABLE anchor_metrics (run_id TEXT NOT NULL, name TEXT NOT NULL, value DOUBLE PRECISION NOT NULL, unit TEXT NOT NULL, direction TEXT NOT NULL, PRIMARY KEY (run_id, name))").await.unwrap();
    let ids: Vec<String> =
        (0..rows / 40 + 1).map(|r| format!("03000000-{:04x}-4000-8000-{:012x}", r % 65536, r)).collect();
    let names: Vec<String> = (0..40).map(|m| format!("metric_{m:02}")).collect();
    let t = Instant::now();
    let mut tx = c.begin().await.unwrap();
    for start in (0..rows).step_by(6000) {
        let mut q = sqlx::QueryBuilder::new("INSERT INTO anchor_metrics (run_id, name, value, unit, direction) ");
        q.push_values(start..(start + 6000).min(rows), |mut b, i| {
            b.push_bind(&ids[i / 40]).push_bind(&names[i % 40]).push_bind(i as f64).push_bind("u").push_bind("higher");
        });
        q.build().execute(&mut *tx).await.unwrap();
    }
    tx.commit().await.unwrap();
    let rate = rows as f64 / t.elapsed().as_secs_f64();
    c.execute("DROP TABLE anchor_metrics").await.unwrap();
    rate
}

/// The import and the read commands on PostgreSQL.
/// `rows`: every row the import writes (metrics, samples and telemetry points).
fn postgres(
    file: &std::path::Path,
    bare_file: &std::path::Path,
    metrics: usize,
    rows: usize,
    bare_metrics: usize,
    hosts: usize,
) {
    if let Some(missing) = pg_cluster::missing() {
        println!("postgresql: SKIPPED — needs {missing}");
        return;
    }
    let cluster = pg_cluster::PgCluster::start_durable();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let url = cluster.url.clone();
    let import = time(&["import", file.to_str().unwrap()], url.as_str(), &[0]);
    let batched = rt.block_on(pg_anchor(&url, 1_200_000));
    let rate = metrics as f64 / import;
    println!("postgresql: anchor (same run): sqlx batched {:.0} k rows/s", batched / 1e3);
    println!(
        "postgresql: import: {metrics} metric rows (with samples and telemetry) in {import:.2} s = {:.0} k metric rows/s ({:.2}x the batched anchor); every row: {:.0} k rows/s ({:.2}x)",
        rate / 1e3,
        rate / batched,
        rows as f64 / import / 1e3,
        rows as f64 / import / batched
    );
    let again = time(&["import", file.to_str().unwrap()], url.as_str(), &[0]);
    println!("postgresql: import again (idempotent, nothing new): {again:.2} s");
    cluster.psql("postgres", "CREATE DATABASE bare");
    let bare_url = url.replace("/kiln?", "/bare?");
    let secs = time(&["import", bare_file.to_str().unwrap()], bare_url.as_str(), &[0]);
    let bare_rate = bare_metrics as f64 / secs;
    println!(
        "postgresql: import, metrics only: {bare_metrics} metric rows in {secs:.2} s = {:.0} k rows/s ({:.2}x the batched anchor; goal >= 1.0x)",
        bare_rate / 1e3,
        bare_rate / batched
    );
    for (name, args, codes, n) in [
        ("compare --by config", vec!["compare", "--by", "config", "--json"], vec![0], 5),
        ("outliers", vec!["outliers", "--json"], vec![0], 3),
        ("regressions --since 40d (whole fleet)", vec!["regressions", "--since", "40d", "--json"], vec![0, 1], 3),
    ] {
        let times: Vec<f64> = (0..n).map(|_| time(&args, url.as_str(), &codes)).collect();
        println!("postgresql: {name}: median {:.0} ms over {n} runs ({hosts} hosts)", median(&times) * 1e3);
    }
}

fn main() {
    let hosts: usize = std::env::var("KILN_BENCH_HOSTS").ok().and_then(|v| v.parse().ok()).unwrap_or(2000);
    let dir = tempfile::tempdir().unwrap();
    // KILN_BENCH_KEEP=DIR keeps the export and the database there, for profiling.
    let keep = std::env::var_os("KILN_BENCH_KEEP").map(std::path::PathBuf::from);
    let base = keep.clone().unwrap_or_else(|| dir.path().to_path_buf());
    std::fs::create_dir_all(&base).unwrap();
    let _ = std::fs::remove_file(base.join("fleet.db"));
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    let spec = fleet_gen::FleetSpec {
        hosts,
        configs: 8,
        nights: 30,
        metrics: 40,
        samples_per_metric: 5,
        sampled_metrics: 5,
        gpus: 8,
        telemetry_points: 2,
        end: now - 3600,
        seed: 7,
    };
    let t = Instant::now();
    let (text, metrics, samples, telemetry) = fleet_gen::generate(&spec);
    let file = base.join("fleet.jsonl");
    std::fs::write(&file, &text).unwrap();
    eprintln!("generated {hosts} hosts × {} nights × {} metrics: {metrics} metric rows, {samples} samples, {telemetry} telemetry points, {:.0} MB in {:.1} s", spec.nights, spec.metrics, text.len() as f64 / 1e6, t.elapsed().as_secs_f64());
    drop(text);

    let db = base.join("fleet.db");
    let import = time(&["import", file.to_str().unwrap()], &db, &[0]);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let naive = rt.block_on(anchor(&base.join("anchor.db"), 100_000, false));
    let batched = rt.block_on(anchor(&base.join("anchor.db"), 1_200_000, true));
    let rate = metrics as f64 / import;
    let all_rows = metrics + samples + telemetry;
    println!(
        "anchors (same run): sqlx row by row {:.0} k rows/s, sqlx batched {:.0} k rows/s",
        naive / 1e3,
        batched / 1e3
    );
    println!("import: {metrics} metric rows (+ {samples} samples, {telemetry} telemetry points) in {import:.2} s = {:.0} k metric rows/s (target >= 500 k/s: {:.2}x; {:.1}x row by row, {:.2}x batched); every row: {:.0} k rows/s ({:.2}x batched)", rate / 1e3, rate / 500e3, rate / naive, rate / batched, all_rows as f64 / import / 1e3, all_rows as f64 / import / batched);
    let again = time(&["import", file.to_str().unwrap()], &db, &[0]);
    println!("import again (idempotent, nothing new): {again:.2} s");
    // The same fleet with metrics only (no samples, no telemetry): the metric-row rate alone.
    let bare = fleet_gen::FleetSpec { samples_per_metric: 0, sampled_metrics: 0, gpus: 0, ..spec };
    let (text, bare_metrics, ..) = fleet_gen::generate(&bare);
    let bare_file = base.join("fleet-metrics-only.jsonl");
    std::fs::write(&bare_file, &text).unwrap();
    drop(text);
    let bare_db = base.join("fleet-metrics-only.db");
    let _ = std::fs::remove_file(&bare_db);
    let secs = time(&["import", bare_file.to_str().unwrap()], &bare_db, &[0]);
    let bare_rate = bare_metrics as f64 / secs;
    println!("import, metrics only: {bare_metrics} metric rows in {secs:.2} s = {:.0} k rows/s (target >= 500 k/s: {:.2}x; {:.2}x the batched anchor; goal >= 1.0x)", bare_rate / 1e3, bare_rate / 500e3, bare_rate / batched);
    postgres(&file, &bare_file, metrics, all_rows, bare_metrics, hosts);

    let report = |name: &str, args: &[&str], codes: &[i32], target: f64, n: usize| {
        let times: Vec<f64> = (0..n).map(|_| time(args, &db, codes)).collect();
        let m = median(&times);
        println!(
            "{name}: median {:.0} ms over {n} runs (min {:.0}){}",
            m * 1e3,
            times.iter().copied().fold(f64::INFINITY, f64::min) * 1e3,
            if target > 0.0 {
                format!(", target < {:.0} ms: {:.2}x of it", target * 1e3, m / target)
            } else {
                String::new()
            }
        );
    };
    let html = dir.path().join("report.html");
    report("compare --by config", &["compare", "--by", "config", "--json"], &[0], 0.3, 5);
    report("outliers", &["outliers", "--json"], &[0], 0.0, 3);
    report("regressions --since 40d (whole fleet)", &["regressions", "--since", "40d", "--json"], &[0, 1], 2.0, 3);
    report(
        "report --host (HTML)",
        &["report", "--host", &fleet_gen::hostname(13), "--since", "40d", "--html", html.to_str().unwrap()],
        &[0],
        1.0,
        5,
    );
    report(
        "report --config (HTML)",
        &["report", "--config", &fleet_gen::config_fp(2), "--since", "40d", "--html", html.to_str().unwrap()],
        &[0],
        1.0,
        3,
    );
}

//! Adding runs to the fleet's series (`series_keys`, `host_series`; the blob format is in
//! `crate::series`), in the transaction that stores the runs.

use std::collections::{BTreeMap, HashMap};

use crate::engine::{query, Arg, Builder, Conn};
use crate::series::{period_of, HostSeries, RunPoint};
use kiln_text::timefmt::parse_rfc3339;

/// A run to add to the series.
pub(crate) struct IndexRun<'a> {
    pub host_id: &'a str,
    pub run_id: &'a str,
    pub started_at: &'a str,
    pub config_fingerprint: &'a str,
    pub config_name: &'a str,
    pub benchmark: &'a str,
    pub bench_config: &'a str,
    pub software_fingerprint: &'a str,
    pub metrics: Vec<(&'a str, f64, &'a str, &'a str)>,
    pub power_watts: Option<f64>,
}

/// Adds runs to the series blobs, creating series keys as needed. Runs that are not `ok` or
/// `unstable` carry no results worth comparing and are left out.
pub(crate) async fn index_runs(conn: &mut Conn<'_>, runs: &[IndexRun<'_>]) -> std::result::Result<(), sqlx::Error> {
    if runs.is_empty() {
        return Ok(());
    }
    // The keys of these runs' series only (an upload must not read every key the fleet has).
    let prefixes: Vec<[&str; 4]> = runs
        .iter()
        .map(|r| [r.config_fingerprint, r.benchmark, r.bench_config, r.software_fingerprint])
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let mut existing: Vec<(i64, String, String, String, String, String)> = Vec::new();
    for chunk in prefixes.chunks(500) {
        let mut q = Builder::new(
            "SELECT id, config_fingerprint, benchmark, bench_config, software_fingerprint, metric FROM series_keys \
             WHERE (config_fingerprint, benchmark, bench_config, software_fingerprint) IN (",
        );
        q.values(chunk.iter().map(|p| p.map(Arg::from)));
        q.push(")");
        existing.extend(q.build().fetch_all_as(conn).await?);
    }
    // Keys borrowed from the rows above and from the runs: no string copies per metric. Grouped
    // by what a run shares (configuration, benchmark, its configuration, software), so that each
    // metric hashes only its name.
    type Prefix<'k> = (&'k str, &'k str, &'k str, &'k str);
    let mut keys: crate::FastMap<Prefix<'_>, crate::FastMap<&str, i64>> = crate::FastMap::default();
    for (id, c, b, bc, sw, m) in &existing {
        keys.entry((c.as_str(), b.as_str(), bc.as_str(), sw.as_str())).or_default().insert(m.as_str(), *id);
    }
    let mut by_host: BTreeMap<(&str, i64), Vec<(RunPoint, Vec<(i64, f64)>)>> = BTreeMap::new();
    for run in runs {
        let Some(t) = parse_rfc3339(run.started_at) else { continue };
        let Ok(run_id) = uuid::Uuid::parse_str(run.run_id) else { continue };
        let mut values = Vec::with_capacity(run.metrics.len());
        let of_run = keys
            .entry((run.config_fingerprint, run.benchmark, run.bench_config, run.software_fingerprint))
            .or_default();
        for &(name, value, unit, direction) in &run.metrics {
            if !value.is_finite() {
                continue;
            }
            let id = match of_run.get(name) {
                Some(id) => *id,
                // A key another writer added since the read above (a second fleet service on the
                // same PostgreSQL) conflicts: the no-op update returns its id.
                None => {
                    let id: i64 = query(
                        "INSERT INTO series_keys (config_fingerprint, config_name, benchmark, bench_config, software_fingerprint, metric, unit, direction) \
                         VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
                         ON CONFLICT (config_fingerprint, benchmark, bench_config, software_fingerprint, metric) \
                         DO UPDATE SET unit = series_keys.unit RETURNING id",
                    )
                    .bind(run.config_fingerprint)
                    .bind(run.config_name)
                    .bind(run.benchmark)
                    .bind(run.bench_config)
                    .bind(run.software_fingerprint)
                    .bind(name)
                    .bind(unit)
                    .bind(direction)
                    .scalar(conn)
                    .await?;
                    of_run.insert(name, id);
                    id
                }
            };
            values.push((id, value));
        }
        by_host
            .entry((run.host_id, period_of(t)))
            .or_default()
            .push((RunPoint { run_id, t, power_watts: run.power_watts.map(|p| p as f32) }, values));
    }
    // The partitions these runs fall in, read in batches (a statement per partition cost a
    // round trip each: a fleet's import touches thousands), merged, and written back in batches.
    let wanted: Vec<(&str, i64)> = by_host.keys().copied().collect();
    let mut existing: HashMap<(String, i64), Vec<u8>> = HashMap::new();
    for chunk in wanted.chunks(500) {
        let mut q = Builder::new("SELECT host_id, period, data FROM host_series WHERE (host_id, period) IN (");
        q.values(chunk.iter().map(|(host, period)| [Arg::from(*host), Arg::from(*period)]));
        q.push(")");
        for r in q.build().fetch_all(conn).await? {
            existing.insert((r.get(0), r.get(1)), r.get(2));
        }
    }
    let mut merged: Vec<(&str, i64, i64, i64, Vec<u8>)> = Vec::with_capacity(by_host.len());
    for ((host, period), new) in by_host {
        let old = existing.remove(&(host.to_string(), period));
        let mut series = old.and_then(|b| HostSeries::decode(&b).ok()).unwrap_or_default();
        series.merge(new);
        merged.push((host, period, series.runs.len() as i64, series.points() as i64, series.encode()));
    }
    for chunk in merged.chunks(500) {
        let mut q = Builder::new("INSERT INTO host_series (host_id, period, runs, points, data) ");
        q.values(chunk.iter().map(|(host, period, runs, points, data)| {
            [Arg::from(*host), Arg::from(*period), Arg::from(*runs), Arg::from(*points), Arg::from(data.as_slice())]
        }));
        q.push(
            " ON CONFLICT (host_id, period) DO UPDATE SET runs = excluded.runs, points = excluded.points, \
             data = excluded.data",
        );
        q.build().execute(conn).await?;
    }
    Ok(())
}

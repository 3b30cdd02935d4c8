//! The fleet: every host's metric series, packed one blob per host (`host_series`) and grouped by
//! comparable configuration (`series_keys`), plus moving results between databases as JSON lines.
//!
//! Why blobs: reading a row through sqlx costs microseconds, so two million metric rows cost
//! seconds; two thousand host blobs cost milliseconds. The blobs are derived data, written in the
//! same transaction as the runs they come from and rebuilt from the normalized tables when absent.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Write;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use sqlx::sqlite::SqliteConnection;
use sqlx::{Connection, QueryBuilder, Row};

use crate::{DbError, Direction, Result, Store, MAX_BINDS};

/// One comparable group and metric.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SeriesKey {
    pub id: i64,
    pub config_fingerprint: String,
    pub config_name: String,
    pub benchmark: String,
    pub bench_config: String,
    pub software_fingerprint: String,
    pub metric: String,
    pub unit: String,
    pub direction: Direction,
}

/// A run as the fleet sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct RunPoint {
    pub run_id: uuid::Uuid,
    /// Start, seconds since the Unix epoch.
    pub t: i64,
    /// Mean total GPU power during the run, when telemetry had it.
    pub power_watts: Option<f32>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub key: i64,
    /// (index into the host's runs, value), in time order.
    pub points: Vec<(u32, f64)>,
}

/// One host's runs and series.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HostSeries {
    pub runs: Vec<RunPoint>,
    pub series: Vec<Series>,
}

const MAGIC: &[u8; 4] = b"KSB1";

impl HostSeries {
    /// `KSB1`, runs (u32 count; uuid 16 bytes, t i64, power f32 or NaN), series (u32 count; key i64,
    /// u32 count, then (run u32, value f64) each). Little-endian.
    pub fn encode(&self) -> Vec<u8> {
        let points: usize = self.series.iter().map(|s| s.points.len()).sum();
        let mut out = Vec::with_capacity(12 + self.runs.len() * 28 + self.series.len() * 12 + points * 12);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&(self.runs.len() as u32).to_le_bytes());
        for r in &self.runs {
            out.extend_from_slice(r.run_id.as_bytes());
            out.extend_from_slice(&r.t.to_le_bytes());
            out.extend_from_slice(&r.power_watts.unwrap_or(f32::NAN).to_le_bytes());
        }
        out.extend_from_slice(&(self.series.len() as u32).to_le_bytes());
        for s in &self.series {
            out.extend_from_slice(&s.key.to_le_bytes());
            out.extend_from_slice(&(s.points.len() as u32).to_le_bytes());
            for (run, value) in &s.points {
                out.extend_from_slice(&run.to_le_bytes());
                out.extend_from_slice(&value.to_le_bytes());
            }
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> std::result::Result<HostSeries, String> {
        struct Reader<'a>(&'a [u8]);
        impl Reader<'_> {
            fn take<const N: usize>(&mut self) -> std::result::Result<[u8; N], String> {
                if self.0.len() < N {
                    return Err("truncated series blob".into());
                }
                let (head, rest) = self.0.split_at(N);
                self.0 = rest;
                Ok(head.try_into().unwrap())
            }
            fn u32(&mut self) -> std::result::Result<u32, String> {
                Ok(u32::from_le_bytes(self.take()?))
            }
        }
        let mut r = Reader(bytes);
        if &r.take::<4>()? != MAGIC {
            return Err("not a kiln series blob".into());
        }
        let n = r.u32()? as usize;
        let mut runs = Vec::with_capacity(n.min(1 << 20));
        for _ in 0..n {
            let id = uuid::Uuid::from_bytes(r.take()?);
            let t = i64::from_le_bytes(r.take()?);
            let p = f32::from_le_bytes(r.take()?);
            runs.push(RunPoint { run_id: id, t, power_watts: (!p.is_nan()).then_some(p) });
        }
        let n = r.u32()? as usize;
        let mut series = Vec::with_capacity(n.min(1 << 20));
        for _ in 0..n {
            let key = i64::from_le_bytes(r.take()?);
            let m = r.u32()? as usize;
            let mut points = Vec::with_capacity(m.min(1 << 24));
            for _ in 0..m {
                let run = r.u32()?;
                if run as usize >= runs.len() {
                    return Err("series point names a run that is not there".into());
                }
                points.push((run, f64::from_le_bytes(r.take()?)));
            }
            series.push(Series { key, points });
        }
        Ok(HostSeries { runs, series })
    }

    /// Adds runs and their points, keeping runs and points in time order; a run already present is
    /// skipped.
    fn merge(&mut self, new: Vec<(RunPoint, Vec<(i64, f64)>)>) {
        let known: HashSet<uuid::Uuid> = self.runs.iter().map(|r| r.run_id).collect();
        // Expand to (run, key, value), re-sort runs by time, renumber.
        let mut all: Vec<(RunPoint, Vec<(i64, f64)>)> = Vec::with_capacity(self.runs.len() + new.len());
        let mut per_run: Vec<Vec<(i64, f64)>> = vec![Vec::new(); self.runs.len()];
        for s in &self.series {
            for &(run, value) in &s.points {
                per_run[run as usize].push((s.key, value));
            }
        }
        all.extend(self.runs.drain(..).zip(per_run));
        all.extend(new.into_iter().filter(|(r, _)| !known.contains(&r.run_id)));
        all.sort_by_key(|(r, _)| (r.t, r.run_id));
        let mut by_key: BTreeMap<i64, Vec<(u32, f64)>> = BTreeMap::new();
        for (i, (run, values)) in all.into_iter().enumerate() {
            for (key, value) in values {
                by_key.entry(key).or_default().push((i as u32, value));
            }
            self.runs.push(run);
        }
        self.series = by_key.into_iter().map(|(key, points)| Series { key, points }).collect();
    }

    pub fn points(&self) -> usize {
        self.series.iter().map(|s| s.points.len()).sum()
    }
}

/// A host with its series.
#[derive(Debug, Clone)]
pub struct FleetHost {
    pub id: String,
    pub hostname: Option<String>,
    pub config_fingerprint: String,
    pub config_name: String,
    pub data: HostSeries,
}

/// Every host and series key: what compare, outliers, regressions and reports work on.
#[derive(Debug, Clone, Default)]
pub struct Fleet {
    pub keys: BTreeMap<i64, SeriesKey>,
    pub hosts: Vec<FleetHost>,
}

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

/// The length of a series partition: a window loads only the partitions it reaches.
pub const PERIOD_SECONDS: i64 = 30 * 86_400;

fn period_of(t: i64) -> i64 {
    t.div_euclid(PERIOD_SECONDS)
}

/// Seconds since the epoch of an RFC 3339 UTC time (`2026-12-02T15:33:58.126Z`, `+00:00` too);
/// offsets other than UTC are applied.
pub fn parse_rfc3339(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() < 19
        || b[4] != b'-'
        || b[7] != b'-'
        || !(b[10] == b'T' || b[10] == b' ')
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    let num = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let (y, mo, d, h, mi, se) = (num(0..4)?, num(5..7)?, num(8..10)?, num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || se > 60 {
        return None;
    }
    let mut rest = &s[19..];
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        rest = &frac[digits..];
    }
    let offset = match rest {
        "Z" | "z" | "" => 0,
        _ if rest.len() == 6 && (rest.starts_with('+') || rest.starts_with('-')) => {
            let sign = if rest.starts_with('-') { -1 } else { 1 };
            sign * (rest[1..3].parse::<i64>().ok()? * 3600 + rest[4..6].parse::<i64>().ok()? * 60)
        }
        _ => return None,
    };
    // Howard Hinnant's days-from-civil.
    let y = if mo <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (mo + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + h * 3600 + mi * 60 + se - offset)
}

fn direction_of(s: &str) -> Direction {
    match s {
        "higher" => Direction::Higher,
        "lower" => Direction::Lower,
        _ => Direction::None,
    }
}

/// Mean total power of a run: the mean of each GPU's `power_watts` samples, summed over GPUs.
pub fn mean_power<'a>(telemetry: impl Iterator<Item = (&'a str, &'a str, f64)>) -> Option<f64> {
    let mut per_source: BTreeMap<&str, (f64, usize)> = BTreeMap::new();
    for (source, name, value) in telemetry {
        if name == "power_watts" && value.is_finite() {
            let e = per_source.entry(source).or_default();
            e.0 += value;
            e.1 += 1;
        }
    }
    (!per_source.is_empty()).then(|| per_source.values().map(|(s, n)| s / *n as f64).sum())
}

/// Adds runs to the series blobs, creating series keys as needed. Runs that are not `ok` or
/// `unstable` carry no results worth comparing and are left out.
pub(crate) async fn index_runs(
    conn: &mut SqliteConnection,
    runs: &[IndexRun<'_>],
) -> std::result::Result<(), sqlx::Error> {
    if runs.is_empty() {
        return Ok(());
    }
    let existing: Vec<(i64, String, String, String, String, String)> = sqlx::query_as(
        "SELECT id, config_fingerprint, benchmark, bench_config, software_fingerprint, metric FROM series_keys",
    )
    .fetch_all(&mut *conn)
    .await?;
    // Keys borrowed from the rows above and from the runs: no string copies per metric.
    let mut keys: HashMap<(&str, &str, &str, &str, &str), i64> = existing
        .iter()
        .map(|(id, c, b, bc, sw, m)| ((c.as_str(), b.as_str(), bc.as_str(), sw.as_str(), m.as_str()), *id))
        .collect();
    let mut by_host: BTreeMap<(&str, i64), Vec<(RunPoint, Vec<(i64, f64)>)>> = BTreeMap::new();
    for run in runs {
        let Some(t) = parse_rfc3339(run.started_at) else { continue };
        let Ok(run_id) = uuid::Uuid::parse_str(run.run_id) else { continue };
        let mut values = Vec::with_capacity(run.metrics.len());
        for &(name, value, unit, direction) in &run.metrics {
            if !value.is_finite() {
                continue;
            }
            let k = (run.config_fingerprint, run.benchmark, run.bench_config, run.software_fingerprint, name);
            let id = match keys.get(&k) {
                Some(id) => *id,
                None => {
                    let id: i64 = sqlx::query_scalar(
                        "INSERT INTO series_keys (config_fingerprint, config_name, benchmark, bench_config, software_fingerprint, metric, unit, direction) \
                         VALUES (?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
                    )
                    .bind(run.config_fingerprint)
                    .bind(run.config_name)
                    .bind(run.benchmark)
                    .bind(run.bench_config)
                    .bind(run.software_fingerprint)
                    .bind(name)
                    .bind(unit)
                    .bind(direction)
                    .fetch_one(&mut *conn)
                    .await?;
                    keys.insert(k, id);
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
    for ((host, period), new) in by_host {
        let existing: Option<Vec<u8>> =
            sqlx::query_scalar("SELECT data FROM host_series WHERE host_id = ? AND period = ?")
                .bind(host)
                .bind(period)
                .fetch_optional(&mut *conn)
                .await?;
        let mut series = existing.and_then(|b| HostSeries::decode(&b).ok()).unwrap_or_default();
        series.merge(new);
        sqlx::query("INSERT OR REPLACE INTO host_series (host_id, period, runs, points, data) VALUES (?, ?, ?, ?, ?)")
            .bind(host)
            .bind(period)
            .bind(series.runs.len() as i64)
            .bind(series.points() as i64)
            .bind(series.encode())
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Export and import.

/// The export format's version; a file from a newer kiln is refused.
pub const EXPORT_VERSION: i64 = 1;

#[derive(Serialize, Deserialize)]
struct Header {
    kiln_export: i64,
    exported_at: String,
    #[serde(default)]
    since: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HostRec {
    #[serde(rename = "type")]
    _kind: serde::de::IgnoredAny,
    id: String,
    identity: String,
    hostname: Option<String>,
    config_fingerprint: String,
    config_name: String,
    first_seen: String,
    last_seen: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct InventoryRec<'a> {
    #[serde(rename = "type")]
    _kind: serde::de::IgnoredAny,
    id: String,
    host_id: String,
    collected_at: String,
    schema_version: i64,
    config_fingerprint: String,
    config_name: String,
    cpu_model: Option<String>,
    cpu_packages: Option<i64>,
    cpu_cores: Option<i64>,
    cpu_threads: Option<i64>,
    memory_bytes: Option<i64>,
    kernel_release: Option<String>,
    problem_count: i64,
    #[serde(borrow)]
    document: &'a RawValue,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SoftwareRec<'a> {
    #[serde(rename = "type")]
    _kind: serde::de::IgnoredAny,
    id: String,
    fingerprint: String,
    #[serde(borrow)]
    document: &'a RawValue,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RunRec {
    #[serde(rename = "type")]
    _kind: serde::de::IgnoredAny,
    id: String,
    host_id: String,
    inventory_id: Option<String>,
    software_id: Option<String>,
    benchmark: String,
    config: String,
    started_at: String,
    finished_at: Option<String>,
    status: crate::RunStatus,
    #[serde(default)]
    metrics: Vec<(String, f64, String, String)>,
    #[serde(default)]
    samples: Vec<(String, i64, f64)>,
    #[serde(default)]
    telemetry: Vec<(i64, String, String, f64)>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EndRec {
    #[serde(rename = "type")]
    _kind: serde::de::IgnoredAny,
    records: u64,
}

/// One line of an export. (Parsed by hand on its `type`: serde's tagged enums buffer their
/// content, which neither borrows raw documents nor runs fast.)
enum Record<'a> {
    Host(HostRec),
    Inventory(InventoryRec<'a>),
    Software(SoftwareRec<'a>),
    Run(RunRec),
    End(EndRec),
}

fn parse_record(line: &str) -> std::result::Result<Record<'_>, serde_json::Error> {
    #[derive(Deserialize)]
    struct Kind {
        #[serde(rename = "type")]
        kind: String,
    }
    // The export writes `type` first; anything else is looked up the slow way.
    let fast = line.strip_prefix("{\"type\":\"").and_then(|rest| rest.split('"').next());
    let kind = match fast {
        Some(k) => k.to_string(),
        None => serde_json::from_str::<Kind>(line)?.kind,
    };
    Ok(match kind.as_str() {
        "host" => Record::Host(serde_json::from_str(line)?),
        "inventory" => Record::Inventory(serde_json::from_str(line)?),
        "software" => Record::Software(serde_json::from_str(line)?),
        "run" => Record::Run(serde_json::from_str(line)?),
        "end" => Record::End(serde_json::from_str(line)?),
        other => {
            return Err(serde::de::Error::custom(format!(
                "unknown record type {other:?} (host, inventory, software, run or end)"
            )))
        }
    })
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct ExportStats {
    pub hosts: u64,
    pub inventories: u64,
    pub software: u64,
    pub runs: u64,
    pub metrics: u64,
    pub samples: u64,
    pub telemetry: u64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct ImportStats {
    pub records: u64,
    pub hosts_new: u64,
    pub inventories_new: u64,
    pub software_new: u64,
    pub runs_new: u64,
    pub runs_known: u64,
    pub metrics: u64,
    pub samples: u64,
    pub telemetry: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("{file}:{line}: {message}; nothing was imported")]
    Malformed { file: String, line: usize, message: String },
    #[error("{file}: {message}; nothing was imported")]
    File { file: String, message: String },
    #[error(transparent)]
    Db(#[from] DbError),
}

fn json_line<T: Serialize>(out: &mut dyn Write, value: &T) -> std::io::Result<()> {
    serde_json::to_writer(&mut *out, value)?;
    out.write_all(b"\n")
}

impl Store {
    /// Loads every series key and every host with its series — those of the partitions that reach
    /// `since` (seconds since the epoch; older points of a reached partition are included: callers
    /// filter by time).
    pub async fn fleet(&mut self, since: Option<i64>) -> Result<Fleet> {
        let err = self.sql_err();
        let mut keys = BTreeMap::new();
        for r in sqlx::query("SELECT id, config_fingerprint, config_name, benchmark, bench_config, software_fingerprint, metric, unit, direction FROM series_keys")
            .fetch_all(&mut self.conn)
            .await
            .map_err(&err)?
        {
            let key = SeriesKey {
                id: r.get(0),
                config_fingerprint: r.get(1),
                config_name: r.get(2),
                benchmark: r.get(3),
                bench_config: r.get(4),
                software_fingerprint: r.get(5),
                metric: r.get(6),
                unit: r.get(7),
                direction: direction_of(&r.get::<String, _>(8)),
            };
            keys.insert(key.id, key);
        }
        // Every host, and its partitions that reach the window, oldest first.
        let first_period = since.map(period_of).unwrap_or(i64::MIN);
        let rows = sqlx::query(
            "SELECT h.id, h.hostname, h.config_fingerprint, h.config_name, s.data FROM hosts h \
             LEFT JOIN host_series s ON s.host_id = h.id AND s.period >= ?1 ORDER BY h.id, s.period",
        )
        .bind(first_period)
        .fetch_all(&mut self.conn)
        .await
        .map_err(&err)?;
        let mut hosts: Vec<FleetHost> = Vec::with_capacity(rows.len());
        // Per host being assembled: key → its points, in time order across partitions.
        let mut points: BTreeMap<i64, Vec<(u32, f64)>> = BTreeMap::new();
        let finish = |host: &mut FleetHost, points: &mut BTreeMap<i64, Vec<(u32, f64)>>| {
            host.data.series = std::mem::take(points).into_iter().map(|(key, points)| Series { key, points }).collect();
        };
        for r in rows {
            let id: String = r.get(0);
            if hosts.last().is_none_or(|h| h.id != id) {
                if let Some(last) = hosts.last_mut() {
                    finish(last, &mut points);
                }
                hosts.push(FleetHost {
                    id: id.clone(),
                    hostname: r.get(1),
                    config_fingerprint: r.get(2),
                    config_name: r.get(3),
                    data: HostSeries::default(),
                });
            }
            let Some(blob) = r.get::<Option<Vec<u8>>, _>(4) else { continue };
            let part = HostSeries::decode(&blob).map_err(|e| DbError::Corrupt {
                path: self.path.clone(),
                cause: sqlx::Error::Protocol(format!(
                    "series of host {id}: {e}; `kiln` rebuilds them from the runs when the table is emptied"
                )),
            })?;
            let host = hosts.last_mut().unwrap();
            let offset = host.data.runs.len() as u32;
            host.data.runs.extend(part.runs);
            for s in part.series {
                points.entry(s.key).or_default().extend(s.points.into_iter().map(|(run, v)| (run + offset, v)));
            }
        }
        if let Some(last) = hosts.last_mut() {
            finish(last, &mut points);
        }
        Ok(Fleet { keys, hosts })
    }

    /// What a run was measured on: (software fingerprint, software document, inventory document).
    pub async fn run_context(
        &mut self,
        run_id: &str,
    ) -> Result<Option<(Option<String>, Option<String>, Option<String>)>> {
        let row = sqlx::query(
            "SELECT s.fingerprint, s.document, i.document FROM runs r LEFT JOIN software_stacks s ON s.id = r.software_id \
             LEFT JOIN inventories i ON i.id = r.inventory_id WHERE r.id = ?",
        )
        .bind(run_id)
        .fetch_optional(&mut self.conn)
        .await
        .map_err(self.sql_err())?;
        Ok(row.map(|r| (r.get(0), r.get(1), r.get(2))))
    }

    /// The mean of each telemetry channel of a run: (source, name, mean, samples).
    pub async fn telemetry_means(&mut self, run_id: &str) -> Result<Vec<(String, String, f64, i64)>> {
        let rows = sqlx::query("SELECT source, name, AVG(value), COUNT(*) FROM telemetry WHERE run_id = ? GROUP BY source, name ORDER BY source, name")
            .bind(run_id)
            .fetch_all(&mut self.conn)
            .await
            .map_err(self.sql_err())?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1), r.get(2), r.get(3))).collect())
    }

    /// A host's newest inventory document.
    pub async fn latest_inventory(&mut self, host_id: &str) -> Result<Option<(String, String)>> {
        let row = sqlx::query("SELECT collected_at, document FROM inventories WHERE host_id = ? ORDER BY collected_at DESC, rowid DESC LIMIT 1")
            .bind(host_id)
            .fetch_optional(&mut self.conn)
            .await
            .map_err(self.sql_err())?;
        Ok(row.map(|r| (r.get(0), r.get(1))))
    }

    /// Rebuilds every host's series from the runs and metrics tables (after the migration that
    /// introduced them, or to repair them).
    pub async fn rebuild_series(&mut self) -> Result<()> {
        let err = self.sql_err();
        let mut tx = self.conn.begin().await.map_err(&err)?;
        sqlx::query("DELETE FROM host_series").execute(&mut *tx).await.map_err(&err)?;
        let rows = sqlx::query(
            "SELECT r.id, r.host_id, r.started_at, COALESCE(i.config_fingerprint, h.config_fingerprint), COALESCE(i.config_name, h.config_name), \
             r.benchmark, r.config, COALESCE(s.fingerprint, ''), \
             (SELECT json_group_array(json_array(m.name, m.value, m.unit, m.direction)) FROM metrics m WHERE m.run_id = r.id), \
             (SELECT SUM(a) FROM (SELECT AVG(t.value) AS a FROM telemetry t WHERE t.run_id = r.id AND t.name = 'power_watts' GROUP BY t.source)) \
             FROM runs r JOIN hosts h ON h.id = r.host_id LEFT JOIN inventories i ON i.id = r.inventory_id \
             LEFT JOIN software_stacks s ON s.id = r.software_id WHERE r.status IN ('ok', 'unstable')",
        )
        .fetch_all(&mut *tx)
        .await
        .map_err(&err)?;
        struct Owned {
            strings: [String; 8],
            metrics: Vec<(String, f64, String, String)>,
            power: Option<f64>,
        }
        let owned: Vec<Owned> = rows
            .iter()
            .map(|r| Owned {
                strings: [r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5), r.get(6), r.get(7)],
                metrics: serde_json::from_str(&r.get::<String, _>(8)).unwrap_or_default(),
                power: r.get(9),
            })
            .collect();
        let runs: Vec<IndexRun> = owned
            .iter()
            .map(|o| IndexRun {
                run_id: &o.strings[0],
                host_id: &o.strings[1],
                started_at: &o.strings[2],
                config_fingerprint: &o.strings[3],
                config_name: &o.strings[4],
                benchmark: &o.strings[5],
                bench_config: &o.strings[6],
                software_fingerprint: &o.strings[7],
                metrics: o.metrics.iter().map(|(n, v, u, d)| (n.as_str(), *v, u.as_str(), d.as_str())).collect(),
                power_watts: o.power,
            })
            .collect();
        index_runs(&mut tx, &runs).await.map_err(&err)?;
        tx.commit().await.map_err(&err)?;
        Ok(())
    }

    /// Writes every host, inventory, software stack and run (with metrics, samples, telemetry) —
    /// of runs started at or after `since`, when given — as JSON lines: a header, the records, and
    /// an end record with the count, so that a truncated file is recognised.
    pub async fn export(&mut self, since: Option<&str>, exported_at: &str, out: &mut dyn Write) -> Result<ExportStats> {
        let err = self.sql_err();
        let io = |e: std::io::Error| DbError::Open { path: "<output>".into(), source: e };
        let since = since.unwrap_or("");
        let mut stats = ExportStats::default();
        json_line(
            out,
            &Header {
                kiln_export: EXPORT_VERSION,
                exported_at: exported_at.to_string(),
                since: (!since.is_empty()).then(|| since.to_string()),
            },
        )
        .map_err(io)?;
        let mut records = 0u64;
        // Hosts with a run in the window (or an inventory, when there is no window).
        let hosts = sqlx::query(
            "SELECT json_object('type', 'host', 'id', id, 'identity', identity, 'hostname', hostname, 'config_fingerprint', config_fingerprint, \
             'config_name', config_name, 'first_seen', first_seen, 'last_seen', last_seen) FROM hosts h \
             WHERE ?1 = '' OR EXISTS (SELECT 1 FROM runs r WHERE r.host_id = h.id AND r.started_at >= ?1) ORDER BY id",
        )
        .bind(since)
        .fetch_all(&mut self.conn)
        .await
        .map_err(&err)?;
        for h in hosts {
            out.write_all(h.get::<String, _>(0).as_bytes()).and_then(|_| out.write_all(b"\n")).map_err(io)?;
            stats.hosts += 1;
        }
        let inventories = sqlx::query(
            "SELECT json_object('type', 'inventory', 'id', id, 'host_id', host_id, 'collected_at', collected_at, 'schema_version', schema_version, \
             'config_fingerprint', config_fingerprint, 'config_name', config_name, 'cpu_model', cpu_model, 'cpu_packages', cpu_packages, \
             'cpu_cores', cpu_cores, 'cpu_threads', cpu_threads, 'memory_bytes', memory_bytes, 'kernel_release', kernel_release, \
             'problem_count', problem_count, 'document', json(document)) FROM inventories i \
             WHERE ?1 = '' OR EXISTS (SELECT 1 FROM runs r WHERE r.inventory_id = i.id AND r.started_at >= ?1) ORDER BY collected_at",
        )
        .bind(since)
        .fetch_all(&mut self.conn)
        .await
        .map_err(&err)?;
        for i in inventories {
            out.write_all(i.get::<String, _>(0).as_bytes()).and_then(|_| out.write_all(b"\n")).map_err(io)?;
            stats.inventories += 1;
        }
        let software = sqlx::query(
            "SELECT json_object('type', 'software', 'id', id, 'fingerprint', fingerprint, 'document', json(document)) FROM software_stacks s \
             WHERE EXISTS (SELECT 1 FROM runs r WHERE r.software_id = s.id AND r.started_at >= ?1) ORDER BY id",
        )
        .bind(since)
        .fetch_all(&mut self.conn)
        .await
        .map_err(&err)?;
        for s in software {
            out.write_all(s.get::<String, _>(0).as_bytes()).and_then(|_| out.write_all(b"\n")).map_err(io)?;
            stats.software += 1;
        }
        // One row per run, its children folded in by SQLite's JSON functions: a few thousand rows
        // instead of millions.
        let runs = sqlx::query(
            "SELECT json_object('type', 'run', 'id', r.id, 'host_id', r.host_id, 'inventory_id', r.inventory_id, 'software_id', r.software_id, \
             'benchmark', r.benchmark, 'config', r.config, 'started_at', r.started_at, 'finished_at', r.finished_at, 'status', r.status, \
             'metrics', (SELECT json_group_array(json_array(name, value, unit, direction)) FROM metrics WHERE run_id = r.id), \
             'samples', (SELECT json_group_array(json_array(metric, idx, value)) FROM samples WHERE run_id = r.id), \
             'telemetry', (SELECT json_group_array(json_array(t_ms, source, name, value)) FROM telemetry WHERE run_id = r.id)), \
             (SELECT COUNT(*) FROM metrics WHERE run_id = r.id), (SELECT COUNT(*) FROM samples WHERE run_id = r.id), \
             (SELECT COUNT(*) FROM telemetry WHERE run_id = r.id) \
             FROM runs r WHERE r.started_at >= ?1 ORDER BY r.started_at, r.id",
        )
        .bind(since)
        .fetch_all(&mut self.conn)
        .await
        .map_err(&err)?;
        for r in runs {
            out.write_all(r.get::<String, _>(0).as_bytes()).and_then(|_| out.write_all(b"\n")).map_err(io)?;
            stats.runs += 1;
            stats.metrics += r.get::<i64, _>(1) as u64;
            stats.samples += r.get::<i64, _>(2) as u64;
            stats.telemetry += r.get::<i64, _>(3) as u64;
        }
        records += stats.hosts + stats.inventories + stats.software + stats.runs;
        json_line(out, &serde_json::json!({ "type": "end", "records": records })).map_err(io)?;
        out.flush().map_err(io)?;
        Ok(stats)
    }

    /// Imports an export: every line is parsed and checked first (a malformed or truncated file is
    /// refused with its line number, and nothing is imported), then everything goes in as one
    /// transaction. Records carry UUIDs: what is already here is skipped, so importing twice adds
    /// nothing. Hosts merge by identity, software stacks by fingerprint.
    pub async fn import(&mut self, file: &str, text: &str) -> std::result::Result<ImportStats, ImportError> {
        let malformed = |line: usize, message: String| ImportError::Malformed { file: file.to_string(), line, message };
        let mut lines = text.split_inclusive('\n').enumerate().map(|(i, l)| (i + 1, l));
        let Some((_, first)) = lines.next() else {
            return Err(ImportError::File { file: file.into(), message: "empty file, not a kiln export".into() });
        };
        let header: Header = serde_json::from_str(first.trim_end())
            .map_err(|e| malformed(1, format!("not a kiln export header ({e})")))?;
        if header.kiln_export > EXPORT_VERSION {
            return Err(malformed(
                1,
                format!(
                    "export format {} is newer than this kiln knows ({EXPORT_VERSION}); upgrade kiln",
                    header.kiln_export
                ),
            ));
        }
        // Lines are parsed on every core (the file is in memory), then checked in order.
        let lines: Vec<(usize, &str)> = lines.collect();
        let workers = std::thread::available_parallelism().map_or(1, |n| n.get()).min(8);
        let chunk = lines.len().div_ceil(workers).max(1);
        let parsed: Vec<Vec<(usize, std::result::Result<Option<Record>, String>)>> = std::thread::scope(|scope| {
            let handles: Vec<_> = lines
                .chunks(chunk)
                .map(|part| {
                    scope.spawn(move || {
                        part.iter()
                            .map(|&(n, line)| {
                                if !line.ends_with('\n') {
                                    return (
                                        n,
                                        Err("the last line is cut off (no newline): the file is truncated".to_string()),
                                    );
                                }
                                let body = line.trim_end();
                                if body.is_empty() {
                                    return (n, Ok(None));
                                }
                                (n, parse_record(body).map(Some).map_err(|e| e.to_string()))
                            })
                            .collect()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("parser thread")).collect()
        });
        let mut records = Vec::new();
        let mut end: Option<(usize, u64)> = None;
        for (n, record) in parsed.into_iter().flatten() {
            let record = record.map_err(|e| malformed(n, e))?;
            let Some(record) = record else { continue };
            if let Some((at, _)) = end {
                return Err(malformed(n, format!("data after the end record of line {at}")));
            }
            if let Record::End(EndRec { records: count, .. }) = record {
                end = Some((n, count));
            } else {
                records.push((n, record));
            }
        }
        let Some((at, count)) = end else {
            return Err(ImportError::File {
                file: file.into(),
                message: "no end record: the file is truncated".into(),
            });
        };
        if count != records.len() as u64 {
            return Err(malformed(
                at,
                format!("the end record counts {count} records, the file holds {}", records.len()),
            ));
        }
        self.import_records(records, &malformed).await
    }

    async fn import_records(
        &mut self,
        records: Vec<(usize, Record<'_>)>,
        malformed: &dyn Fn(usize, String) -> ImportError,
    ) -> std::result::Result<ImportStats, ImportError> {
        let err = self.sql_err();
        let mut stats = ImportStats { records: records.len() as u64, ..Default::default() };
        // A page cache large enough that a big import does not spill pages mid-transaction.
        sqlx::query("PRAGMA cache_size = -262144").execute(&mut self.conn).await.map_err(&err)?;
        let mut tx = self.conn.begin().await.map_err(&err)?;
        // Hosts: by identity; an export's id maps onto the id this database already has.
        let mut host_ids: HashMap<String, String> = HashMap::new();
        let mut software_ids: HashMap<String, String> = HashMap::new();
        let mut host_configs: HashMap<String, (String, String)> = HashMap::new();
        let existing_hosts: HashMap<String, String> = sqlx::query("SELECT identity, id FROM hosts")
            .fetch_all(&mut *tx)
            .await
            .map_err(&err)?
            .into_iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        let existing_software: HashMap<String, String> = sqlx::query("SELECT fingerprint, id FROM software_stacks")
            .fetch_all(&mut *tx)
            .await
            .map_err(&err)?
            .into_iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        let mut inventory_configs: HashMap<String, (String, String)> = HashMap::new();
        for (n, rec) in &records {
            match rec {
                Record::Host(HostRec {
                    id,
                    identity,
                    hostname,
                    config_fingerprint,
                    config_name,
                    first_seen,
                    last_seen,
                    ..
                }) => {
                    host_configs.insert(id.clone(), (config_fingerprint.clone(), config_name.clone()));
                    if let Some(known) = existing_hosts.get(identity) {
                        host_ids.insert(id.clone(), known.clone());
                        sqlx::query(
                            "UPDATE hosts SET last_seen = MAX(last_seen, ?1), first_seen = MIN(first_seen, ?2), \
                             hostname = CASE WHEN ?1 > last_seen THEN COALESCE(?3, hostname) ELSE hostname END, \
                             config_fingerprint = CASE WHEN ?1 > last_seen THEN ?4 ELSE config_fingerprint END, \
                             config_name = CASE WHEN ?1 > last_seen THEN ?5 ELSE config_name END WHERE id = ?6",
                        )
                        .bind(last_seen)
                        .bind(first_seen)
                        .bind(hostname)
                        .bind(config_fingerprint)
                        .bind(config_name)
                        .bind(known)
                        .execute(&mut *tx)
                        .await
                        .map_err(&err)?;
                    } else {
                        sqlx::query("INSERT INTO hosts (id, identity, hostname, config_fingerprint, config_name, first_seen, last_seen) VALUES (?, ?, ?, ?, ?, ?, ?)")
                            .bind(id)
                            .bind(identity)
                            .bind(hostname)
                            .bind(config_fingerprint)
                            .bind(config_name)
                            .bind(first_seen)
                            .bind(last_seen)
                            .execute(&mut *tx)
                            .await
                            .map_err(|e| malformed(*n, format!("host {id}: {e}")))?;
                        host_ids.insert(id.clone(), id.clone());
                        stats.hosts_new += 1;
                    }
                }
                Record::Software(SoftwareRec { id, fingerprint, document, .. }) => {
                    if let Some(known) = existing_software.get(fingerprint) {
                        software_ids.insert(id.clone(), known.clone());
                    } else {
                        sqlx::query(
                            "INSERT OR IGNORE INTO software_stacks (id, fingerprint, document) VALUES (?, ?, ?)",
                        )
                        .bind(id)
                        .bind(fingerprint)
                        .bind(document.get())
                        .execute(&mut *tx)
                        .await
                        .map_err(&err)?;
                        software_ids.insert(id.clone(), id.clone());
                        stats.software_new += 1;
                    }
                }
                Record::Inventory(InventoryRec {
                    id,
                    host_id,
                    collected_at,
                    schema_version,
                    config_fingerprint,
                    config_name,
                    cpu_model,
                    cpu_packages,
                    cpu_cores,
                    cpu_threads,
                    memory_bytes,
                    kernel_release,
                    problem_count,
                    document,
                    ..
                }) => {
                    let Some(host) = host_ids.get(host_id) else {
                        return Err(malformed(
                            *n,
                            format!("inventory {id} names host {host_id}, which no earlier host record gives"),
                        ));
                    };
                    inventory_configs.insert(id.clone(), (config_fingerprint.clone(), config_name.clone()));
                    let done = sqlx::query(
                        "INSERT OR IGNORE INTO inventories (id, host_id, collected_at, schema_version, config_fingerprint, config_name, \
                         cpu_model, cpu_packages, cpu_cores, cpu_threads, memory_bytes, kernel_release, problem_count, document) \
                         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    )
                    .bind(id)
                    .bind(host)
                    .bind(collected_at)
                    .bind(schema_version)
                    .bind(config_fingerprint)
                    .bind(config_name)
                    .bind(cpu_model)
                    .bind(cpu_packages)
                    .bind(cpu_cores)
                    .bind(cpu_threads)
                    .bind(memory_bytes)
                    .bind(kernel_release)
                    .bind(problem_count)
                    .bind(document.get())
                    .execute(&mut *tx)
                    .await
                    .map_err(&err)?;
                    stats.inventories_new += done.rows_affected();
                }
                Record::Run(_) | Record::End(_) => {}
            }
        }
        // Runs: which are new? (Batched lookups; a fresh database answers with nothing.)
        let run_ids: Vec<&str> = records
            .iter()
            .filter_map(|(_, r)| if let Record::Run(r) = r { Some(r.id.as_str()) } else { None })
            .collect();
        let mut known_runs: HashSet<String> = HashSet::new();
        for chunk in run_ids.chunks(MAX_BINDS) {
            let mut q = QueryBuilder::new("SELECT id FROM runs WHERE id IN (");
            let mut sep = q.separated(", ");
            for id in chunk {
                sep.push_bind(*id);
            }
            q.push(")");
            for r in q.build().fetch_all(&mut *tx).await.map_err(&err)? {
                known_runs.insert(r.get(0));
            }
        }
        // Inventories a run may name: those in this file (inserted above) and those already here.
        let mut known_inventories: HashSet<String> = inventory_configs.keys().cloned().collect();
        let outside: Vec<&str> =
            records
                .iter()
                .filter_map(|(_, r)| {
                    if let Record::Run(RunRec { inventory_id: Some(i), .. }) = r {
                        Some(i.as_str())
                    } else {
                        None
                    }
                })
                .filter(|i| !known_inventories.contains(*i))
                .collect();
        for chunk in outside.chunks(MAX_BINDS) {
            let mut q = QueryBuilder::new("SELECT id FROM inventories WHERE id IN (");
            let mut sep = q.separated(", ");
            for id in chunk {
                sep.push_bind(*id);
            }
            q.push(")");
            for r in q.build().fetch_all(&mut *tx).await.map_err(&err)? {
                known_inventories.insert(r.get(0));
            }
        }
        struct NewRunRef<'r, 'a> {
            id: &'r str,
            host: String,
            inventory: Option<&'r str>,
            software: Option<String>,
            rec: &'r Record<'a>,
        }
        let mut fresh: Vec<NewRunRef> = Vec::new();
        for (n, rec) in &records {
            let Record::Run(RunRec { id, host_id, inventory_id, software_id, .. }) = rec else { continue };
            if known_runs.contains(id) {
                stats.runs_known += 1;
                continue;
            }
            let Some(host) = host_ids.get(host_id) else {
                return Err(malformed(*n, format!("run {id} names host {host_id}, which no host record gives")));
            };
            let software = match software_id {
                Some(s) => Some(software_ids.get(s).cloned().ok_or_else(|| {
                    malformed(*n, format!("run {id} names software stack {s}, which no software record gives"))
                })?),
                None => None,
            };
            if let Some(inv) = inventory_id {
                if !known_inventories.contains(inv) {
                    return Err(malformed(
                        *n,
                        format!("run {id} names inventory {inv}, which no inventory record gives"),
                    ));
                }
            }
            if uuid::Uuid::parse_str(id).is_err() {
                return Err(malformed(*n, format!("run id {id:?} is not a UUID")));
            }
            known_runs.insert(id.clone());
            fresh.push(NewRunRef { id, host: host.clone(), inventory: inventory_id.as_deref(), software, rec });
        }
        fresh.sort_unstable_by(|a, b| a.id.cmp(b.id));
        stats.runs_new = fresh.len() as u64;
        for chunk in fresh.chunks(MAX_BINDS / 9) {
            let mut q = QueryBuilder::new("INSERT INTO runs (id, host_id, inventory_id, software_id, benchmark, config, started_at, finished_at, status) ");
            q.push_values(chunk, |mut b, r| {
                let Record::Run(RunRec { benchmark, config, started_at, finished_at, status, .. }) = r.rec else {
                    unreachable!()
                };
                b.push_bind(r.id)
                    .push_bind(&r.host)
                    .push_bind(r.inventory)
                    .push_bind(&r.software)
                    .push_bind(benchmark)
                    .push_bind(config)
                    .push_bind(started_at)
                    .push_bind(finished_at)
                    .push_bind(status.as_str());
            });
            q.build().execute(&mut *tx).await.map_err(&err)?;
        }
        // Their values, numbered in run-id order (the runs are sorted) and written key-sorted.
        let ids: Vec<&str> = fresh.iter().map(|r| r.id).collect();
        let nums = crate::values::run_numbers(&mut tx, &ids).await.map_err(&err)?;
        let mut v = crate::values::Values::default();
        for r in &fresh {
            let Record::Run(rec) = r.rec else { continue };
            v.metrics.extend(rec.metrics.iter().map(|(n, x, u, d)| (r.id, n.as_str(), u.as_str(), d.as_str(), *x)));
            v.samples.extend(rec.samples.iter().map(|(m, i, x)| (r.id, m.as_str(), *i, *x)));
            v.telemetry.extend(rec.telemetry.iter().map(|(t, src, n, x)| (r.id, src.as_str(), n.as_str(), *t, *x)));
        }
        crate::values::write(&mut tx, &nums, &v).await.map_err(&err)?;
        (stats.metrics, stats.samples, stats.telemetry) =
            (v.metrics.len() as u64, v.samples.len() as u64, v.telemetry.len() as u64);
        // The series of the new runs.
        let mut software_fps: HashMap<String, String> = HashMap::new();
        for r in sqlx::query("SELECT id, fingerprint FROM software_stacks").fetch_all(&mut *tx).await.map_err(&err)? {
            software_fps.insert(r.get(0), r.get(1));
        }
        let empty = (String::new(), String::new());
        let index: Vec<IndexRun> = fresh
            .iter()
            .filter_map(|r| {
                let Record::Run(RunRec { host_id, benchmark, config, started_at, status, metrics, telemetry, .. }) =
                    r.rec
                else {
                    return None;
                };
                if !status.is_result() {
                    return None;
                }
                let (cfp, cname) = r
                    .inventory
                    .and_then(|i| inventory_configs.get(i))
                    .or_else(|| host_configs.get(host_id))
                    .unwrap_or(&empty);
                Some(IndexRun {
                    host_id: &r.host,
                    run_id: r.id,
                    started_at,
                    config_fingerprint: cfp,
                    config_name: cname,
                    benchmark,
                    bench_config: config,
                    software_fingerprint: r
                        .software
                        .as_ref()
                        .and_then(|s| software_fps.get(s))
                        .map_or("", String::as_str),
                    metrics: metrics.iter().map(|(n, v, u, d)| (n.as_str(), *v, u.as_str(), d.as_str())).collect(),
                    power_watts: mean_power(telemetry.iter().map(|(_, s, n, v)| (s.as_str(), n.as_str(), *v))),
                })
            })
            .collect();
        index_runs(&mut tx, &index).await.map_err(&err)?;
        tx.commit().await.map_err(&err)?;
        Ok(stats)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blob_round_trip_and_merge_in_time_order() {
        let id = |n: u8| uuid::Uuid::from_bytes([n; 16]);
        let mut s = HostSeries::default();
        s.merge(vec![(RunPoint { run_id: id(2), t: 200, power_watts: Some(700.0) }, vec![(1, 2.0), (2, 20.0)])]);
        s.merge(vec![
            (RunPoint { run_id: id(1), t: 100, power_watts: None }, vec![(1, 1.0)]),
            (RunPoint { run_id: id(2), t: 200, power_watts: None }, vec![(1, 99.0)]), // already there
        ]);
        assert_eq!(s.runs.iter().map(|r| r.t).collect::<Vec<_>>(), [100, 200]);
        assert_eq!(
            s.series,
            vec![Series { key: 1, points: vec![(0, 1.0), (1, 2.0)] }, Series { key: 2, points: vec![(1, 20.0)] }]
        );
        let back = HostSeries::decode(&s.encode()).unwrap();
        assert_eq!(back, s);
        assert!(HostSeries::decode(&s.encode()[..20]).is_err());
    }

    #[test]
    fn rfc3339() {
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(parse_rfc3339("2000-02-29T00:00:00Z"), Some(951_782_400));
        assert_eq!(parse_rfc3339("2026-12-02T15:33:58.126Z"), Some(1_796_225_638));
        assert_eq!(parse_rfc3339("2026-12-02T16:33:58+01:00"), Some(1_796_225_638));
        assert_eq!(parse_rfc3339("yesterday"), None);
    }
}

//! The fleet as the analyses see it: every host with its series (loaded by window), series keys,
//! and the per-run details they ask for (telemetry means, context, the latest inventory).

use std::collections::BTreeMap;

use sqlx::{Connection, Row};

use crate::engine::Conn;
use crate::queries::index::{index_runs, IndexRun};
use crate::series::{HostSeries, SeriesKey};
use crate::{Direction, Result, Store};

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

pub(crate) fn direction_of(s: &str) -> Direction {
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

impl Store {
    /// Rebuilds every host's series from the runs and metrics tables (after the migration that
    /// introduced them, or to repair them).
    pub async fn rebuild_series(&mut self) -> Result<()> {
        let err = self.sql_err();
        let mut tx = self.conn.begin_with(crate::WRITE).await.map_err(&err)?;
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
        index_runs(&mut Conn::Sqlite(&mut tx), &runs).await.map_err(&err)?;
        tx.commit().await.map_err(&err)?;
        Ok(())
    }
}

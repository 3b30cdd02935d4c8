//! What the fleet service and the read commands ask of a store: hosts, runs, inventories, the
//! fleet's series, verdicts, the provisioning journal — written once, compiled for each engine (see `shared/mod.rs`).

use std::collections::{BTreeMap, BTreeSet};

use crate::engine::{query, sql_err, Backend, Builder, Conn, Row};
use crate::fleet::{direction_of, Fleet, FleetHost};
use crate::series::{period_of, HostSeries, Series, SeriesKey};
use crate::{
    like_prefix, ApplyRow, DbError, HostRow, InventoryRow, Metric, NewVerdict, Result, RunContexts, RunDetail, RunRefs,
    RunRow, StepRow, VerdictRow, RUN_COLUMNS,
};

/// The columns [`apply_row`] reads, in its order.
pub(crate) const APPLY_COLUMNS: &str =
    "id, image, image_version, image_hash, root, hostname, started_at, finished_at, resumes, status";

/// The columns [`step_row`] reads, in its order.
pub(crate) const STEP_COLUMNS: &str =
    "seq, step_key, summary, command, image_hash, started_at, finished_at, status, exit_code, duration_ms, output_tail";

pub(crate) fn apply_row(r: &Row) -> ApplyRow {
    ApplyRow {
        id: r.get(0),
        image: r.get(1),
        image_version: r.get(2),
        image_hash: r.get(3),
        root: r.get(4),
        hostname: r.get(5),
        started_at: r.get(6),
        finished_at: r.get(7),
        resumes: r.get(8),
        status: r.get(9),
    }
}

pub(crate) fn step_row(r: &Row) -> StepRow {
    StepRow {
        seq: r.get(0),
        step_key: r.get(1),
        summary: r.get(2),
        command: r.get(3),
        image_hash: r.get(4),
        started_at: r.get(5),
        finished_at: r.get(6),
        status: r.get(7),
        exit_code: r.get(8),
        duration_ms: r.get(9),
        output_tail: r.get(10),
    }
}

/// Inserts a verdict row under `id` (kept as it is when that id is there already: an import of
/// what this database holds). Returns the rows written, 0 or 1.
pub(crate) async fn insert_verdict(conn: &mut Conn<'_>, id: &str, v: &NewVerdict) -> sqlx::Result<u64> {
    query(
        "INSERT INTO verdicts (id, host_id, inventory_id, judged_at, spec_name, spec_hash, spec, verdict, \
         failed, document) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) ON CONFLICT DO NOTHING",
    )
    .bind(id)
    .bind(&v.host_id)
    .bind(&v.inventory_id)
    .bind(&v.judged_at)
    .bind(&v.spec_name)
    .bind(&v.spec_hash)
    .bind(&v.spec)
    .bind(&v.verdict)
    .bind(v.failed)
    .bind(&v.document)
    .execute(conn)
    .await
}

/// A verdict's columns but its document.
const SUMMARY: &str = "id, host_id, inventory_id, judged_at, spec_name, spec_hash, verdict, failed";

/// `v` is its host's newest verdict.
const NEWEST: &str =
    "v.rowid = (SELECT rowid FROM verdicts w WHERE w.host_id = v.host_id ORDER BY judged_at DESC, rowid DESC LIMIT 1)";

fn row(r: &Row) -> VerdictRow {
    VerdictRow {
        id: r.get(0),
        host_id: r.get(1),
        inventory_id: r.get(2),
        judged_at: r.get(3),
        spec_name: r.get(4),
        spec_hash: r.get(5),
        verdict: r.get(6),
        failed: r.get(7),
        document: r.get(8),
    }
}

pub(crate) async fn metrics_of(s: &mut impl Backend, run_id: &str) -> Result<Vec<Metric>> {
    let err = sql_err(s);
    let rows = query("SELECT name, value, unit, direction FROM metrics WHERE run_id = $1 ORDER BY name")
        .bind(run_id)
        .fetch_all(&mut s.conn())
        .await
        .map_err(err)?;
    Ok(rows
        .into_iter()
        .map(|r| Metric {
            name: r.get(0),
            value: r.get(1),
            unit: r.get(2),
            direction: direction_of(&r.get::<String>(3)),
        })
        .collect())
}

/// Each host's newest run start (RFC 3339), by host id.
pub(crate) async fn last_runs(s: &mut impl Backend) -> Result<std::collections::BTreeMap<String, String>> {
    let err = sql_err(s);
    let rows: Vec<(String, String)> = query("SELECT host_id, MAX(started_at) FROM runs GROUP BY host_id")
        .fetch_all_as(&mut s.conn())
        .await
        .map_err(err)?;
    Ok(rows.into_iter().collect())
}

/// The most recent runs first, with their metrics.
pub(crate) async fn runs(s: &mut impl Backend, limit: i64) -> Result<Vec<RunRow>> {
    let err = sql_err(s);
    let sql = format!(
        "SELECT {RUN_COLUMNS} FROM runs r JOIN hosts h ON h.id = r.host_id \
             ORDER BY r.started_at DESC, r.rowid DESC LIMIT $1"
    );
    let rows = query(sql).bind(limit).fetch_all(&mut s.conn()).await.map_err(err)?;
    with_metrics(s, rows).await
}

/// Rows of [`RUN_COLUMNS`] as runs, each with its metrics.
pub(crate) async fn with_metrics(s: &mut impl Backend, rows: Vec<Row>) -> Result<Vec<RunRow>> {
    let mut out = Vec::new();
    for r in rows {
        let id: String = r.get(0);
        let metrics = metrics_of(s, &id).await?;
        out.push(RunRow {
            id,
            host_id: r.get(1),
            hostname: r.get(2),
            benchmark: r.get(3),
            config: r.get(4),
            started_at: r.get(5),
            finished_at: r.get(6),
            status: r.get(7),
            status_reason: r.get(8),
            metrics,
        });
    }
    Ok(out)
}

/// One run by id or unique prefix, with its samples and telemetry.
pub(crate) async fn run(s: &mut impl Backend, id: &str) -> Result<RunDetail> {
    let err = sql_err(s);
    let pattern = like_prefix(id);
    let rows = query(
            "SELECT r.id, r.host_id, h.hostname, r.benchmark, r.config, r.started_at, r.finished_at, r.status, s.document, \
                    r.status_reason \
             FROM runs r JOIN hosts h ON h.id = r.host_id LEFT JOIN software_stacks s ON s.id = r.software_id \
             WHERE r.id LIKE $1 ESCAPE '\\' LIMIT 2",
        )
        .bind(&pattern)
        .fetch_all(&mut s.conn())
        .await
        .map_err(&err)?;
    let r = match rows.len() {
        0 => return Err(DbError::NotFound { what: "run", id: id.to_string() }),
        1 => &rows[0],
        count => return Err(DbError::Ambiguous { what: "run", id: id.to_string(), count }),
    };
    let run_id: String = r.get(0);
    let samples = query("SELECT metric, idx, value FROM samples WHERE run_id = $1 ORDER BY metric, idx")
        .bind(&run_id)
        .fetch_all(&mut s.conn())
        .await
        .map_err(&err)?
        .into_iter()
        .map(|s| (s.get(0), s.get(1), s.get(2)))
        .collect();
    let telemetry =
        query("SELECT t_ms, source, name, value FROM telemetry WHERE run_id = $1 ORDER BY t_ms, source, name")
            .bind(&run_id)
            .fetch_all(&mut s.conn())
            .await
            .map_err(&err)?
            .into_iter()
            .map(|t| (t.get(0), t.get(1), t.get(2), t.get(3)))
            .collect();
    let metrics = metrics_of(s, &run_id).await?;
    Ok(RunDetail {
        software: r.get(8),
        run: RunRow {
            id: run_id,
            host_id: r.get(1),
            hostname: r.get(2),
            benchmark: r.get(3),
            config: r.get(4),
            started_at: r.get(5),
            finished_at: r.get(6),
            status: r.get(7),
            status_reason: r.get(9),
            metrics,
        },
        samples,
        telemetry,
    })
}

/// Every known host with its inventory count, most recently seen first.
pub(crate) async fn hosts(s: &mut impl Backend) -> Result<Vec<HostRow>> {
    let err = sql_err(s);
    let rows = query(
            "SELECT h.id, h.identity, h.hostname, h.config_fingerprint, h.config_name, h.first_seen, h.last_seen, \
                    COUNT(i.id) AS n, \
                    (SELECT id FROM inventories WHERE host_id = h.id ORDER BY collected_at DESC, rowid DESC LIMIT 1) AS latest \
             FROM hosts h LEFT JOIN inventories i ON i.host_id = h.id \
             GROUP BY h.id ORDER BY h.last_seen DESC, h.id",
        )
        .fetch_all(&mut s.conn())
        .await
        .map_err(err)?;
    Ok(rows
        .into_iter()
        .map(|r| HostRow {
            id: r.get(0),
            identity: r.get(1),
            hostname: r.get(2),
            config_fingerprint: r.get(3),
            config_name: r.get(4),
            first_seen: r.get(5),
            last_seen: r.get(6),
            inventories: r.get(7),
            latest_inventory: r.get(8),
        })
        .collect())
}

/// One inventory by its id or a unique prefix of it.
pub(crate) async fn inventory(s: &mut impl Backend, id: &str) -> Result<InventoryRow> {
    let err = sql_err(s);
    let pattern = like_prefix(id);
    let rows = query(
        "SELECT id, host_id, collected_at, config_fingerprint, document FROM inventories \
             WHERE id LIKE $1 ESCAPE '\\' LIMIT 2",
    )
    .bind(&pattern)
    .fetch_all(&mut s.conn())
    .await
    .map_err(err)?;
    match rows.len() {
        0 => Err(DbError::NotFound { what: "inventory", id: id.to_string() }),
        1 => {
            let r = &rows[0];
            Ok(InventoryRow {
                id: r.get(0),
                host_id: r.get(1),
                collected_at: r.get(2),
                config_fingerprint: r.get(3),
                document: r.get(4),
            })
        }
        count => Err(DbError::Ambiguous { what: "inventory", id: id.to_string(), count }),
    }
}

/// Loads every series key and every host with its series — those of the partitions that reach
/// `since` (seconds since the epoch; older points of a reached partition are included: callers
/// filter by time).
pub(crate) async fn fleet(s: &mut impl Backend, since: Option<i64>) -> Result<Fleet> {
    let err = sql_err(s);
    let mut keys = BTreeMap::new();
    for r in query("SELECT id, config_fingerprint, config_name, benchmark, bench_config, software_fingerprint, metric, unit, direction FROM series_keys")
            .fetch_all(&mut s.conn())
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
                direction: direction_of(&r.get::<String>(8)),
            };
            keys.insert(key.id, key);
        }
    // Every host, and its partitions that reach the window, oldest first.
    let first_period = since.map(period_of).unwrap_or(i64::MIN);
    let rows = query(
        "SELECT h.id, h.hostname, h.config_fingerprint, h.config_name, s.data FROM hosts h \
             LEFT JOIN host_series s ON s.host_id = h.id AND s.period >= $1 ORDER BY h.id, s.period",
    )
    .bind(first_period)
    .fetch_all(&mut s.conn())
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
        let Some(blob) = r.get::<Option<Vec<u8>>>(4) else { continue };
        let part = HostSeries::decode(&blob).map_err(|e| DbError::Corrupt {
            path: s.path().to_path_buf(),
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

/// What runs were measured on, by run id, with the documents of the stacks and inventories in
/// which consecutive runs of `boundaries` differ (the documents of runs that share their stack
/// and inventory are never read: a regression search may ask about thousands of runs, and an
/// inventory can be tens of kilobytes). Batched: a handful of statements for any number of runs.
pub(crate) async fn run_contexts(s: &mut impl Backend, boundaries: &[(String, String)]) -> Result<RunContexts> {
    let err = sql_err(s);
    let ids: BTreeSet<&str> = boundaries.iter().flat_map(|(a, b)| [a.as_str(), b.as_str()]).collect();
    let ids: Vec<&str> = ids.into_iter().collect();
    let mut out = RunContexts::default();
    for chunk in ids.chunks(crate::MAX_BINDS) {
        let mut q = Builder::new(
            "SELECT r.id, s.fingerprint, r.software_id, r.inventory_id FROM runs r \
                 LEFT JOIN software_stacks s ON s.id = r.software_id WHERE r.id IN (",
        );
        q.list(chunk.iter().copied());
        q.push(")");
        for r in q.build().fetch_all(&mut s.conn()).await.map_err(&err)? {
            let refs = RunRefs { software_fingerprint: r.get(1), software_id: r.get(2), inventory_id: r.get(3) };
            out.runs.insert(r.get(0), refs);
        }
    }
    // The documents that a boundary's difference needs.
    let (mut software, mut inventories) = (BTreeSet::new(), BTreeSet::new());
    for (a, b) in boundaries {
        let (Some(a), Some(b)) = (out.runs.get(a), out.runs.get(b)) else { continue };
        if a.software_fingerprint != b.software_fingerprint {
            software.extend([&a.software_id, &b.software_id].into_iter().flatten().cloned());
        }
        if a.inventory_id != b.inventory_id {
            inventories.extend([&a.inventory_id, &b.inventory_id].into_iter().flatten().cloned());
        }
    }
    for (table, wanted, into) in
        [("software_stacks", software, &mut out.software), ("inventories", inventories, &mut out.inventories)]
    {
        let wanted: Vec<String> = wanted.into_iter().collect();
        for chunk in wanted.chunks(crate::MAX_BINDS) {
            let mut q = Builder::new(format!("SELECT id, document FROM {table} WHERE id IN ("));
            q.list(chunk);
            q.push(")");
            for r in q.build().fetch_all(&mut s.conn()).await.map_err(&err)? {
                into.insert(r.get(0), r.get(1));
            }
        }
    }
    Ok(out)
}

/// The mean of each telemetry channel of a run: (source, name, mean, samples).
pub(crate) async fn telemetry_means(s: &mut impl Backend, run_id: &str) -> Result<Vec<(String, String, f64, i64)>> {
    let rows = query("SELECT source, name, AVG(value), COUNT(*) FROM telemetry WHERE run_id = $1 GROUP BY source, name ORDER BY source, name")
            .bind(run_id)
            .fetch_all(&mut s.conn())
            .await
            .map_err(sql_err(s))?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1), r.get(2), r.get(3))).collect())
}

/// A host's newest inventory document.
pub(crate) async fn latest_inventory(s: &mut impl Backend, host_id: &str) -> Result<Option<(String, String)>> {
    let row = query("SELECT collected_at, document FROM inventories WHERE host_id = $1 ORDER BY collected_at DESC, rowid DESC LIMIT 1")
            .bind(host_id)
            .fetch_optional(&mut s.conn())
            .await
            .map_err(sql_err(s))?;
    Ok(row.map(|r| (r.get(0), r.get(1))))
}

/// The newest verdict of every host that has one, without its document (the hosts list needs
/// the decision, not every check of a fleet).
pub(crate) async fn latest_verdicts(s: &mut impl Backend) -> Result<BTreeMap<String, VerdictRow>> {
    let err = sql_err(s);
    let sql = format!("SELECT {SUMMARY}, NULL FROM verdicts v WHERE {NEWEST}");
    let rows = query(sql).fetch_all(&mut s.conn()).await.map_err(err)?;
    Ok(rows.iter().map(row).map(|v| (v.host_id.clone(), v)).collect())
}

/// The newest verdict of one host, with its document.
pub(crate) async fn latest_verdict(s: &mut impl Backend, host_id: &str) -> Result<Option<VerdictRow>> {
    let err = sql_err(s);
    let sql = format!("SELECT {SUMMARY}, document FROM verdicts v WHERE v.host_id = $1 AND {NEWEST}");
    let found = query(sql).bind(host_id).fetch_optional(&mut s.conn()).await.map_err(err)?;
    Ok(found.as_ref().map(row))
}

/// Every rank's runs of one cluster run (`kiln cluster …`, by the `cluster_id` in their
/// configuration, or a unique prefix of it), oldest first, each with its samples.
pub(crate) async fn runs_of_cluster(s: &mut impl Backend, cluster_id: &str) -> Result<Vec<RunDetail>> {
    let err = sql_err(s);
    let pattern = format!("%\"cluster_id\":\"{}", like_prefix(cluster_id));
    let rows = query("SELECT id, config FROM runs WHERE config LIKE $1 ESCAPE '\\' ORDER BY started_at, rowid")
        .bind(&pattern)
        .fetch_all(&mut s.conn())
        .await
        .map_err(&err)?;
    let ids: BTreeSet<String> = rows
        .iter()
        .filter_map(|r| {
            let config: String = r.get(1);
            let v: serde_json::Value = serde_json::from_str(&config).ok()?;
            v["cluster_id"].as_str().map(str::to_string)
        })
        .collect();
    match ids.len() {
        0 => return Err(DbError::NotFound { what: "cluster run", id: cluster_id.to_string() }),
        1 => {}
        count => return Err(DbError::Ambiguous { what: "cluster run", id: cluster_id.to_string(), count }),
    }
    let mut runs = Vec::with_capacity(rows.len());
    for r in &rows {
        let id: String = r.get(0);
        runs.push(run(s, &id).await?);
    }
    Ok(runs)
}

/// The runs taken with one inventory, oldest first, with their metrics.
pub(crate) async fn runs_of_inventory(s: &mut impl Backend, inventory_id: &str) -> Result<Vec<RunRow>> {
    let err = sql_err(s);
    let sql = format!(
        "SELECT {RUN_COLUMNS} FROM runs r JOIN hosts h ON h.id = r.host_id \
             WHERE r.inventory_id = $1 ORDER BY r.started_at, r.rowid"
    );
    let rows = query(sql).bind(inventory_id).fetch_all(&mut s.conn()).await.map_err(err)?;
    with_metrics(s, rows).await
}

/// Provisioning applies, newest first, optionally of one image (an agent's own, or every
/// box's on the fleet service).
pub(crate) async fn applies(s: &mut impl Backend, image: Option<&str>, limit: i64) -> Result<Vec<ApplyRow>> {
    let rows = query(format!(
        "SELECT {APPLY_COLUMNS} FROM provision_applies WHERE (CAST($1 AS TEXT) IS NULL OR image = $1) \
             ORDER BY started_at DESC, rowid DESC LIMIT $2"
    ))
    .bind(image)
    .bind(limit)
    .fetch_all(&mut s.conn())
    .await
    .map_err(sql_err(s))?;
    Ok(rows.iter().map(apply_row).collect())
}

/// One apply by id or unique prefix, with its steps in order.
pub(crate) async fn apply_journal(s: &mut impl Backend, id: &str) -> Result<(ApplyRow, Vec<StepRow>)> {
    let err = sql_err(s);
    let rows = query(format!("SELECT {APPLY_COLUMNS} FROM provision_applies WHERE id LIKE $1 ESCAPE '\\' LIMIT 2"))
        .bind(like_prefix(id))
        .fetch_all(&mut s.conn())
        .await
        .map_err(&err)?;
    let apply = match rows.as_slice() {
        [one] => apply_row(one),
        [] => return Err(DbError::NotFound { what: "apply", id: id.to_string() }),
        _ => return Err(DbError::Ambiguous { what: "apply", id: id.to_string(), count: rows.len() }),
    };
    let steps = query(format!("SELECT {STEP_COLUMNS} FROM provision_steps WHERE apply_id = $1 ORDER BY seq, id"))
        .bind(&apply.id)
        .fetch_all(&mut s.conn())
        .await
        .map_err(&err)?;
    Ok((apply, steps.iter().map(step_row).collect()))
}

//! Writing runs' measured values — metric values, raw samples, telemetry — into the integer-keyed
//! tables of schema 3: each run gets a number (`run_numbers`), each metric, sampled metric and
//! telemetry channel a dictionary id, and rows go in sorted by key (B-tree appends) in batches. One
//! path for `save_run` and `import`, in both engines.

use crate::bulk::Field;
use crate::engine::{query, Arg, Builder, Conn};
use crate::{FastMap, MAX_BINDS};

/// The values of one or more runs, each row naming its run by id.
#[derive(Default)]
pub(crate) struct Values<'a> {
    /// (run, name, unit, direction, value)
    pub metrics: Vec<(&'a str, &'a str, &'a str, &'a str, f64)>,
    /// (run, metric, repetition, value)
    pub samples: Vec<(&'a str, &'a str, i64, f64)>,
    /// (run, source, name, milliseconds since start, value)
    pub telemetry: Vec<(&'a str, &'a str, &'a str, i64, f64)>,
}

/// Numbers new runs, in the order given (sorted ids give numbers in id order); run id → number.
pub(crate) async fn run_numbers<'a>(
    conn: &mut Conn<'_>,
    run_ids: &[&'a str],
) -> Result<FastMap<&'a str, i64>, sqlx::Error> {
    let mut nums = FastMap::with_capacity_and_hasher(run_ids.len(), Default::default());
    if !conn.copies() && run_ids.len() >= BULK_NUMBERS {
        // SQLite, in a write transaction (`BEGIN IMMEDIATE` holds the database's write lock): the
        // numbers SQLite itself would give (one past the largest), written through the bulk path
        // instead of each coming back through sqlx (a fleet's 60,000 runs: 120 ms → 36 ms).
        let last: i64 = query("SELECT COALESCE(MAX(num), 0) FROM run_numbers").scalar(conn).await?;
        let rows: Vec<(i64, &str)> = run_ids.iter().zip(last + 1..).map(|(id, num)| (num, *id)).collect();
        conn.insert_rows("run_numbers (num, run_id)", 2, &rows, |(num, id), out| {
            out.extend([Field::Int(*num), Field::Text(id)]);
        })
        .await?;
        nums.extend(rows.iter().map(|(num, id)| (*id, *num)));
        return Ok(nums);
    }
    let mut by_id: FastMap<&str, &'a str> = run_ids.iter().map(|id| (*id, *id)).collect();
    for chunk in run_ids.chunks(MAX_BINDS) {
        let mut q = Builder::new("INSERT INTO run_numbers (run_id) ");
        q.values(chunk.iter().map(|id| [Arg::from(*id)]));
        q.push(" RETURNING num, run_id");
        for row in q.build().fetch_all(conn).await? {
            let id: &str = row.get(1);
            let id = by_id
                .remove(id)
                .ok_or_else(|| sqlx::Error::Protocol(format!("run_numbers returned {id}, not asked for")))?;
            nums.insert(id, row.get(0));
        }
    }
    Ok(nums)
}

/// From this many runs at once, SQLite numbers them through the bulk path.
const BULK_NUMBERS: usize = 256;

/// The id of each key (in the order given) in a dictionary table whose key is the TEXT
/// `columns`, creating the missing ones. One hash per key: an import asks for millions.
async fn dictionary<'a, const N: usize>(
    conn: &mut Conn<'_>,
    table: &str,
    columns: [&str; N],
    keys: impl Iterator<Item = [&'a str; N]>,
) -> Result<Vec<i64>, sqlx::Error> {
    let mut known: FastMap<[String; N], i64> = FastMap::default();
    for r in query(format!("SELECT id, {} FROM {table}", columns.join(", "))).fetch_all(conn).await? {
        known.insert(std::array::from_fn(|i| r.get(i + 1)), r.get(0));
    }
    // A key another writer added since the read above (a second fleet service on the same
    // PostgreSQL) conflicts: it is looked up instead.
    let insert = format!(
        "INSERT INTO {table} ({}) VALUES ({}) ON CONFLICT DO NOTHING RETURNING id",
        columns.join(", "),
        (1..=N).map(|i| format!("${i}")).collect::<Vec<_>>().join(", ")
    );
    let lookup = format!(
        "SELECT id FROM {table} WHERE {}",
        columns.iter().enumerate().map(|(i, c)| format!("{c} = ${}", i + 1)).collect::<Vec<_>>().join(" AND ")
    );
    let mut seen: FastMap<[&'a str; N], i64> = FastMap::default();
    let mut out = Vec::with_capacity(keys.size_hint().0);
    for key in keys {
        if let Some(id) = seen.get(&key) {
            out.push(*id);
            continue;
        }
        let owned = key.map(str::to_string);
        let id = match known.get(&owned) {
            Some(id) => *id,
            None => {
                let mut q = query(insert.as_str());
                for part in key {
                    q = q.bind(part);
                }
                match q.scalar_optional(conn).await? {
                    Some(id) => id,
                    None => {
                        let mut q = query(lookup.as_str());
                        for part in key {
                            q = q.bind(part);
                        }
                        q.scalar(conn).await?
                    }
                }
            }
        };
        seen.insert(key, id);
        out.push(id);
    }
    Ok(out)
}

/// Each row's run number: rows of one run come together, so the run's number is looked up once
/// per run rather than once per row.
fn numbers<'a>(nums: &FastMap<&str, i64>, runs: impl Iterator<Item = &'a str>) -> Vec<i64> {
    let mut last: Option<(&str, i64)> = None;
    runs.map(|run| match last {
        Some((id, num)) if id == run => num,
        _ => {
            let num = nums[run];
            last = Some((run, num));
            num
        }
    })
    .collect()
}

/// Writes the values of runs already numbered in `nums`.
pub(crate) async fn write(conn: &mut Conn<'_>, nums: &FastMap<&str, i64>, v: &Values<'_>) -> Result<(), sqlx::Error> {
    let ids =
        dictionary(conn, "metric_names", ["name", "unit", "direction"], v.metrics.iter().map(|m| [m.1, m.2, m.3]))
            .await?;
    let runs = numbers(nums, v.metrics.iter().map(|m| m.0));
    let mut rows: Vec<(i64, i64, f64)> =
        v.metrics.iter().zip(runs).zip(ids).map(|((m, run), id)| (run, id, m.4)).collect();
    rows.sort_unstable_by_key(|r| (r.0, r.1));
    conn.insert_rows("metric_values (run, metric, value)", 3, &rows, |(run, metric, value), out| {
        out.extend([Field::Int(*run), Field::Int(*metric), Field::Real(*value)])
    })
    .await?;
    let ids = dictionary(conn, "sample_metrics", ["name"], v.samples.iter().map(|s| [s.1])).await?;
    let runs = numbers(nums, v.samples.iter().map(|s| s.0));
    let mut rows: Vec<(i64, i64, i64, f64)> =
        v.samples.iter().zip(runs).zip(ids).map(|((s, run), id)| (run, id, s.2, s.3)).collect();
    rows.sort_unstable_by_key(|r| (r.0, r.1, r.2));
    conn.insert_rows("sample_values (run, metric, idx, value)", 4, &rows, |(run, metric, idx, value), out| {
        out.extend([Field::Int(*run), Field::Int(*metric), Field::Int(*idx), Field::Real(*value)]);
    })
    .await?;
    let ids =
        dictionary(conn, "telemetry_channels", ["source", "name"], v.telemetry.iter().map(|t| [t.1, t.2])).await?;
    let runs = numbers(nums, v.telemetry.iter().map(|t| t.0));
    let mut rows: Vec<(i64, i64, i64, f64)> =
        v.telemetry.iter().zip(runs).zip(ids).map(|((t, run), id)| (run, id, t.3, t.4)).collect();
    rows.sort_unstable_by_key(|r| (r.0, r.1, r.2));
    conn.insert_rows("telemetry_values (run, channel, t_ms, value)", 4, &rows, |(run, channel, t, value), out| {
        out.extend([Field::Int(*run), Field::Int(*channel), Field::Int(*t), Field::Real(*value)]);
    })
    .await?;
    Ok(())
}

//! Writing runs' measured values — metric values, raw samples, telemetry — into the integer-keyed
//! tables of schema 3: each run gets a number (`run_numbers`), each metric, sampled metric and
//! telemetry channel a dictionary id, and rows go in sorted by key (B-tree appends) in batches. One
//! path for `save_run` and `import`, in both engines.

use std::collections::HashMap;

use std::fmt::Write;

use sqlx::query_builder::Separated;
use sqlx::{QueryBuilder, Row};

use super::{copy_in, Conn, Db, COPY_IN};
use crate::MAX_BINDS;

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
pub(crate) async fn run_numbers(conn: &mut Conn, run_ids: &[&str]) -> Result<HashMap<String, i64>, sqlx::Error> {
    let mut nums = HashMap::with_capacity(run_ids.len());
    for chunk in run_ids.chunks(MAX_BINDS) {
        let mut q = QueryBuilder::new("INSERT INTO run_numbers (run_id) ");
        q.push_values(chunk, |mut b, id| {
            b.push_bind(*id);
        });
        q.push(" RETURNING num, run_id");
        for row in q.build().fetch_all(&mut *conn).await? {
            nums.insert(row.get(1), row.get(0));
        }
    }
    Ok(nums)
}

/// Ids of keys in a dictionary table whose key is the TEXT `columns`, creating the missing ones.
async fn dictionary<'a, const N: usize>(
    conn: &mut Conn,
    table: &str,
    columns: [&str; N],
    keys: impl Iterator<Item = [&'a str; N]>,
) -> Result<HashMap<[&'a str; N], i64>, sqlx::Error> {
    let mut known: HashMap<[String; N], i64> = HashMap::new();
    for r in sqlx::query(&format!("SELECT id, {} FROM {table}", columns.join(", "))).fetch_all(&mut *conn).await? {
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
    let mut out = HashMap::new();
    for key in keys {
        if out.contains_key(&key) {
            continue;
        }
        let owned = key.map(str::to_string);
        let id = match known.get(&owned) {
            Some(id) => *id,
            None => {
                let mut q = sqlx::query_scalar(&insert);
                for part in key {
                    q = q.bind(part);
                }
                match q.fetch_optional(&mut *conn).await? {
                    Some(id) => id,
                    None => {
                        let mut q = sqlx::query_scalar(&lookup);
                        for part in key {
                            q = q.bind(part);
                        }
                        q.fetch_one(&mut *conn).await?
                    }
                }
            }
        };
        out.insert(key, id);
    }
    Ok(out)
}

/// Rows into `into` (`table (columns)`), in the order given: through COPY where the engine has
/// it (PostgreSQL's own bulk path, several times faster than any INSERT), else as batched
/// multi-row INSERTs. `bind` binds a row's `width` values; `text` writes it as a line of COPY's
/// text format (text fields through [`copy_field`]).
pub(crate) async fn insert_rows<'r, R>(
    conn: &mut Conn,
    into: &str,
    width: usize,
    rows: &'r [R],
    bind: impl Fn(Separated<'_, 'r, Db, &'static str>, &'r R),
    text: impl Fn(&mut String, &'r R) -> std::fmt::Result,
) -> Result<(), sqlx::Error> {
    if rows.is_empty() {
        return Ok(());
    }
    if COPY_IN {
        let mut data = String::with_capacity(rows.len() * 8 * width);
        for r in rows {
            text(&mut data, r).expect("writing to a String");
        }
        return copy_in(conn, &format!("COPY {into} FROM STDIN"), data).await;
    }
    for chunk in rows.chunks(MAX_BINDS / width) {
        let mut q: QueryBuilder<'r, Db> = QueryBuilder::new(format!("INSERT INTO {into} "));
        q.push_values(chunk, &bind);
        q.build().execute(&mut *conn).await?;
    }
    Ok(())
}

/// A text field in COPY's text format, tab-separated from the next: `\\N` for NULL, and the
/// format's escapes for a backslash, tab, newline and carriage return.
pub(crate) fn copy_field(out: &mut String, value: Option<&str>, last: bool) {
    match value {
        None => out.push_str("\\N"),
        Some(v) => {
            for c in v.chars() {
                match c {
                    '\\' => out.push_str("\\\\"),
                    '\t' => out.push_str("\\t"),
                    '\n' => out.push_str("\\n"),
                    '\r' => out.push_str("\\r"),
                    c => out.push(c),
                }
            }
        }
    }
    out.push(if last { '\n' } else { '\t' });
}

/// Writes the values of runs already numbered in `nums`.
pub(crate) async fn write(conn: &mut Conn, nums: &HashMap<String, i64>, v: &Values<'_>) -> Result<(), sqlx::Error> {
    let ids =
        dictionary(conn, "metric_names", ["name", "unit", "direction"], v.metrics.iter().map(|m| [m.1, m.2, m.3]))
            .await?;
    let mut rows: Vec<(i64, i64, f64)> = v.metrics.iter().map(|m| (nums[m.0], ids[&[m.1, m.2, m.3]], m.4)).collect();
    rows.sort_unstable_by_key(|r| (r.0, r.1));
    insert_rows(
        conn,
        "metric_values (run, metric, value)",
        3,
        &rows,
        |mut b, (run, metric, value)| {
            b.push_bind(*run).push_bind(*metric).push_bind(*value);
        },
        |out, (run, metric, value)| writeln!(out, "{run}\t{metric}\t{value}"),
    )
    .await?;
    let ids = dictionary(conn, "sample_metrics", ["name"], v.samples.iter().map(|s| [s.1])).await?;
    let mut rows: Vec<(i64, i64, i64, f64)> = v.samples.iter().map(|s| (nums[s.0], ids[&[s.1]], s.2, s.3)).collect();
    rows.sort_unstable_by_key(|r| (r.0, r.1, r.2));
    insert_rows(
        conn,
        "sample_values (run, metric, idx, value)",
        4,
        &rows,
        |mut b, (run, metric, idx, value)| {
            b.push_bind(*run).push_bind(*metric).push_bind(*idx).push_bind(*value);
        },
        |out, (run, metric, idx, value)| writeln!(out, "{run}\t{metric}\t{idx}\t{value}"),
    )
    .await?;
    let ids =
        dictionary(conn, "telemetry_channels", ["source", "name"], v.telemetry.iter().map(|t| [t.1, t.2])).await?;
    let mut rows: Vec<(i64, i64, i64, f64)> =
        v.telemetry.iter().map(|t| (nums[t.0], ids[&[t.1, t.2]], t.3, t.4)).collect();
    rows.sort_unstable_by_key(|r| (r.0, r.1, r.2));
    insert_rows(
        conn,
        "telemetry_values (run, channel, t_ms, value)",
        4,
        &rows,
        |mut b, (run, channel, t, value)| {
            b.push_bind(*run).push_bind(*channel).push_bind(*t).push_bind(*value);
        },
        |out, (run, channel, t, value)| writeln!(out, "{run}\t{channel}\t{t}\t{value}"),
    )
    .await?;
    Ok(())
}

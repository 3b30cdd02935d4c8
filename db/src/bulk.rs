//! Bulk rows, each engine through its own fast path: a row is a list of [`Field`]s, which
//! PostgreSQL takes as `COPY … FROM STDIN` text and SQLite through one prepared statement stepped
//! once per row with SQLite's C API (`sqlite_insert`), on the calling thread while sqlx's worker
//! holds off. sqlx binds every value of a multi-row INSERT through its own argument buffer and
//! hands each statement to its worker thread; stepping a prepared statement directly is what
//! SQLite's own bulk loaders do, and writes the same rows in the same transaction.

use std::ffi::{c_int, CString};
use std::fmt::Write;

use libsqlite3_sys as ffi;
use sqlx::sqlite::SqliteConnection;

/// One value of a bulk row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Field<'a> {
    Int(i64),
    Real(f64),
    Text(&'a str),
    Null,
}

impl<'a> From<Option<&'a str>> for Field<'a> {
    fn from(v: Option<&'a str>) -> Self {
        v.map_or(Field::Null, Field::Text)
    }
}

/// Appends a row as a line of COPY's text format: tab-separated, `\N` for NULL, and the format's
/// escapes for a backslash, tab, newline and carriage return in text.
pub(crate) fn copy_line(out: &mut String, row: &[Field<'_>]) {
    for (i, f) in row.iter().enumerate() {
        if i > 0 {
            out.push('\t');
        }
        match f {
            Field::Int(v) => write!(out, "{v}").expect("writing to a String"),
            // Rust prints the shortest text that reads back as the same f64.
            Field::Real(v) => write!(out, "{v}").expect("writing to a String"),
            Field::Null => out.push_str("\\N"),
            Field::Text(s) => {
                for c in s.chars() {
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
    }
    out.push('\n');
}

/// A prepared statement, finalized when dropped.
struct Statement(*mut ffi::sqlite3_stmt);

impl Drop for Statement {
    fn drop(&mut self) {
        // SAFETY: the statement came from sqlite3_prepare_v2 on a connection that outlives it
        // (the handle's lock is held while this lives) and is finalized exactly once, here.
        unsafe { ffi::sqlite3_finalize(self.0) };
    }
}

/// Inserts `rows` into `into` (`table (columns)`) through prepared statements of
/// [`ROWS_PER_STATEMENT`] rows (and one of a single row for the rest), each row's `width` fields
/// from `fields`, in the connection's current transaction; fewer than [`SMALL`] rows through sqlx.
///
/// # Errors
/// SQLite's own error for the statement or the row (a full disk, a constraint), as sqlx reports
/// database errors, so that callers classify it as they would any other.
pub(crate) async fn sqlite_insert<'r, R>(
    conn: &mut SqliteConnection,
    into: &str,
    width: usize,
    rows: &'r [R],
    fields: impl Fn(&'r R, &mut Vec<Field<'r>>),
) -> Result<(), sqlx::Error> {
    if rows.len() < SMALL {
        return small_insert(conn, into, width, rows, fields).await;
    }
    let mut handle = conn.lock_handle().await?;
    let db = handle.as_raw_handle().as_ptr();
    let failed = |handle: &mut sqlx::sqlite::LockedSqliteHandle<'_>, code: c_int| match handle.last_error() {
        Some(e) => sqlx::Error::Database(Box::new(e)),
        None => sqlx::Error::Protocol(format!("SQLite answered {code} without an error")),
    };
    // Rows go in ROWS_PER_STATEMENT at a time (a statement's own start and end, per row, was a
    // fifth of the time), the rest one by one.
    let many = rows.len() / ROWS_PER_STATEMENT * ROWS_PER_STATEMENT;
    let mut values = Vec::with_capacity(width * ROWS_PER_STATEMENT);
    for (chunk, per) in [(&rows[..many], ROWS_PER_STATEMENT), (&rows[many..], 1)] {
        if chunk.is_empty() {
            continue;
        }
        let row = format!("({})", vec!["?"; width].join(", "));
        let sql = format!("INSERT INTO {into} VALUES {}", vec![row; per].join(", "));
        let sql = CString::new(sql).map_err(|e| sqlx::Error::Protocol(format!("a statement with a NUL byte: {e}")))?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: `db` is the connection's open handle, used by no other thread while `handle`
        // (the lock on sqlx's worker) lives; `sql` is NUL-terminated and outlives the call.
        let rc = unsafe { ffi::sqlite3_prepare_v2(db, sql.as_ptr(), -1, &mut raw, std::ptr::null_mut()) };
        if rc != ffi::SQLITE_OK {
            return Err(failed(&mut handle, rc));
        }
        let statement = Statement(raw);
        for group in chunk.chunks(per) {
            values.clear();
            for r in group {
                let before = values.len();
                fields(r, &mut values);
                assert_eq!(values.len() - before, width, "a bulk row of the wrong width for {into}");
            }
            for (i, f) in values.iter().enumerate() {
                let at = i as c_int + 1;
                // SAFETY: `statement` is a live prepared statement of `width × per` parameters on
                // `db`; text is bound SQLITE_STATIC with its byte length: the &str lives for 'r,
                // past the statement's finalization at the end of this function.
                let rc = unsafe {
                    match *f {
                        Field::Int(v) => ffi::sqlite3_bind_int64(statement.0, at, v),
                        Field::Real(v) => ffi::sqlite3_bind_double(statement.0, at, v),
                        Field::Null => ffi::sqlite3_bind_null(statement.0, at),
                        Field::Text(s) => ffi::sqlite3_bind_text64(
                            statement.0,
                            at,
                            s.as_ptr().cast(),
                            s.len() as u64,
                            ffi::SQLITE_STATIC(),
                            ffi::SQLITE_UTF8 as u8,
                        ),
                    }
                };
                if rc != ffi::SQLITE_OK {
                    return Err(failed(&mut handle, rc));
                }
            }
            // SAFETY: as above; a step either completes the rows or fails with the connection's
            // error.
            let rc = unsafe { ffi::sqlite3_step(statement.0) };
            if rc != ffi::SQLITE_DONE {
                let error = failed(&mut handle, rc);
                // SAFETY: as above; resetting a failed statement only returns the same error.
                unsafe { ffi::sqlite3_reset(statement.0) };
                return Err(error);
            }
            // SAFETY: as above; reset after SQLITE_DONE succeeds.
            unsafe { ffi::sqlite3_reset(statement.0) };
        }
    }
    Ok(())
}

/// Below this many rows (one agent's upload, one saved run) preparing statements afresh costs
/// more than it saves: the rows go through sqlx, whose statements stay prepared between calls.
const SMALL: usize = 256;

/// A few rows as one multi-row INSERT through sqlx (its statement cache keeps it prepared).
async fn small_insert<'r, R>(
    conn: &mut SqliteConnection,
    into: &str,
    width: usize,
    rows: &'r [R],
    fields: impl Fn(&'r R, &mut Vec<Field<'r>>),
) -> Result<(), sqlx::Error> {
    let mut values = Vec::with_capacity(width * rows.len());
    for r in rows {
        fields(r, &mut values);
    }
    assert_eq!(values.len(), width * rows.len(), "bulk rows of the wrong width for {into}");
    let mut q = sqlx::QueryBuilder::<sqlx::Sqlite>::new(format!("INSERT INTO {into} "));
    q.push_values(values.chunks(width), |mut b, row| {
        for f in row {
            match *f {
                Field::Int(v) => b.push_bind(v),
                Field::Real(v) => b.push_bind(v),
                Field::Text(v) => b.push_bind(v),
                Field::Null => b.push_bind(None::<&str>),
            };
        }
    });
    q.build().execute(&mut *conn).await?;
    Ok(())
}

/// Rows per multi-row INSERT of [`sqlite_insert`] (at most 10 columns × 64 = 640 parameters, far
/// under SQLite's limit of 32,766).
const ROWS_PER_STATEMENT: usize = 64;

#[cfg(test)]
mod tests {
    use super::*;
    use sqlx::{Connection, Row};

    #[test]
    fn copy_lines_escape_text_and_mark_null() {
        let mut out = String::new();
        copy_line(&mut out, &[Field::Int(-3), Field::Real(0.1), Field::Text("a\tb\\c\nd"), Field::Null]);
        assert_eq!(out, "-3\t0.1\ta\\tb\\\\c\\nd\t\\N\n");
    }

    #[test]
    fn rows_go_in_exactly_and_an_error_is_sqlites_own() {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(async {
            let mut c = SqliteConnection::connect("sqlite::memory:").await.unwrap();
            sqlx::query("CREATE TABLE t (i INTEGER PRIMARY KEY, r REAL, s TEXT)").execute(&mut c).await.unwrap();
            let rows: Vec<(i64, f64, Option<String>)> =
                (0..1000).map(|i| (i, 1.0 / (i as f64 + 3.0), (i % 3 != 0).then(|| format!("r{i}\u{e9}")))).collect();
            sqlite_insert(&mut c, "t (i, r, s)", 3, &rows, |r, out| {
                out.extend([Field::Int(r.0), Field::Real(r.1), r.2.as_deref().into()]);
            })
            .await
            .unwrap();
            let back: Vec<(i64, f64, Option<String>)> = sqlx::query("SELECT i, r, s FROM t ORDER BY i")
                .fetch_all(&mut c)
                .await
                .unwrap()
                .iter()
                .map(|row| (row.get(0), row.get(1), row.get(2)))
                .collect();
            assert_eq!(back, rows, "every value to the bit, text and NULL included");
            // A duplicate key: SQLite's constraint error, as sqlx reports database errors; the
            // connection still works afterwards.
            let e = sqlite_insert(&mut c, "t (i, r, s)", 3, &rows[..300], |r, out| {
                out.extend([Field::Int(r.0), Field::Real(r.1), Field::Null]);
            })
            .await
            .unwrap_err();
            let db = e.as_database_error().expect("a database error");
            assert_eq!(db.code().as_deref(), Some("1555"), "{db}");
            let n: i64 = sqlx::query_scalar("SELECT count(*) FROM t").fetch_one(&mut c).await.unwrap();
            assert_eq!(n, 1000);
            // A few rows take sqlx's path: the same values, the same errors.
            let few: Vec<(i64, f64, Option<String>)> = vec![(5000, 0.25, None), (5001, -1e300, Some("x".into()))];
            fn fill<'r>(r: &'r (i64, f64, Option<String>), out: &mut Vec<Field<'r>>) {
                out.extend([Field::Int(r.0), Field::Real(r.1), r.2.as_deref().into()]);
            }
            sqlite_insert(&mut c, "t (i, r, s)", 3, &few, fill).await.unwrap();
            let back: Vec<(i64, f64, Option<String>)> = sqlx::query("SELECT i, r, s FROM t WHERE i >= 5000 ORDER BY i")
                .fetch_all(&mut c)
                .await
                .unwrap()
                .iter()
                .map(|row| (row.get(0), row.get(1), row.get(2)))
                .collect();
            assert_eq!(back, few);
            let e = sqlite_insert(&mut c, "t (i, r, s)", 3, &few, fill).await.unwrap_err();
            assert_eq!(e.as_database_error().unwrap().code().as_deref(), Some("1555"));
        });
    }
}

//! Either engine behind one set of names, so that the queries both run (`crate::queries`) are
//! written and compiled once: [`Conn`] is a connection to SQLite or to PostgreSQL, [`Query`] a
//! statement with its arguments, [`Row`] a row either engine returned, [`Tx`] a write transaction.
//! A statement's text is what both engines take: `$N` placeholders, `ON CONFLICT`, standard
//! functions only; `rowid` (an insertion order SQLite keeps by itself) is an identity column in the
//! PostgreSQL schema.
//!
//! The engines differ in a few things only, each a method here: how a write transaction begins
//! ([`Conn::begin_write`]), how an import keeps other importers out ([`Tx::one_writer`]) and what it
//! prepares ([`Conn::prepare_import`]), and how bulk rows go in ([`Conn::insert_rows`]: COPY on
//! PostgreSQL, SQLite's C API on SQLite).

use std::borrow::Cow;
use std::path::Path;

use sqlx::postgres::{PgConnection, PgRow, Postgres};
use sqlx::sqlite::{Sqlite, SqliteConnection, SqliteRow};
use sqlx::{Connection, Database, Decode, Encode, FromRow, Type};

use crate::bulk::Field;
use crate::DbError;

/// A store the shared queries run on: an SQLite [`crate::Store`], a [`crate::PgStore`], or an
/// [`crate::AnyStore`] holding either. Sealed: it is public only so that [`crate::Queries`] can
/// require it, and its module is private.
pub trait Backend: Send {
    /// The store's connection.
    fn conn(&mut self) -> Conn<'_>;
    /// How messages name the store (a file, or a URL without its password).
    fn path(&self) -> &Path;
    /// How this engine's errors become [`DbError`]s (SQLite's busy, read-only and full; a
    /// PostgreSQL server that is not there).
    fn classifier(&self) -> fn(&Path, sqlx::Error) -> DbError;
}

/// Maps an sqlx error to a [`DbError`] naming `store` (an owned closure, so that the store stays
/// free to lend its connection).
pub(crate) fn sql_err(store: &impl Backend) -> impl Fn(sqlx::Error) -> DbError + Send + Sync + 'static {
    let (path, classify) = (store.path().to_path_buf(), store.classifier());
    move |cause| classify(&path, cause)
}

/// A connection to either engine.
pub enum Conn<'c> {
    Sqlite(&'c mut SqliteConnection),
    Pg(&'c mut PgConnection),
}

/// The advisory lock that PostgreSQL imports take in turn (`pg_advisory_xact_lock`): "kilnimpt".
const IMPORT_LOCK: i64 = 0x6b69_6c6e_696d_7074;

impl Conn<'_> {
    /// Begins a write transaction: on SQLite with the database's write lock taken at once
    /// ([`crate::WRITE`]).
    pub async fn begin_write(&mut self) -> sqlx::Result<Tx<'_>> {
        Ok(match self {
            Conn::Sqlite(c) => Tx::Sqlite(c.begin_with(crate::WRITE).await?),
            Conn::Pg(c) => Tx::Pg(c.begin().await?),
        })
    }

    /// Before a large import, on SQLite: a page cache big enough that the transaction does not
    /// spill pages mid-way (a hint: a failure here fails nothing). PostgreSQL sizes its own.
    pub async fn prepare_import(&mut self) {
        if let Conn::Sqlite(c) = self {
            let _ = sqlx::query("PRAGMA cache_size = -262144").execute(&mut **c).await;
        }
    }

    /// Whether bulk rows go in through COPY (PostgreSQL) rather than SQLite's bulk path.
    pub fn copies(&self) -> bool {
        matches!(self, Conn::Pg(_))
    }

    /// Rows into `into` (`table (columns)`), in the order given, through the engine's own bulk
    /// path: COPY on PostgreSQL (several times faster than any INSERT), prepared multi-row INSERTs
    /// stepped through SQLite's C API on SQLite (`crate::bulk`). `fields` gives a row's `width`
    /// values.
    pub(crate) async fn insert_rows<'r, R>(
        &mut self,
        into: &str,
        width: usize,
        rows: &'r [R],
        fields: impl Fn(&'r R, &mut Vec<Field<'r>>),
    ) -> sqlx::Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        match self {
            Conn::Sqlite(c) => crate::bulk::sqlite_insert(c, into, width, rows, fields).await,
            Conn::Pg(c) => {
                let mut data = String::with_capacity(rows.len() * 8 * width);
                let mut row = Vec::with_capacity(width);
                for r in rows {
                    row.clear();
                    fields(r, &mut row);
                    crate::bulk::copy_line(&mut data, &row);
                }
                let mut copy = c.copy_in_raw(&format!("COPY {into} FROM STDIN")).await?;
                if let Err(e) = copy.send(data.into_bytes()).await {
                    let _ = copy.abort(e.to_string()).await;
                    return Err(e);
                }
                copy.finish().await.map(|_| ())
            }
        }
    }
}

/// A write transaction on either engine; dropped without [`Tx::commit`], it rolls back.
pub enum Tx<'c> {
    Sqlite(sqlx::Transaction<'c, Sqlite>),
    Pg(sqlx::Transaction<'c, Postgres>),
}

impl Tx<'_> {
    /// The transaction's connection, for statements inside it.
    pub fn conn(&mut self) -> Conn<'_> {
        match self {
            Tx::Sqlite(t) => Conn::Sqlite(t),
            Tx::Pg(t) => Conn::Pg(t),
        }
    }

    /// Makes an import's transaction the only importer until it ends. On PostgreSQL, two imports
    /// at once (two services on one database, or `kiln import` beside one) would each find a new
    /// host absent and insert it; the second would then fail on the first's row, or map records
    /// onto a software stack it never stored. Taken in turn (an advisory lock), each sees what the
    /// one before it committed; readers never wait. SQLite's `BEGIN IMMEDIATE` already took the
    /// database's write lock.
    pub async fn one_writer(&mut self) -> sqlx::Result<()> {
        if let Tx::Pg(t) = self {
            sqlx::query("SELECT pg_advisory_xact_lock($1)").bind(IMPORT_LOCK).execute(&mut **t).await?;
        }
        Ok(())
    }

    pub async fn commit(self) -> sqlx::Result<()> {
        match self {
            Tx::Sqlite(t) => t.commit().await,
            Tx::Pg(t) => t.commit().await,
        }
    }
}

/// A value bound to a statement: the types kiln's columns hold.
#[derive(Debug, Clone)]
pub enum Arg<'q> {
    Text(Option<Cow<'q, str>>),
    Int(Option<i64>),
    Real(Option<f64>),
    Blob(&'q [u8]),
}

impl<'q> From<&'q str> for Arg<'q> {
    fn from(v: &'q str) -> Self {
        Arg::Text(Some(Cow::Borrowed(v)))
    }
}
impl<'q> From<&'q String> for Arg<'q> {
    fn from(v: &'q String) -> Self {
        Arg::Text(Some(Cow::Borrowed(v)))
    }
}
impl From<String> for Arg<'_> {
    fn from(v: String) -> Self {
        Arg::Text(Some(Cow::Owned(v)))
    }
}
impl<'q> From<Option<&'q str>> for Arg<'q> {
    fn from(v: Option<&'q str>) -> Self {
        Arg::Text(v.map(Cow::Borrowed))
    }
}
impl<'q> From<&'q Option<String>> for Arg<'q> {
    fn from(v: &'q Option<String>) -> Self {
        Arg::Text(v.as_deref().map(Cow::Borrowed))
    }
}
impl From<i64> for Arg<'_> {
    fn from(v: i64) -> Self {
        Arg::Int(Some(v))
    }
}
impl From<Option<i64>> for Arg<'_> {
    fn from(v: Option<i64>) -> Self {
        Arg::Int(v)
    }
}
impl From<f64> for Arg<'_> {
    fn from(v: f64) -> Self {
        Arg::Real(Some(v))
    }
}
impl<'q> From<&'q [u8]> for Arg<'q> {
    fn from(v: &'q [u8]) -> Self {
        Arg::Blob(v)
    }
}

/// A statement and its arguments, run on either engine.
#[must_use = "a query does nothing until it is run on a connection"]
pub struct Query<'q> {
    sql: Cow<'q, str>,
    args: Vec<Arg<'q>>,
}

/// A statement to run: `$1`, `$2`… are its arguments, bound in order with [`Query::bind`].
pub fn query<'q>(sql: impl Into<Cow<'q, str>>) -> Query<'q> {
    Query { sql: sql.into(), args: Vec::new() }
}

/// sqlx's statement for one engine, with the arguments bound.
fn bound<'a, DB: Database>(sql: &'a str, args: &'a [Arg<'a>]) -> sqlx::query::Query<'a, DB, DB::Arguments<'a>>
where
    Option<&'a str>: Encode<'a, DB> + Type<DB>,
    Option<i64>: Encode<'a, DB> + Type<DB>,
    Option<f64>: Encode<'a, DB> + Type<DB>,
    &'a [u8]: Encode<'a, DB> + Type<DB>,
{
    let mut q = sqlx::query(sql);
    for a in args {
        q = match a {
            Arg::Text(v) => q.bind(v.as_deref()),
            Arg::Int(v) => q.bind(*v),
            Arg::Real(v) => q.bind(*v),
            Arg::Blob(v) => q.bind(*v),
        };
    }
    q
}

impl<'q> Query<'q> {
    pub fn bind(mut self, value: impl Into<Arg<'q>>) -> Self {
        self.args.push(value.into());
        self
    }

    /// Runs the statement; the rows it changed.
    pub async fn execute(self, conn: &mut Conn<'_>) -> sqlx::Result<u64> {
        Ok(match conn {
            Conn::Sqlite(c) => bound::<Sqlite>(&self.sql, &self.args).execute(&mut **c).await?.rows_affected(),
            Conn::Pg(c) => bound::<Postgres>(&self.sql, &self.args).execute(&mut **c).await?.rows_affected(),
        })
    }

    pub async fn fetch_all(self, conn: &mut Conn<'_>) -> sqlx::Result<Vec<Row>> {
        Ok(match conn {
            Conn::Sqlite(c) => {
                bound::<Sqlite>(&self.sql, &self.args).fetch_all(&mut **c).await?.into_iter().map(Row::Sqlite).collect()
            }
            Conn::Pg(c) => {
                bound::<Postgres>(&self.sql, &self.args).fetch_all(&mut **c).await?.into_iter().map(Row::Pg).collect()
            }
        })
    }

    pub async fn fetch_optional(self, conn: &mut Conn<'_>) -> sqlx::Result<Option<Row>> {
        Ok(match conn {
            Conn::Sqlite(c) => bound::<Sqlite>(&self.sql, &self.args).fetch_optional(&mut **c).await?.map(Row::Sqlite),
            Conn::Pg(c) => bound::<Postgres>(&self.sql, &self.args).fetch_optional(&mut **c).await?.map(Row::Pg),
        })
    }

    /// The one row the statement returns (none is `sqlx::Error::RowNotFound`).
    pub async fn fetch_one(self, conn: &mut Conn<'_>) -> sqlx::Result<Row> {
        self.fetch_optional(conn).await?.ok_or(sqlx::Error::RowNotFound)
    }

    /// Every row, each as a tuple of its columns.
    pub async fn fetch_all_as<T: Tuple>(self, conn: &mut Conn<'_>) -> sqlx::Result<Vec<T>> {
        self.fetch_all(conn).await?.iter().map(Row::tuple).collect()
    }

    pub async fn fetch_optional_as<T: Tuple>(self, conn: &mut Conn<'_>) -> sqlx::Result<Option<T>> {
        self.fetch_optional(conn).await?.as_ref().map(Row::tuple).transpose()
    }

    /// The first column of the one row returned.
    pub async fn scalar<T: Value>(self, conn: &mut Conn<'_>) -> sqlx::Result<T> {
        self.fetch_one(conn).await?.try_get(0)
    }

    /// The first column of the row returned, if one was.
    pub async fn scalar_optional<T: Value>(self, conn: &mut Conn<'_>) -> sqlx::Result<Option<T>> {
        self.fetch_optional(conn).await?.map(|r| r.try_get(0)).transpose()
    }
}

/// A statement assembled from parts, its arguments numbered as they are pushed (`IN (…)` lists,
/// multi-row `VALUES`).
pub struct Builder<'q> {
    sql: String,
    args: Vec<Arg<'q>>,
}

impl<'q> Builder<'q> {
    pub fn new(sql: impl Into<String>) -> Self {
        Builder { sql: sql.into(), args: Vec::new() }
    }

    pub fn push(&mut self, sql: &str) -> &mut Self {
        self.sql.push_str(sql);
        self
    }

    /// `$N, $N+1, …`: one placeholder per value.
    pub fn list<A: Into<Arg<'q>>>(&mut self, values: impl IntoIterator<Item = A>) -> &mut Self {
        for (i, v) in values.into_iter().enumerate() {
            if i > 0 {
                self.sql.push_str(", ");
            }
            self.args.push(v.into());
            self.sql.push('$');
            self.sql.push_str(&self.args.len().to_string());
        }
        self
    }

    /// `VALUES (…), (…)`: each row's values as a parenthesised list.
    pub fn values<R: IntoIterator<Item = Arg<'q>>>(&mut self, rows: impl IntoIterator<Item = R>) -> &mut Self {
        self.sql.push_str("VALUES ");
        for (i, row) in rows.into_iter().enumerate() {
            self.sql.push_str(if i > 0 { ", (" } else { "(" });
            self.list(row);
            self.sql.push(')');
        }
        self
    }

    pub fn build(self) -> Query<'q> {
        Query { sql: Cow::Owned(self.sql), args: self.args }
    }
}

/// A row either engine returned.
pub enum Row {
    Sqlite(SqliteRow),
    Pg(PgRow),
}

/// A column's type that both engines decode.
pub trait Value: for<'r> Decode<'r, Sqlite> + Type<Sqlite> + for<'r> Decode<'r, Postgres> + Type<Postgres> {}
impl<T> Value for T where T: for<'r> Decode<'r, Sqlite> + Type<Sqlite> + for<'r> Decode<'r, Postgres> + Type<Postgres> {}

/// A tuple of columns that both engines decode.
pub trait Tuple: for<'r> FromRow<'r, SqliteRow> + for<'r> FromRow<'r, PgRow> {}
impl<T> Tuple for T where T: for<'r> FromRow<'r, SqliteRow> + for<'r> FromRow<'r, PgRow> {}

impl Row {
    /// Column `i`, decoded.
    ///
    /// # Panics
    /// No such column, or a value of another type (a query and its reader out of step), as sqlx's
    /// own `Row::get`.
    pub fn get<'r, T>(&'r self, i: usize) -> T
    where
        T: Decode<'r, Sqlite> + Type<Sqlite> + Decode<'r, Postgres> + Type<Postgres>,
    {
        match self {
            Row::Sqlite(r) => sqlx::Row::get(r, i),
            Row::Pg(r) => sqlx::Row::get(r, i),
        }
    }

    pub fn try_get<T: Value>(&self, i: usize) -> sqlx::Result<T> {
        match self {
            Row::Sqlite(r) => sqlx::Row::try_get(r, i),
            Row::Pg(r) => sqlx::Row::try_get(r, i),
        }
    }

    /// The row as a tuple of its columns.
    pub fn tuple<T: Tuple>(&self) -> sqlx::Result<T> {
        match self {
            Row::Sqlite(r) => T::from_row(r),
            Row::Pg(r) => T::from_row(r),
        }
    }
}

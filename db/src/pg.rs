//! The fleet store on PostgreSQL (`--db postgres://…`), for a fleet service that outgrows one
//! SQLite file: the same queries as SQLite's (`crate::queries`, over `crate::engine`'s
//! connection), the schema in `migrations-pg/`. Only what the fleet service and the fleet's read commands need
//! lives here; an agent's own results (runs being measured, the provisioning journal, the upload
//! outbox) stay in its SQLite file.

use std::path::{Path, PathBuf};
use std::str::FromStr;

use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{ConnectOptions, Connection};

use crate::{Access, DbError, Result};

static MIGRATOR: Migrator = sqlx::migrate!("./migrations-pg");

/// A connection to kiln's fleet store in a PostgreSQL database.
pub struct PgStore {
    /// The URL without its password: how messages name the database.
    path: PathBuf,
    options: PgConnectOptions,
    conn: PgConnection,
}

/// `url` with any password replaced by `***`, to name the database in messages and logs.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_string() };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((user_info, host)) => match user_info.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***@{host}{tail}"),
            None => url.to_string(),
        },
        None => url.to_string(),
    }
}

/// Whether an error means the server is not there (down, restarting, refusing connections)
/// rather than that a statement is wrong: SQLSTATE class 08 (connection exception) and 57P
/// (operator intervention: shutdown, crash, starting up), and any failure to talk to it.
fn unavailable(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) | sqlx::Error::Tls(_) | sqlx::Error::Protocol(_) | sqlx::Error::PoolTimedOut => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|c| c.starts_with("08") || c.starts_with("57P")),
        _ => false,
    }
}

fn classify(path: &Path, cause: sqlx::Error) -> DbError {
    if unavailable(&cause) {
        DbError::Unavailable { path: path.to_owned(), cause }
    } else {
        DbError::Sql { path: path.to_owned(), cause }
    }
}

impl crate::engine::Backend for PgStore {
    fn conn(&mut self) -> crate::engine::Conn<'_> {
        crate::engine::Conn::Pg(&mut self.conn)
    }
    fn path(&self) -> &Path {
        &self.path
    }
    fn classifier(&self) -> fn(&Path, sqlx::Error) -> DbError {
        classify
    }
}

impl PgStore {
    /// Connects to the database at `url`. A writer brings the schema up to date (sqlx holds an
    /// advisory lock while it migrates, so two services starting at once do not race); a reader
    /// needs the schema there already and never changes it.
    ///
    /// # Errors
    /// A malformed URL; a server that cannot be reached; a database written by a newer kiln, or
    /// (for reading) one kiln never wrote.
    pub async fn open(url: &str, access: Access) -> Result<PgStore> {
        let path = PathBuf::from(redact(url));
        let options = PgConnectOptions::from_str(url)
            .map_err(|cause| DbError::Sql { path: path.clone(), cause })?
            .disable_statement_logging();
        let mut conn = options.connect().await.map_err(|e| classify(&path, e))?;
        let known = MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0);
        let found: Option<i64> =
            match sqlx::query_scalar("SELECT MAX(version) FROM _sqlx_migrations").fetch_one(&mut conn).await {
                Ok(v) => v,
                // 42P01: no such table (a database kiln has not written yet).
                Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42P01") => None,
                Err(e) => return Err(classify(&path, e)),
            };
        match (found, access) {
            (Some(v), _) if v > known => return Err(DbError::TooNew { path, found: v, known }),
            (None, Access::Read) => return Err(DbError::Missing { path }),
            (Some(v), Access::Read) if v == known => {}
            _ => {
                MIGRATOR.run(&mut conn).await.map_err(|cause| DbError::Migrate { path: path.clone(), cause })?;
            }
        }
        Ok(PgStore { path, options, conn })
    }

    /// The database, as messages name it (its URL without the password).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Maps an sqlx error to a `DbError` naming this database.
    pub(crate) fn sql_err(&self) -> impl Fn(sqlx::Error) -> DbError {
        crate::engine::sql_err(self)
    }

    /// Makes sure the connection is alive, connecting again when it is not (the server restarted
    /// or dropped it). A server still down is an error; the connection is tried again next time.
    ///
    /// # Errors
    /// The server cannot be reached.
    pub async fn revive(&mut self) -> Result<()> {
        if self.conn.ping().await.is_ok() {
            return Ok(());
        }
        let fresh = self.options.connect().await.map_err(self.sql_err())?;
        let old = std::mem::replace(&mut self.conn, fresh);
        // The old connection is dead; closing it can only fail.
        let _ = old.close_hard().await;
        Ok(())
    }

    pub async fn close(self) -> Result<()> {
        let err = self.sql_err();
        self.conn.close().await.map_err(err)
    }
}

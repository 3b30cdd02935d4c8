//! A store in either engine, for what the fleet service and the fleet's read commands do:
//! [`Location`] is what `--db` names, [`AnyStore`] the open store. The shared queries
//! ([`crate::Queries`]) run on whichever engine holds the fleet.

use std::path::{Path, PathBuf};

use crate::engine::{Backend, Conn};
use crate::{Access, DbError, PgStore, Result, Store};

/// Where results are stored: an SQLite file (a path, or `sqlite://PATH`) or a PostgreSQL database
/// (`postgres://` or `postgresql://` URL, as libpq takes it: `?host=/run/postgresql` for a socket).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    Sqlite(PathBuf),
    Postgres(String),
}

impl Location {
    /// Reads `--db`.
    ///
    /// # Errors
    /// An empty path.
    pub fn parse(text: &str) -> std::result::Result<Location, String> {
        if text.starts_with("postgres://") || text.starts_with("postgresql://") {
            return Ok(Location::Postgres(text.to_string()));
        }
        let path = text.strip_prefix("sqlite://").unwrap_or(text);
        if path.is_empty() {
            return Err("an empty path".into());
        }
        Ok(Location::Sqlite(PathBuf::from(path)))
    }

    /// How messages name it (a URL without its password).
    pub fn shown(&self) -> String {
        match self {
            Location::Sqlite(p) => p.display().to_string(),
            Location::Postgres(url) => crate::pg::redact(url),
        }
    }
}

/// An open store in either engine.
pub enum AnyStore {
    Sqlite(Store),
    /// Boxed: a PostgreSQL connection is several times larger than SQLite's handle.
    Pg(Box<PgStore>),
}

impl Backend for AnyStore {
    fn conn(&mut self) -> Conn<'_> {
        match self {
            AnyStore::Sqlite(s) => s.conn(),
            AnyStore::Pg(s) => s.conn(),
        }
    }
    fn path(&self) -> &Path {
        match self {
            AnyStore::Sqlite(s) => Backend::path(s),
            AnyStore::Pg(s) => Backend::path(&**s),
        }
    }
    fn classifier(&self) -> fn(&Path, sqlx::Error) -> DbError {
        match self {
            AnyStore::Sqlite(s) => s.classifier(),
            AnyStore::Pg(s) => s.classifier(),
        }
    }
}

impl AnyStore {
    /// Opens the store at `location` (an SQLite file as [`Store::open_for`] does; PostgreSQL as
    /// [`PgStore::open`]).
    ///
    /// # Errors
    /// As those.
    pub async fn open(location: &Location, access: Access) -> Result<AnyStore> {
        Ok(match location {
            Location::Sqlite(path) => AnyStore::Sqlite(Store::open_for(path, access).await?),
            Location::Postgres(url) => AnyStore::Pg(Box::new(PgStore::open(url, access).await?)),
        })
    }

    /// The SQLite store, when this is one.
    pub fn sqlite(&mut self) -> Option<&mut Store> {
        match self {
            AnyStore::Sqlite(s) => Some(s),
            AnyStore::Pg(_) => None,
        }
    }

    /// Before work on a long-lived connection: a PostgreSQL connection the server dropped (a
    /// restart) is made again. SQLite has nothing to do.
    ///
    /// # Errors
    /// The PostgreSQL server cannot be reached.
    pub async fn revive(&mut self) -> Result<()> {
        match self {
            AnyStore::Sqlite(_) => Ok(()),
            AnyStore::Pg(s) => s.revive().await,
        }
    }

    pub async fn close(self) -> Result<()> {
        match self {
            AnyStore::Sqlite(s) => s.close().await,
            AnyStore::Pg(s) => s.close().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_and_redacted_urls() {
        assert_eq!(Location::parse("/var/lib/kiln/kiln.db"), Ok(Location::Sqlite("/var/lib/kiln/kiln.db".into())));
        assert_eq!(Location::parse("sqlite://rel/k.db"), Ok(Location::Sqlite("rel/k.db".into())));
        assert!(Location::parse("sqlite://").is_err());
        let pg = Location::parse("postgresql://kiln:s3cret@db:5432/kiln?sslmode=disable").unwrap();
        assert_eq!(pg, Location::Postgres("postgresql://kiln:s3cret@db:5432/kiln?sslmode=disable".into()));
        assert_eq!(pg.shown(), "postgresql://kiln:***@db:5432/kiln?sslmode=disable");
        for plain in ["postgres://kiln@localhost/kiln?host=/run/postgresql", "postgres://db/kiln", "not a url"] {
            assert_eq!(crate::redact(plain), plain);
        }
        // An '@' in the password: everything up to the last '@' of the authority is user info.
        assert_eq!(crate::redact("postgres://u:p@ss@h/d"), "postgres://u:***@h/d");
    }
}

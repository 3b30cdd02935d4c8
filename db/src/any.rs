//! A store in either engine, for what the fleet service and the fleet's read commands do:
//! [`Location`] is what `--db` names, [`AnyStore`] the open store. Each method runs the same
//! query text (`shared`) on whichever engine holds the fleet.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::{
    Access, ApplyRow, Fleet, HostRow, ImportError, ImportStats, InventoryRow, PgStore, Result, Role, RunContexts,
    RunDetail, RunRow, StepRow, Store, TokenRow, VerdictRow,
};

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

/// Methods that run the shared queries on whichever engine this is.
macro_rules! delegate {
    ($($(#[$meta:meta])* fn $name:ident(&mut self $(, $arg:ident: $ty:ty)*) -> $ret:ty;)*) => {
        $(
            $(#[$meta])*
            pub async fn $name(&mut self $(, $arg: $ty)*) -> $ret {
                match self {
                    AnyStore::Sqlite(s) => s.$name($($arg),*).await,
                    AnyStore::Pg(s) => s.$name($($arg),*).await,
                }
            }
        )*
    };
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

    delegate! {
        /// Every known host, most recently seen first.
        fn hosts(&mut self) -> Result<Vec<HostRow>>;
        /// The most recent runs first, with their metrics.
        fn runs(&mut self, limit: i64) -> Result<Vec<RunRow>>;
        /// One run by id or unique prefix, with its samples and telemetry.
        fn run(&mut self, id: &str) -> Result<RunDetail>;
        /// Every rank's runs of one cluster run, with their samples (see [`Store::runs_of_cluster`]).
        fn runs_of_cluster(&mut self, cluster_id: &str) -> Result<Vec<RunDetail>>;
        /// One inventory by id or unique prefix.
        fn inventory(&mut self, id: &str) -> Result<InventoryRow>;
        /// Each host's newest run start, by host id.
        fn last_runs(&mut self) -> Result<BTreeMap<String, String>>;
        /// Every series key and host with its series (see [`Store::fleet`]).
        fn fleet(&mut self, since: Option<i64>) -> Result<Fleet>;
        /// What runs were measured on, batched (see [`Store::run_contexts`]).
        fn run_contexts(&mut self, boundaries: &[(String, String)]) -> Result<RunContexts>;
        /// The mean of each telemetry channel of a run.
        fn telemetry_means(&mut self, run_id: &str) -> Result<Vec<(String, String, f64, i64)>>;
        /// A host's newest inventory (collected at, document).
        fn latest_inventory(&mut self, host_id: &str) -> Result<Option<(String, String)>>;
        /// The newest verdict of every host that has one, without its document.
        fn latest_verdicts(&mut self) -> Result<BTreeMap<String, VerdictRow>>;
        /// The newest verdict of one host, with its document.
        fn latest_verdict(&mut self, host_id: &str) -> Result<Option<VerdictRow>>;
        /// Provisioning applies, newest first, optionally of one image.
        fn applies(&mut self, image: Option<&str>, limit: i64) -> Result<Vec<ApplyRow>>;
        /// One apply by id or unique prefix, with its steps in order.
        fn apply_journal(&mut self, id: &str) -> Result<(ApplyRow, Vec<StepRow>)>;
        /// Stores a new token's hash.
        fn create_token(&mut self, id: &str, name: &str, role: Role, secret_sha256: &[u8], created_at: &str) -> Result<()>;
        /// Every token, newest first.
        fn tokens(&mut self) -> Result<Vec<TokenRow>>;
        /// One token by its id.
        fn token(&mut self, id: &str) -> Result<Option<TokenRow>>;
        /// Revokes the live token with this name or id.
        fn revoke_token(&mut self, name_or_id: &str, at: &str) -> Result<Option<TokenRow>>;
        /// Records that a token was used.
        fn token_used(&mut self, id: &str, at: &str) -> Result<()>;
        /// Imports an export, all or nothing.
        fn import(&mut self, file: &str, text: &str) -> std::result::Result<ImportStats, ImportError>;
        /// Several uploads in one transaction, each whole or not at all.
        fn import_many(&mut self, uploads: &[(String, String)]) -> Vec<std::result::Result<ImportStats, ImportError>>;
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

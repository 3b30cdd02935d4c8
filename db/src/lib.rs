//! kiln's results store: SQLite through sqlx, with embedded migrations and WAL; for the fleet
//! service, PostgreSQL too (`pg`), running the same queries (`queries`, over `engine`'s one
//! connection type for both).
//!
//! Invariants: the store never overwrites or "repairs" a file it did not create (a corrupt or
//! foreign file is refused), never writes to a database from a newer kiln, and every write is one
//! transaction. It knows nothing of kiln's JSON documents beyond storing them as text.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use sqlx::migrate::Migrator;
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqliteSynchronous};
use sqlx::{ConnectOptions, Connection};

use engine::Conn;

mod any;
mod bulk;
mod engine;
mod exchange;
mod fleet;
mod journal;
mod outbox;
mod pg;
mod queries;
mod series;
mod status;
mod tokens;
mod verdicts;
pub use any::{AnyStore, Location};
pub use exchange::{check_export, ExportStats, ImportError, ImportStats, Sender, Upload, EXPORT_VERSION};
pub use fleet::{mean_power, Fleet, FleetHost};
pub use journal::{ApplyRow, NewApply, StepRow};
pub use kiln_text::timefmt::parse_rfc3339;
pub use outbox::{Pending, UploadBatch};
pub use pg::{redact, PgStore};
pub use queries::Queries;
pub use series::{BlobError, HostSeries, RunPoint, Series, SeriesKey};
pub use status::{ApplyStatus, RunStatus, StepStatus, UnknownName};
pub use tokens::{Role, TokenRow};
pub use verdicts::{AcceptedInventory, NewVerdict, VerdictRow};

static MIGRATOR: Migrator = sqlx::migrate!("./migrations");

/// How every write transaction starts: taking the write lock at once, so that a busy database is
/// waited for (the busy timeout) instead of failing when a transaction that has read tries to
/// write (SQLite refuses that upgrade at once to avoid a deadlock).
pub(crate) const WRITE: &str = "BEGIN IMMEDIATE";

/// A hash map for the import's hot lookups (run ids, dictionary keys, series keys, millions of
/// times per fleet import): keys are kiln's own ids and names, so a fast non-cryptographic hash
/// is enough (SipHash was a tenth of a fleet import's time).
pub(crate) type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

const SQLITE_MAGIC: &[u8; 16] = b"SQLite format 3\0";

#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("{path}: not an SQLite database (the file was left untouched; point --db elsewhere or move it away)")]
    NotSqlite { path: PathBuf },
    // Causes are part of the message rather than `source`, so that a chain printer does not
    // repeat sqlx's own nested errors.
    #[error("{path}: the database is corrupt ({cause}); the file was left untouched: restore it from a backup, or move it away to start a new one")]
    Corrupt { path: PathBuf, cause: sqlx::Error },
    #[error("{path}: written by a newer kiln (schema {found}, this kiln knows up to {known}); upgrade kiln or use another --db")]
    TooNew { path: PathBuf, found: i64, known: i64 },
    #[error("{path}: an SQLite database, but not kiln's (it has tables and no kiln migrations); the file was left untouched")]
    Foreign { path: PathBuf },
    #[error("{path}: cannot open: {source}")]
    Open { path: PathBuf, source: std::io::Error },
    #[error("{path}: {cause}")]
    Sql { path: PathBuf, cause: sqlx::Error },
    #[error("{path}: migrating the schema failed: {cause}")]
    Migrate { path: PathBuf, cause: sqlx::migrate::MigrateError },
    #[error("{path}: no database here (nothing was stored yet, or the path is mistyped); nothing was created")]
    Missing { path: PathBuf },
    #[error("{dir}: no such directory; kiln creates a database only in a directory that exists")]
    NoDirectory { dir: PathBuf },
    #[error("{path}: the database failed its integrity check ({detail}); the file was left untouched: restore it from a backup, or move it away to start a new one (`kiln db check` lists every problem)")]
    Damaged { path: PathBuf, detail: String },
    #[error("{path}: another program has held the database for 10 s (another kiln writing, say); nothing was written: try again when it is done")]
    Busy { path: PathBuf },
    #[error("{path}: the database or its directory is read-only for this user; nothing was written (run as a user who may write it, or point --db elsewhere)")]
    ReadOnly { path: PathBuf },
    #[error("{path}: a write to this database was interrupted (a killed kiln, a crash or a power cut) and SQLite must roll it back before anything can read it, which needs write access to the file and its directory; run kiln once as a user who may write them")]
    Interrupted { path: PathBuf },
    #[error("{path}: the database server cannot be reached ({cause}); nothing was written: start it, or check the URL and that this host may connect")]
    Unavailable { path: PathBuf, cause: sqlx::Error },
    #[error("{path}: the filesystem holding the database is full ({cause}); nothing was written and what was stored before is intact: free space there, or point --db elsewhere, and run the command again")]
    Full { path: PathBuf, cause: sqlx::Error },
    #[error("{path}: {what}")]
    Conflict { path: PathBuf, what: String },
    #[error("no {what} matches {id:?}")]
    NotFound { what: &'static str, id: String },
    #[error("{id:?} matches {count} {what}s; give more characters")]
    Ambiguous { what: &'static str, id: String, count: usize },
}

pub type Result<T, E = DbError> = std::result::Result<T, E>;

/// The newest schema this build knows.
pub fn latest_schema() -> i64 {
    MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0)
}

/// What the agent hands over to store one inventory: plain values, no agent types.
#[derive(Debug, Clone)]
pub struct NewInventory {
    pub host_identity: String,
    pub hostname: Option<String>,
    pub collected_at: String,
    pub schema_version: i64,
    pub config_fingerprint: String,
    pub config_name: String,
    pub cpu_model: Option<String>,
    pub cpu_packages: i64,
    pub cpu_cores: i64,
    pub cpu_threads: i64,
    pub memory_bytes: Option<i64>,
    pub kernel_release: Option<String>,
    pub problem_count: i64,
    pub document: String,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct SavedInventory {
    pub inventory_id: String,
    pub host_id: String,
    pub new_host: bool,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct HostRow {
    pub id: String,
    pub identity: String,
    pub hostname: Option<String>,
    pub config_fingerprint: String,
    pub config_name: String,
    pub first_seen: String,
    pub last_seen: String,
    pub inventories: i64,
    pub latest_inventory: Option<String>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct InventoryRow {
    pub id: String,
    pub host_id: String,
    pub collected_at: String,
    pub config_fingerprint: String,
    pub document: String,
}

/// Whether a bigger value of a metric is better.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    Higher,
    Lower,
    None,
}

impl Direction {
    fn as_str(self) -> &'static str {
        match self {
            Direction::Higher => "higher",
            Direction::Lower => "lower",
            Direction::None => "none",
        }
    }
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Metric {
    pub name: String,
    pub value: f64,
    pub unit: String,
    pub direction: Direction,
}

/// One benchmark run with everything measured in it; written in one transaction.
#[derive(Debug, Clone)]
pub struct NewRun {
    pub host_id: String,
    pub inventory_id: Option<String>,
    /// The software stack (kernel, driver, frameworks) as JSON, deduplicated by its fingerprint.
    pub software: Option<(String, String)>,
    pub benchmark: String,
    pub config: String,
    pub started_at: String,
    pub finished_at: String,
    pub status: RunStatus,
    /// Why the run is `invalid` (or any other note on its status).
    pub status_reason: Option<String>,
    pub metrics: Vec<Metric>,
    /// (metric, repetition, value): every raw sample behind the metrics.
    pub samples: Vec<(String, i64, f64)>,
    /// (milliseconds since start, source, name, value).
    pub telemetry: Vec<(i64, String, String, f64)>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct RunRow {
    pub id: String,
    pub host_id: String,
    pub hostname: Option<String>,
    pub benchmark: String,
    /// The benchmark's exact configuration, a JSON document (an object in the row's JSON).
    #[serde(serialize_with = "as_json")]
    pub config: String,
    pub started_at: String,
    pub finished_at: Option<String>,
    pub status: RunStatus,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status_reason: Option<String>,
    pub metrics: Vec<Metric>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct RunDetail {
    #[serde(flatten)]
    pub run: RunRow,
    /// The software stack, a JSON document (an object in the row's JSON).
    #[serde(serialize_with = "as_optional_json")]
    pub software: Option<String>,
    pub samples: Vec<(String, i64, f64)>,
    pub telemetry: Vec<(i64, String, String, f64)>,
}

/// What a run was measured on: its software stack (fingerprint and id) and inventory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunRefs {
    pub software_fingerprint: Option<String>,
    pub software_id: Option<String>,
    pub inventory_id: Option<String>,
}

/// What runs were measured on, and the documents needed to say how consecutive runs differ
/// ([`Store::run_contexts`]).
#[derive(Debug, Default)]
pub struct RunContexts {
    /// By run id; a run that is not stored is absent.
    pub runs: std::collections::HashMap<String, RunRefs>,
    /// Software stack documents by id.
    pub software: std::collections::HashMap<String, String>,
    /// Inventory documents by id.
    pub inventories: std::collections::HashMap<String, String>,
}

/// A stored JSON document serialised as the JSON it holds, not as a string of it; text that is not
/// JSON (never written by kiln) stays a string.
fn as_json<S: serde::Serializer>(text: &str, s: S) -> std::result::Result<S::Ok, S::Error> {
    use serde::Serialize;
    match serde_json::from_str::<&serde_json::value::RawValue>(text) {
        Ok(raw) => raw.serialize(s),
        Err(_) => s.serialize_str(text),
    }
}

fn as_optional_json<S: serde::Serializer>(text: &Option<String>, s: S) -> std::result::Result<S::Ok, S::Error> {
    match text {
        Some(t) => as_json(t, s),
        None => s.serialize_none(),
    }
}

/// The columns a run query selects first (`runs r JOIN hosts h`), as [`Store::with_metrics`] reads them.
pub(crate) const RUN_COLUMNS: &str =
    "r.id, r.host_id, h.hostname, r.benchmark, r.config, r.started_at, r.finished_at, r.status, r.status_reason";

/// SQLite allows 32766 bound values per statement; stay well under.
pub(crate) const MAX_BINDS: usize = 30_000;

pub struct Store {
    path: PathBuf,
    conn: SqliteConnection,
    created: bool,
    /// Every inventory, run and verdict saved is queued in the outbox for the fleet service, in
    /// the transaction that stores it ([`Store::queue_uploads`]).
    queue_uploads: bool,
}

/// How a command uses the database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Reads only: the file must exist; it is opened read-only (a read-only file or directory
    /// will do) and never created or migrated, unless its schema is older than this kiln's.
    Read,
    /// Writes: created where its directory exists, checked (`PRAGMA quick_check`) before the
    /// first write, migrated.
    Write,
}

/// Reads the first 16 bytes; `None` for an empty or absent file (a new database).
fn header(path: &Path) -> Result<Option<[u8; 16]>> {
    let mut file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(DbError::Open { path: path.to_owned(), source }),
    };
    let mut buf = [0u8; 16];
    let mut filled = 0;
    while filled < 16 {
        match file.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(source) => return Err(DbError::Open { path: path.to_owned(), source }),
        }
    }
    match filled {
        0 => Ok(None),
        16 => Ok(Some(buf)),
        _ => Err(DbError::NotSqlite { path: path.to_owned() }),
    }
}

/// An exclusive `flock` on `<database>.lock`, released when dropped. Where the lock file cannot be
/// created (a read-only directory) there is nobody to race with a migration: no lock.
struct OpenLock {
    _file: Option<std::fs::File>,
}

/// A file beside the database: `<database><suffix>` (SQLite's `-wal` and `-shm`, kiln's `.lock`).
fn beside(db: &Path, suffix: &str) -> PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

impl OpenLock {
    fn take(db: &Path) -> Result<OpenLock> {
        let name = beside(db, ".lock");
        let file = match std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(&name) {
            Ok(f) => f,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::ReadOnlyFilesystem
                ) =>
            {
                return Ok(OpenLock { _file: None })
            }
            Err(source) => return Err(DbError::Open { path: name, source }),
        };
        use std::os::fd::AsRawFd;
        // SAFETY: flock on a descriptor we own; blocks until the other opener has finished.
        while unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(DbError::Open { path: name.clone(), source: e });
            }
        }
        Ok(OpenLock { _file: Some(file) })
    }
}

/// SQLite's primary result code of a database error (extended codes folded).
fn sqlite_code(e: &sqlx::Error) -> Option<i64> {
    match e {
        sqlx::Error::Database(db) => db.code().and_then(|c| c.parse::<i64>().ok()).map(|c| c & 0xff),
        _ => None,
    }
}

/// Whether a read-only connection met the traces of an interrupted write that only a connection
/// allowed to write may clear: a hot rollback journal (SQLITE_READONLY_ROLLBACK, 776) or a
/// write-ahead log whose index must be rebuilt (SQLITE_READONLY_RECOVERY, 264).
fn needs_recovery(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(db) => matches!(db.code().and_then(|c| c.parse::<i64>().ok()), Some(264 | 776)),
        _ => false,
    }
}

fn is_corruption(e: &sqlx::Error) -> bool {
    // SQLITE_CORRUPT (11) and SQLITE_NOTADB (26).
    matches!(sqlite_code(e), Some(11 | 26))
}

/// A LIKE pattern matching ids that start with `id`, its wildcards escaped (ESCAPE '\\') so that an
/// id never matches more than its prefix says.
fn like_prefix(id: &str) -> String {
    format!("{}%", id.replace('\\', "\\\\").replace('%', "\\%").replace('_', "\\_"))
}

/// What every connection to the database at `path` shares: the file, the busy timeout (10 s), no
/// statement logging.
fn connect_options(path: &Path) -> Result<SqliteConnectOptions> {
    Ok(SqliteConnectOptions::from_str("sqlite://")
        .map_err(|source| classify(path, source))?
        .filename(path)
        .busy_timeout(std::time::Duration::from_secs(10))
        .disable_statement_logging())
}

/// The bytes free to this user on the filesystem that holds (or will hold) the database at `db`;
/// `None` where its directory cannot be asked (it does not exist yet).
pub fn free_bytes(db: &Path) -> Option<u64> {
    let dir = db.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    nix::sys::statvfs::statvfs(dir).ok().map(|s| s.blocks_available().saturating_mul(s.fragment_size()))
}

/// Whether the filesystem holding `db` has (next to) no room left: under 1 MiB free to this user.
fn disk_full(db: &Path) -> bool {
    free_bytes(db).is_some_and(|free| free < 1 << 20)
}

fn classify(path: &Path, cause: sqlx::Error) -> DbError {
    if is_corruption(&cause) {
        DbError::Corrupt { path: path.to_owned(), cause }
    } else if matches!(sqlite_code(&cause), Some(5 | 6)) {
        // SQLITE_BUSY, SQLITE_LOCKED: still so after the busy timeout.
        DbError::Busy { path: path.to_owned() }
    } else if sqlite_code(&cause) == Some(8) {
        DbError::ReadOnly { path: path.to_owned() }
    } else if sqlite_code(&cause) == Some(13) || (sqlite_code(&cause) == Some(10) && disk_full(path)) {
        // SQLITE_FULL; or an I/O error (growing the WAL index, say) on a filesystem with no room.
        DbError::Full { path: path.to_owned(), cause }
    } else {
        DbError::Sql { path: path.to_owned(), cause }
    }
}

impl engine::Backend for Store {
    fn conn(&mut self) -> Conn<'_> {
        Conn::Sqlite(&mut self.conn)
    }
    fn path(&self) -> &Path {
        &self.path
    }
    fn classifier(&self) -> fn(&Path, sqlx::Error) -> DbError {
        classify
    }
}

impl Store {
    /// Opens the database at `path` for writing (creating it when absent) and brings its schema
    /// up to date: [`Store::open_for`] with [`Access::Write`].
    ///
    /// # Errors
    /// As [`Store::open_for`].
    pub async fn open(path: &Path) -> Result<Store> {
        Self::open_for(path, Access::Write).await
    }

    /// Opens the database at `path` for reading or writing.
    ///
    /// # Errors
    /// A file that is not SQLite, is corrupt (a damaged page included, before a write), belongs to
    /// another program or to a newer kiln is refused and left byte-for-byte as it was; for reading,
    /// a missing file; for writing, a missing directory.
    pub async fn open_for(path: &Path, access: Access) -> Result<Store> {
        if access == Access::Read {
            match header(path)? {
                None if !path.exists() => return Err(DbError::Missing { path: path.to_owned() }),
                Some(h) if &h != SQLITE_MAGIC => return Err(DbError::NotSqlite { path: path.to_owned() }),
                Some(_) => {
                    if let Some(store) = Self::open_read_only(path).await? {
                        return Ok(store);
                    }
                    // An older schema: reading it needs the migration, which is a write.
                }
                None => {}
            }
        }
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            if !dir.is_dir() {
                return Err(DbError::NoDirectory { dir: dir.to_owned() });
            }
        }
        // Two kilns opening a new or older database at once would both migrate it: the second
        // fails on tables the first created. Opening, checking and migrating are serialised on a
        // lock file beside the database (not the database itself: closing another descriptor of
        // it would drop SQLite's own POSIX locks).
        let _guard = OpenLock::take(path)?;
        let existing = match header(path)? {
            Some(h) if &h != SQLITE_MAGIC => return Err(DbError::NotSqlite { path: path.to_owned() }),
            Some(_) => true,
            None => false,
        };
        let sql_err = |source| classify(path, source);
        let base = connect_options(path)?.foreign_keys(true).synchronous(SqliteSynchronous::Normal);
        if existing {
            // Look before touching: a read-only connection cannot write, checkpoint or convert
            // a file that turns out to be corrupt, foreign or from a newer kiln.
            let mut probe = Self::probe(path, &base).await?;
            let verdict = match Self::check(path, &mut probe).await {
                Ok(()) => Self::quick_check(path, &mut probe).await,
                e => e,
            };
            probe.close().await.map_err(sql_err)?;
            verdict?;
        }
        let mut conn =
            base.create_if_missing(!existing).journal_mode(SqliteJournalMode::Wal).connect().await.map_err(sql_err)?;
        let applied_before: i64 = if existing {
            sqlx::query_scalar("SELECT COALESCE(MAX(version), 0) FROM _sqlx_migrations")
                .fetch_one(&mut conn)
                .await
                .unwrap_or(0)
        } else {
            0
        };
        MIGRATOR.run(&mut conn).await.map_err(|cause| match cause {
            sqlx::migrate::MigrateError::Execute(e) if is_corruption(&e) => {
                DbError::Corrupt { path: path.to_owned(), cause: e }
            }
            cause => DbError::Migrate { path: path.to_owned(), cause },
        })?;
        let mut store = Store { path: path.to_owned(), conn, created: !existing, queue_uploads: false };
        // Runs stored before the fleet series existed (schema 3), or series emptied to repair a
        // damaged blob: derive them from the runs.
        let missing: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM runs) AND NOT EXISTS (SELECT 1 FROM host_series)")
                .fetch_one(&mut store.conn)
                .await
                .map_err(|e| classify(path, e))?;
        if (1..3).contains(&applied_before) || missing {
            store.rebuild_series().await?;
        }
        Ok(store)
    }

    /// A read-only connection to an existing database, after SQLite's crash recovery where an
    /// interrupted write left traces only a writer may clear (see [`Store::recover`]).
    async fn probe(path: &Path, base: &SqliteConnectOptions) -> Result<SqliteConnection> {
        let sql_err = |source| classify(path, source);
        let read_only = base.clone().read_only(true);
        match read_only.connect().await {
            Ok(mut conn) => match sqlx::query("SELECT 1 FROM sqlite_master LIMIT 1").fetch_optional(&mut conn).await {
                Err(e) if needs_recovery(&e) => conn.close().await.map_err(sql_err)?,
                // Any other error is for the checks that follow to report.
                _ => return Ok(conn),
            },
            Err(e) if needs_recovery(&e) => {}
            Err(e) => return Err(sql_err(e)),
        }
        Self::recover(path, base).await?;
        read_only.connect().await.map_err(sql_err)
    }

    /// SQLite's own crash recovery, which a read-only connection may not run: the first connection
    /// allowed to write rolls back a killed writer's hot journal (restoring the file as it was
    /// before the interrupted transaction) or rebuilds its write-ahead log's index. Nothing else is
    /// written.
    async fn recover(path: &Path, base: &SqliteConnectOptions) -> Result<()> {
        let refused = |cause: sqlx::Error| match classify(path, cause) {
            DbError::ReadOnly { .. } => DbError::Interrupted { path: path.to_owned() },
            e => e,
        };
        let mut conn = base.clone().connect().await.map_err(refused)?;
        sqlx::query("SELECT 1 FROM sqlite_master LIMIT 1").fetch_optional(&mut conn).await.map_err(refused)?;
        conn.close().await.map_err(refused)
    }

    /// Refuses files that are not kiln's, are corrupt, or come from a newer kiln.
    async fn check(path: &Path, conn: &mut SqliteConnection) -> Result<()> {
        let sql_err = |source| classify(path, source);
        let tables: Vec<String> = sqlx::query_scalar("SELECT name FROM sqlite_master WHERE type = 'table'")
            .fetch_all(&mut *conn)
            .await
            .map_err(sql_err)?;
        let has_migrations = tables.iter().any(|t| t == "_sqlx_migrations");
        if !has_migrations && tables.iter().any(|t| !t.starts_with("sqlite_")) {
            return Err(DbError::Foreign { path: path.to_owned() });
        }
        if has_migrations {
            let found: Option<i64> = sqlx::query_scalar("SELECT MAX(version) FROM _sqlx_migrations")
                .fetch_one(&mut *conn)
                .await
                .map_err(sql_err)?;
            let known = latest_schema();
            if let Some(found) = found.filter(|&f| f > known) {
                return Err(DbError::TooNew { path: path.to_owned(), found, known });
            }
        }
        Ok(())
    }

    /// A read-only connection to an existing database at this kiln's schema; `None` when its
    /// schema is older (it must be migrated first) or an interrupted write must be rolled back. In a directory where SQLite cannot make the
    /// write-ahead log's index (a read-only one), the file is read as immutable.
    async fn open_read_only(path: &Path) -> Result<Option<Store>> {
        let sql_err = |source| classify(path, source);
        let base = connect_options(path)?.read_only(true);
        let mut conn = match base.clone().connect().await {
            Ok(mut c) => match sqlx::query("SELECT 1 FROM sqlite_master LIMIT 1").fetch_optional(&mut c).await {
                Ok(_) => c,
                // An interrupted write: reading the file as it lies would see half of it. Opening
                // for writing rolls it back first.
                Err(e) if needs_recovery(&e) => {
                    c.close().await.map_err(sql_err)?;
                    return Ok(None);
                }
                Err(_) => base.immutable(true).connect().await.map_err(sql_err)?,
            },
            Err(e) if needs_recovery(&e) => return Ok(None),
            Err(_) => base.immutable(true).connect().await.map_err(sql_err)?,
        };
        Self::check(path, &mut conn).await?;
        let found: Option<i64> =
            sqlx::query_scalar("SELECT MAX(version) FROM _sqlx_migrations").fetch_one(&mut conn).await.unwrap_or(None);
        if found.unwrap_or(0) < latest_schema() {
            conn.close().await.map_err(sql_err)?;
            return Ok(None);
        }
        Ok(Some(Store { path: path.to_owned(), conn, created: false, queue_uploads: false }))
    }

    /// `PRAGMA quick_check`: damaged pages, out-of-order or missing index entries. Cheap enough to
    /// run before the first write of every command.
    async fn quick_check(path: &Path, conn: &mut SqliteConnection) -> Result<()> {
        let rows: Vec<String> = sqlx::query_scalar("PRAGMA quick_check(10)")
            .fetch_all(&mut *conn)
            .await
            .map_err(|source| classify(path, source))?;
        if rows.len() == 1 && rows[0] == "ok" {
            return Ok(());
        }
        Err(DbError::Damaged { path: path.to_owned(), detail: rows.join("; ") })
    }

    /// `PRAGMA integrity_check`: every problem SQLite finds, or `["ok"]`.
    ///
    /// # Errors
    /// The check cannot run (the file is too damaged to read).
    pub async fn integrity_check(&mut self) -> Result<Vec<String>> {
        sqlx::query_scalar("PRAGMA integrity_check").fetch_all(&mut self.conn).await.map_err(self.sql_err())
    }

    /// Whether this open created the database.
    pub fn created(&self) -> bool {
        self.created
    }

    /// Closes a database this open created and removes it with its log, index and lock files: for
    /// a command that failed before storing anything (nothing is created by mistake). A database
    /// that was already there is only closed.
    ///
    /// # Errors
    /// Closing fails.
    pub async fn discard(self) -> Result<()> {
        let (path, created) = (self.path.clone(), self.created);
        self.close().await?;
        if created {
            for suffix in ["", "-wal", "-shm", ".lock"] {
                let _ = std::fs::remove_file(beside(&path, suffix));
            }
        }
        Ok(())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Maps an sqlx error to a `DbError` naming this store's file.
    pub(crate) fn sql_err(&self) -> impl Fn(sqlx::Error) -> DbError {
        engine::sql_err(self)
    }

    /// Stores an inventory and creates or updates its host, in one transaction.
    pub async fn save_inventory(&mut self, inv: &NewInventory) -> Result<SavedInventory> {
        let err = self.sql_err();
        let mut tx = self.conn.begin_with(crate::WRITE).await.map_err(&err)?;
        let existing: Option<String> = sqlx::query_scalar("SELECT id FROM hosts WHERE identity = ?")
            .bind(&inv.host_identity)
            .fetch_optional(&mut *tx)
            .await
            .map_err(&err)?;
        let (host_id, new_host) = match existing {
            Some(id) => {
                sqlx::query(
                    "UPDATE hosts SET hostname = ?, config_fingerprint = ?, config_name = ?, last_seen = ? WHERE id = ?",
                )
                .bind(&inv.hostname)
                .bind(&inv.config_fingerprint)
                .bind(&inv.config_name)
                .bind(&inv.collected_at)
                .bind(&id)
                .execute(&mut *tx)
                .await
                .map_err(&err)?;
                (id, false)
            }
            None => {
                let id = uuid::Uuid::new_v4().to_string();
                sqlx::query(
                    "INSERT INTO hosts (id, identity, hostname, config_fingerprint, config_name, first_seen, last_seen) \
                     VALUES (?, ?, ?, ?, ?, ?, ?)",
                )
                .bind(&id)
                .bind(&inv.host_identity)
                .bind(&inv.hostname)
                .bind(&inv.config_fingerprint)
                .bind(&inv.config_name)
                .bind(&inv.collected_at)
                .bind(&inv.collected_at)
                .execute(&mut *tx)
                .await
                .map_err(&err)?;
                (id, true)
            }
        };
        let inventory_id = uuid::Uuid::new_v4().to_string();
        sqlx::query(
            "INSERT INTO inventories (id, host_id, collected_at, schema_version, config_fingerprint, config_name, \
             cpu_model, cpu_packages, cpu_cores, cpu_threads, memory_bytes, kernel_release, problem_count, document) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(&inventory_id)
        .bind(&host_id)
        .bind(&inv.collected_at)
        .bind(inv.schema_version)
        .bind(&inv.config_fingerprint)
        .bind(&inv.config_name)
        .bind(&inv.cpu_model)
        .bind(inv.cpu_packages)
        .bind(inv.cpu_cores)
        .bind(inv.cpu_threads)
        .bind(inv.memory_bytes)
        .bind(&inv.kernel_release)
        .bind(inv.problem_count)
        .bind(&inv.document)
        .execute(&mut *tx)
        .await
        .map_err(&err)?;
        if self.queue_uploads {
            outbox::queue(&mut tx, "inventory", &inventory_id).await.map_err(&err)?;
        }
        tx.commit().await.map_err(&err)?;
        Ok(SavedInventory { inventory_id, host_id, new_host })
    }

    /// Stores a run, its metrics, samples and telemetry in one transaction, with batched inserts.
    pub async fn save_run(&mut self, run: &NewRun) -> Result<String> {
        let err = self.sql_err();
        let id = uuid::Uuid::new_v4().to_string();
        let mut tx = self.conn.begin_with(crate::WRITE).await.map_err(&err)?;
        let software_id = match &run.software {
            Some((fingerprint, document)) => {
                let existing: Option<String> =
                    sqlx::query_scalar("SELECT id FROM software_stacks WHERE fingerprint = ?")
                        .bind(fingerprint)
                        .fetch_optional(&mut *tx)
                        .await
                        .map_err(&err)?;
                match existing {
                    Some(id) => Some(id),
                    None => {
                        let sid = uuid::Uuid::new_v4().to_string();
                        sqlx::query("INSERT INTO software_stacks (id, fingerprint, document) VALUES (?, ?, ?)")
                            .bind(&sid)
                            .bind(fingerprint)
                            .bind(document)
                            .execute(&mut *tx)
                            .await
                            .map_err(&err)?;
                        Some(sid)
                    }
                }
            }
            None => None,
        };
        sqlx::query(
            "INSERT INTO runs (id, host_id, inventory_id, software_id, benchmark, config, started_at, finished_at, status, \
             status_reason) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(&id)
        .bind(&run.host_id)
        .bind(&run.inventory_id)
        .bind(&software_id)
        .bind(&run.benchmark)
        .bind(&run.config)
        .bind(&run.started_at)
        .bind(&run.finished_at)
        .bind(run.status.as_str())
        .bind(&run.status_reason)
        .execute(&mut *tx)
        .await
        .map_err(&err)?;
        let nums = queries::values::run_numbers(&mut Conn::Sqlite(&mut tx), &[id.as_str()]).await.map_err(&err)?;
        let v = queries::values::Values {
            metrics: run
                .metrics
                .iter()
                .map(|m| (id.as_str(), m.name.as_str(), m.unit.as_str(), m.direction.as_str(), m.value))
                .collect(),
            samples: run.samples.iter().map(|(m, i, x)| (id.as_str(), m.as_str(), *i, *x)).collect(),
            telemetry: run
                .telemetry
                .iter()
                .map(|(t, src, n, x)| (id.as_str(), src.as_str(), n.as_str(), *t, *x))
                .collect(),
        };
        queries::values::write(&mut Conn::Sqlite(&mut tx), &nums, &v).await.map_err(&err)?;
        let (config_fingerprint, config_name): (String, String) = sqlx::query_as(
            "SELECT COALESCE(i.config_fingerprint, h.config_fingerprint), COALESCE(i.config_name, h.config_name) \
             FROM hosts h LEFT JOIN inventories i ON i.id = ?2 WHERE h.id = ?1",
        )
        .bind(&run.host_id)
        .bind(&run.inventory_id)
        .fetch_one(&mut *tx)
        .await
        .map_err(&err)?;
        if run.status.is_result() {
            let index = queries::index::IndexRun {
                host_id: &run.host_id,
                run_id: &id,
                started_at: &run.started_at,
                config_fingerprint: &config_fingerprint,
                config_name: &config_name,
                benchmark: &run.benchmark,
                bench_config: &run.config,
                software_fingerprint: run.software.as_ref().map_or("", |(fp, _)| fp.as_str()),
                metrics: run
                    .metrics
                    .iter()
                    .map(|m| (m.name.as_str(), m.value, m.unit.as_str(), m.direction.as_str()))
                    .collect(),
                power_watts: fleet::mean_power(run.telemetry.iter().map(|(_, s, n, v)| (s.as_str(), n.as_str(), *v))),
            };
            queries::index::index_runs(&mut Conn::Sqlite(&mut tx), &[index]).await.map_err(&err)?;
        }
        if self.queue_uploads {
            outbox::queue(&mut tx, "run", &id).await.map_err(&err)?;
        }
        tx.commit().await.map_err(&err)?;
        Ok(id)
    }

    pub async fn close(self) -> Result<()> {
        let path = self.path.clone();
        self.conn.close().await.map_err(|cause| DbError::Sql { path, cause })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn sample(identity: &str) -> NewInventory {
        NewInventory {
            host_identity: identity.to_string(),
            hostname: Some("gpu-node-01".into()),
            collected_at: "2026-12-02T10:00:00Z".into(),
            schema_version: 1,
            config_fingerprint: "abcd".into(),
            config_name: "2× EPYC · 1.5 TiB".into(),
            cpu_model: Some("AMD EPYC 9654".into()),
            cpu_packages: 2,
            cpu_cores: 192,
            cpu_threads: 384,
            memory_bytes: Some(1 << 40),
            kernel_release: Some("6.8.0".into()),
            problem_count: 0,
            document: "{}".into(),
        }
    }

    #[tokio::test]
    async fn saves_and_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/kiln.db");
        // Neither a read nor a write creates a directory, or a database for a read.
        assert!(matches!(Store::open_for(&path, Access::Read).await, Err(DbError::Missing { .. })));
        assert!(matches!(Store::open(&path).await, Err(DbError::NoDirectory { .. })));
        assert!(!dir.path().join("sub").exists());
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let mut store = Store::open(&path).await.unwrap();
        assert!(store.created());
        let a = store.save_inventory(&sample("host-a")).await.unwrap();
        let b = store.save_inventory(&sample("host-a")).await.unwrap();
        assert!(a.new_host && !b.new_host);
        assert_eq!(a.host_id, b.host_id);
        store.save_inventory(&sample("host-b")).await.unwrap();
        let hosts = store.hosts().await.unwrap();
        assert_eq!(hosts.len(), 2);
        assert_eq!(hosts.iter().map(|h| h.inventories).sum::<i64>(), 3);
        let row = store.inventory(&a.inventory_id[..8]).await.unwrap();
        assert_eq!(row.id, a.inventory_id);
        assert!(matches!(store.inventory("zz").await, Err(DbError::NotFound { .. })));
        assert!(matches!(store.inventory("").await, Err(DbError::Ambiguous { .. })));
        store.close().await.unwrap();
        // Reopening an up-to-date database is a no-op.
        Store::open(&path).await.unwrap().close().await.unwrap();
    }

    /// A database written before the fleet tables (schema 2) keeps its metrics through migration 3
    /// (moved to `metric_values`, read back through the `metrics` view) and gets its series built.
    #[tokio::test]
    async fn a_schema_2_database_migrates_with_its_results() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.db");
        {
            let old = Migrator {
                migrations: std::borrow::Cow::Owned(MIGRATOR.migrations[..2].to_vec()),
                ..Migrator::DEFAULT
            };
            let mut conn = SqliteConnectOptions::from_str("sqlite://")
                .unwrap()
                .filename(&path)
                .create_if_missing(true)
                .connect()
                .await
                .unwrap();
            old.run(&mut conn).await.unwrap();
            for sql in [
                "INSERT INTO hosts VALUES ('h1', 'ident', 'node1', 'cfg', 'Config', '2026-12-01T00:00:00Z', '2026-12-01T00:00:00Z')",
                "INSERT INTO runs (id, host_id, benchmark, config, started_at, status) VALUES ('00000000-0000-4000-8000-000000000001', 'h1', 'membw', '{}', '2026-12-01T01:00:00Z', 'ok')",
                "INSERT INTO metrics VALUES ('00000000-0000-4000-8000-000000000001', 'triad', 42.5, 'GB/s', 'higher')",
                "INSERT INTO metrics VALUES ('00000000-0000-4000-8000-000000000001', 'copy', 40.0, 'GB/s', 'higher')",
                "INSERT INTO samples VALUES ('00000000-0000-4000-8000-000000000001', 'triad', 0, 42.0)",
                "INSERT INTO samples VALUES ('00000000-0000-4000-8000-000000000001', 'triad', 1, 43.0)",
                "INSERT INTO telemetry VALUES ('00000000-0000-4000-8000-000000000001', 0, 'gpu0', 'power_watts', 700.0)",
                "INSERT INTO telemetry VALUES ('00000000-0000-4000-8000-000000000001', 500, 'gpu0', 'power_watts', 710.0)",
            ] {
                sqlx::query(sql).execute(&mut conn).await.unwrap();
            }
            conn.close().await.unwrap();
        }
        let mut store = Store::open(&path).await.unwrap();
        let run = store.run("00000000").await.unwrap();
        let got: Vec<(String, f64)> = run.run.metrics.iter().map(|m| (m.name.clone(), m.value)).collect();
        assert_eq!(got, [("copy".to_string(), 40.0), ("triad".to_string(), 42.5)]);
        assert_eq!(run.samples, [("triad".to_string(), 0, 42.0), ("triad".to_string(), 1, 43.0)]);
        assert_eq!(
            run.telemetry,
            [
                (0, "gpu0".to_string(), "power_watts".to_string(), 700.0),
                (500, "gpu0".to_string(), "power_watts".to_string(), 710.0)
            ]
        );
        let fleet = store.fleet(None).await.unwrap();
        assert_eq!(fleet.hosts[0].data.points(), 2, "series rebuilt from the migrated results");
        assert_eq!(fleet.hosts[0].data.runs[0].power_watts, Some(705.0), "mean GPU power from the migrated telemetry");
        store.close().await.unwrap();
    }

    #[tokio::test]
    async fn runs_round_trip_with_batches_larger_than_one_statement() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(&dir.path().join("kiln.db")).await.unwrap();
        let saved = store.save_inventory(&sample("host-a")).await.unwrap();
        // More samples than fit in one statement's bound values.
        let samples: Vec<(String, i64, f64)> = (0..20_000).map(|i| ("triad".to_string(), i, i as f64)).collect();
        let run = NewRun {
            host_id: saved.host_id.clone(),
            inventory_id: Some(saved.inventory_id.clone()),
            software: Some(("sw1".into(), "{\"kernel\":\"6.8\"}".into())),
            benchmark: "membw".into(),
            config: "{}".into(),
            started_at: "2026-12-02T10:00:00Z".into(),
            finished_at: "2026-12-02T10:00:05Z".into(),
            status: RunStatus::Ok,
            status_reason: None,
            metrics: vec![Metric {
                name: "triad".into(),
                value: 42.0,
                unit: "GB/s".into(),
                direction: Direction::Higher,
            }],
            samples,
            telemetry: vec![(0, "cpu".into(), "utilization_percent".into(), 99.0)],
        };
        let id = store.save_run(&run).await.unwrap();
        let second = store.save_run(&run).await.unwrap();
        let detail = store.run(&id[..8]).await.unwrap();
        assert_eq!(detail.samples.len(), 20_000);
        assert_eq!(detail.run.metrics[0].value, 42.0);
        assert_eq!(detail.telemetry.len(), 1);
        assert_eq!(detail.software.as_deref(), Some("{\"kernel\":\"6.8\"}"));
        let stacks: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM software_stacks").fetch_one(&mut store.conn).await.unwrap();
        assert_eq!(stacks, 1, "one software stack shared by both runs");
        let runs = store.runs(10).await.unwrap();
        assert_eq!(runs.len(), 2);
        assert!(runs.iter().any(|r| r.id == second));

        // Every saved run is in the fleet series, under its comparable group; rebuilding the
        // series from the tables (what opening a schema-2 database does) gives the same.
        let fleet = store.fleet(None).await.unwrap();
        let series = &fleet.hosts[0].data;
        assert_eq!(series.runs.len(), 2);
        assert_eq!(series.series.len(), 1);
        let key = &fleet.keys[&series.series[0].key];
        assert_eq!(
            (
                key.config_fingerprint.as_str(),
                key.benchmark.as_str(),
                key.software_fingerprint.as_str(),
                key.metric.as_str()
            ),
            ("abcd", "membw", "sw1", "triad")
        );
        assert_eq!(series.series[0].points.iter().map(|p| p.1).collect::<Vec<_>>(), [42.0, 42.0]);
        sqlx::query("DELETE FROM host_series").execute(&mut store.conn).await.unwrap();
        store.rebuild_series().await.unwrap();
        assert_eq!(store.fleet(None).await.unwrap().hosts[0].data, *series);
        // Emptied (to repair a damaged blob): the next open rebuilds them.
        sqlx::query("DELETE FROM host_series").execute(&mut store.conn).await.unwrap();
        let path = store.path().to_path_buf();
        store.close().await.unwrap();
        let mut store = Store::open(&path).await.unwrap();
        assert_eq!(store.fleet(None).await.unwrap().hosts[0].data, *series);

        // A run 100 days earlier lands in an older partition: a window that does not reach it
        // leaves it unloaded, the whole history has it first.
        let old = NewRun {
            started_at: "2026-08-24T10:00:00Z".into(),
            finished_at: "2026-08-24T10:00:05Z".into(),
            ..run.clone()
        };
        store.save_run(&old).await.unwrap();
        let all = store.fleet(None).await.unwrap();
        assert_eq!(all.hosts[0].data.runs.len(), 3);
        assert_eq!(all.hosts[0].data.runs[0].t, parse_rfc3339("2026-08-24T10:00:00Z").unwrap());
        assert_eq!(all.hosts[0].data.series[0].points.iter().map(|p| p.0).collect::<Vec<_>>(), [0, 1, 2]);
        let recent = store.fleet(parse_rfc3339("2026-11-25T00:00:00Z")).await.unwrap();
        assert_eq!(recent.hosts[0].data, *series);
        let partitions: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM host_series").fetch_one(&mut store.conn).await.unwrap();
        assert_eq!(partitions, 2);
    }

    /// A writer killed mid-transaction leaves a hot rollback journal, which a read-only connection
    /// may not roll back (SQLITE_READONLY_ROLLBACK). Reading and writing both open it: the
    /// interrupted transaction is rolled back, and what was committed before it is all there.
    #[tokio::test]
    async fn an_interrupted_write_is_rolled_back_on_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kiln.db");
        let mut store = Store::open(&path).await.unwrap();
        store.save_inventory(&sample("host-a")).await.unwrap();
        store.close().await.unwrap();
        // A transaction large enough to spill its pages into the file before it commits, copied
        // with its journal while it is open: the files a SIGKILL at that moment leaves.
        let crashed = dir.path().join("crashed");
        std::fs::create_dir(&crashed).unwrap();
        let copy = crashed.join("kiln.db");
        {
            let mut conn = SqliteConnectOptions::new().filename(&path).connect().await.unwrap();
            for pragma in ["PRAGMA journal_mode = DELETE", "PRAGMA cache_size = 10", "BEGIN"] {
                sqlx::query(pragma).execute(&mut conn).await.unwrap();
            }
            sqlx::query("UPDATE hosts SET hostname = 'half-written'").execute(&mut conn).await.unwrap();
            sqlx::query("CREATE TABLE pad (x BLOB)").execute(&mut conn).await.unwrap();
            sqlx::query("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 500) INSERT INTO pad SELECT randomblob(4000) FROM n")
                .execute(&mut conn)
                .await
                .unwrap();
            std::fs::copy(&path, &copy).unwrap();
            std::fs::copy(beside(&path, "-journal"), beside(&copy, "-journal")).unwrap();
            sqlx::query("ROLLBACK").execute(&mut conn).await.unwrap();
            conn.close().await.unwrap();
        }
        // The copy's state is what a crash leaves: a plain read-only connection refuses it.
        let mut raw = SqliteConnectOptions::new().filename(&copy).read_only(true).connect().await.unwrap();
        let refused = sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM hosts").fetch_one(&mut raw).await.unwrap_err();
        assert!(needs_recovery(&refused), "{refused}");
        raw.close().await.unwrap();
        // kiln's read opens it (rolling it back), and sees the committed state.
        let mut read = Store::open_for(&copy, Access::Read).await.unwrap();
        let hosts = read.hosts().await.unwrap();
        assert_eq!(hosts.len(), 1);
        assert_eq!(hosts[0].hostname.as_deref(), Some("gpu-node-01"));
        assert_eq!(read.integrity_check().await.unwrap(), ["ok"]);
        read.close().await.unwrap();
        assert!(!beside(&copy, "-journal").exists());
    }

    #[tokio::test]
    async fn refuses_newer_schema() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kiln.db");
        Store::open(&path).await.unwrap().close().await.unwrap();
        {
            let mut conn = SqliteConnectOptions::new().filename(&path).connect().await.unwrap();
            sqlx::query(
                "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
                 VALUES (9999, 'future', 1, x'00', 0)",
            )
            .execute(&mut conn)
            .await
            .unwrap();
            conn.close().await.unwrap();
        }
        let before = std::fs::read(&path).unwrap();
        match Store::open(&path).await {
            Err(DbError::TooNew { found: 9999, .. }) => {}
            other => panic!("expected TooNew, got {:?}", other.map(|_| ())),
        }
        assert!(std::fs::read(&path).unwrap() == before, "a refused database must not be written");
    }

    #[tokio::test]
    async fn refuses_foreign_and_garbage_files() {
        let dir = tempfile::tempdir().unwrap();
        let garbage = dir.path().join("garbage.db");
        std::fs::write(&garbage, b"this is not a database at all, just text").unwrap();
        assert!(matches!(Store::open(&garbage).await, Err(DbError::NotSqlite { .. })));
        assert_eq!(std::fs::read(&garbage).unwrap(), b"this is not a database at all, just text");

        let foreign = dir.path().join("foreign.db");
        {
            let mut conn =
                SqliteConnectOptions::new().filename(&foreign).create_if_missing(true).connect().await.unwrap();
            sqlx::query("CREATE TABLE t (x)").execute(&mut conn).await.unwrap();
            conn.close().await.unwrap();
        }
        assert!(matches!(Store::open(&foreign).await, Err(DbError::Foreign { .. })));
    }
}

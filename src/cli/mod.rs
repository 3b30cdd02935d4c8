//! The `kiln` command line: one module per command family, each `run(args, &Ctx) -> Result<Output>`.
//! Only this module knows about clap, the tokio runtime, output formats and exit codes; `main.rs`
//! parses, dispatches and maps the result to the process's exit status.
//!
//! Cross-cutting rules: every command returns a typed value that serialises to its `--json` (inside
//! one envelope that adds `schema_version`) and renders itself for people; progress and diagnostics go
//! to stderr; a failed check is [`Exit::CheckFailed`], an error is `Err` (exit 2).

pub mod args;
pub mod bench;
pub mod cluster;
pub mod fleet;
pub mod inventory;
pub mod outfile;
pub mod provision;
pub mod service;
pub mod store;
pub mod verdict;

use std::cell::{OnceCell, RefCell};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result};
use kiln_db::{AnyStore, Location, Store};

pub use args::{Cli, Command};
pub use kiln_app::views::{document, window_start, View};

/// How a command ended, when it did not fail with an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Exit 0.
    Ok,
    /// Exit 1: a check the command makes failed (a regression, drift, lint findings, training that
    /// did not learn).
    CheckFailed,
    /// Exit 2 after the command has said what went wrong itself (a failed apply's story).
    Error,
    /// Exit 3: a verdict is inconclusive (a check the spec requires could not run), or a benchmark
    /// could not run on this box (skipped, with the reason: no GPU, no driver, no kiln-gpu).
    Inconclusive,
}

impl Exit {
    /// 1 when `failed`, else 0.
    pub fn check(failed: bool) -> Exit {
        if failed {
            Exit::CheckFailed
        } else {
            Exit::Ok
        }
    }

    pub fn code(self) -> u8 {
        match self {
            Exit::Ok => 0,
            Exit::CheckFailed => 1,
            Exit::Error => 2,
            Exit::Inconclusive => 3,
        }
    }
}

/// What a command prints, already in the format asked for, and how it exits.
#[derive(Debug)]
pub struct Output {
    pub text: String,
    pub exit: Exit,
    /// Printed on stderr instead of stdout (a failed apply's story).
    pub to_stderr: bool,
}

impl Output {
    /// Text for stdout, exit 0.
    pub fn new(text: String) -> Output {
        Output { text, exit: Exit::Ok, to_stderr: false }
    }

    /// Nothing to print.
    pub fn empty(exit: Exit) -> Output {
        Output::new(String::new()).with_exit(exit)
    }

    pub fn with_exit(mut self, exit: Exit) -> Output {
        self.exit = exit;
        self
    }

    pub fn on_stderr(mut self) -> Output {
        self.to_stderr = true;
        self
    }

    /// Writes the text; a closed pipe (`kiln ... | head`) surfaces as BrokenPipe and ends quietly.
    pub fn print(&self) -> std::io::Result<()> {
        if self.text.is_empty() {
            return Ok(());
        }
        let newline = if self.text.ends_with('\n') { "" } else { "\n" };
        if self.to_stderr {
            let mut err = std::io::stderr().lock();
            write!(err, "{}{newline}", self.text)?;
            return err.flush();
        }
        let mut out = std::io::stdout().lock();
        write!(out, "{}{newline}", self.text)?;
        out.flush()
    }
}

/// What every command may need, made once: the output format, the database path, one async
/// runtime and one open store (both made on first use).
pub struct Ctx {
    db: Option<kiln_db::Location>,
    pub json: bool,
    /// How the command uses the database: read-only commands never create, migrate or write it.
    access: kiln_db::Access,
    runtime: OnceCell<tokio::runtime::Runtime>,
    store: RefCell<Option<AnyStore>>,
    /// The fleet service results are uploaded to (flags, environment or agent file).
    remote: Option<kiln_serve::upload::Remote>,
    /// Whether `finish` sends what is due (not after `kiln sync`, which has just sent it).
    upload_after: bool,
}

impl Ctx {
    /// The context of one command; `access` is what [`access`] says of it.
    pub fn new(db: Option<kiln_db::Location>, json: bool, access: kiln_db::Access) -> Ctx {
        Ctx { db, json, access, runtime: OnceCell::new(), store: RefCell::new(None), remote: None, upload_after: false }
    }

    /// Uploads what the command stores to `remote` (queued in the store; sent when it finishes
    /// where `upload_after`).
    pub fn with_remote(mut self, remote: Option<kiln_serve::upload::Remote>, upload_after: bool) -> Ctx {
        self.remote = remote;
        self.upload_after = upload_after;
        self
    }

    /// The fleet service, if one is configured.
    pub fn remote(&self) -> Option<&kiln_serve::upload::Remote> {
        self.remote.as_ref()
    }

    /// The command's result in the format asked for (`--json` or text).
    pub fn output<V: View>(&self, value: &V) -> Result<Output> {
        Ok(Output::new(document(value, self.json)?))
    }

    /// `--db`/`KILN_DB`, else the system location as root, else the user's data directory.
    pub fn location(&self) -> Result<Location> {
        if let Some(location) = &self.db {
            return Ok(location.clone());
        }
        Ok(Location::Sqlite(Self::default_path()?))
    }

    /// The SQLite file this command stores in: commands that keep a box's own results (measuring,
    /// the provisioning journal, uploads) work on a local file, never on the fleet's PostgreSQL.
    pub fn db_path(&self) -> Result<PathBuf> {
        match self.location()? {
            Location::Sqlite(path) => Ok(path),
            Location::Postgres(url) => anyhow::bail!(
                "--db {}: this command keeps results in a local SQLite file (give a path); a PostgreSQL \
                 database serves `kiln serve`, `kiln token`, `kiln import` and the fleet's read commands \
                 (hosts, runs, show, compare, outliers, regressions, report)",
                kiln_db::redact(&url)
            ),
        }
    }

    fn default_path() -> Result<PathBuf> {
        if nix::unistd::geteuid().is_root() {
            return Ok(PathBuf::from("/var/lib/kiln/kiln.db"));
        }
        let data = std::env::var_os("XDG_DATA_HOME")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))
            .context("no --db given and neither XDG_DATA_HOME nor HOME is set; pass --db PATH")?;
        Ok(data.join("kiln/kiln.db"))
    }

    /// [`Ctx::location`], for a command that uses it with `access`: for a writer, the default
    /// location's directory is made (it is kiln's own); an explicit --db's never is.
    pub fn location_for(&self, access: kiln_db::Access) -> Result<Location> {
        let location = self.location()?;
        if let (Location::Sqlite(path), kiln_db::Access::Write, None) = (&location, access, &self.db) {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            }
        }
        Ok(location)
    }

    /// The one async runtime (current thread), made on first use.
    pub fn runtime(&self) -> Result<&tokio::runtime::Runtime> {
        if let Some(rt) = self.runtime.get() {
            return Ok(rt);
        }
        let rt =
            tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the async runtime")?;
        Ok(self.runtime.get_or_init(|| rt))
    }

    pub fn block_on<F: std::future::Future>(&self, future: F) -> Result<F::Output> {
        Ok(self.runtime()?.block_on(future))
    }

    /// Opens (and so checks) the database now: a bad file should stop a job before minutes of
    /// benchmarks, not after.
    pub fn open_store(&self) -> Result<()> {
        self.with_store_sync(|_, _| Ok(()))
    }

    /// Runs `f` on the store, opened on first use and kept open for the rest of the command.
    pub fn with_store<T>(&self, f: impl AsyncFnOnce(&mut Store) -> kiln_db::Result<T>) -> Result<T> {
        self.with_store_sync(|rt, store| Ok(rt.block_on(f(store))?))
    }

    /// Like [`Ctx::with_store`], for code that drives the runtime itself (the provisioning journal).
    pub fn with_store_sync<T>(&self, f: impl FnOnce(&tokio::runtime::Runtime, &mut Store) -> Result<T>) -> Result<T> {
        self.db_path()?;
        self.with_any_sync(|rt, any| f(rt, any.sqlite().expect("db_path() said SQLite")))
    }

    /// Runs `f` on the store in whichever engine `--db` names: for the commands a fleet's
    /// PostgreSQL database serves as well as a file.
    pub fn with_any<T>(&self, f: impl AsyncFnOnce(&mut AnyStore) -> kiln_db::Result<T>) -> Result<T> {
        self.with_any_sync(|rt, store| Ok(rt.block_on(f(store))?))
    }

    /// Like [`Ctx::with_any`], for code that drives the runtime itself.
    pub fn with_any_sync<T>(&self, f: impl FnOnce(&tokio::runtime::Runtime, &mut AnyStore) -> Result<T>) -> Result<T> {
        let rt = self.runtime()?;
        let mut slot = self.store.borrow_mut();
        if slot.is_none() {
            let access = self.access;
            let mut store = rt.block_on(AnyStore::open(&self.location_for(access)?, access))?;
            if let (Some(s), kiln_db::Access::Write, Some(_)) = (store.sqlite(), access, &self.remote) {
                s.queue_uploads(true);
            }
            *slot = Some(store);
        }
        f(rt, slot.as_mut().expect("opened above"))
    }

    /// Removes the database this command created, after the command failed before storing
    /// anything in it (a refused import): nothing is created by mistake.
    pub fn discard_created(&self) -> Result<()> {
        let Some(AnyStore::Sqlite(store)) =
            self.store.borrow_mut().take_if(|s| s.sqlite().is_some_and(|s| s.created()))
        else {
            return Ok(());
        };
        Ok(self.block_on(store.discard())??)
    }

    /// Closes the store if one was opened (checkpointing its write-ahead log).
    /// A command that stored results sends those due to the fleet service first; a failed upload is
    /// a warning (the results stay queued for the next command or `kiln sync`).
    pub fn finish(self) -> Result<()> {
        if let Some(store) = self.store.into_inner() {
            let sends = self.upload_after && self.access == kiln_db::Access::Write;
            if let (Some(remote), Some(rt), true, AnyStore::Sqlite(_)) =
                (&self.remote, self.runtime.get(), sends, &store)
            {
                let mut store = store;
                let local = store.sqlite().expect("matched above");
                match rt.block_on(kiln_serve::upload::sync(local, remote, true)) {
                    Ok(s) if s.error.is_some() || s.pending.total() > 0 => eprintln!(
                        "kiln: warning: {} results not sent to {}{}; they stay queued here and are retried by \
                         the next command (with back-off) or now by `kiln sync`",
                        s.pending.total(),
                        remote.url,
                        s.error.map(|e| format!(" ({e})")).unwrap_or_default()
                    ),
                    Ok(_) => {}
                    Err(e) => eprintln!("kiln: warning: uploading to {}: {e:#}", remote.url),
                }
                return Self::close(store, rt);
            }
            if let Some(rt) = self.runtime.get() {
                return Self::close(store, rt);
            }
        }
        Ok(())
    }

    fn close(store: AnyStore, rt: &tokio::runtime::Runtime) -> Result<()> {
        if let AnyStore::Sqlite(s) = &store {
            if s.created() {
                // Said once the command has succeeded: a database it then discarded is not news.
                eprintln!("kiln: created the results database {}", s.path().display());
            }
        }
        Ok(rt.block_on(store.close())?)
    }
}

/// The application layer's workflows keep what they measure in the command's store.
impl kiln_app::stored::Stores for Ctx {
    fn with_store<T>(&self, f: impl AsyncFnOnce(&mut Store) -> kiln_db::Result<T>) -> Result<T> {
        Ctx::with_store(self, f)
    }
}

/// Runs one parsed command.
///
/// # Errors
/// Anything that stops the command; `main` prints it and exits 2.
pub fn run(command: Command, ctx: &Ctx) -> Result<Output> {
    match command {
        Command::Inventory { source, save } => inventory::inventory(&source, save, ctx),
        Command::Topo { source } => inventory::topo(&source, ctx),
        Command::Snapshot { output } => inventory::snapshot(&output, ctx),
        Command::Commission { source, no_bench, budget, data_dirs, judge, no_verdict, act } => {
            let acts = bench::actions(act)?;
            bench::commission(&source, bench::Suite { no_bench, budget, data_dirs }, &judge, no_verdict, acts, ctx)
        }
        Command::Verdict { inventory, no_perf, no_save, verbose, judge } => {
            verdict::rejudge(&inventory, no_perf, no_save, verbose, &judge, ctx)
        }
        Command::Spec { what: args::SpecCmd::Lint { files } } => verdict::lint(&files, ctx),
        Command::Spec { what: args::SpecCmd::References { sku } } => verdict::references(sku.as_deref(), ctx),
        Command::Spec { what: args::SpecCmd::Capture { source, inventory, config, fraction, name, output } } => {
            verdict::capture(&source, inventory.as_deref(), config.as_deref(), fraction, name, output.as_deref(), ctx)
        }
        Command::Bench { what } => bench::run(what, ctx),
        Command::Cluster { stall_timeout, what } => cluster::run(what, stall_timeout, ctx),
        Command::Runs { limit } => store::runs(limit, ctx),
        Command::Hosts => store::hosts(ctx),
        Command::Show { what } => store::show(what, ctx),
        Command::Export { window, output } => store::export(&window, output.as_deref(), ctx),
        Command::Import { files } => store::import(&files, ctx),
        Command::Compare { subjects, by, metric, prices, across_software, window, noise } => {
            let filter = kiln_app::views::filter(window.since.as_deref(), metric, across_software)?;
            fleet::compare(&subjects, by, prices.as_deref(), &filter, noise, ctx)
        }
        Command::Outliers { metric, threshold, min_deviation, across_software, window } => {
            let filter = kiln_app::views::filter(window.since.as_deref(), metric, across_software)?;
            fleet::outliers(&filter, threshold, min_deviation, ctx)
        }
        Command::Regressions { since, metric, noise } => fleet::regressions(&since, metric, noise, ctx),
        Command::Report { host, config, run, cluster, html, markdown, since } => {
            fleet::report(fleet::ReportArgs { host, config, run, cluster, html, markdown, since }, ctx)
        }
        Command::Provision { what } => provision::run(what, ctx),
        Command::Db { what: args::Db::Check } => store::check(ctx),
        Command::Serve { listen, tls_cert, tls_key, max_upload_mib, anonymous_read, shutdown_deadline, readers } => {
            let args = service::ServeArgs {
                listen,
                tls_cert,
                tls_key,
                max_upload_mib,
                anonymous_read,
                shutdown_deadline,
                readers,
            };
            service::serve(args, ctx)
        }
        Command::Token { what } => service::token(what, ctx),
        Command::Sync { all } => service::sync(all, ctx),
        Command::Agent { metrics, nvml_lib } => {
            kiln_serve::exporter::run(metrics, nvml_lib)?;
            Ok(Output::empty(Exit::Ok))
        }
    }
}

/// How `command` uses the database: the commands that only read open it read-only and never
/// create it.
pub fn access(command: &Command) -> kiln_db::Access {
    use args::Provision;
    let reads = matches!(
        command,
        Command::Runs { .. }
            | Command::Hosts
            | Command::Show { .. }
            | Command::Export { .. }
            | Command::Compare { .. }
            | Command::Outliers { .. }
            | Command::Regressions { .. }
            | Command::Report { .. }
            | Command::Db { .. }
            | Command::Spec { .. }
            | Command::Snapshot { .. }
            | Command::Verdict { no_save: true, .. }
            | Command::Provision { what: Provision::Log { .. } }
            | Command::Token { what: args::TokenCmd::List }
            | Command::Agent { .. }
    );
    if reads {
        kiln_db::Access::Read
    } else {
        kiln_db::Access::Write
    }
}

/// Runs a parsed command line: a read command with `--server` asks the fleet service; any other
/// command runs here, uploading what it stores where a fleet service is configured.
///
/// # Errors
/// A malformed agent file or server URL; anything that stops the command.
pub fn run_cli(cli: Cli) -> Result<Exit> {
    use kiln_serve::upload::Remote;
    let flags = (cli.server.as_deref(), cli.token.as_deref(), cli.ca_cert.as_deref());
    let access = access(&cli.command);
    let ctx = Ctx::new(cli.db, cli.json, access);
    // Uploads only from the commands that store results; the server's own commands never.
    let uploads = access == kiln_db::Access::Write
        && !matches!(
            cli.command,
            Command::Serve { .. } | Command::Token { .. } | Command::Import { .. } | Command::Db { .. }
        );
    let sync = matches!(cli.command, Command::Sync { .. });
    // A read command asks the fleet only when --server names it (not KILN_SERVER or the agent file).
    let remote = if flags.0.is_some() || uploads || sync { Remote::resolve(flags.0, flags.1, flags.2)? } else { None };
    if let (Some(remote), true) = (&remote, flags.0.is_some()) {
        if let Some(out) = service::remote_read(&cli.command, remote, &ctx) {
            let out = out?;
            out.print()?;
            return Ok(out.exit);
        }
    }
    let ctx = ctx.with_remote(remote.filter(|_| uploads || sync), !sync);
    let out = run(cli.command, &ctx)?;
    ctx.finish()?;
    out.print()?;
    Ok(out.exit)
}

/// Set by SIGINT/SIGTERM so that long benchmarks stop cleanly and remove what they created.
pub static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: nix::libc::c_int) {
    INTERRUPTED.store(true, Ordering::Relaxed);
}

/// From now on SIGINT and SIGTERM set [`INTERRUPTED`] instead of killing kiln.
pub fn catch_interrupts() {
    use nix::sys::signal::{signal, SigHandler, Signal};
    for sig in [Signal::SIGINT, Signal::SIGTERM] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        if let Err(e) = unsafe { signal(sig, SigHandler::Handler(on_signal)) } {
            tracing::warn!(%e, ?sig, "cannot catch the signal; it will stop kiln at once");
        }
    }
}

/// Opens the database before a benchmark runs, so that a bad file — or a full disk — stops the job
/// before the minutes of measuring, not after.
pub fn preflight(ctx: &Ctx, store: args::Store) -> Result<()> {
    if store.no_save {
        return Ok(());
    }
    let path = ctx.db_path()?;
    if let Some(free) = kiln_db::free_bytes(&path) {
        if free < MIN_FREE {
            anyhow::bail!(
                "{}: the filesystem holding the database has {} KiB free, under the {} MiB a benchmark's results \
                 may need; nothing was measured: free space there, or point --db elsewhere (--no-save measures \
                 without storing)",
                path.display(),
                free / 1024,
                MIN_FREE >> 20
            );
        }
    }
    ctx.open_store()
}

/// The room a benchmark wants before it starts: a run with its samples and telemetry, the
/// inventory it is stored with, and the write-ahead log's copies of both, with a margin.
const MIN_FREE: u64 = 16 << 20;

/// Whether an error is a closed stdout (`kiln ... | head`), which is not a failure.
pub fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe))
}

/// Reads a whole file, or standard input for `-`.
pub fn read_input(path: &Path) -> Result<Vec<u8>> {
    if path.as_os_str() == "-" {
        let mut buf = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut buf).context("reading standard input")?;
        return Ok(buf);
    }
    std::fs::read(path).with_context(|| format!("reading {}", path.display()))
}

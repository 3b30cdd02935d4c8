//! `kiln serve`: the fleet service. Agents upload their results (the export format, over HTTP with
//! a bearer token), readers ask the same questions as the local commands (`hosts`, `runs`,
//! `compare`, `outliers`, `regressions`, `report`) of every box at once, a dashboard shows the
//! fleet, and `/metrics` feeds Prometheus.
//!
//! The routes (`/api/v1/...`) answer the local commands' `--json` documents (or their text with
//! `?format=text`); errors are `{"error": ..., "line": ...}` with the HTTP status that says whose
//! fault it is. Storage is the SQLite store ([`pool::Pool`]: one writer, a few readers).
//!
//! Beside the service: its agent-side client (`upload`: an agent's results sent to it) and the
//! host metrics exporter (`exporter`: `kiln agent --metrics`), which serves HTTP the same way. The
//! answers are the application layer's views (`kiln_app::views`); this crate knows HTTP, never the
//! command line.

pub mod auth;
pub mod dashboard;
pub mod exporter;
pub mod metrics;
pub mod pool;
pub mod tls;
pub mod upload;

use std::collections::HashMap;
use std::future::IntoFuture;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use axum::body::Body;
use axum::extract::{ConnectInfo, DefaultBodyLimit, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use kiln_db::{AnyStore, DbError, ImportError, ImportStats, Queries, TokenRow};
use serde::Deserialize;

use auth::Need;
use kiln_app::defaults;
use kiln_app::views::{self, View};
use pool::Pool;

/// How `kiln serve` runs.
pub struct Config {
    pub db: kiln_db::Location,
    pub listen: SocketAddr,
    /// PEM certificate chain and private key: HTTPS when both are given.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// The largest upload body, in bytes (larger ones are answered 413).
    pub max_upload_bytes: usize,
    /// Reads (the API's GETs, the dashboard, /metrics) without a token, for a lab.
    pub anonymous_read: bool,
    /// After SIGTERM/SIGINT, how long requests in flight may take before the server stops.
    pub shutdown_deadline: Duration,
    /// Read-only database connections.
    pub readers: usize,
}

/// The address a request came from, over TCP or TLS: recorded with each accepted upload.
#[derive(Debug, Clone, Copy)]
struct Peer(SocketAddr);

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, tokio::net::TcpListener>> for Peer {
    fn connect_info(stream: axum::serve::IncomingStream<'_, tokio::net::TcpListener>) -> Peer {
        Peer(*stream.remote_addr())
    }
}

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, tls::TlsListener>> for Peer {
    fn connect_info(stream: axum::serve::IncomingStream<'_, tls::TlsListener>) -> Peer {
        Peer(*stream.remote_addr())
    }
}

/// An upload on its way to the writer, and where its answer goes.
struct Queued {
    upload: kiln_db::Upload,
    reply: tokio::sync::oneshot::Sender<Result<ImportStats, ImportError>>,
}

/// At most this many uploads, and about this many bytes, share one transaction.
const GROUP_UPLOADS: usize = 256;
const GROUP_BYTES: usize = 64 << 20;

/// Upload bodies in memory at once (read, or waiting for the writer), in KiB: 4 GiB, sixteen
/// uploads of the 256 MiB default limit. Each takes its `Content-Length` (the limit when it
/// declares none), so that the thousand small uploads of a fleet's night (about 10 KiB each) are
/// all in at once and reach the writer together; the others wait, their connections open.
const UPLOAD_MEMORY_KIB: usize = 4 << 20;

/// What the handlers share.
pub struct App {
    pool: Pool,
    /// Uploads waiting for the writer (see [`group_commit`]).
    uploads: tokio::sync::mpsc::Sender<Queued>,
    anonymous_read: bool,
    max_upload_bytes: usize,
    /// KiB of upload bodies in memory at once (see [`records`]).
    upload_memory: tokio::sync::Semaphore,
    metrics: metrics::Metrics,
    /// When each token's use was last written down (at most once a minute per token).
    used: Mutex<HashMap<String, Instant>>,
}

type Shared = Arc<App>;

/// Runs the server until SIGTERM or SIGINT; blocks the calling thread.
pub fn serve(config: Config) -> Result<()> {
    raise_open_files();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("kiln-http")
        .build()
        .context("starting the server's runtime")?;
    let pool = Pool::open(&config.db, config.readers)?;
    let (uploads, queued) = tokio::sync::mpsc::channel(1024);
    let app = Arc::new(App {
        pool,
        uploads,
        anonymous_read: config.anonymous_read,
        max_upload_bytes: config.max_upload_bytes,
        upload_memory: tokio::sync::Semaphore::new(UPLOAD_MEMORY_KIB),
        metrics: metrics::Metrics::new(),
        used: Mutex::new(HashMap::new()),
    });
    rt.spawn(group_commit(app.clone(), queued));
    let result = rt.block_on(run(&config, app.clone()));
    // Every connection is gone; the queued database work finishes, then the store is closed.
    app.pool.close();
    result
}

/// Every agent of a fleet may upload at once, each on a connection (a file descriptor): the soft
/// limit (1,024 under systemd) is raised to the hard one, as servers do.
fn raise_open_files() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        if soft < hard {
            if let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
                tracing::warn!("raising the open-files limit from {soft} to {hard}: {e}");
            }
        }
    }
}

/// Connections the kernel may hold for the server before it accepts them: a fleet's agents
/// connect at once after a nightly run (the default, 128, overflowed at 1,000 agents on loopback;
/// the kernel caps it at `net.core.somaxconn`).
const BACKLOG: u32 = 4096;

/// A listening socket on `addr` with room for [`BACKLOG`] pending connections.
pub(crate) fn listen(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = if addr.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(BACKLOG)
}

async fn run(config: &Config, app: Shared) -> Result<()> {
    let stop_signal = shutdown_signal()?;
    let router = router(app);
    let listener = listen(config.listen).with_context(|| format!("listening on {}", config.listen))?;
    let addr = listener.local_addr()?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let signal = async move {
        let mut stop = stop_rx;
        let _ = stop.wait_for(|s| *s).await;
    };
    let server = match &config.tls {
        Some((cert, key)) => {
            let tls = tls::server_config(cert, key)?;
            eprintln!("kiln serve: listening on https://{addr}");
            let listener = tls::TlsListener::new(listener, tls);
            let service = router.into_make_service_with_connect_info::<Peer>();
            tokio::spawn(axum::serve(listener, service).with_graceful_shutdown(signal).into_future())
        }
        None => {
            eprintln!("kiln serve: listening on http://{addr}");
            let service = router.into_make_service_with_connect_info::<Peer>();
            tokio::spawn(axum::serve(listener, service).with_graceful_shutdown(signal).into_future())
        }
    };
    let which = stop_signal.await;
    eprintln!(
        "kiln serve: {which}: no new connections; requests in flight have {:.0} s to finish",
        config.shutdown_deadline.as_secs_f64()
    );
    let _ = stop_tx.send(true);
    let abort = server.abort_handle();
    match tokio::time::timeout(config.shutdown_deadline, server).await {
        Ok(joined) => joined.context("the server task")?.context("serving")?,
        Err(_) => {
            // An upload cut off here is not half-stored: each is one transaction, applied whole by
            // the writer or not at all.
            abort.abort();
            eprintln!("kiln serve: the deadline passed; the connections still open were closed");
        }
    }
    eprintln!("kiln serve: stopped");
    Ok(())
}

/// Installs the SIGTERM and SIGINT handlers now (before the server says it listens), and returns
/// the first of them to arrive, by name.
pub(crate) fn shutdown_signal() -> Result<impl std::future::Future<Output = &'static str>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        }
    })
}

/// The writer's side of the uploads: each time it is free, it takes every upload that queued
/// meanwhile (up to [`GROUP_UPLOADS`] or [`GROUP_BYTES`]) and stores them in one transaction, as
/// one import where they all hold (`Store::import_many`): one sync to disk and a statement per
/// table for the lot, and each upload still whole or not at all. Alone, an upload goes at once.
async fn group_commit(app: Shared, mut queued: tokio::sync::mpsc::Receiver<Queued>) {
    while let Some(first) = queued.recv().await {
        let mut bytes = first.upload.text.len();
        let mut batch = vec![first];
        while batch.len() < GROUP_UPLOADS && bytes < GROUP_BYTES {
            let Ok(next) = queued.try_recv() else { break };
            bytes += next.upload.text.len();
            batch.push(next);
        }
        let (inputs, replies): (Vec<kiln_db::Upload>, Vec<_>) = batch.into_iter().map(|q| (q.upload, q.reply)).unzip();
        // A closed pool (the server stopping) drops the replies: those requests answer 503.
        if let Ok(results) = app.pool.write(async move |s: &mut AnyStore| s.import_many(&inputs).await).await {
            for (result, reply) in results.into_iter().zip(replies) {
                let _ = reply.send(result);
            }
        }
    }
}

/// Every route.
pub fn router(app: Shared) -> Router {
    Router::new()
        .route("/api/v1/records", post(records).layer(DefaultBodyLimit::disable()))
        .route("/api/v1/hosts", get(hosts))
        .route("/api/v1/runs", get(runs))
        .route("/api/v1/compare", get(compare))
        .route("/api/v1/outliers", get(outliers))
        .route("/api/v1/regressions", get(regressions))
        .route("/api/v1/report", get(report))
        .route("/api/v1/applies", get(applies))
        .route("/api/v1/applies/{id}", get(apply_journal))
        .route("/metrics", get(metrics_page))
        .route("/", get(dashboard))
        .route_layer(axum::middleware::from_fn_with_state(app.clone(), metrics::track))
        .route("/healthz", get(healthz))
        .fallback(|| async { ApiError::NotFound("no such route; the API is under /api/v1/".into()) })
        .with_state(app)
}

/// A request that did not succeed, answered as `{"error": ..., "line": ...}`.
#[derive(Debug)]
pub enum ApiError {
    /// No token, a malformed one, an unknown or a revoked one (401).
    Unauthorized(String),
    Forbidden(String),
    /// The body is larger than `--max-upload-mib` (413).
    TooLarge(String),
    BadRequest {
        message: String,
        line: Option<usize>,
    },
    NotFound(String),
    /// The server is stopping.
    Unavailable(String),
    Internal(String),
}

impl From<pool::Closed> for ApiError {
    fn from(e: pool::Closed) -> ApiError {
        ApiError::Unavailable(e.to_string())
    }
}

impl From<DbError> for ApiError {
    fn from(e: DbError) -> ApiError {
        match e {
            DbError::NotFound { .. } => ApiError::NotFound(e.to_string()),
            DbError::Ambiguous { .. } => ApiError::BadRequest { message: e.to_string(), line: None },
            // The database server is down or restarting: the agent tries again later.
            DbError::Unavailable { .. } => ApiError::Unavailable(e.to_string()),
            _ => ApiError::Internal(e.to_string()),
        }
    }
}

impl From<anyhow::Error> for ApiError {
    /// A question the store could not answer is the server's fault; anything else (a subject that
    /// matches nothing, a bad window) is the asker's.
    fn from(e: anyhow::Error) -> ApiError {
        match e.downcast::<DbError>() {
            Ok(db) => db.into(),
            Err(e) => ApiError::BadRequest { message: format!("{e:#}"), line: None },
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, message, line) = match self {
            ApiError::Unauthorized(m) => (StatusCode::UNAUTHORIZED, m, None),
            ApiError::Forbidden(m) => (StatusCode::FORBIDDEN, m, None),
            ApiError::TooLarge(m) => (StatusCode::PAYLOAD_TOO_LARGE, m, None),
            ApiError::BadRequest { message, line } => (StatusCode::BAD_REQUEST, message, line),
            ApiError::NotFound(m) => (StatusCode::NOT_FOUND, m, None),
            ApiError::Unavailable(m) => (StatusCode::SERVICE_UNAVAILABLE, m, None),
            ApiError::Internal(m) => {
                tracing::error!("{m}");
                (StatusCode::INTERNAL_SERVER_ERROR, m, None)
            }
        };
        let body = serde_json::json!({ "error": message, "line": line });
        let mut response = (status, axum::Json(body)).into_response();
        if status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer realm=\"kiln\""));
        }
        response
    }
}

/// The token of a request, checked against the store (so that a revoked token fails at once), and
/// allowed `need`. `None`: an anonymous read the server allows.
async fn authorize(app: &Shared, headers: &HeaderMap, need: Need) -> Result<Option<TokenRow>, ApiError> {
    let given = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(auth::from_header);
    let Some(token) = given else {
        if need == Need::Read && app.anonymous_read {
            return Ok(None);
        }
        return Err(ApiError::Unauthorized("no token: send `Authorization: Bearer TOKEN`".into()));
    };
    let Some((id, secret)) = auth::split(&token) else {
        return Err(ApiError::Unauthorized("not a kiln token (kiln_<id>_<secret>)".into()));
    };
    let id_owned = id.to_string();
    let row = app.pool.read(async move |s: &mut AnyStore| s.token(&id_owned).await).await??;
    let row = match row {
        Some(row) if row.revoked_at.is_none() && auth::secret_matches(&row, secret) => row,
        _ => return Err(ApiError::Unauthorized("unknown or revoked token".into())),
    };
    if !need.allowed(row.role) {
        let what = if need == Need::Write { "upload" } else { "read the fleet" };
        return Err(ApiError::Forbidden(format!("token {:?} ({}) may not {what}", row.name, row.role.as_str())));
    }
    // An upload writes its token's use in its own transaction when it is stored (`records`).
    if need != Need::Write {
        note_use(app, &row.id).await;
    }
    Ok(Some(row))
}

/// Writes down that a token was used, at most once a minute per token (a transaction of its own:
/// reads, and uploads that were not stored).
async fn note_use(app: &Shared, token_id: &str) {
    {
        let Ok(mut used) = app.used.lock() else { return };
        let now = Instant::now();
        if used.get(token_id).is_some_and(|t| now.duration_since(*t) < Duration::from_secs(60)) {
            return;
        }
        used.insert(token_id.to_string(), now);
    }
    let id = token_id.to_string();
    let at = kiln_text::timefmt::now_rfc3339();
    if let Ok(Err(e)) = app.pool.write(async move |s: &mut AnyStore| s.token_used(&id, &at).await).await {
        tracing::warn!("noting a token's use: {e}");
    }
}

/// `?format=text` answers the text the command prints; JSON otherwise.
#[derive(Deserialize, Default)]
struct Format {
    format: Option<String>,
}

fn answer<V: View>(view: &V, format: Option<&str>) -> Result<Response, ApiError> {
    let text = format == Some("text");
    let body = views::document(view, !text).map_err(|e| ApiError::Internal(e.to_string()))?;
    let kind = if text { "text/plain; charset=utf-8" } else { "application/json" };
    Ok(([(header::CONTENT_TYPE, kind)], body).into_response())
}

/// Reads and drops a refused upload's body (up to `limit` bytes, never holding more than a frame),
/// so that the client, still sending, gets to read the refusal instead of a broken pipe.
async fn discard(body: Body, limit: usize) {
    let _ = frames(body, limit, |_| {}).await;
}

/// A body of at most `limit` bytes; `None` when it is larger (what follows the limit is read, up to
/// `limit` more, and dropped, so that the client reads the refusal).
async fn read_body(body: Body, limit: usize) -> Result<Option<Vec<u8>>, axum::Error> {
    let mut out = Vec::new();
    let mut over = false;
    frames(body, 2 * limit, |data| {
        if !over && out.len() + data.len() <= limit {
            out.extend_from_slice(data);
        } else {
            over = true;
            out = Vec::new();
        }
    })
    .await?;
    Ok((!over).then_some(out))
}

/// Feeds the body's data to `keep` frame by frame, up to about `limit` bytes.
async fn frames(body: Body, limit: usize, mut keep: impl FnMut(&[u8])) -> Result<(), axum::Error> {
    use axum::body::HttpBody;
    let mut body = std::pin::pin!(body);
    let mut seen = 0usize;
    while seen <= limit {
        match std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    seen += data.len();
                    keep(data);
                }
            }
            Some(Err(e)) => return Err(e),
            None => break,
        }
    }
    Ok(())
}

/// `POST /api/v1/records`: an export, stored whole or not at all.
///
/// The token is checked before the body is read, and at most [`UPLOAD_MEMORY_KIB`] of bodies are
/// in memory at once, each up to `--max-upload-mib` (a larger one is refused with 413 as soon as it
/// shows: by its `Content-Length`, or when the limit is reached).
async fn records(
    State(app): State<Shared>,
    ConnectInfo(Peer(client)): ConnectInfo<Peer>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let token = match authorize(&app, &headers, Need::Write).await {
        Ok(token) => token,
        Err(refused) => {
            discard(body, app.max_upload_bytes).await;
            return Err(refused);
        }
    };
    let too_large = || {
        let mib = app.max_upload_bytes >> 20;
        ApiError::TooLarge(format!("the upload is larger than this server takes ({mib} MiB, --max-upload-mib)"))
    };
    let declared = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
    if declared.is_some_and(|n| n > app.max_upload_bytes) {
        discard(body, app.max_upload_bytes).await;
        return Err(too_large());
    }
    // Its share of the memory, held until it is stored: what it declares, else the most it may send.
    let kib = declared.unwrap_or(app.max_upload_bytes).div_ceil(1024).clamp(1, UPLOAD_MEMORY_KIB);
    let _memory = app
        .upload_memory
        .acquire_many(u32::try_from(kib).unwrap_or(u32::MAX))
        .await
        .map_err(|_| ApiError::Unavailable("the server is stopping".into()))?;
    let body = match read_body(body, app.max_upload_bytes).await {
        Ok(Some(body)) => body,
        Ok(None) => return Err(too_large()),
        Err(e) => {
            let message = format!("reading the body: {e}; nothing was imported");
            return Err(ApiError::BadRequest { message, line: None });
        }
    };
    let text = String::from_utf8(body).map_err(|e| ApiError::BadRequest {
        message: format!("the body is not UTF-8 (byte {}); nothing was imported", e.utf8_error().valid_up_to()),
        line: None,
    })?;
    // Uploads always carry a token (`authorize` with `Need::Write` insists).
    let token = token.ok_or_else(|| ApiError::Unauthorized("no token".into()))?;
    let label = format!("upload by token {}", token.name);
    let sender = kiln_db::Sender {
        token_id: token.id.clone(),
        client: Some(client.ip().to_string()),
        one_host: token.role.one_host(),
    };
    let (reply, answer) = tokio::sync::oneshot::channel();
    let stopping = || ApiError::Unavailable("the server is stopping; nothing was stored, send it again".into());
    app.uploads
        .send(Queued { upload: kiln_db::Upload { label, text, sender }, reply })
        .await
        .map_err(|_| stopping())?;
    let result = answer.await.map_err(|_| stopping())?;
    if result.is_err() {
        note_use(&app, &token.id).await;
    }
    match result {
        Ok(stats) => {
            app.metrics.uploaded(&stats);
            Ok(axum::Json(stats).into_response())
        }
        Err(ImportError::Malformed { line, message, .. }) => Err(ApiError::BadRequest {
            message: format!("line {line}: {message}; nothing was imported"),
            line: Some(line),
        }),
        Err(ImportError::File { message, .. }) => {
            Err(ApiError::BadRequest { message: format!("{message}; nothing was imported"), line: None })
        }
        Err(ImportError::Refused { message, .. }) => {
            Err(ApiError::Forbidden(format!("{message}; nothing was imported")))
        }
        Err(ImportError::Db(e)) => Err(e.into()),
    }
}

async fn healthz(State(app): State<Shared>) -> Result<Response, ApiError> {
    // The database answers (a PostgreSQL connection is made again after a restart).
    app.pool.read(async |s: &mut AnyStore| s.revive().await).await??;
    Ok(axum::Json(serde_json::json!({ "status": "ok", "version": env!("CARGO_PKG_VERSION") })).into_response())
}

/// A read question: the token checked, `question` answered on a reader connection, the answer in
/// the format asked for.
async fn ask<V, E, F>(
    app: &Shared,
    headers: &HeaderMap,
    format: Option<&str>,
    question: F,
) -> Result<Response, ApiError>
where
    F: AsyncFnOnce(&mut AnyStore) -> Result<V, E> + Send + 'static,
    V: View + Send + 'static,
    E: Into<ApiError> + Send + 'static,
{
    authorize(app, headers, Need::Read).await?;
    let view = app.pool.read(question).await?.map_err(Into::into)?;
    answer(&view, format)
}

async fn hosts(State(app): State<Shared>, headers: HeaderMap, Query(q): Query<Format>) -> Result<Response, ApiError> {
    ask(&app, &headers, q.format.as_deref(), async |s: &mut AnyStore| views::hosts_view(s, "the fleet".into()).await)
        .await
}

#[derive(Deserialize)]
struct RunsQuery {
    limit: Option<i64>,
    format: Option<String>,
}

async fn runs(State(app): State<Shared>, headers: HeaderMap, Query(q): Query<RunsQuery>) -> Result<Response, ApiError> {
    let limit = q.limit.unwrap_or(20);
    ask(&app, &headers, q.format.as_deref(), async move |s: &mut AnyStore| {
        views::runs_view(s, limit, "the fleet".into()).await
    })
    .await
}

#[derive(Deserialize)]
struct AppliesQuery {
    image: Option<String>,
    limit: Option<i64>,
    format: Option<String>,
}

/// The provisioning applies agents uploaded, newest first (`kiln provision log --server`).
async fn applies(
    State(app): State<Shared>,
    headers: HeaderMap,
    Query(q): Query<AppliesQuery>,
) -> Result<Response, ApiError> {
    let limit = q.limit.unwrap_or(20);
    ask(&app, &headers, q.format.as_deref(), async move |s: &mut AnyStore| {
        let applies = s.applies(q.image.as_deref(), limit).await?;
        Ok::<_, kiln_db::DbError>(views::Applies { applies, source: "the fleet".into(), fleet: true })
    })
    .await
}

/// One uploaded apply with its steps (`kiln provision log --apply ID --server`).
async fn apply_journal(
    State(app): State<Shared>,
    headers: HeaderMap,
    axum::extract::Path(id): axum::extract::Path<String>,
    Query(q): Query<Format>,
) -> Result<Response, ApiError> {
    ask(&app, &headers, q.format.as_deref(), async move |s: &mut AnyStore| {
        let (apply, steps) = s.apply_journal(&id).await?;
        Ok::<_, kiln_db::DbError>(views::Journal { apply, steps })
    })
    .await
}

/// The fleet questions' common parameters.
#[derive(Deserialize)]
struct FleetQuery {
    /// `config` for one row per configuration.
    by: Option<String>,
    a: Option<String>,
    b: Option<String>,
    metric: Option<String>,
    since: Option<String>,
    #[serde(default)]
    across_software: bool,
    noise: Option<f64>,
    threshold: Option<f64>,
    min_deviation: Option<f64>,
    format: Option<String>,
}

impl FleetQuery {
    fn filter(&self) -> Result<kiln_app::fleet::Filter, ApiError> {
        Ok(views::filter(self.since.as_deref(), self.metric.clone(), self.across_software)?)
    }
}

async fn compare(
    State(app): State<Shared>,
    headers: HeaderMap,
    Query(q): Query<FleetQuery>,
) -> Result<Response, ApiError> {
    let filter = q.filter()?;
    let by = match q.by.as_deref() {
        None => None,
        Some("config") => Some(views::By::Config),
        Some(other) => {
            return Err(ApiError::BadRequest { message: format!("by={other}: only by=config is known"), line: None })
        }
    };
    let subjects: Vec<String> = q.a.iter().chain(q.b.iter()).cloned().collect();
    let noise = q.noise.unwrap_or(defaults::NOISE);
    ask(&app, &headers, q.format.as_deref(), async move |s: &mut AnyStore| {
        views::compare_view(s, &subjects, by, &Default::default(), &filter, noise).await
    })
    .await
}

async fn outliers(
    State(app): State<Shared>,
    headers: HeaderMap,
    Query(q): Query<FleetQuery>,
) -> Result<Response, ApiError> {
    let filter = q.filter()?;
    let threshold = q.threshold.unwrap_or(defaults::OUTLIER_THRESHOLD);
    let min_dev = q.min_deviation.unwrap_or(defaults::MIN_DEVIATION);
    ask(&app, &headers, q.format.as_deref(), async move |s: &mut AnyStore| {
        views::outliers_view(s, &filter, threshold, min_dev).await
    })
    .await
}

/// Answers `X-Kiln-Exit: 1` when a regression is found, as `kiln regressions` exits 1.
async fn regressions(
    State(app): State<Shared>,
    headers: HeaderMap,
    Query(q): Query<FleetQuery>,
) -> Result<Response, ApiError> {
    authorize(&app, &headers, Need::Read).await?;
    let since = q.since.clone().unwrap_or_else(|| defaults::WINDOW.into());
    let noise = q.noise.unwrap_or(defaults::NOISE);
    let metric = q.metric.clone();
    let view =
        app.pool.read(async move |s: &mut AnyStore| views::regressions_view(s, &since, metric, noise).await).await??;
    let found = !view.regressions.is_empty();
    let mut response = answer(&view, q.format.as_deref())?;
    response.headers_mut().insert("x-kiln-exit", HeaderValue::from_static(if found { "1" } else { "0" }));
    Ok(response)
}

#[derive(Deserialize)]
struct ReportQuery {
    host: Option<String>,
    config: Option<String>,
    run: Option<String>,
    /// A cluster run's id (or a unique prefix).
    cluster: Option<String>,
    since: Option<String>,
    /// `html` (the default) or `markdown`.
    format: Option<String>,
}

async fn report(
    State(app): State<Shared>,
    headers: HeaderMap,
    Query(q): Query<ReportQuery>,
) -> Result<Response, ApiError> {
    authorize(&app, &headers, Need::Read).await?;
    let built = if let Some(id) = q.cluster.filter(|_| q.host.is_none() && q.config.is_none() && q.run.is_none()) {
        let asked = id.clone();
        let runs = app.pool.read(async move |s: &mut AnyStore| s.runs_of_cluster(&asked).await).await??;
        kiln_app::cluster_report::build(&id, &runs)
    } else {
        let Some(asked) = kiln_app::report::subject(q.host, q.config, q.run) else {
            return Err(ApiError::BadRequest {
                message: "give one of host=, config=, run= or cluster=".into(),
                line: None,
            });
        };
        let start = views::window_start(q.since.as_deref().unwrap_or(defaults::WINDOW))?;
        let evidence = app
            .pool
            .read(async move |s: &mut AnyStore| kiln_app::report::gather(s, &asked, start).await)
            .await?
            .map_err(|e| ApiError::BadRequest { message: e.to_string(), line: None })?;
        kiln_app::report::build(&evidence)
    };
    Ok(match q.format.as_deref() {
        Some("markdown") => {
            ([(header::CONTENT_TYPE, "text/markdown; charset=utf-8")], kiln_app::report::markdown(&built))
                .into_response()
        }
        _ => ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], kiln_app::report::html(&built)).into_response(),
    })
}

async fn metrics_page(State(app): State<Shared>, headers: HeaderMap) -> Result<Response, ApiError> {
    authorize(&app, &headers, Need::Read).await?;
    let text = app.metrics.scrape(&app.pool).await?;
    Ok(([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], text).into_response())
}

/// `GET /`: the dashboard. Browsers are asked for the token as the password of HTTP Basic.
async fn dashboard(State(app): State<Shared>, headers: HeaderMap) -> Result<Response, ApiError> {
    match authorize(&app, &headers, Need::Read).await {
        Err(ApiError::Unauthorized(m)) => {
            let mut r = ApiError::Unauthorized(m).into_response();
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Basic realm=\"kiln fleet: any user name, the token as password\""),
            );
            return Ok(r);
        }
        other => other?,
    };
    let page = app.pool.read(async |s: &mut AnyStore| dashboard::page(s).await).await??;
    Ok(([(header::CONTENT_TYPE, "text/html; charset=utf-8")], page).into_response())
}

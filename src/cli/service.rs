//! The fleet service's commands: `kiln serve`, `kiln token`, `kiln sync`, and the read commands
//! asked of a server (`--server`).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use kiln_db::{Queries, Role, TokenRow};
use serde::Serialize;

use super::args::{Command, TokenCmd, TokenRole};
use super::{Ctx, Exit, Output, View};
use kiln_serve::auth;
use kiln_serve::upload::{self, Remote};

/// `kiln serve`'s arguments.
pub struct ServeArgs {
    pub listen: std::net::SocketAddr,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub max_upload_mib: usize,
    pub anonymous_read: bool,
    pub shutdown_deadline: u64,
    pub readers: usize,
}

pub fn serve(args: ServeArgs, ctx: &Ctx) -> Result<Output> {
    let db = ctx.location_for(kiln_db::Access::Write)?;
    kiln_serve::serve(kiln_serve::Config {
        db,
        listen: args.listen,
        tls: args.tls_cert.zip(args.tls_key),
        max_upload_bytes: args.max_upload_mib.saturating_mul(1 << 20),
        anonymous_read: args.anonymous_read,
        shutdown_deadline: Duration::from_secs(args.shutdown_deadline),
        readers: args.readers,
    })?;
    Ok(Output::empty(Exit::Ok))
}

/// `kiln token create`: the token, shown once.
#[derive(Serialize)]
pub struct Created {
    pub id: String,
    pub name: String,
    pub role: Role,
    /// The host an agent token speaks for, when named at creation.
    pub host: Option<String>,
    pub token: String,
}

impl View for Created {
    /// The token alone: what `$(kiln token create …)` captures. The advice goes to standard error.
    fn render(&self) -> String {
        self.token.clone()
    }
}

impl Created {
    /// What to do with the token, for standard error.
    fn advice(&self) -> String {
        let host = match (&self.host, self.role) {
            (Some(h), _) => format!(", for host {h} only"),
            (None, Role::Agent) => ", for the host of its first upload only".into(),
            _ => String::new(),
        };
        format!(
            "kiln: token {} for {:?} ({}{host}): copy it now, kiln keeps only its hash. Agents take it as --token, \
             KILN_TOKEN or `token` in /etc/kiln/agent.toml.",
            self.id,
            self.name,
            self.role.as_str()
        )
    }
}

/// `kiln token list`.
#[derive(Serialize)]
pub struct Tokens {
    pub tokens: Vec<TokenRow>,
}

impl View for Tokens {
    fn render(&self) -> String {
        if self.tokens.is_empty() {
            return "no tokens yet: kiln token create --name NAME [--role agent|reader|admin|importer] [--host IDENTITY]"
                .into();
        }
        let rows: Vec<Vec<String>> = self
            .tokens
            .iter()
            .map(|t| {
                vec![
                    t.id.clone(),
                    t.name.clone(),
                    t.role.as_str().into(),
                    match (&t.host_identity, t.role) {
                        (Some(h), _) => h.clone(),
                        (None, Role::Agent) => "(first upload's)".into(),
                        (None, _) => "any".into(),
                    },
                    t.created_at.clone(),
                    t.last_used_at.clone().unwrap_or_else(|| "never".into()),
                    t.revoked_at.clone().map(|r| format!("revoked {r}")).unwrap_or_else(|| "live".into()),
                ]
            })
            .collect();
        kiln_text::table(&["ID", "NAME", "ROLE", "HOST", "CREATED", "LAST USED", "STATE"], &rows)
    }
}

/// `kiln token revoke`.
#[derive(Serialize)]
pub struct Revoked {
    pub token: TokenRow,
}

impl View for Revoked {
    fn render(&self) -> String {
        format!("revoked token {} ({:?}); it stops working at once", self.token.id, self.token.name)
    }
}

pub fn token(what: TokenCmd, ctx: &Ctx) -> Result<Output> {
    match what {
        TokenCmd::Create { name, role, host } => {
            let role = match role {
                TokenRole::Agent => Role::Agent,
                TokenRole::Reader => Role::Reader,
                TokenRole::Admin => Role::Admin,
                TokenRole::Importer => Role::Importer,
            };
            if name.trim().is_empty() {
                anyhow::bail!("--name must not be empty");
            }
            if host.is_some() && !role.one_host() {
                anyhow::bail!("--host binds an agent token to its host; a {} token is not bound", role.as_str());
            }
            if host.as_deref().is_some_and(|h| h.trim().is_empty()) {
                anyhow::bail!("--host must not be empty");
            }
            let new = auth::new_token();
            let (id, hash, at) = (new.id.clone(), new.secret_sha256.clone(), kiln_text::timefmt::now_rfc3339());
            let stored_name = name.clone();
            ctx.with_any(async |s| s.create_token(&id, &stored_name, role, &hash, &at, host.as_deref()).await)?;
            let created = Created { id: new.id, name, role, host, token: new.token };
            eprintln!("{}", created.advice());
            ctx.output(&created)
        }
        TokenCmd::List => ctx.output(&Tokens { tokens: ctx.with_any(async |s| s.tokens().await)? }),
        TokenCmd::Revoke { name_or_id } => {
            let at = kiln_text::timefmt::now_rfc3339();
            let row = ctx.with_any(async |s| s.revoke_token(&name_or_id, &at).await)?;
            let row =
                row.with_context(|| format!("no live token is named or has the id {name_or_id:?} (kiln token list)"))?;
            ctx.output(&Revoked { token: row })
        }
    }
}

/// `kiln sync`: everything in the outbox (with `--all`, everything stored), now; exit 2 when an upload failed (the results stay queued).
pub fn sync(all: bool, ctx: &Ctx) -> Result<Output> {
    let remote = ctx.remote().context(
        "no fleet service to send to: pass --server URL --token TOKEN, set KILN_SERVER and KILN_TOKEN, or write \
         /etc/kiln/agent.toml",
    )?;
    let synced = ctx.with_store_sync(|rt, store| {
        if all {
            rt.block_on(store.queue_everything())?;
        }
        rt.block_on(upload::sync(store, remote, false))
    })?;
    let failed = synced.error.is_some();
    let out = ctx.output(&synced)?;
    Ok(if failed { out.with_exit(Exit::Error) } else { out })
}

/// A read command asked of the fleet service instead of the local database; `None` for the
/// commands that are not read commands.
pub fn remote_read(command: &Command, remote: &Remote, ctx: &Ctx) -> Option<Result<Output>> {
    let since = |w: &super::args::Window| w.since.clone();
    let mut q: Vec<(&str, String)> = Vec::new();
    let mut push = |k: &'static str, v: Option<String>| {
        if let Some(v) = v {
            q.push((k, v));
        }
    };
    let path = match command {
        Command::Hosts => "/api/v1/hosts",
        Command::Runs { limit } => {
            push("limit", Some(limit.to_string()));
            "/api/v1/runs"
        }
        Command::Compare { subjects, by, metric, prices, across_software, window, noise } => {
            if prices.is_some() {
                return Some(Err(anyhow::anyhow!("--prices is read locally; it cannot be sent with --server")));
            }
            push("by", by.map(|_| "config".to_string()));
            push("a", subjects.first().cloned());
            push("b", subjects.get(1).cloned());
            push("metric", metric.clone());
            push("since", since(window));
            push("across_software", across_software.then(|| "true".into()));
            push("noise", Some(noise.to_string()));
            "/api/v1/compare"
        }
        Command::Outliers { metric, threshold, min_deviation, across_software, window } => {
            push("metric", metric.clone());
            push("threshold", Some(threshold.to_string()));
            push("min_deviation", Some(min_deviation.to_string()));
            push("across_software", across_software.then(|| "true".into()));
            push("since", since(window));
            "/api/v1/outliers"
        }
        Command::Regressions { since, metric, noise } => {
            push("since", Some(since.clone()));
            push("metric", metric.clone());
            push("noise", Some(noise.to_string()));
            "/api/v1/regressions"
        }
        Command::Report { host, config, run, cluster, html, markdown, since } => {
            push("host", host.clone());
            push("config", config.clone());
            push("run", run.clone());
            push("cluster", cluster.clone());
            push("since", Some(since.clone()));
            return Some(remote_report(remote, q, html.clone(), markdown.clone(), ctx));
        }
        Command::Provision { what: super::args::Provision::Log { image, apply, limit, .. } } => match apply {
            Some(id) => return Some(remote_get(remote, &format!("/api/v1/applies/{}", encode_path(id)), q, ctx)),
            None => {
                push("image", image.clone());
                push("limit", Some(limit.to_string()));
                "/api/v1/applies"
            }
        },
        _ => return None,
    };
    Some(remote_get(remote, path, q, ctx))
}

/// One path segment, percent-encoded (an apply id or prefix as the user typed it).
fn encode_path(segment: &str) -> String {
    segment
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A read question's answer from the fleet service: text for people, or its JSON.
fn remote_get(remote: &Remote, path: &str, mut q: Vec<(&str, String)>, ctx: &Ctx) -> Result<Output> {
    if !ctx.json {
        q.push(("format", "text".into()));
    }
    remote.get(path, &q).map(|(exit, body)| {
        let exit = if exit.as_deref() == Some("1") { Exit::CheckFailed } else { Exit::Ok };
        Output::new(body).with_exit(exit)
    })
}

fn remote_report(
    remote: &Remote,
    q: Vec<(&str, String)>,
    html: Option<PathBuf>,
    markdown: Option<PathBuf>,
    ctx: &Ctx,
) -> Result<Output> {
    if html.is_none() && markdown.is_none() {
        anyhow::bail!("say where the report goes: --html FILE and/or --markdown FILE");
    }
    for (path, format) in [(&html, "html"), (&markdown, "markdown")] {
        let Some(path) = path else { continue };
        let mut query = q.clone();
        query.push(("format", format.into()));
        let (_, body) = remote.get("/api/v1/report", &query)?;
        super::outfile::write_output(path, |w| {
            w.write_all(body.as_bytes()).with_context(|| path.display().to_string())
        })?;
    }
    let title = format!("report from {}", remote.url);
    ctx.output(&super::fleet::Written { title, html, markdown })
}

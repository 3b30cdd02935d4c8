//! The agent's side of the fleet service: where it is (`--server`/`--token`/`--ca-cert`, else
//! `KILN_SERVER`/`KILN_TOKEN`/`KILN_CA_CERT`, else `/etc/kiln/agent.toml`), sending the outbox
//! (results are stored locally first and queued in the same transaction; a batch leaves the outbox
//! only once the server has answered that it stored it), and asking the fleet questions.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use kiln_db::{Pending, Store};
use serde::{Deserialize, Serialize};

/// The agent's configuration file, unless `KILN_AGENT_CONFIG` names another.
pub const AGENT_CONFIG: &str = "/etc/kiln/agent.toml";

/// At most this many outbox entries (inventories, runs, verdicts, provisioning applies) per upload.
pub const BATCH: i64 = 100;

/// A fleet service and the token to use with it.
#[derive(Debug, Clone)]
pub struct Remote {
    /// The base URL, without a trailing `/`.
    pub url: String,
    pub token: Option<String>,
    /// Trust this CA (PEM) instead of the built-in web roots: a site's own CA or a self-signed server.
    pub ca_cert: Option<PathBuf>,
    /// The HTTP client, made on first use and kept for every request of the command (its
    /// connections and the CA file read once).
    client: std::sync::OnceLock<ureq::Agent>,
}

/// `/etc/kiln/agent.toml` (or `KILN_AGENT_CONFIG`): the fleet service to upload to, and what a
/// verdict sets off where the cluster is scheduled.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct AgentFile {
    pub server: Option<String>,
    pub token: Option<String>,
    pub ca_cert: Option<PathBuf>,
    /// `drain` or `nothing` (`kiln commission --on-reject`).
    pub on_reject: Option<String>,
    /// The node's name in Slurm (`--slurm-node`).
    pub slurm_node: Option<String>,
    /// A command run with each verdict on standard input (`--on-verdict`).
    pub on_verdict: Option<String>,
}

impl AgentFile {
    /// The agent file, where it is; `None` when there is none.
    ///
    /// # Errors
    /// A file that is there but unreadable or malformed, naming it.
    pub fn read() -> Result<Option<(PathBuf, AgentFile)>> {
        let path = std::env::var_os("KILN_AGENT_CONFIG")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(AGENT_CONFIG));
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        let file: AgentFile = toml::from_str(&text).with_context(|| {
            format!(
                "{}: expected `server = \"https://…\"`, optional `token`, `ca_cert`, `on_reject`, `slurm_node` and \
                 `on_verdict`",
                path.display()
            )
        })?;
        Ok(Some((path, file)))
    }
}

impl Remote {
    /// The flags' remote, else the environment's, else the agent file's; `None` when none is set.
    ///
    /// # Errors
    /// An agent file that is there but unreadable or malformed; a URL that is not http(s).
    pub fn resolve(server: Option<&str>, token: Option<&str>, ca_cert: Option<&Path>) -> Result<Option<Remote>> {
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let token = token.map(str::to_string).or_else(|| env("KILN_TOKEN"));
        let ca_cert = ca_cert.map(Path::to_path_buf).or_else(|| env("KILN_CA_CERT").map(PathBuf::from));
        if let Some(url) = server {
            return Remote::new(url, token, ca_cert, "--server").map(Some);
        }
        if let Some(url) = env("KILN_SERVER") {
            return Remote::new(&url, token, ca_cert, "KILN_SERVER").map(Some);
        }
        let Some((path, file)) = AgentFile::read()? else { return Ok(None) };
        let Some(server) = &file.server else { return Ok(None) };
        let from = path.display().to_string();
        Remote::new(server, token.or(file.token), ca_cert.or(file.ca_cert), &from).map(Some)
    }

    fn new(url: &str, token: Option<String>, ca_cert: Option<PathBuf>, from: &str) -> Result<Remote> {
        let url = url.trim().trim_end_matches('/').to_string();
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            anyhow::bail!("{from}: {url:?} is not an http:// or https:// URL");
        }
        Ok(Remote { url, token, ca_cert, client: std::sync::OnceLock::new() })
    }

    /// The HTTP client (see [`Remote::make_client`]).
    fn client(&self) -> Result<&ureq::Agent> {
        if let Some(client) = self.client.get() {
            return Ok(client);
        }
        let made = self.make_client()?;
        Ok(self.client.get_or_init(|| made))
    }

    /// An HTTP client that trusts `ca_cert` (or the web's roots) and leaves status codes to us.
    fn make_client(&self) -> Result<ureq::Agent> {
        use ureq::tls::{PemItem, RootCerts, TlsConfig};
        let mut tls = TlsConfig::builder();
        if let Some(ca) = &self.ca_cert {
            let pem = std::fs::read(ca).with_context(|| format!("reading the CA certificate {}", ca.display()))?;
            let certs = ureq::tls::parse_pem(&pem)
                .filter_map(|item| match item {
                    Ok(PemItem::Certificate(c)) => Some(Ok(c)),
                    Ok(_) => None,
                    Err(e) => Some(Err(e)),
                })
                .collect::<Result<Vec<_>, _>>()
                .with_context(|| format!("{}: not a PEM certificate", ca.display()))?;
            if certs.is_empty() {
                anyhow::bail!("{}: no certificate in it", ca.display());
            }
            tls = tls.root_certs(RootCerts::Specific(Arc::new(certs)));
        }
        let config = ureq::Agent::config_builder()
            .tls_config(tls.build())
            .http_status_as_error(false)
            .timeout_connect(Some(Duration::from_secs(10)))
            .timeout_global(Some(Duration::from_secs(300)))
            .build();
        Ok(config.into())
    }

    fn authorization(&self) -> Result<String> {
        let token = self.token.as_deref().with_context(|| {
            format!("no token for {}: pass --token, set KILN_TOKEN, or put `token` in {AGENT_CONFIG}", self.url)
        })?;
        Ok(format!("Bearer {token}"))
    }

    /// `POST /api/v1/records` with an export; `Err` with the server's words when it did not store it.
    pub fn upload(&self, export: &[u8]) -> Result<kiln_db::ImportStats, String> {
        let client = self.client().map_err(|e| format!("{e:#}"))?;
        let auth = self.authorization().map_err(|e| format!("{e:#}"))?;
        let response = client
            .post(format!("{}/api/v1/records", self.url))
            .header("Authorization", auth)
            .header("Content-Type", "application/x-ndjson")
            .send(export)
            .map_err(|e| format!("{}: {e}", self.url))?;
        let (status, body) = read(response)?;
        if status != 200 {
            return Err(format!("{} answered {status}: {}", self.url, server_error(&body)));
        }
        serde_json::from_str(&body).map_err(|e| format!("{}: an answer that is not an import's ({e})", self.url))
    }

    /// `GET path?query`: the `X-Kiln-Exit` header and the body of a 200 answer; any other status is
    /// an error with the server's words.
    pub fn get(&self, path: &str, query: &[(&str, String)]) -> Result<(Option<String>, String)> {
        let client = self.client()?;
        let mut request = client.get(format!("{}{path}", self.url));
        if self.token.is_some() {
            request = request.header("Authorization", self.authorization()?);
        }
        for (k, v) in query {
            request = request.query(*k, v);
        }
        let response = request.call().with_context(|| format!("asking {}", self.url))?;
        let exit = response.headers().get("x-kiln-exit").and_then(|v| v.to_str().ok()).map(str::to_string);
        let (status, body) = read(response).map_err(anyhow::Error::msg)?;
        if status != 200 {
            anyhow::bail!("{}{path} answered {status}: {}", self.url, server_error(&body));
        }
        Ok((exit, body))
    }
}

fn read(mut response: ureq::http::Response<ureq::Body>) -> Result<(u16, String), String> {
    let status = response.status().as_u16();
    let body = response
        .body_mut()
        .with_config()
        .limit(1 << 30)
        .read_to_string()
        .map_err(|e| format!("reading the answer: {e}"))?;
    Ok((status, body))
}

/// The `error` of a JSON error answer, else the body's start.
fn server_error(body: &str) -> String {
    serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_string))
        .unwrap_or_else(|| body.chars().take(300).collect())
}

/// The wait after the `n`th failed attempt of a batch: 1, 2, 4 … minutes, at most 6 hours.
pub fn backoff(attempts: i64) -> i64 {
    60i64.saturating_mul(1i64 << attempts.clamp(0, 9)).min(6 * 3_600)
}

/// What one sync did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Synced {
    pub server: String,
    /// Uploads the server stored.
    pub uploads: u64,
    /// Outbox entries (inventories, runs, verdicts, provisioning applies) they held.
    pub entries: u64,
    /// Export records sent in them.
    pub records: u64,
    /// Records the server had not seen before (the rest it already held: nothing is stored twice).
    pub new_runs: u64,
    /// The failure that stopped the sync, if any; the entries stay in the outbox.
    pub error: Option<String>,
    /// What is left in the outbox.
    pub pending: Pending,
}

/// Sends the outbox in batches: every entry (`due_only == false`, `kiln sync`) or those whose
/// back-off has passed (after another command). Stops at the first failure, which counts an
/// attempt against the batch and sets its next time.
pub async fn sync(store: &mut Store, remote: &Remote, due_only: bool) -> Result<Synced> {
    let mut done = Synced { server: remote.url.clone(), ..Default::default() };
    loop {
        let now = kiln_text::timefmt::now_unix();
        let now_text = kiln_text::timefmt::rfc3339(now);
        let mut body = Vec::new();
        let due = due_only.then_some(now_text.as_str());
        let Some(batch) = store.upload_batch(due, BATCH, &now_text, &mut body).await? else { break };
        match remote.upload(&body) {
            Ok(stats) => {
                store.upload_done().await?;
                done.uploads += 1;
                done.entries += batch.entries;
                done.records += stats.records;
                done.new_runs += stats.runs_new;
            }
            Err(e) => {
                let attempts = store.batch_attempts().await?;
                let next = kiln_text::timefmt::rfc3339(now + backoff(attempts));
                store.upload_failed(&e, &next).await?;
                done.error = Some(e);
                break;
            }
        }
    }
    done.pending = store.pending_uploads(&kiln_text::timefmt::now_rfc3339()).await?;
    Ok(done)
}

impl kiln_app::views::View for Synced {
    fn render(&self) -> String {
        let mut text = format!(
            "sent {} results ({} records, {} new runs there) in {} uploads to {}",
            self.entries, self.records, self.new_runs, self.uploads, self.server
        );
        if let Some(e) = &self.error {
            text.push_str(&format!("\nfailed: {e}"));
        }
        let left = self.pending.total();
        if left > 0 {
            text.push_str(&format!("\n{left} results are still waiting to be sent"));
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_a_minute_up_to_six_hours() {
        assert_eq!(backoff(0), 60);
        assert_eq!(backoff(1), 120);
        assert_eq!(backoff(5), 1_920);
        assert_eq!(backoff(9), 6 * 3_600);
        assert_eq!(backoff(1_000), 6 * 3_600);
    }

    #[test]
    fn a_server_must_be_an_http_url() {
        assert!(Remote::new("fleet:8080", None, None, "--server").is_err());
        assert_eq!(Remote::new("https://fleet:8443/", None, None, "x").unwrap().url, "https://fleet:8443");
        assert_eq!(server_error(r#"{"error":"no token","line":null}"#), "no token");
    }
}

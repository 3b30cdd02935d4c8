//! The fleet service through the binary: `kiln serve` started on a loopback port, tokens made with
//! `kiln token`, agents uploading with their own commands and `kiln sync`, readers asking with
//! `--server`, and raw HTTP (ureq) for what a command never sends (no token, a wrong one, a body
//! too large, a malformed one). The dashboard is checked in headless Chromium. The service's
//! tests run on both engines: an SQLite file, and PostgreSQL in a throwaway cluster.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::fleet_gen::{generate, hostname};
use crate::pg_cluster::PgCluster;
use crate::util::{fixtures, kiln, unpack, Run};

/// A running `kiln serve`, stopped (SIGTERM) when dropped.
pub(crate) struct Server {
    child: Child,
    pub(crate) url: String,
    stderr: std::sync::mpsc::Receiver<String>,
}

impl Server {
    pub(crate) fn start(db: &Path, extra: &[&str]) -> Server {
        let mut args = vec!["serve", "--listen", "127.0.0.1:0", "--shutdown-deadline", "5"];
        args.extend(extra);
        Server::spawn(&args, &[("KILN_DB", db)])
    }

    /// Any long-running kiln command that says `listening on URL` on stderr.
    fn spawn(args: &[&str], env: &[(&str, &Path)]) -> Server {
        let mut command = Command::new(env!("CARGO_BIN_EXE_kiln"));
        command.args(args).env_remove("KILN_LOG").env_remove("KILN_DB");
        for (k, v) in env {
            command.env(k, v);
        }
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting kiln serve");
        let (tx, rx) = std::sync::mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let mut seen = Vec::new();
        loop {
            match rx.recv_timeout(Duration::from_secs(30)) {
                Ok(line) => {
                    if let Some(at) = line.find("listening on ") {
                        let url = line[at + "listening on ".len()..].trim().to_string();
                        return Server { child, url, stderr: rx };
                    }
                    seen.push(line);
                }
                Err(_) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("kiln serve did not start: {seen:?}");
                }
            }
        }
    }

    /// SIGTERM, then its exit status and what it said.
    fn stop(mut self) -> (std::process::ExitStatus, String) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        let status = self.child.wait().unwrap();
        let said: Vec<String> = self.stderr.try_iter().collect();
        (status, said.join("\n"))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) struct Site {
    dir: tempfile::TempDir,
    /// The service's PostgreSQL cluster, when the site stores there instead of an SQLite file.
    pg: Option<PgCluster>,
}

impl Site {
    pub(crate) fn new() -> Site {
        Site { dir: tempfile::tempdir().unwrap(), pg: None }
    }
    /// A site whose service stores in PostgreSQL; `None` (said, or refused under
    /// KILN_TEST_REQUIRE_ALL) where PostgreSQL is not installed.
    fn postgres(test: &str) -> Option<Site> {
        if !crate::util::needs(test, &crate::pg_cluster::missing().into_iter().collect::<Vec<_>>()) {
            return None;
        }
        Some(Site { dir: tempfile::tempdir().unwrap(), pg: Some(PgCluster::start()) })
    }
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
    /// The service's `--db`: a file, or the PostgreSQL URL.
    pub(crate) fn server_db(&self) -> PathBuf {
        match &self.pg {
            Some(pg) => PathBuf::from(&pg.url),
            None => self.path("fleet.db"),
        }
    }
    /// Checks the service's database: `kiln db check` on a file; on PostgreSQL, that every run's
    /// values belong to a stored run (the engine keeps its own pages).
    fn check_db(&self) {
        match &self.pg {
            None => {
                self.admin(&["db", "check"]).success();
            }
            Some(pg) => {
                let orphans = pg.psql(
                    "kiln",
                    "SELECT COUNT(*) FROM metric_values v LEFT JOIN run_numbers n ON n.num = v.run \
                     LEFT JOIN runs r ON r.id = n.run_id WHERE r.id IS NULL",
                );
                assert_eq!(orphans.trim(), "0", "metric values without their run");
            }
        }
    }
    /// `kiln` on the server's database.
    pub(crate) fn admin(&self, args: &[&str]) -> Run {
        kiln(args, &[("KILN_DB", &self.server_db())])
    }
    /// A new token of `role`.
    pub(crate) fn token(&self, name: &str, role: &str) -> String {
        let made = self.admin(&["token", "create", "--name", name, "--role", role, "--json"]).success().json();
        made["token"].as_str().unwrap().to_string()
    }
}

fn client() -> ureq::Agent {
    ureq::Agent::config_builder().http_status_as_error(false).build().into()
}

/// A request's status, `WWW-Authenticate` and body.
fn send(req: Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> (u16, String, String) {
    let mut r = req.expect("the server answers");
    let auth = r.headers().get("www-authenticate").map(|v| v.to_str().unwrap().to_string()).unwrap_or_default();
    (r.status().as_u16(), auth, r.body_mut().with_config().limit(1 << 30).read_to_string().unwrap())
}

fn post(url: &str, token: Option<&str>, body: &str) -> (u16, String, String) {
    let mut req = client().post(format!("{url}/api/v1/records"));
    if let Some(t) = token {
        req = req.header("Authorization", format!("Bearer {t}"));
    }
    send(req.send(body))
}

fn get(url: &str, path: &str, token: Option<&str>) -> (u16, String, String) {
    let mut req = client().get(format!("{url}{path}"));
    if let Some(t) = token {
        req = req.header("Authorization", format!("Bearer {t}"));
    }
    send(req.call())
}

fn runs_in(site: &Site) -> usize {
    let runs = site.admin(&["runs", "--limit", "100000", "--json"]).success().json();
    runs["runs"].as_array().unwrap().len()
}

#[test]
fn the_service_stores_uploads_once_and_answers_as_the_local_commands_do() {
    stores_uploads_once_and_answers_as_the_local_commands_do(Site::new());
}

#[test]
fn the_service_on_postgresql_stores_uploads_once_and_answers_as_the_local_commands_do() {
    if let Some(site) = Site::postgres("the fleet service on PostgreSQL") {
        stores_uploads_once_and_answers_as_the_local_commands_do(site);
    }
}

// Long: one fleet, uploaded once and asked every question, keeps the assertions next to their setup.
fn stores_uploads_once_and_answers_as_the_local_commands_do(site: Site) {
    let importer = site.token("site-import", "importer");
    let reader = site.token("procurement", "reader");
    let server = Server::start(&site.server_db(), &[]);
    let url = server.url.clone();
    let (export, ..) = generate(&crate::fleet::spec_seeded(42));

    // Authentication before anything is stored.
    let (status, auth, body) = post(&url, None, &export);
    assert_eq!((status, auth.as_str()), (401, "Bearer realm=\"kiln\""), "{body}");
    let mut wrong = importer.clone();
    let last = wrong.pop().unwrap();
    wrong.push(if last == '0' { '1' } else { '0' });
    assert_eq!(post(&url, Some(&wrong), &export).0, 401, "a token with one digit changed");
    assert_eq!(post(&url, Some("Bearer nonsense"), &export).0, 401);
    let (status, _, body) = post(&url, Some(&reader), &export);
    assert_eq!(status, 403, "a reader may not upload: {body}");
    assert_eq!(get(&url, "/api/v1/hosts", Some(&importer)).0, 403, "an importer may not read the fleet");
    assert_eq!(runs_in(&site), 0);

    // Malformed uploads: refused with the line, nothing stored.
    let (status, _, body) = post(&url, Some(&importer), "hello\n");
    let answer: Value = serde_json::from_str(&body).unwrap();
    assert_eq!((status, answer["line"].as_u64()), (400, Some(1)), "{body}");
    let lines: Vec<&str> = export.lines().collect();
    let mut broken = lines.clone();
    let bad = broken[299].replacen(r#""metrics":[["#, r#""metrics":[[7,"#, 1);
    broken[299] = &bad;
    let (status, _, body) = post(&url, Some(&importer), &(broken.join("\n") + "\n"));
    let answer: Value = serde_json::from_str(&body).unwrap();
    assert_eq!((status, answer["line"].as_u64()), (400, Some(300)), "{body}");
    assert!(answer["error"].as_str().unwrap().contains("nothing was imported"), "{body}");
    assert_eq!(runs_in(&site), 0, "a refused upload stores nothing");

    // The upload, and the same again: stored once.
    let (status, _, body) = post(&url, Some(&importer), &export);
    assert_eq!(status, 200, "{body}");
    let stats: Value = serde_json::from_str(&body).unwrap();
    assert_eq!((stats["runs_new"].as_u64(), stats["hosts_new"].as_u64()), (Some(1200), Some(40)), "{body}");
    let (status, _, body) = post(&url, Some(&importer), &export);
    let stats: Value = serde_json::from_str(&body).unwrap();
    assert_eq!((status, stats["runs_new"].as_u64(), stats["runs_known"].as_u64()), (200, Some(0), Some(1200)));
    assert_eq!(runs_in(&site), 1200);

    // Every question asked of the server answers what the same command answers on a local copy.
    let local = site.path("local.db");
    let export_file = site.path("fleet.jsonl");
    std::fs::write(&export_file, &export).unwrap();
    kiln(&["import", export_file.to_str().unwrap()], &[("KILN_DB", &local)]).success();
    let questions: Vec<Vec<&str>> = vec![
        vec!["hosts"],
        vec!["runs", "--limit", "5"],
        vec!["compare", "--by", "config", "--since", "40d"],
        vec!["compare", crate::fleet_gen::CONFIG_NAMES[0], crate::fleet_gen::CONFIG_NAMES[1], "--since", "40d"],
        vec!["outliers", "--since", "40d"],
        vec!["regressions", "--since", "40d"],
    ];
    for q in &questions {
        for json in [true, false] {
            let mut args = q.clone();
            if json {
                args.push("--json");
            }
            let here = kiln(&args, &[("KILN_DB", &local)]);
            let mut remote_args = vec!["--server", &url, "--token", &reader];
            remote_args.extend(&args);
            let there = kiln(&remote_args, &[]);
            assert_eq!(here.code(), there.code(), "{}\n{}", here.describe(), there.describe());
            if json {
                let (mut a, mut b) = (here.json(), there.json());
                for v in [&mut a, &mut b] {
                    // The regressions' window ends now: seconds apart.
                    if let Some(o) = v.as_object_mut() {
                        o.remove("days");
                    }
                }
                assert_eq!(a, b, "kiln {q:?} --json differs through the server");
            } else if q[0] != "hosts" && q[0] != "runs" {
                assert_eq!(here.stdout(), there.stdout(), "kiln {q:?} differs through the server");
            }
        }
    }
    let regs = kiln(&["--server", &url, "--token", &reader, "regressions", "--since", "40d"], &[]);
    assert_eq!(regs.code(), Some(1), "regressions found exit 1 through the server too: {}", regs.describe());
    let html = site.path("host.html");
    kiln(
        &[
            "--server",
            &url,
            "--token",
            &reader,
            "report",
            "--host",
            &hostname(13),
            "--since",
            "40d",
            "--html",
            html.to_str().unwrap(),
        ],
        &[],
    )
    .success();
    assert!(std::fs::read_to_string(&html).unwrap().contains("<h2>Results against the fleet</h2>"));

    // Metrics: requests by route and status, and the fleet's gauges.
    let (status, _, metrics) = get(&url, "/metrics", Some(&reader));
    assert_eq!(status, 200);
    for want in [
        "kiln_http_requests_total{method=\"POST\",route=\"/api/v1/records\",status=\"200\"} 2",
        "kiln_http_requests_total{method=\"POST\",route=\"/api/v1/records\",status=\"401\"} 3",
        "kiln_http_requests_total{method=\"POST\",route=\"/api/v1/records\",status=\"400\"} 2",
        "kiln_http_request_duration_seconds_bucket{le=\"+Inf\",route=\"/api/v1/records\"} 8",
        "kiln_uploads_total 2",
        "# TYPE kiln_fleet_host_last_run_age_seconds gauge",
        "# EOF",
    ] {
        assert!(metrics.contains(want), "/metrics lacks {want:?}:\n{metrics}");
    }
    let hosts: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("kiln_fleet_hosts{"))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum();
    assert_eq!(hosts, 40.0, "hosts per configuration and verdict add up to the fleet");
    let open: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("kiln_fleet_open_regressions "))
        .expect("open regressions")
        .parse()
        .unwrap();
    assert!(open >= 1.0, "the generated fleet's regressions are counted: {open}");

    // The dashboard: Basic authentication for browsers, then a page built from the report's parts.
    let (status, auth, _) = get(&url, "/", None);
    assert_eq!(status, 401);
    assert!(auth.starts_with("Basic realm="), "a browser is asked for the token: {auth}");
    let (status, _, page) = get(&url, "/", Some(&reader));
    assert_eq!(status, 200);
    for want in ["<h2>Hosts</h2>", "<h2>Configurations</h2>", "<h2>Regressions (30 days)</h2>", "<svg", &hostname(13)] {
        assert!(page.contains(want), "the dashboard lacks {want:?}");
    }
    assert!(!page.contains("<script") && !page.contains("src="), "no scripts, no external assets");
    if site.pg.is_none() {
        // The page is built by the same code on either engine: drawn once.
        dashboard_in_chromium(&site.path("dashboard.html"), &page);
    }

    // A revoked token stops working at once; the others keep working.
    site.admin(&["token", "revoke", "procurement"]).success();
    assert_eq!(get(&url, "/api/v1/hosts", Some(&reader)).0, 401, "revoked");
    let listed = site.admin(&["token", "list", "--json"]).success().json();
    let agent_row = listed["tokens"].as_array().unwrap().iter().find(|t| t["name"] == "site-import").unwrap().clone();
    assert!(agent_row["last_used_at"].is_string() && agent_row.get("secret_sha256").is_none(), "{agent_row}");

    let (status, said) = server.stop();
    assert!(status.success(), "SIGTERM stops the server cleanly: {said}");
    assert!(said.contains("SIGTERM") && said.contains("stopped"), "{said}");
    site.check_db();
}

fn dashboard_in_chromium(file: &Path, page: &str) {
    let browser = ["/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome"]
        .into_iter()
        .find(|p| Path::new(p).exists());
    let missing: Vec<String> =
        browser.is_none().then(|| "headless Chromium (Debian package chromium)".into()).into_iter().collect();
    if !crate::util::needs("the dashboard in headless Chromium", &missing) {
        return;
    }
    std::fs::write(file, page).unwrap();
    let profile = tempfile::tempdir().unwrap();
    let out = Command::new(browser.unwrap())
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"])
        .args(["--disable-component-update", "--disable-sync", "--enable-logging=stderr", "--v=0"])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg("--dump-dom")
        .arg(format!("file://{}", file.display()))
        .output()
        .expect("running chromium");
    let (dom, log) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "chromium failed: {log}");
    let console: Vec<&str> = log.lines().filter(|l| l.contains("CONSOLE") || l.contains("Uncaught")).collect();
    assert!(console.is_empty(), "console messages: {console:?}");
    assert!(dom.matches("<svg").count() >= 10, "the distributions are drawn");
    assert!(dom.matches("<tr>").count() > 40, "a row per host");
}

fn snapshot(name: &str) -> PathBuf {
    unpack(&fixtures().join("hwloc").join(format!("{name}.tar.bz2"))).join(name)
}

// Long: the agent's whole story (upload, server down, spool, sync, revoked token) in order.
#[test]
fn an_agent_spools_while_the_server_is_down_and_sends_each_result_once() {
    let site = Site::new();
    let token = site.token("box", "agent");
    let reader = site.token("ops", "reader");
    let agent_db = site.path("agent.db");
    let agent = |url: &str, args: &[&str]| {
        let mut all = vec!["--server", url, "--token", &token];
        all.extend(args);
        kiln(&all, &[("KILN_DB", &agent_db)])
    };
    let save = |url: &str, name: &str| {
        let root = snapshot(name);
        agent(url, &["inventory", "--save", "--root", root.to_str().unwrap()])
    };
    // The fleet's hosts and their inventories: an agent's token speaks for its own host, so every
    // save here is of the same snapshot, each a new inventory of that one host.
    let box_ = "16em64t-4s2c2t";
    let inventories = |url: &str| -> (usize, u64) {
        let h = kiln(&["--server", url, "--token", &reader, "hosts", "--json"], &[]).success().json();
        let hosts = h["hosts"].as_array().unwrap();
        (hosts.len(), hosts.iter().map(|h| h["inventories"].as_u64().unwrap()).sum())
    };

    let server = Server::start(&site.server_db(), &[]);
    let url = server.url.clone();
    let first = save(&url, box_).success();
    assert!(!first.stderr().contains("warning"), "{}", first.describe());
    assert_eq!(inventories(&url), (1, 1), "stored here, then uploaded");
    let (status, _) = server.stop();
    assert!(status.success());

    // The server is down: the command succeeds, says so, and keeps the result queued.
    let down = save(&url, box_).success();
    assert!(down.stderr().contains("warning: 1 results not sent"), "{}", down.describe());
    let again = agent(&url, &["sync"]);
    assert_eq!(again.code(), Some(2), "{}", again.describe());
    assert!(again.stdout().contains("failed:") && again.stdout().contains("1 results are still waiting"));
    assert!(!again.stderr().contains("warning"), "said once, not again as a warning: {}", again.describe());

    // Back up (on another port): sync sends the queued result, once.
    let server = Server::start(&site.server_db(), &[]);
    let url = server.url.clone();
    let sent = agent(&url, &["sync", "--json"]).success().json();
    assert_eq!((sent["entries"].as_u64(), sent["pending"]["inventories"].as_u64()), (Some(1), Some(0)), "{sent}");
    assert_eq!(inventories(&url), (1, 2));
    let nothing = agent(&url, &["sync", "--json"]).success().json();
    assert_eq!(nothing["uploads"].as_u64(), Some(0), "nothing is sent twice: {nothing}");
    // --all sends everything stored again; the server keeps each record once.
    let all = agent(&url, &["sync", "--all", "--json"]).success().json();
    assert_eq!(all["entries"].as_u64(), Some(2), "{all}");
    assert_eq!(inventories(&url), (1, 2));

    // A revoked token: the agent keeps its result and says why.
    site.admin(&["token", "revoke", "box"]).success();
    let refused = save(&url, box_).success();
    assert!(refused.stderr().contains("401") && refused.stderr().contains("revoked"), "{}", refused.describe());
    assert_eq!(inventories(&url), (1, 2));
    let pending = agent(&url, &["sync", "--json"]);
    assert_eq!(pending.code(), Some(2));
    assert_eq!(pending.json()["pending"]["inventories"].as_u64(), Some(1), "{}", pending.describe());
}

/// An image whose command fails until `ROOT/ok` exists: an apply that fails, then a resumed one
/// that succeeds.
const LAB_IMAGE: &str = r#"
[image]
name = "fleet-lab"
version = "3"

[[file]]
path = "/etc/kiln-fleet-lab/app.conf"
content = "threads = 8\n"

[[command]]
name = "needs ok"
run = ["sh", "-c", "echo looking for ok; test -e ${root}/ok && touch ${root}/done"]
creates = "/done"
"#;

#[test]
fn an_agent_token_uploads_its_own_hosts_records_only() {
    agent_tokens_speak_for_their_own_host(Site::new());
}

#[test]
fn an_agent_token_uploads_its_own_hosts_records_only_on_postgresql() {
    if let Some(site) = Site::postgres("agent tokens on PostgreSQL") {
        agent_tokens_speak_for_their_own_host(site);
    }
}

/// The probes of a node speaking for others, over HTTP: agent B's token sending agent A's host
/// (same identity, fresh record ids) or a host that is not B's, refused with 403 and nothing
/// stored; each token bound to its first upload's host and listed with it; an importer's token
/// loading any host; `kiln token create` printing only the token on a pipe.
fn agent_tokens_speak_for_their_own_host(site: Site) {
    let made = site.admin(&["token", "create", "--name", "node-a"]).success();
    let a = made.stdout().trim().to_string();
    assert!(
        a.starts_with("kiln_") && !a.contains(char::is_whitespace),
        "only the token on stdout: {}",
        made.describe()
    );
    assert!(made.stderr().contains("copy it now") && made.stderr().contains("first upload"), "{}", made.describe());
    let b = site.token("node-b", "agent");
    let importer = site.token("site-import", "importer");
    let refused = site.admin(&["token", "create", "--name", "r", "--role", "reader", "--host", "x"]);
    assert_eq!(refused.code(), Some(2), "{}", refused.describe());
    assert!(refused.stderr().contains("--host binds an agent token"), "{}", refused.describe());

    let (export, ..) = generate(&crate::fleet_gen::FleetSpec { hosts: 3, ..crate::fleet::spec_seeded(5) });
    let bodies = crate::fleet_gen::split_by_host(&export, 3);
    let identity = |body: &str| -> String {
        let host = body.lines().find(|l| l.starts_with(r#"{"type":"host""#)).unwrap();
        serde_json::from_str::<Value>(host).unwrap()["identity"].as_str().unwrap().to_string()
    };
    let server = Server::start(&site.server_db(), &[]);
    let url = server.url.clone();
    assert_eq!(post(&url, Some(&a), &bodies[0]).0, 200);
    assert_eq!(post(&url, Some(&b), &bodies[1]).0, 200);
    let stored = runs_in(&site);

    // B sends A's host, with fresh record ids.
    let forged = bodies[0].replace(r#""id":""#, r#""id":"f"#).replace(r#""host_id":""#, r#""host_id":"f"#);
    let (status, _, body) = post(&url, Some(&b), &forged);
    assert_eq!(status, 403, "{body}");
    assert!(body.contains(&identity(&bodies[0])) && body.contains("nothing was imported"), "{body}");
    // B sends a host that is not its own (a node that does not exist, say).
    let (status, _, body) = post(&url, Some(&b), &bodies[2]);
    assert_eq!(status, 403, "{body}");
    assert_eq!(runs_in(&site), stored, "a refused upload stores nothing");
    let hosts = site.admin(&["hosts", "--json"]).success().json();
    assert_eq!(hosts["hosts"].as_array().unwrap().len(), 2, "no host was made by a refused upload");

    // Each token is listed with its host; an importer loads any host.
    let listed = site.admin(&["token", "list", "--json"]).success().json();
    let host_of = |name: &str| {
        let rows = listed["tokens"].as_array().unwrap();
        rows.iter().find(|t| t["name"] == name).unwrap()["host_identity"].as_str().map(str::to_string)
    };
    assert_eq!(host_of("node-a"), Some(identity(&bodies[0])));
    assert_eq!(host_of("node-b"), Some(identity(&bodies[1])));
    assert_eq!(host_of("site-import"), None);
    assert!(site.admin(&["token", "list"]).success().stdout().contains(&identity(&bodies[1])));
    assert_eq!(post(&url, Some(&importer), &bodies[2]).0, 200);
    assert!(runs_in(&site) > stored);
}

#[test]
fn provision_applies_reach_the_service_with_their_journal() {
    let test = "provision applies reach the service";
    if crate::util::needs(test, &crate::util::root("provision apply").into_iter().collect::<Vec<_>>()) {
        applies_reach_the_service(Site::new());
    }
}

#[test]
fn provision_applies_reach_the_service_on_postgresql_with_their_journal() {
    let test = "provision applies reach the service on PostgreSQL";
    if !crate::util::needs(test, &crate::util::root("provision apply").into_iter().collect::<Vec<_>>()) {
        return;
    }
    if let Some(site) = Site::postgres(test) {
        applies_reach_the_service(site);
    }
}

// Long: one apply's story (failed, uploaded; resumed, uploaded again; the server down) in order.
fn applies_reach_the_service(site: Site) {
    let token = site.token("box", "agent");
    let reader = site.token("ops", "reader");
    let (agent_db, root, spec) = (site.path("agent.db"), site.path("root"), site.path("fleet-lab.toml"));
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(&spec, LAB_IMAGE).unwrap();
    let apply = |url: &str, extra: &[&str]| {
        let mut args = vec!["--server", url, "--token", &token, "provision", "apply", spec.to_str().unwrap()];
        args.extend_from_slice(&["--root", root.to_str().unwrap()]);
        args.extend_from_slice(extra);
        kiln(&args, &[("KILN_DB", &agent_db)])
    };
    let local = |args: &[&str]| kiln(args, &[("KILN_DB", &agent_db)]).success().json();
    let fleet = |url: &str, args: &[&str]| {
        let mut all = vec!["--server", url, "--token", &reader];
        all.extend_from_slice(args);
        kiln(&all, &[]).success()
    };

    let server = Server::start(&site.server_db(), &[]);
    let url = server.url.clone();
    // A failed apply is stored here, then uploaded with its journal.
    let failed = apply(&url, &[]);
    assert_eq!(failed.code(), Some(2), "{}", failed.describe());
    assert!(!failed.stderr().contains("warning"), "{}", failed.describe());
    let listed = fleet(&url, &["provision", "log", "--json"]).json();
    let applies = listed["applies"].as_array().unwrap();
    assert_eq!(applies.len(), 1, "{listed}");
    assert_eq!(applies[0]["status"], "failed");
    let id = applies[0]["id"].as_str().unwrap().to_string();
    let there = fleet(&url, &["provision", "log", "--apply", &id[..8], "--json"]).json();
    assert_eq!(there["steps"][1]["status"], "failed", "{there}");
    assert!(there["steps"][1]["output_tail"].as_str().unwrap().contains("looking for ok"), "{there}");
    assert_eq!(there, local(&["provision", "log", "--apply", &id, "--json"]), "the fleet's journal is the box's");
    let text = fleet(&url, &["provision", "log"]).stdout();
    assert!(text.contains("HOST") && text.contains("failed") && text.contains("fleet-lab 3"), "{text}");

    // Resumed and finished: the same apply comes again with the rest of its story, once.
    std::fs::write(root.join("ok"), "").unwrap();
    apply(&url, &["--resume"]).success();
    let there = fleet(&url, &["provision", "log", "--apply", &id, "--json"]).json();
    assert_eq!((there["apply"]["status"].as_str(), there["apply"]["resumes"].as_i64()), (Some("succeeded"), Some(1)));
    assert_eq!(there, local(&["provision", "log", "--apply", &id, "--json"]));
    let (status, _) = server.stop();
    assert!(status.success());

    // The server down: the apply (a new one: the image changed) waits in the outbox, then goes.
    let next = LAB_IMAGE.replace("version = \"3\"", "version = \"4\"").replace("threads = 8", "threads = 16");
    std::fs::write(&spec, next).unwrap();
    let down = apply(&url, &[]).success();
    assert!(down.stderr().contains("warning: 1 results not sent"), "{}", down.describe());
    let server = Server::start(&site.server_db(), &[]);
    let url = server.url.clone();
    let sent =
        kiln(&["--server", &url, "--token", &token, "sync", "--json"], &[("KILN_DB", &agent_db)]).success().json();
    assert_eq!(sent["entries"].as_u64(), Some(1), "{sent}");
    let listed = fleet(&url, &["provision", "log", "--json"]).json();
    let versions: Vec<&str> =
        listed["applies"].as_array().unwrap().iter().map(|a| a["image_version"].as_str().unwrap()).collect();
    assert_eq!(versions, ["4", "3"], "{listed}");
    site.check_db();
}

#[test]
fn an_upload_cut_off_by_a_killed_server_is_stored_whole_or_not_at_all() {
    upload_cut_off_by_a_killed_server(Site::new());
}

#[test]
fn an_upload_cut_off_by_a_killed_server_on_postgresql_is_stored_whole_or_not_at_all() {
    if let Some(site) = Site::postgres("a killed server on PostgreSQL") {
        upload_cut_off_by_a_killed_server(site);
    }
}

fn upload_cut_off_by_a_killed_server(site: Site) {
    let token = site.token("site-import", "importer");
    let server = Server::start(&site.server_db(), &[]);
    let (export, ..) = generate(&crate::fleet::spec_seeded(7));
    let url = server.url.clone();
    let (t, body) = (token.clone(), export.clone());
    let upload = std::thread::spawn(move || {
        client().post(format!("{url}/api/v1/records")).header("Authorization", format!("Bearer {t}")).send(&body)
    });
    std::thread::sleep(Duration::from_millis(150));
    let mut server = server;
    server.child.kill().unwrap();
    server.child.wait().unwrap();
    let _ = upload.join();
    let stored = runs_in(&site);
    assert!(stored == 0 || stored == 1200, "{stored} runs: an upload is one transaction");
    site.check_db();

    // The agent tries again: everything, once.
    let server = Server::start(&site.server_db(), &[]);
    let (status, _, body) = post(&server.url, Some(&token), &export);
    assert_eq!(status, 200, "{body}");
    assert_eq!(runs_in(&site), 1200);
}

#[test]
fn postgresql_restarted_under_the_server_costs_one_refused_upload_and_no_data() {
    let Some(site) = Site::postgres("PostgreSQL restarted under the server") else { return };
    let pg = site.pg.as_ref().unwrap();
    let token = site.token("site-import", "importer");
    let reader = site.token("ops", "reader");
    let server = Server::start(&site.server_db(), &[]);
    let (first, ..) = generate(&crate::fleet::spec_seeded(11));
    assert_eq!(post(&server.url, Some(&token), &first).0, 200);

    // The database goes away: uploads and questions answer 503 (agents keep their results and
    // try again), health says so, and the server stays up.
    pg.stop();
    // Twenty more boxes (the first forty's runs again, and 600 new ones).
    let (second, ..) = generate(&crate::fleet_gen::FleetSpec { hosts: 60, ..crate::fleet::spec_seeded(12) });
    let (status, _, body) = post(&server.url, Some(&token), &second);
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("cannot be reached"), "{body}");
    assert_eq!(get(&server.url, "/healthz", None).0, 503);

    // Back: the server's connections are made again; nothing was lost, nothing half-stored.
    pg.restart();
    assert_eq!(get(&server.url, "/healthz", None).0, 200);
    let (status, _, body) = post(&server.url, Some(&token), &second);
    assert_eq!(status, 200, "{body}");
    let hosts = kiln(&["--server", &server.url, "--token", &reader, "hosts", "--json"], &[]).success().json();
    assert_eq!(hosts["hosts"].as_array().unwrap().len(), 60);
    assert_eq!(runs_in(&site), 1800);
    site.check_db();
    let (status, said) = server.stop();
    assert!(status.success(), "{said}");
}

#[test]
fn two_services_on_one_postgresql_share_its_fleet() {
    let Some(site) = Site::postgres("two services on one PostgreSQL") else { return };
    let token = site.token("site-import", "importer");
    let (a, b) = (Server::start(&site.server_db(), &[]), Server::start(&site.server_db(), &[]));
    // The same configurations in both halves: both uploads bring the same new metrics and series
    // keys. (Whether the two imports overlap is up to timing; a race on a new key is handled by
    // ON CONFLICT in the shared queries, which this test does not force.)
    let (export, ..) = generate(&crate::fleet_gen::FleetSpec { hosts: 80, ..crate::fleet::spec_seeded(31) });
    let [first, second]: [String; 2] = crate::fleet_gen::split_by_host(&export, 2).try_into().unwrap();
    let sent: Vec<_> = [(a.url.clone(), first), (b.url.clone(), second)]
        .into_iter()
        .map(|(url, body)| {
            let token = token.clone();
            std::thread::spawn(move || post(&url, Some(&token), &body))
        })
        .collect();
    for s in sent {
        let (status, _, body) = s.join().unwrap();
        assert_eq!(status, 200, "{body}");
    }
    assert_eq!(runs_in(&site), 2400);
    let reader = site.token("ops", "reader");
    let hosts = kiln(&["--server", &a.url, "--token", &reader, "hosts", "--json"], &[]).success().json();
    assert_eq!(hosts["hosts"].as_array().unwrap().len(), 80);
    let pg = site.pg.as_ref().unwrap();
    let keys = pg.psql("kiln", "SELECT COUNT(*), COUNT(DISTINCT (config_fingerprint, benchmark, bench_config, software_fingerprint, metric)) FROM series_keys");
    let (all, distinct) = keys.trim().split_once('|').unwrap();
    assert_eq!(all, distinct, "each series key once");
    site.check_db();
}

/// Two services given the same new hosts at once (an agent that retried on the other replica):
/// a lock on `runs` held from outside keeps both uploads' transactions open until both have
/// started, so each sees the hosts absent when it begins. Both must be stored, once.
#[test]
fn two_services_on_one_postgresql_take_the_same_new_hosts_at_once() {
    let Some(site) = Site::postgres("two imports racing on PostgreSQL") else { return };
    let token = site.token("site-import", "importer");
    let (a, b) = (Server::start(&site.server_db(), &[]), Server::start(&site.server_db(), &[]));
    let (export, ..) = generate(&crate::fleet_gen::FleetSpec { hosts: 40, ..crate::fleet::spec_seeded(37) });
    let pg = site.pg.as_ref().unwrap();
    std::thread::scope(|scope| {
        let held = scope
            .spawn(|| pg.psql("kiln", "BEGIN; LOCK TABLE runs IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(4); COMMIT;"));
        // Until the lock is taken: no upload may reach `runs` before it.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while pg
            .psql(
                "kiln",
                "SELECT COUNT(*) FROM pg_locks WHERE relation = 'runs'::regclass AND mode = 'AccessExclusiveLock'",
            )
            .trim()
            != "1"
        {
            assert!(std::time::Instant::now() < deadline, "the lock on runs was never taken");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let sent: Vec<_> = [&a.url, &b.url]
            .into_iter()
            .map(|url| {
                let (token, export) = (&token, &export);
                scope.spawn(move || post(url, Some(token), export))
            })
            .collect();
        for s in sent {
            let (status, _, body) = s.join().unwrap();
            assert_eq!(status, 200, "{body}");
        }
        held.join().unwrap();
    });
    assert_eq!(runs_in(&site), 40 * crate::fleet::spec_seeded(37).nights, "every run once");
    let hosts = pg.psql("kiln", "SELECT COUNT(*), COUNT(DISTINCT identity) FROM hosts");
    assert_eq!(hosts.trim(), "40|40", "every host once");
    site.check_db();
}

#[test]
fn postgresql_urls_are_taken_where_they_serve_and_refused_clearly_elsewhere() {
    let url = "postgres://kiln:s3cret@localhost/kiln?host=/nonexistent-kiln-socket-dir";
    // A command that keeps a box's own results: refused before anything runs, saying what takes one.
    let refused = kiln(&["--db", url, "db", "check"], &[]);
    assert_eq!(refused.code(), Some(2), "{}", refused.describe());
    assert!(refused.stderr().contains("local SQLite file"), "{}", refused.describe());
    // A fleet command takes it; a server that is not there is named, never with the password.
    for args in [vec!["hosts"], vec!["token", "list"], vec!["compare", "--by", "config"]] {
        let mut all = vec!["--db", url];
        all.extend(&args);
        let down = kiln(&all, &[]);
        assert_eq!(down.code(), Some(2), "{}", down.describe());
        assert!(down.stderr().contains("cannot be reached"), "{}", down.describe());
        assert!(down.stderr().contains("postgres://kiln:***@localhost"), "{}", down.describe());
        assert!(!down.stderr().contains("s3cret") && !down.stdout().contains("s3cret"), "{}", down.describe());
    }
}

#[test]
fn limits_anonymous_reads_and_https() {
    let site = Site::new();
    let token = site.token("site-import", "importer");
    let server = Server::start(&site.server_db(), &["--max-upload-mib", "1", "--anonymous-read"]);
    let (export, ..) = generate(&crate::fleet::spec_seeded(3));
    assert!(export.len() > 1 << 20);
    let (status, _, body) = post(&server.url, Some(&token), &export);
    assert_eq!(status, 413, "a body above --max-upload-mib (by its Content-Length)");
    assert!(body.contains("1 MiB"), "{body}");
    // Without a length (chunked), refused when the limit is reached.
    let mut reader = std::io::Cursor::new(export.as_bytes());
    let chunked = client()
        .post(format!("{}/api/v1/records", server.url))
        .header("Authorization", format!("Bearer {token}"))
        .send(ureq::SendBody::from_reader(&mut reader));
    assert_eq!(send(chunked).0, 413, "a chunked body above --max-upload-mib");
    assert_eq!(runs_in(&site), 0);
    let (status, _, body) = get(&server.url, "/api/v1/hosts", None);
    assert_eq!(status, 200, "--anonymous-read: {body}");
    assert_eq!(post(&server.url, None, "x").0, 401, "uploads still need a token");
    assert_eq!(get(&server.url, "/healthz", None).0, 200);
    assert_eq!(get(&server.url, "/nope", None).0, 404);
    drop(server);

    // HTTPS with a site's own CA, which agents are told to trust.
    let missing: Vec<String> = crate::util::program("openssl", "openssl").into_iter().collect();
    if !crate::util::needs("limits_anonymous_reads_and_https (its HTTPS half)", &missing) {
        return;
    }
    let dir = site.dir.path();
    let openssl = |args: &[&str]| {
        let out = Command::new("openssl").args(args).current_dir(dir).output().expect("openssl");
        assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    openssl(
        &["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2"]
            .into_iter()
            .chain(["-subj", "/CN=kiln test CA"])
            .collect::<Vec<_>>(),
    );
    std::fs::write(dir.join("ext.cnf"), "basicConstraints=CA:FALSE\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n")
        .unwrap();
    openssl(&["req", "-newkey", "rsa:2048", "-nodes", "-keyout", "key.pem", "-out", "req.csr", "-subj", "/CN=kiln"]);
    openssl(&[
        "x509",
        "-req",
        "-in",
        "req.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "cert.pem",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
    ]);
    let (cert, key, ca) = (dir.join("cert.pem"), dir.join("key.pem"), dir.join("ca.pem"));
    let server = Server::start(
        &site.server_db(),
        &["--tls-cert", cert.to_str().unwrap(), "--tls-key", key.to_str().unwrap(), "--anonymous-read"],
    );
    assert!(server.url.starts_with("https://127.0.0.1:"), "{}", server.url);
    let agent_db = site.path("agent.db");
    let root = snapshot("16em64t-4s2c2t");
    let ok = kiln(
        &[
            "--server",
            &server.url,
            "--token",
            &token,
            "--ca-cert",
            ca.to_str().unwrap(),
            "inventory",
            "--save",
            "--root",
            root.to_str().unwrap(),
        ],
        &[("KILN_DB", &agent_db)],
    )
    .success();
    assert!(!ok.stderr().contains("warning"), "{}", ok.describe());
    let hosts = kiln(&["--server", &server.url, "--ca-cert", ca.to_str().unwrap(), "hosts", "--json"], &[]).success();
    assert_eq!(hosts.json()["hosts"].as_array().unwrap().len(), 1);
    let untrusted = kiln(&["--server", &server.url, "hosts"], &[]);
    assert_eq!(untrusted.code(), Some(2), "the web's roots do not know this CA: {}", untrusted.describe());
    assert!(untrusted.stderr().to_lowercase().contains("certificate"), "{}", untrusted.describe());
}

/// `kiln agent --metrics`: host metrics always, GPU metrics through NVML (the fake library here).
#[test]
fn the_agent_exports_host_and_gpu_telemetry_for_prometheus() {
    use crate::gpu::{capture, fixture, FakeMachine, Wiring};
    let smi = capture("H100SXMx8_smi_q.txt");
    let text = fixture(&smi, Wiring::None, |i, lines| {
        // GPU 3 sits at its power cap (SW_POWER_CAP, 0x4); the others run free.
        let throttle = if i == 3 { "4" } else { "0" };
        lines.push(format!("load 650000 1755 2619 100 40 {throttle}"));
    });
    let machine = FakeMachine::new(&text);
    let lib = crate::util::fake_nvml();
    let agent = Server::spawn(
        &["agent", "--metrics", "127.0.0.1:0", "--nvml-lib", lib.to_str().unwrap()],
        &[("KILN_FAKE_NVML_FIXTURE", machine.fixture())],
    );
    let url = agent.url.trim_end_matches("/metrics").to_string();
    let (status, _, metrics) = get(&url, "/metrics", None);
    assert_eq!(status, 200);
    let value = |prefix: &str| -> f64 {
        let line = metrics.lines().find(|l| l.starts_with(prefix)).unwrap_or_else(|| panic!("no {prefix}:\n{metrics}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    assert_eq!(value("kiln_nvml_up "), 1.0);
    assert_eq!(value("kiln_gpus "), 8.0);
    assert!(value("kiln_host_cpu_seconds_total{mode=\"idle\"}") > 0.0);
    assert!(value("kiln_host_memory_total_bytes ") > 1e8);
    let gpu = |metric: &str, gpu: usize| -> f64 {
        let line = metrics
            .lines()
            .find(|l| l.starts_with(&format!("kiln_{metric}{{")) && l.contains(&format!("gpu=\"{gpu}\"")))
            .unwrap_or_else(|| panic!("no {metric} of gpu {gpu}:\n{metrics}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    assert_eq!(gpu("gpu_power_watts", 0), 650.0);
    assert_eq!(gpu("gpu_sm_clock_mhz", 7), 1755.0);
    assert_eq!((gpu("gpu_throttled_power", 3), gpu("gpu_throttled_power", 0)), (1.0, 0.0));
    assert!(gpu("gpu_memory_total_bytes", 0) > 8e10, "an H100 has 80 GB");
    assert!(metrics.contains("name=\"NVIDIA H100 80GB HBM3\""), "{metrics}");
    let (status, said) = agent.stop();
    assert!(status.success(), "{said}");
}

//! The views both front ends answer with: each question of the results store (`runs`, `hosts`,
//! `compare`, `outliers`, `regressions`, the provisioning journal) as a typed value that renders
//! itself for people and serialises to its `--json` document, and the one function (`document`)
//! that turns a view into either. `kiln …` prints them; `kiln serve` answers HTTP with the same
//! bytes, so that a question asked of the server answers exactly what the local command answers.

use std::collections::BTreeMap;

use anyhow::Result;
use kiln_db::{AnyStore, ApplyRow, HostRow, Queries, RunRow, StepRow, StepStatus};
use serde::Serialize;

use crate::fleet::{self, Comparison, ConfigSummary, Filter, Regression};
use crate::fleet_view::{self, OutlierEntry};

/// The version of every `--json` document's shape. Adding a field is free; renaming or removing
/// one bumps it.
pub const SCHEMA_VERSION: u32 = 1;

/// A command's result as people read it. Its `Serialize` form is the `--json` document.
pub trait View: Serialize {
    /// The text for people.
    fn render(&self) -> String;
    /// Whether `--json` wraps the value in the envelope. Documents that carry their own
    /// `schema_version` (the inventory) are printed as they are.
    const ENVELOPED: bool = true;
}

/// `{"schema_version": N, ...the value's own fields}`.
#[derive(Serialize)]
struct Envelope<'a, T: Serialize> {
    schema_version: u32,
    #[serde(flatten)]
    value: &'a T,
}

/// A command's result as text for people, or as its `--json` document (the fleet service answers
/// with the same).
pub fn document<V: View>(value: &V, json: bool) -> serde_json::Result<String> {
    Ok(match (json, V::ENVELOPED) {
        (false, _) => value.render(),
        (true, true) => serde_json::to_string_pretty(&Envelope { schema_version: SCHEMA_VERSION, value })?,
        (true, false) => serde_json::to_string_pretty(value)?,
    })
}

/// The start of a `--since` window (`30d`, `12h`, `2w`), in seconds since the epoch.
pub fn window_start(since: &str) -> Result<i64> {
    let length = fleet::parse_duration(since)?;
    Ok(kiln_text::timefmt::now_unix() - length)
}

/// The filter of a window (`--since`: none is every result), a metric and whether results on
/// other software stacks compare (`--across-software`).
pub fn filter(since: Option<&str>, metric: Option<String>, across_software: bool) -> Result<Filter> {
    let since = since.map(window_start).transpose()?;
    Ok(Filter { since, metric, across_software })
}

/// How `kiln compare` groups what it compares: `--by config` (every configuration side by side).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum By {
    Config,
}

impl View for kiln_inventory::Inventory {
    fn render(&self) -> String {
        kiln_inventory::summary::summary(self)
    }
    const ENVELOPED: bool = false;
}

impl View for crate::provisioning::Verification {
    fn render(&self) -> String {
        crate::provisioning::render_verification(self)
    }
}

/// `kiln compare --by config`.
#[derive(Serialize)]
pub struct Configs {
    pub configs: Vec<ConfigSummary>,
}

impl View for Configs {
    fn render(&self) -> String {
        fleet_view::render_configs(&self.configs)
    }
}

impl View for Comparison {
    fn render(&self) -> String {
        fleet_view::render_comparison(self)
    }
}

/// What `kiln compare` answers: every configuration, or two subjects side by side.
#[derive(Serialize)]
#[serde(untagged)]
pub enum CompareView {
    Configs(Configs),
    Two(Comparison),
}

impl View for CompareView {
    fn render(&self) -> String {
        match self {
            CompareView::Configs(c) => c.render(),
            CompareView::Two(c) => c.render(),
        }
    }
}

/// `kiln compare` of a store (the command's own, or the fleet service's).
pub async fn compare_view(
    store: &mut AnyStore,
    subjects: &[String],
    by: Option<By>,
    prices: &BTreeMap<String, f64>,
    filter: &Filter,
    noise: f64,
) -> Result<CompareView> {
    let fleet = store.fleet(filter.since).await?;
    match (by, subjects) {
        (Some(By::Config), []) => {
            Ok(CompareView::Configs(Configs { configs: fleet::compare_configs(&fleet, filter, prices) }))
        }
        (None, [a, b]) => {
            let (sa, la) = fleet::resolve(&fleet, a)?;
            let (sb, lb) = fleet::resolve(&fleet, b)?;
            let rows = fleet::compare_two(&fleet, &sa, &sb, filter, noise)?;
            Ok(CompareView::Two(Comparison { a: la, b: lb, noise, rows, across_software: filter.across_software }))
        }
        _ => anyhow::bail!("give `--by config`, or two subjects: kiln compare A B"),
    }
}

/// `kiln outliers`.
#[derive(Serialize)]
pub struct Outliers {
    pub threshold: f64,
    pub min_deviation: f64,
    pub outliers: Vec<OutlierEntry>,
}

impl View for Outliers {
    fn render(&self) -> String {
        fleet_view::render_outliers(&self.outliers, self.threshold, self.min_deviation)
    }
}

/// `kiln outliers` of a store (the command's own, or the fleet service's).
pub async fn outliers_view(
    store: &mut AnyStore,
    filter: &Filter,
    threshold: f64,
    min_deviation: f64,
) -> kiln_db::Result<Outliers> {
    let fleet = store.fleet(filter.since).await?;
    let mut outliers = Vec::new();
    for outlier in fleet::outliers(&fleet, filter, threshold, min_deviation) {
        let telemetry = fleet_view::outlier_telemetry(store, &outlier).await?;
        outliers.push(OutlierEntry { outlier, telemetry });
    }
    Ok(Outliers { threshold, min_deviation, outliers })
}

/// `kiln regressions`.
#[derive(Serialize)]
pub struct Regressions {
    pub since: String,
    pub noise: f64,
    pub regressions: Vec<Regression>,
    /// The window's length in days, for the text.
    #[serde(skip)]
    pub days: f64,
}

impl View for Regressions {
    fn render(&self) -> String {
        fleet_view::render_regressions(&self.regressions, self.days)
    }
}

/// `kiln regressions` of a store (the command's own, or the fleet service's).
pub async fn regressions_view(
    store: &mut AnyStore,
    since: &str,
    metric: Option<String>,
    noise: f64,
) -> Result<Regressions> {
    let start = window_start(since)?;
    let filter = Filter { since: Some(start), metric, across_software: true };
    let fleet = store.fleet(filter.since).await?;
    let mut regressions = fleet::regressions(&fleet, &filter, noise);
    fleet_view::explain_all(store, &mut regressions).await?;
    let days = (kiln_text::timefmt::now_unix() - start) as f64 / 86_400.0;
    Ok(Regressions { since: since.to_string(), noise, regressions, days })
}

/// `kiln runs`.
#[derive(Serialize)]
pub struct Runs {
    pub runs: Vec<RunRow>,
    /// Where the runs came from (the database file, or the fleet service), for the text.
    #[serde(skip)]
    pub database: String,
}

impl View for Runs {
    fn render(&self) -> String {
        if self.runs.is_empty() {
            return format!("no runs in {} yet: run `kiln bench membw`", self.database);
        }
        let mut text = format!("{:<36}  {:<20}  {:<10}  {:<8}  HEADLINE\n", "RUN", "STARTED", "BENCHMARK", "STATUS");
        for r in &self.runs {
            let headline = r.metrics.iter().find(|m| m.name.ends_with("all.triad_gbps")).or(r.metrics.first());
            text.push_str(&format!(
                "{:<36}  {:<20}  {:<10}  {:<8}  {}\n",
                r.id,
                r.started_at,
                r.benchmark,
                r.status,
                headline.map(|m| format!("{} {:.2} {}", m.name, m.value, m.unit)).unwrap_or_default()
            ));
        }
        text
    }
}

/// `kiln runs` of a store (the command's own, or the fleet service's).
pub async fn runs_view(store: &mut kiln_db::AnyStore, limit: i64, database: String) -> kiln_db::Result<Runs> {
    Ok(Runs { runs: store.runs(limit).await?, database })
}

/// `kiln hosts`.
#[derive(Serialize)]
pub struct Hosts {
    pub hosts: Vec<HostEntry>,
    /// Where the hosts came from (the database file, or the fleet service), for the text.
    #[serde(skip)]
    pub database: String,
}

/// A host with its newest verdict.
#[derive(Serialize)]
pub struct HostEntry {
    #[serde(flatten)]
    pub host: HostRow,
    pub verdict: Option<kiln_db::VerdictRow>,
}

impl View for Hosts {
    fn render(&self) -> String {
        if self.hosts.is_empty() {
            return format!("no hosts in {} yet: run `kiln commission` or `kiln inventory --save`", self.database);
        }
        let rows: Vec<Vec<String>> = self
            .hosts
            .iter()
            .map(|e| {
                let h = &e.host;
                let verdict = e.verdict.as_ref().map_or("-".to_string(), |v| {
                    format!(
                        "{} ({}, {})",
                        v.verdict.to_uppercase(),
                        v.spec_name,
                        &v.judged_at[..v.judged_at.len().min(10)]
                    )
                });
                vec![
                    h.id.clone(),
                    h.config_fingerprint.clone(),
                    h.last_seen.clone(),
                    h.inventories.to_string(),
                    verdict,
                    format!("{} ({})", h.hostname.as_deref().unwrap_or("-"), h.config_name),
                ]
            })
            .collect();
        kiln_text::table(&["HOST", "CONFIG", "LAST SEEN", "INV", "LAST VERDICT", "NAME"], &rows)
    }
}

/// `kiln hosts` of a store (the command's own, or the fleet service's).
pub async fn hosts_view(store: &mut kiln_db::AnyStore, database: String) -> kiln_db::Result<Hosts> {
    let (hosts, mut verdicts) = (store.hosts().await?, store.latest_verdicts().await?);
    let hosts = hosts.into_iter().map(|host| HostEntry { verdict: verdicts.remove(&host.id), host }).collect();
    Ok(Hosts { hosts, database })
}

/// `kiln provision log --apply ID`.
#[derive(Serialize)]
pub struct Journal {
    pub apply: ApplyRow,
    pub steps: Vec<StepRow>,
}

impl View for Journal {
    fn render(&self) -> String {
        let a = &self.apply;
        let mut text = format!(
            "apply {} of {} {} to {}{} — {} (started {}, finished {}, resumed {} time{})\n",
            a.id,
            a.image,
            a.image_version,
            a.root,
            a.hostname.as_deref().map(|h| format!(" on {h}")).unwrap_or_default(),
            a.status,
            a.started_at,
            a.finished_at.as_deref().unwrap_or("-"),
            a.resumes,
            if a.resumes == 1 { "" } else { "s" }
        );
        for s in &self.steps {
            text += &format!(
                "{:>3}  {:<11}  {:>8}  exit {:<4}  {}\n",
                s.seq,
                s.status,
                s.duration_ms.map_or("-".into(), |d| format!("{:.1} s", d as f64 / 1000.0)),
                s.exit_code.map_or("-".into(), |c| c.to_string()),
                s.summary
            );
            if s.status == StepStatus::Failed {
                let tail = s.output_tail.as_deref().unwrap_or("");
                let lines: Vec<&str> = tail.lines().rev().take(10).collect();
                for line in lines.into_iter().rev() {
                    text += &format!("       | {line}\n");
                }
            }
        }
        text
    }
}

/// `kiln provision log`.
#[derive(Serialize)]
pub struct Applies {
    pub applies: Vec<ApplyRow>,
    /// Where they were read: a database file, or "the fleet" (which adds each apply's host).
    #[serde(skip)]
    pub source: String,
    #[serde(skip)]
    pub fleet: bool,
}

impl View for Applies {
    fn render(&self) -> String {
        if self.applies.is_empty() {
            return format!("no applies journaled in {}", self.source);
        }
        let host = |a: &ApplyRow| {
            if self.fleet {
                format!("{:<20}  ", a.hostname.as_deref().unwrap_or("?"))
            } else {
                String::new()
            }
        };
        let head = if self.fleet { format!("{:<20}  ", "HOST") } else { String::new() };
        let mut text = format!("{:<8}  {head}{:<24}  {:<11}  {:<24}  ROOT\n", "APPLY", "STARTED", "STATUS", "IMAGE");
        for a in &self.applies {
            let image = format!("{} {}", a.image, a.image_version);
            text += &format!(
                "{:<8}  {}{:<24}  {:<11}  {:<24}  {}\n",
                &a.id[..8.min(a.id.len())],
                host(a),
                a.started_at,
                a.status,
                image,
                a.root
            );
        }
        text
    }
}

//! Questions about the fleet in the database: `kiln compare`, `outliers`, `regressions`, `report`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use kiln_db::AnyStore;
use serde::Serialize;

use super::args::{By, Window};
use super::{window_start, Ctx, Exit, Output, View};
use crate::fleet::{self, Comparison, ConfigSummary, Filter, Regression};
use crate::fleet_view::{self, OutlierEntry};

/// The filter of `--since`, `--metric` and `--across-software`.
pub fn filter(window: &Window, metric: Option<String>, across_software: bool) -> Result<Filter> {
    let since = window.since.as_deref().map(window_start).transpose()?;
    Ok(Filter { since, metric, across_software })
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

pub fn compare(
    subjects: &[String],
    by: Option<By>,
    prices: Option<&Path>,
    filter: &Filter,
    noise: f64,
    ctx: &Ctx,
) -> Result<Output> {
    let prices = match prices {
        Some(p) => {
            let text = std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            fleet::parse_prices(&text).with_context(|| p.display().to_string())?
        }
        None => BTreeMap::new(),
    };
    let view = ctx.with_any_sync(|rt, store| rt.block_on(compare_view(store, subjects, by, &prices, filter, noise)))?;
    ctx.output(&view)
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

pub fn outliers(filter: &Filter, threshold: f64, min_deviation: f64, ctx: &Ctx) -> Result<Output> {
    ctx.output(&ctx.with_any(async |store| outliers_view(store, filter, threshold, min_deviation).await)?)
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

pub fn regressions(since: &str, metric: Option<String>, noise: f64, ctx: &Ctx) -> Result<Output> {
    let view = ctx.with_any_sync(|rt, store| rt.block_on(regressions_view(store, since, metric, noise)))?;
    let found = !view.regressions.is_empty();
    Ok(ctx.output(&view)?.with_exit(Exit::check(found)))
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
    let days = (crate::timefmt::now_unix() - start) as f64 / 86_400.0;
    Ok(Regressions { since: since.to_string(), noise, regressions, days })
}

/// `kiln report`'s arguments.
pub struct ReportArgs {
    pub host: Option<String>,
    pub config: Option<String>,
    pub run: Option<String>,
    pub cluster: Option<String>,
    pub html: Option<PathBuf>,
    pub markdown: Option<PathBuf>,
    pub since: String,
}

/// `kiln report --json`: what was written.
#[derive(Serialize)]
pub struct Written {
    pub title: String,
    pub html: Option<PathBuf>,
    pub markdown: Option<PathBuf>,
}

impl View for Written {
    fn render(&self) -> String {
        String::new()
    }
}

pub fn report(args: ReportArgs, ctx: &Ctx) -> Result<Output> {
    if args.html.is_none() && args.markdown.is_none() {
        anyhow::bail!("say where the report goes: --html FILE and/or --markdown FILE");
    }
    let start = window_start(&args.since)?;
    let report = match &args.cluster {
        Some(id) => {
            let runs = ctx.with_any_sync(|rt, store| Ok(rt.block_on(store.runs_of_cluster(id))?))?;
            crate::cluster::report::build(id, &runs)
        }
        None => {
            let asked = crate::report::subject(args.host, args.config, args.run)
                .context("give one of --host, --config, --run or --cluster")?;
            let evidence =
                ctx.with_any_sync(|rt, store| Ok(rt.block_on(crate::report::gather(store, &asked, start))?))?;
            crate::report::build(&evidence)
        }
    };
    let write = |path: &Path, text: String| {
        super::outfile::write_output(path, |w| w.write_all(text.as_bytes()).with_context(|| path.display().to_string()))
    };
    if let Some(path) = &args.html {
        write(path, crate::report::html(&report))?;
    }
    if let Some(path) = &args.markdown {
        write(path, crate::report::markdown(&report))?;
    }
    ctx.output(&Written { title: report.title, html: args.html, markdown: args.markdown })
}
